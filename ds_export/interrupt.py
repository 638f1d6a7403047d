"""Ctrl-C while the main thread waits for worker threads or processes (dsx download, quantize, tiny).

Raised wherever the main thread happens to be, KeyboardInterrupt can land inside concurrent.futures.wait or
as_completed while they hold some futures' locks (taken one by one, released at the end of a `with`): the lock stays
held, the worker finishing that future blocks on it, and the pool's shutdown waits for that worker forever (a Ctrl-C'd
download that never exited, seen once in CI). So, while the main thread waits, Ctrl-C only sets a flag, and the wait
loop (a timed wait) raises KeyboardInterrupt at its one clean point, after telling the workers to stop.
"""

from __future__ import annotations

import signal
import threading
from concurrent.futures import FIRST_COMPLETED, Future, wait
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence


class Stopped(Exception):
    """A worker saw its stop event (Ctrl-C, a caller, or another worker's failure) and abandoned its item."""


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


def wait_for_workers(futs: Sequence[Future], on_done: Callable[[Future], None], stops: Sequence) -> None:
    """Wait for `futs`, calling `on_done(f)` as each finishes (submission order within a batch; a worker's failure
    is `f.result()` raising there). On Ctrl-C (a flag: ctrl_c_as_flag), any of `stops` set by someone else, or an
    exception out of `on_done`: every event of `stops` is set (the workers abandon their items at their next
    check), the queued futures are cancelled, the running ones are waited for (a second Ctrl-C does not cut that
    short), `on_done` is called for those that finished without an error, and KeyboardInterrupt or the exception
    goes on up."""
    order = {f: i for i, f in enumerate(futs)}
    handled = set()
    with ctrl_c_as_flag() as hit:
        pending = set(futs)
        try:
            while pending:  # a timed wait, so Ctrl-C is seen within 0.2 s even while the workers block
                if hit() or any(s.is_set() for s in stops):
                    raise KeyboardInterrupt
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                for f in sorted(done, key=order.__getitem__):
                    handled.add(f)
                    on_done(f)
        except BaseException:
            for s in stops:
                s.set()
            for f in futs:
                f.cancel()
            while not all(f.done() for f in futs):
                wait(futs, timeout=0.2)
            for f in futs:
                if f not in handled and not f.cancelled() and f.exception() is None:
                    on_done(f)
            raise
