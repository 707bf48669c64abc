"""Example applications that ship with Yoke: ``yoke serve --app
yoke.examples.orders:app`` runs the order pipeline (``make run`` in a
checkout does), from the wheel and in the container image too."""
