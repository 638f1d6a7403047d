"""Ctrl-C while the main thread waits for worker threads or processes (dsx download, dsx quantize).

Raised wherever the main thread happens to be, KeyboardInterrupt can land inside concurrent.futures.wait or
as_completed while they hold some futures' locks (taken one by one, released at the end of a `with`): the lock stays
held, the worker finishing that future blocks on it, and the pool's shutdown waits for that worker forever (a Ctrl-C'd
download that never exited, seen once in CI). So, while the main thread waits, Ctrl-C only sets a flag, and the wait
loop (a timed wait) raises KeyboardInterrupt at its one clean point, after telling the workers to stop.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Callable, Iterator


@contextmanager
def ctrl_c_as_flag() -> Iterator[Callable[[], bool]]:
    """Yields `hit()`: whether Ctrl-C (SIGINT) came since entry. In the main thread with Python's own handler in
    place, SIGINT only sets the flag; elsewhere (another thread, or a handler of the caller's own) nothing changes and
    `hit()` stays False. The previous handler is back on exit."""
    flag = [False]
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield lambda: False
        return

    def on_ctrl_c(signum, frame):
        flag[0] = True

    previous = signal.signal(signal.SIGINT, on_ctrl_c)
    try:
        yield lambda: flag[0]
    finally:
        signal.signal(signal.SIGINT, previous)
