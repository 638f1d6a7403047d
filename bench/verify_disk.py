"""`dsx verify` (hashes and weights, no kernel checks) from a cold disk, with less page cache than the checkpoints.

On R1 the target (up to 400 GB) and the source (641 GB) are larger than any page cache, so every byte verify reads
comes off the disk. This bench makes that true of a smaller pair: the verify runs in a process of a memory cgroup
(cgroup v1 `memory.limit_in_bytes`, --limit-mib, which the page cache counts against) with both checkpoints' pages
evicted first (posix_fadvise DONTNEED); --read-mbps also throttles the disk's reads for it (cgroup v1 blkio), for a
host whose disk, not its cores, bounds verify (a two-core VM is CPU-bound; a 16-core host with R1 on one NVMe is not).
Anchors in the same run and cgroups, also cold: `cat` of the target's and the source's shards once each (the bytes a
verify must read at least) and the target's twice plus the source's once (what hashing every file first and then
checking the weights read). Prints seconds and the ratio to each anchor.

    python bench/verify_disk.py --workdir /tmp/dsx-vbench [--limit-mib 3072] [--read-mbps 400] [--workers 2]

Uses the pair bench/verify_weights.py generates (real dimensions, 4 layers, 8 experts, a8w8_fp8_wint4). Needs root
for the cgroup (without one it says so and runs unconfined: the page cache then may hold a second read). To time the
code before a change, run it from a worktree of the older commit with PYTHONPATH=<worktree>.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup/memory/dsx-bench-verify")
BLKIO = Path("/sys/fs/cgroup/blkio/dsx-bench-verify")


def _evict(files: list[str]) -> None:
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _cgroup(limit: int) -> Path | None:
    try:
        CGROUP.mkdir(exist_ok=True)
        (CGROUP / "memory.limit_in_bytes").write_text(str(limit))
        return CGROUP
    except OSError:
        return None


def _disk_of(path: Path) -> str:
    """major:minor of the whole disk holding `path` (blkio throttles whole disks, not partitions)."""
    dev = os.stat(path).st_dev
    sysfs = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    if (sysfs / "partition").exists():
        return (sysfs.resolve().parent / "dev").read_text().strip()
    return f"{os.major(dev)}:{os.minor(dev)}"


def _blkio(path: Path, mbps: int) -> Path | None:
    """The blkio cgroup that counts the bytes a run reads from the disk (and throttles them to mbps MiB/s if set)."""
    try:
        BLKIO.mkdir(exist_ok=True)
        (BLKIO / "blkio.throttle.read_bps_device").write_text(f"{_disk_of(path)} {mbps << 20}" if mbps else
                                                              f"{_disk_of(path)} 0")
        return BLKIO
    except OSError:
        return None


def _disk_read(bl: Path | None) -> float:
    """Bytes the blkio cgroup's members have read from disks (NaN without one; the count only grows: blkio.reset_stats
    leaves the throttle's counters as they are, so a run's bytes are the difference)."""
    if bl is None:
        return float("nan")
    lines = (bl / "blkio.throttle.io_service_bytes").read_text().splitlines()
    return float(sum(int(f[2]) for f in (ln.split() for ln in lines) if len(f) == 3 and f[1] == "Read"))


def _run(cmd: list[str], cgs: list[Path]) -> float:
    def enter():
        for cg in cgs:
            (cg / "cgroup.procs").write_text(str(os.getpid()))
    t0 = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, preexec_fn=enter)
    dt = time.perf_counter() - t0
    if r.returncode:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed (exit {r.returncode})")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/dsx-vbench"))
    ap.add_argument("--pair", default="real-l4-e8,real-l4-e8-fp8_wint4", help="source,target under --workdir")
    ap.add_argument("--limit-mib", type=int, default=3072, help="the cgroup's memory limit (page cache included)")
    ap.add_argument("--read-mbps", type=int, default=0, help="throttle the disk's reads to this many MiB/s (0: not)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    src, dst = (a.workdir / n for n in a.pair.split(","))
    if not (dst / "dsx-manifest.json").exists():
        raise SystemExit(f"{dst}: no converted checkpoint; run bench/verify_weights.py --workdir {a.workdir} first")
    tfiles = [str(p) for p in sorted(dst.glob("*.safetensors"))]
    sfiles = [str(p) for p in sorted(src.glob("*.safetensors"))]
    size_t, size_s = (sum(os.path.getsize(f) for f in fs) for fs in (tfiles, sfiles))
    cg = _cgroup(a.limit_mib << 20)
    bl = _blkio(dst, a.read_mbps)
    print(f"target {dst.name} {size_t / 1e9:.2f} GB in {len(tfiles)} shards, source {src.name} {size_s / 1e9:.2f} GB; "
          f"{'cgroup limit %d MiB' % a.limit_mib if cg else 'NO cgroup (not root?): the page cache is unbounded'}; "
          + (f"reads throttled to {a.read_mbps} MiB/s; " if bl and a.read_mbps else "")
          + ("" if bl else "NO blkio cgroup (bytes read from disk not counted, reads not throttled); ")
          + f"{a.workers} workers; cold disk each run")
    verify = [sys.executable, "-m", "ds_export.cli.app", "verify", str(dst), "--reference", str(src), "--samples", "0",
              "-j", str(a.workers), "-q"]
    rows: dict[str, list[float]] = {"verify": [], "cat once": [], "cat target twice": []}
    disk: dict[str, list[float]] = {k: [] for k in rows}
    try:
        for _ in range(a.rounds):
            for label, cmd in (("cat once", ["cat", *tfiles, *sfiles]), ("verify", verify),
                               ("cat target twice", ["cat", *tfiles, *tfiles, *sfiles])):
                _evict(tfiles + sfiles)
                before = _disk_read(bl)
                rows[label].append(_run(cmd, [c for c in (cg, bl) if c is not None]))
                disk[label].append(_disk_read(bl) - before)
    finally:
        for c in (cg, bl):
            if c is not None:
                try:
                    c.rmdir()
                except OSError:
                    pass
    best = {k: min(v) for k, v in rows.items()}
    print(f"\n{'run':>18} {'best s':>8} {'GB from disk':>13}  all s")
    for label in ("cat once", "verify", "cat target twice"):
        print(f"{label:>18} {best[label]:8.2f} {min(disk[label]) / 1e9:13.2f}  "
              + " ".join(f"{x:.2f}" for x in rows[label]))
    print(f"\nverify / cat once {best['verify'] / best['cat once']:.2f}x; "
          f"verify / cat target twice {best['verify'] / best['cat target twice']:.2f}x")


if __name__ == "__main__":
    main()
