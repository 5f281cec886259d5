"""Worker preload of the embedded local cluster: its workers ignore SIGINT.

A notebook's interrupt (and Ctrl-C in a terminal) sends SIGINT to the kernel's whole
process group, which the local cluster's worker processes share; without this they
would die with the kernel's ``KeyboardInterrupt``. The kernel's own ``fit`` stops
(see :mod:`workbench.fitloop`); the workers stay for the next one. They still go
when their nanny or the kernel closes them.
"""

from __future__ import annotations

import signal
import threading


def ignore_interrupts() -> bool:
    """Ignore SIGINT in this process (only possible from its main thread); whether it did."""
    if threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return True


def dask_setup(worker) -> None:
    """Dask's preload hook: called in the worker process as the worker starts."""
    ignore_interrupts()
