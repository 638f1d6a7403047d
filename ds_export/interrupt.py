"""Ctrl-C while the main thread waits for worker threads or processes (dsx download, quantize, tiny).

Raised wherever the main thread happens to be, KeyboardInterrupt can land inside concurrent.futures.wait or
as_completed while they hold some futures' locks (taken one by one, released at the end of a `with`): the lock stays
held, the worker finishing that future blocks on it, and the pool's shutdown waits for that worker forever (a Ctrl-C'd
download that never exited, seen once in CI). So, while the main thread waits, Ctrl-C only sets a flag, and the wait
loop (a timed wait) raises KeyboardInterrupt at its one clean point, after telling the workers to stop.

Worker processes leave Ctrl-C to the main process (a terminal sends it to the whole process group): they start with
SIGINT blocked (sigint_blocked, around the code that spawns them), so that it cannot kill one while its interpreter
starts ("Fatal Python error: init_import_site" and a traceback, before any of our code runs), and ignore it once they
run (ignore_sigint). multiprocessing starts its resource tracker the same way.

SIGTERM to the dsx command (a scheduler or `kill` stopping it) is handled as Ctrl-C (handle_stop_signals): the same
clean stop, the same one line, exit code 143.
"""

from __future__ import annotations

import signal
import sys
import threading
from concurrent.futures import FIRST_COMPLETED, Future, wait
from contextlib import contextmanager, nullcontext
from typing import Callable, Iterator, Sequence


class Stopped(Exception):
    """A worker saw its stop event (Ctrl-C, a caller, or another worker's failure) and abandoned its item."""


def _on_sigterm(signum, frame):
    _terminated[0] = _stopped[0] = True
    raise KeyboardInterrupt


def _on_sigint(signum, frame):
    _stopped[0] = True
    raise KeyboardInterrupt  # (what Python's own handler does)


_terminated = [False]
_stopped = [False]


def handle_stop_signals() -> None:
    """In the dsx command's process: SIGTERM (a scheduler, `timeout` or `kill` stopping the command) stops it as Ctrl-C
    does, here and in ctrl_c_as_flag / sigint_blocked, whatever SIGINT's state (a background job of a script starts
    with SIGINT ignored). Before, the process died where it stood, or printed Paddle's C++ "FatalError" block, and
    left its staging behind. Either signal is also noted (stop_requested): a KeyboardInterrupt raised inside a C
    extension can come out as another exception (Paddle's graph tracing turns it into a SystemError), and one raised
    where Python cannot raise (a weakref callback, `__del__`: "Exception ignored in ...", seen under an export's
    import lock) is dropped silently: the stop is noted, and a command checks it before it publishes its output."""
    sys.unraisablehook = _quiet_stops(sys.unraisablehook)
    signal.signal(signal.SIGTERM, _on_sigterm)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # (not where SIGINT is ignored)
        signal.signal(signal.SIGINT, _on_sigint)


def _quiet_stops(hook):
    """sys.unraisablehook that drops a KeyboardInterrupt of a noted stop (else `hook`'s traceback on stderr)."""
    if getattr(hook, "dsx_quiet_stops", False):
        return hook

    def quiet(u):
        if not (isinstance(u.exc_value, KeyboardInterrupt) and _stopped[0]):
            hook(u)
    quiet.dsx_quiet_stops = True
    return quiet


def terminated() -> bool:
    """Whether a SIGTERM came (handle_stop_signals): the command exits 143, not 130."""
    return _terminated[0]


def stop_requested() -> bool:
    """Whether Ctrl-C or SIGTERM came since handle_stop_signals: an exception that follows is the stop's."""
    return _stopped[0]


def _ours() -> dict[int, object]:
    """The stop signals whose Python handler is dsx's to swap: SIGINT with Python's own (or handle_stop_signals'),
    SIGTERM with handle_stop_signals'."""
    return {s: h for s, h in ((signal.SIGINT, signal.getsignal(signal.SIGINT)),
                              (signal.SIGTERM, signal.getsignal(signal.SIGTERM)))
            if h in (signal.default_int_handler, _on_sigint, _on_sigterm)}


