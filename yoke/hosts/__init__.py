"""Hosts: user code in processes of its own, behind the op boundary.

``protocol.py`` is the wire format (docs/advanced/hosts.md), ``pool.py`` the kernel's
side (a pool of host processes, each run a JSON-RPC call, every ctx call an
op answered by the kernel's OpHandler), ``python.py`` the Python host.
"""
