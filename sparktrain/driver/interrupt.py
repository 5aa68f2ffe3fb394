"""Ctrl-C during ``run()`` stops this run only, the way sparktrain stops it.

PySpark's SparkContext installs a SIGINT handler that cancels every job of the context (other
threads' and other notebooks' cells' included) before raising KeyboardInterrupt, and it does
so seconds before sparktrain's own stop could give the ranks their grace period. While
``run()`` waits, Ctrl-C raises a plain KeyboardInterrupt instead; the run's monitor turns it
into the stop of this run's ranks and job alone. The previous handler is back afterwards.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def plain_ctrl_c() -> Iterator[None]:
    """While inside, SIGINT raises KeyboardInterrupt in the main thread and does nothing else.

    Outside the main thread (where Python cannot set handlers), or where SIGINT is ignored,
    nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous in (signal.SIG_IGN, None):
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
