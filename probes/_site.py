"""Site-packages on demand, for an interpreter started without them.

The front door starts a liveness run with ``python -I -S`` from the source tree: ``site``
(finding the virtual environment, reading its ``.pth`` files) costs every run ~1.5 ms of
start-up (make bench), and liveness needs no third-party package. A probe that does need
one (``pynvml``, ``psutil``) calls ``packages()`` first; without ``-S`` it does nothing.
"""

from __future__ import annotations

import _thread
import sys

_ready = not sys.flags.no_site
_lock = _thread.allocate_lock()


def packages() -> None:
    """Put the interpreter's site-packages on ``sys.path``, as ``site`` does at start-up."""
    global _ready
    if _ready:
        return
    with _lock:
        if not _ready:
            import site

            site.main()
            _ready = True
