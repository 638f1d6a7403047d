"""A directory's dsx lock (io.dirlock: flock on the directory) held by another process, for the tests that a second
dsx run into it is refused: exclusive as a writer holds it, or shared as a reader (an export, a verify)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap


@contextlib.contextmanager
def held_by_another_process(path, *, reader: bool = False):
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, sys
        fd = os.open({str(path)!r}, os.O_RDONLY)
        fcntl.flock(fd, fcntl.{"LOCK_SH" if reader else "LOCK_EX"})
        print("locked", flush=True)
        sys.stdin.read()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
