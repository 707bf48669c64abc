"""``python -m yoke.cli``: the ``yoke`` command."""

from . import main

main(prog_name="yoke")