@contextmanager
def ctrl_c_as_flag() -> Iterator[Callable[[], bool]]:
    """Yields `hit()`: whether Ctrl-C (SIGINT) or a SIGTERM handled as one came since entry. In the main thread with
    Python's own handler in place (or handle_stop_signals'), the signal only sets the flag; elsewhere (another thread,
    or a handler of the caller's own) nothing changes and `hit()` stays False. The previous handlers are back on
    exit."""
    flag = [False]
    ours = _ours() if threading.current_thread() is threading.main_thread() else {}
    if not ours:
        yield lambda: False
        return

    def on_stop(signum, frame):
        if ours[signum] in (_on_sigint, _on_sigterm):  # (noted as their own handlers note it: handle_stop_signals)
            _terminated[0] = _terminated[0] or signum == signal.SIGTERM
            _stopped[0] = True
        flag[0] = True

    for s in ours:
        signal.signal(s, on_stop)
    try:
        yield lambda: flag[0]
    finally:
        for s, h in ours.items():
            signal.signal(s, h)


@contextmanager
def sigint_blocked() -> Iterator[None]:
    """SIGINT and SIGTERM blocked in this thread inside: processes it starts (fork, then exec) begin with them blocked
    too (ignore_sigint unblocks them). A Ctrl-C (or SIGTERM) that comes meanwhile is held back and delivered when the
    block ends, so it cannot cut a process start short (another thread may take the signal, but Python runs its
    handler in the main thread, wherever that is: there, dsx's handlers are swapped for a note for the duration).
    multiprocessing's resource tracker is started first if it is not running: starting it inside, as the first spawn
    would, ends with SIGINT unblocked in this thread (its own guard takes the block off rather than restoring the
    mask), and the processes after it would start exposed."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    held = []
    main = threading.current_thread() is threading.main_thread()
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    swapped = {}
    if main:
        ours = _ours()
        for s in {signal.SIGINT, *ours}:
            swapped[s] = signal.signal(s, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        for s, h in swapped.items():
            signal.signal(s, h)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)  # (a signal pending for this thread: delivered now)
        if held:
            signal.raise_signal(held[0])  # (to the handler in place again: KeyboardInterrupt, or a flag)


def ignore_sigint() -> None:
    """First thing in a worker process started under sigint_blocked: Ctrl-C is the main process's to handle. SIGTERM
    keeps its default (a worker sent one alone ends at once, and the main process reports it) and is unblocked."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})  # (a pending SIGINT is dropped)


def wait_for_workers(start: Callable[[], Sequence[Future]], on_done: Callable[[Future], None],
                     stops: Sequence, processes: bool = False) -> list[Future]:
    """Submit the work (`start()`: the futures; with `processes`, a process pool's, under sigint_blocked, so that the
    worker processes it spawns there start deaf to Ctrl-C), then wait for the futures, calling `on_done(f)` as each
    finishes (submission order within a batch; a worker's failure is `f.result()` raising there). On Ctrl-C (a flag:
    ctrl_c_as_flag), any of `stops` set by someone else, or an exception out of `on_done`: every event of `stops` is set (the workers abandon their items at their next
    check), the queued futures are cancelled, the running ones are waited for (a second Ctrl-C does not cut that
    short), `on_done` is called for those that finished without an error, and KeyboardInterrupt or the exception
    goes on up (KeyboardInterrupt where a stop signal came meanwhile: the failure is the stop's). Returns the futures,
    all done."""
    handled = set()
    with ctrl_c_as_flag() as hit:
        with sigint_blocked() if processes else nullcontext():  # (a Ctrl-C meanwhile comes when it ends: the flag)
            futs = list(start())
        order = {f: i for i, f in enumerate(futs)}
        pending = set(futs)
        try:
            while pending:  # a timed wait, so Ctrl-C is seen within 0.2 s even while the workers block
                if hit() or any(s.is_set() for s in stops):
                    raise KeyboardInterrupt
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                for f in sorted(done, key=order.__getitem__):
                    handled.add(f)
                    on_done(f)
        except BaseException as e:
            for s in stops:
                s.set()
            for f in futs:
                f.cancel()
            while not all(f.done() for f in futs):
                wait(futs, timeout=0.2)
            for f in futs:
                if f not in handled and not f.cancelled() and f.exception() is None:
                    on_done(f)
            if hit() and not isinstance(e, KeyboardInterrupt):
                # (the stop's doing: a SIGTERM sent to the process group, as `kill -- -PGID` or a scheduler does,
                # ends the worker processes too, and their pool breaks before this loop looks at the flag)
                raise KeyboardInterrupt from None
            raise
        return futs
