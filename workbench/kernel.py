"""Whether this process is an IPython kernel: asked by the views and by the notebook hook alike, so it
lives below both (the hook imports the views; the views never import the hook)."""

from __future__ import annotations

import sys


def in_kernel() -> bool:
    """Whether this process is an IPython kernel (a notebook, not a terminal or a script)."""
    if "IPython" not in sys.modules:  # never import IPython just to ask
        return False
    from IPython import get_ipython

    ip = get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None
