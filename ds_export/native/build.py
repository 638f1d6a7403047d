"""Build csrc/ with CMake into a per-machine cache, keyed by the sources' hash.

The library is built once (by `make setup`, or on first use), then reused: a
changed source file gives a new key, so a stale build is never loaded.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from ds_export.errors import DsxError

CSRC = Path(__file__).resolve().parents[2] / "csrc"


def cache_root() -> Path:
    base = os.environ.get("DSX_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "dsx"
    )
    return Path(base) / "native"


def _source_files(csrc: Path) -> list[Path]:
    files = [csrc / "CMakeLists.txt"]
    for sub in ("include", "cpu"):
        files += sorted(p for p in (csrc / sub).rglob("*") if p.is_file())
    return files


def _cpu_fingerprint() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
        flags = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    except OSError:
        flags = ""
    return platform.machine() + flags


def source_key(csrc: Path = CSRC) -> str:
    h = hashlib.sha256()
    for f in _source_files(csrc):
        h.update(str(f.relative_to(csrc)).encode())
        h.update(f.read_bytes())
    h.update(_cpu_fingerprint().encode())
    return h.hexdigest()[:16]


def _cmake() -> str:
    exe = shutil.which("cmake")
    if exe is None:
        cand = Path(sys.executable).parent / "cmake"
        if cand.exists():
            exe = str(cand)
    if exe is None:
        raise DsxError("cmake not found: install it (pip install cmake) to build dsx's kernels")
    return exe


def build_cpu(csrc: Path = CSRC, *, verbose: bool = False) -> Path:
    """Return the path of libdsx_cpu.so for the current sources, building it if needed."""
    if not (csrc / "CMakeLists.txt").exists():
        raise DsxError(f"kernel sources not found at {csrc}: install dsx from a source checkout (pip install -e .)")
    out_dir = cache_root() / source_key(csrc)
    lib = out_dir / "libdsx_cpu.so"
    if lib.exists():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if lib.exists():
            return lib
        build_dir = out_dir / "build"
        cmake = _cmake()
        cmds = [
            [cmake, "-S", str(csrc), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release"],
            [cmake, "--build", str(build_dir), "--target", "dsx_cpu", "-j", str(os.cpu_count() or 2)],
        ]
        for cmd in cmds:
            res = subprocess.run(cmd, capture_output=not verbose, text=True)
            if res.returncode != 0:
                log = out_dir / "build.log"
                log.write_text((res.stdout or "") + (res.stderr or ""))
                raise DsxError(f"building csrc/ failed ({' '.join(cmd[:2])}); see {log}")
        built = build_dir / "libdsx_cpu.so"
        tmp = out_dir / "libdsx_cpu.so.tmp"
        shutil.copy2(built, tmp)
        os.replace(tmp, lib)  # atomic: a half-copied library is never loaded
    return lib


if __name__ == "__main__":  # python -m ds_export.native.build
    print(build_cpu(verbose="-v" in sys.argv))
