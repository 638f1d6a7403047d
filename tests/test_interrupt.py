"""ds_export.interrupt: worker processes start deaf to Ctrl-C, and a Ctrl-C while they start is held back, not lost."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import pytest

from ds_export.interrupt import ignore_sigint, sigint_blocked


def _report(conn) -> None:
    """A spawned child: was SIGINT blocked when its own code began, and what is its handler after ignore_sigint?"""
    blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    ignore_sigint()
    conn.send((blocked, signal.getsignal(signal.SIGINT) == signal.SIG_IGN,
               signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])))
    conn.close()


def test_a_process_started_under_sigint_blocked_starts_deaf_and_then_ignores_it():
    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_report, args=(send,))
    with sigint_blocked():
        proc.start()
    send.close()
    assert recv.recv() == (True, True, False)  # blocked from exec on; then ignored and no longer blocked
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
