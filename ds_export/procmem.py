"""Process memory: the peak of a process tree, as the quantize goal counts it (RssAnon + RssShmem summed over
processes; file pages of mmapped inputs, RssFile, are not counted: the kernel can drop them at will; used by bench/
and by the bounded-memory test), and malloc's setting for exports (reuse_freed_pages).
"""

from __future__ import annotations

import ctypes
import functools
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


@functools.lru_cache(maxsize=None)  # (once a process: the setting is the process's)
def reuse_freed_pages() -> bool:
    """Have glibc's malloc keep freed memory for the next allocation rather than hand it back to the kernel.

    By default an allocation above malloc's mapping threshold (128 KiB, rising to at most 32 MiB as mapped chunks are
    freed) is a fresh mapping, unmapped again when freed: an export makes each tensor (a dequantized or transposed
    weight, a vocabulary-sized head) in new pages and pays the kernel a page fault and a zeroed page for every 4 KiB
    of it, twice for a weight that is dequantized and then transposed (on the dev VM about 0.4 s a GB, a third of an
    FP8 checkpoint's export's system time). With mappings off and the heap's top
    not trimmed, a tensor lands in the pages its predecessor freed; the peak stays the same (the largest tensors
    alive at once), and it is not returned to the kernel before the process ends. Returns whether it took (False on
    another libc: nothing changes)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    m_trim_threshold, m_mmap_max = -1, -4  # (malloc.h; a big request that finds no room in the heap still maps)
    return mallopt(m_mmap_max, 0) == 1 and mallopt(m_trim_threshold, 2**31 - 1) == 1


def _children(pid: int) -> list[int]:
    out = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:  # (the process is gone)
        return out
    for task in tasks:
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
