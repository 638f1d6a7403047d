"""Build libdsx_cuda.so (csrc/cuda/*.cu, sm_90a) with CMake, cached like build.py.

The CUDA kernels instantiate CUTLASS 3.x templates from the headers that the PyPI wheel
``nvidia-cutlass==4.2.0.0`` ships under ``cutlass_library/source/include`` (pinned: the
templates' behaviour is part of our numerics). The headers are found, in this order:

1. ``cutlass_include=`` given to :func:`build_cuda`;
2. the installed ``nvidia-cutlass`` package, if it is the pinned version;
3. ``<repo>/.cutlass/cutlass_library/source/include`` (an unpacked wheel), or the wheel
   itself in ``<repo>/.cutlass/`` (``pip download nvidia-cutlass==4.2.0.0 -d .cutlass``),
   unpacked there on first use.

The library links the shared CUDA runtime (libcudart), so that ds_export.native.cuda and
the kernels share one runtime. The cache key hashes CMakeLists.txt, include/ and cuda/,
the nvcc release and the CUTLASS version, so any edit rebuilds.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from ds_export.errors import DsxError
from ds_export.native.build import CSRC, _cmake, cache_root

CUTLASS_VERSION = "4.2.0.0"
CUTLASS_HEADER_VERSION = (4, 2, 0)
REPO = CSRC.parent
LOCAL_CUTLASS = REPO / ".cutlass"
_HINT = f"pip install nvidia-cutlass=={CUTLASS_VERSION}, or pip download it into {LOCAL_CUTLASS}"


def header_version(include: Path) -> tuple[int, int, int] | None:
    try:
        text = (include / "cutlass" / "version.h").read_text()
    except OSError:
        return None
    got = [re.search(rf"#define CUTLASS_{p}\s+(\d+)", text) for p in ("MAJOR", "MINOR", "PATCH")]
    return tuple(int(g.group(1)) for g in got) if all(got) else None  # type: ignore[return-value]


def _installed_include() -> Path | None:
    try:
        if importlib.metadata.version("nvidia-cutlass") != CUTLASS_VERSION:
            return None
        spec = importlib.util.find_spec("cutlass_library")  # locate only, do not import
    except (importlib.metadata.PackageNotFoundError, ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "source" / "include"


def _local_include() -> Path | None:
    inc = LOCAL_CUTLASS / "cutlass_library" / "source" / "include"
    if header_version(inc) is None:
        wheels = sorted(LOCAL_CUTLASS.glob(f"nvidia_cutlass-{CUTLASS_VERSION}-*.whl"))
        if not wheels:
            return None
        with zipfile.ZipFile(wheels[0]) as zf:
            members = [n for n in zf.namelist() if n.startswith("cutlass_library/source/include/")]
            zf.extractall(LOCAL_CUTLASS, members)
    return inc


def cutlass_include(explicit: str | os.PathLike | None = None) -> Path:
    """The CUTLASS include directory (pinned version), or a DsxError saying how to get it."""
    cands = [Path(explicit)] if explicit else [p for p in (_installed_include(), _local_include()) if p]
    for inc in cands:
        ver = header_version(inc)
        if ver == CUTLASS_HEADER_VERSION:
            return inc
        if explicit:
            raise DsxError(f"CUTLASS headers at {inc} are version {ver}, dsx pins {CUTLASS_VERSION}: {_HINT}")
    raise DsxError(f"CUTLASS {CUTLASS_VERSION} headers not found: {_HINT}")


def nvcc() -> str:
    exe = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
    if exe is None:
        raise DsxError("nvcc not found: install the CUDA toolkit (12.8+) to build dsx's CUDA kernels")
    return exe


def nvcc_release(exe: str | None = None) -> str:
    out = subprocess.run([exe or nvcc(), "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release (\d+\.\d+)", out)
    if not m:
        raise DsxError(f"could not read the nvcc version from {exe or nvcc()} --version")
    return m.group(1)


def cuda_source_files(csrc: Path = CSRC) -> list[Path]:
    files = [csrc / "CMakeLists.txt"]
    for sub in ("include", "cuda"):
        files += sorted(p for p in (csrc / sub).rglob("*") if p.is_file())
    return files


def cuda_source_key(csrc: Path = CSRC, release: str | None = None) -> str:
    h = hashlib.sha256()
    for f in cuda_source_files(csrc):
        h.update(str(f.relative_to(csrc)).encode())
        h.update(f.read_bytes())
    h.update(f"nvcc {release or nvcc_release()} cutlass {CUTLASS_VERSION}".encode())
    return h.hexdigest()[:16]


def cuda_lib_path(csrc: Path = CSRC) -> Path:
    return cache_root() / f"cuda-{cuda_source_key(csrc)}" / "libdsx_cuda.so"


def _cmake_build(csrc: Path, build_dir: Path, inc: Path, exe: str, log: Path, verbose: bool, jobs: int | None) -> None:
    cmake = _cmake()
    configure = [cmake, "-S", str(csrc), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release", "-DDSX_WITH_CUDA=ON",
                 f"-DDSX_CUTLASS_INCLUDE={inc}", f"-DCMAKE_CUDA_COMPILER={exe}", "-DCMAKE_CUDA_RUNTIME_LIBRARY=Shared"]
    build = [cmake, "--build", str(build_dir), "--target", "dsx_cuda", "-j", str(jobs or os.cpu_count() or 2)]
    for cmd in (configure, build):
        res = subprocess.run(cmd, capture_output=not verbose, text=True)
        if res.returncode != 0 and cmd is configure:  # e.g. the tree was configured for another checkout
            shutil.rmtree(build_dir, ignore_errors=True)
            res = subprocess.run(cmd, capture_output=not verbose, text=True)
        if res.returncode != 0:
            log.write_text((res.stdout or "") + (res.stderr or ""))
            raise DsxError(f"building csrc/cuda failed ({' '.join(cmd[:2])}); see {log}")


def build_cuda(csrc: Path = CSRC, *, cutlass_include_dir=None, verbose: bool = False, jobs: int | None = None) -> Path:
    """Return the path of libdsx_cuda.so for the current sources, building it if needed."""
    exe = nvcc()
    release = nvcc_release(exe)
    key = cuda_source_key(csrc, release)
    lib = cache_root() / f"cuda-{key}" / "libdsx_cuda.so"
    if lib.exists():
        return lib
    inc = cutlass_include(cutlass_include_dir)
    lib.parent.mkdir(parents=True, exist_ok=True)
    with open(cache_root() / ".cuda-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # One build tree for every source version: make's dependency tracking recompiles
        # only the translation units an edit touches (the CUTLASS ones take minutes).
        build_dir = cache_root() / "cuda-build"
        for _ in range(3):
            if lib.exists():
                return lib
            _cmake_build(csrc, build_dir, inc, exe, lib.parent / "build.log", verbose, jobs)
            after = cuda_source_key(csrc, release)
            if after == key:  # no source changed while building: the library is this key's
                tmp = lib.parent / "libdsx_cuda.so.tmp"
                shutil.copy2(build_dir / "libdsx_cuda.so", tmp)
                os.replace(tmp, lib)
                return lib
            key = after
            lib = cache_root() / f"cuda-{key}" / "libdsx_cuda.so"
            lib.parent.mkdir(parents=True, exist_ok=True)
    raise DsxError(f"csrc/ kept changing while building libdsx_cuda; rerun once the edits stop ({csrc})")


if __name__ == "__main__":  # python -m ds_export.native.build_cuda [-v]
    print(build_cuda(verbose="-v" in sys.argv))
