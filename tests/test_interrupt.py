"""ds_export.interrupt: worker processes start deaf to Ctrl-C, and a Ctrl-C while they start is held back, not lost."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import pytest

from ds_export import interrupt
from ds_export.interrupt import ctrl_c_as_flag, handle_stop_signals, ignore_sigint, sigint_blocked, terminated


def _report(conn) -> None:
    """A spawned child: was SIGINT blocked when its own code began, and what is its handler after ignore_sigint?"""
    blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    ignore_sigint()
    conn.send((blocked, signal.getsignal(signal.SIGINT) == signal.SIG_IGN,
               signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []),
               # (SIGTERM: its default, and not left blocked: a worker sent one alone ends)
               signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
               signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, [])))
    conn.close()


def test_a_process_started_under_sigint_blocked_starts_deaf_and_then_ignores_it():
    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_report, args=(send,))
    with sigint_blocked():
        proc.start()
    send.close()
    assert recv.recv() == (True, True, False, True, False)  # blocked from exec on; then ignored, unblocked
    proc.join(30)
    assert proc.exitcode == 0
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])  # the caller's mask is back


def test_ctrl_c_inside_sigint_blocked_arrives_when_it_ends():
    """Planted Ctrl-C inside the block: the block's body runs to its end, then the caller gets KeyboardInterrupt."""
    # (tests/conftest.py puts Python's own SIGINT handler back where the run inherited SIGINT ignored)
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with sigint_blocked():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            reached.append(True)
    assert reached == [True]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.fixture
def sigterm_handled():
    """handle_stop_signals in this (the test's) process, undone after."""
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    handle_stop_signals()
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before[0])
        signal.signal(signal.SIGINT, before[1])
        interrupt._terminated[0] = interrupt._stopped[0] = False


def test_sigterm_is_ctrl_c_everywhere_and_is_told_apart(sigterm_handled):
    """SIGTERM raises KeyboardInterrupt; while workers run (ctrl_c_as_flag) it only sets the flag, as Ctrl-C does (a
    KeyboardInterrupt inside concurrent.futures' wait can hang the pool's shutdown); inside sigint_blocked it is held
    back to the block's end; and terminated() tells the CLI to exit 143."""
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
    assert terminated()
    interrupt._terminated[0] = False
    try:
        with ctrl_c_as_flag() as hit:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            assert hit() and terminated()
    except KeyboardInterrupt:
        pytest.fail("SIGTERM raised KeyboardInterrupt inside ctrl_c_as_flag (where workers are waited for)")
    assert signal.getsignal(signal.SIGTERM) is interrupt._on_sigterm  # (put back)
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with sigint_blocked():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            reached.append(True)
    assert reached == [True] and signal.getsignal(signal.SIGTERM) is interrupt._on_sigterm
    assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_paddle_import_keeps_the_sigterm_handler():
    """`import paddle` replaced the SIGTERM handler with its C++ one (a "FatalError" block on stdout, no cleanup):
    quiet_paddle() before the import puts back the one in place before it, also when the import runs in another
    thread (as a rank process's did). Run in a fresh interpreter."""
    import subprocess
    import sys

    pytest.importorskip("paddle")
    code = """if True:
        import signal
        from ds_export.export.quiet import quiet_paddle
        from ds_export.interrupt import handle_stop_signals, _on_sigterm
        import threading
        quiet_paddle()
        handle_stop_signals()
        t = threading.Thread(target=lambda: __import__("paddle"))  # (the first import may come in a worker thread)
        t.start()
        t.join()
        assert signal.getsignal(signal.SIGTERM) is _on_sigterm
        try:
            signal.raise_signal(signal.SIGTERM)
        except KeyboardInterrupt:
            print("KeyboardInterrupt")
    """
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "KeyboardInterrupt" and "FatalError" not in r.stdout, r


def test_a_stop_dropped_by_a_weakref_callback_still_stops_the_export(tmp_path, monkeypatch):
    """A SIGTERM whose KeyboardInterrupt is raised inside a weakref callback (importlib's module-lock callback, in a
    CI run of the SIGTERM test) is dropped by Python with an "Exception ignored" traceback on stderr, and the export
    went on and published its output (exit 0). Now the stop, noted by the handler, is checked before the export is
    published (Interrupted, nothing at OUT or OUT.partial), and handle_stop_signals' unraisable hook keeps it from
    the hook before it (Python's: the traceback on stderr), which still gets an unrelated one."""
    import sys
    import weakref

    from ds_export.errors import Interrupted
    from ds_export.export import exporter
    from ds_export.tiny import TinySpec, write_tiny

    monkeypatch.setattr(interrupt, "_stopped", [False])
    monkeypatch.setattr(interrupt, "_terminated", [False])
    shown = []  # (what the hook before handle_stop_signals' was handed)
    monkeypatch.setattr(sys, "unraisablehook", lambda u: shown.append(type(u.exc_value).__name__))
    monkeypatch.setattr(signal, "signal", lambda *a: None)  # (the hook only: this process's handlers stay)
    handle_stop_signals()
    write_tiny(tmp_path / "ck", TinySpec(layers=1))
    real = exporter._manifest

    def manifest(*a, **k):
        class Locked:
            pass
        held = Locked()
        ref = weakref.ref(held, lambda _: interrupt._on_sigterm(signal.SIGTERM, None))
        del held  # (the callback raises KeyboardInterrupt: Python drops it)
        assert ref() is None and interrupt.stop_requested()
        return real(*a, **k)

    monkeypatch.setattr(exporter, "_manifest", manifest)
    with pytest.raises(Interrupted, match="was not written"):
        exporter.export(tmp_path / "ck", tmp_path / "e", max_seq_len=64)
    assert not (tmp_path / "e").exists() and not (tmp_path / "e.partial").exists()
    assert "KeyboardInterrupt" not in shown, shown

    class Other:
        pass
    gone = Other()
    keep = weakref.ref(gone, lambda _: 1 / 0)
    del gone
    assert keep() is None and shown[-1:] == ["ZeroDivisionError"], shown
