"""Every name ``yoke`` exports resolves: the lazy table (PEP 562) points at
modules that exist, and each names the object its TYPE_CHECKING import does."""

import importlib
import subprocess
import sys

import yoke


def test_every_exported_name_resolves_in_a_fresh_interpreter():
    # A fresh process: names already resolved in this one are cached in globals().
    code = "import yoke\nfor n in yoke.__all__: getattr(yoke, n)\nprint(len(yoke.__all__))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == len(yoke.__all__)


def test_the_lazy_table_is_the_export_list_and_names_the_defining_modules():
    lazy = yoke._LAZY
    assert set(lazy) <= set(yoke.__all__)
    for name, module in lazy.items():
        value = getattr(importlib.import_module(module, "yoke"), name)
        assert getattr(yoke, name) is value
    # The public classes are the ones the core uses, not copies.
    from yoke.streams.stream import Stream
    from yoke.subscriptions.management import Subscribed

    assert yoke.Stream is Stream and yoke.Subscribed is Subscribed


def test_an_instance_id_is_id_in_python_as_in_http_and_the_cli():
    info = yoke.InstanceInfo("inst_0123", "default", "counter", "a")
    assert info.id == info.instance_id == "inst_0123"
