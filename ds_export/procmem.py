"""Peak memory of a process tree, as the quantize goal counts it: RssAnon + RssShmem summed over processes.

File pages of mmapped inputs (RssFile) are not counted: the kernel can drop
them at will. Used by bench/ and by the bounded-memory test.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path


def memory_available() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where it cannot be read)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        todo += _children(p)
    return pids


def anon_shmem_bytes(pid: int) -> int:
    """RssAnon + RssShmem of one process (0 if it is gone)."""
    total = 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("RssAnon:", "RssShmem:")):
                total += int(line.split()[1]) * 1024
    except OSError:
        return 0
    return total


class PeakSampler:
    """Samples a process tree every `interval` seconds in a thread; `.peak` is the largest sum seen."""

    def __init__(self, pid: int, interval: float = 0.02):
        self.pid, self.interval, self.peak = pid, interval, 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, sum(anon_shmem_bytes(p) for p in tree(self.pid)))
            time.sleep(self.interval)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def run_measured(cmd: list[str], **kw) -> tuple[subprocess.CompletedProcess, float, int]:
    """Run a command; returns (result, seconds, peak RssAnon+RssShmem over its process tree)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, **kw)
    with PeakSampler(p.pid) as s:
        p.wait()
    dt = time.perf_counter() - t0
    return subprocess.CompletedProcess(cmd, p.returncode), dt, s.peak


if __name__ == "__main__":  # python -m ds_export.procmem CMD...: peak memory of a command
    import sys

    r, dt, peak = run_measured(sys.argv[1:])
    print(f"{dt:.2f} s, peak RssAnon+RssShmem {peak / 2**20:.1f} MiB, exit {r.returncode}", file=sys.stderr)
    os._exit(r.returncode)
