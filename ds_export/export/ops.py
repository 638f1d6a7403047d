"""The dsx Paddle custom operators: built once per source hash, loaded per process.

`load_ops()` returns the op module with

    dsx_wo_linear(x, qweight, scale, bits, group_size, arch) -> y   (weight-only int8/int4, Paddle layout)
    dsx_fp8_linear(x, weight, scale_inv) -> y                        (1x128 act quant + block FP8 GEMM)

(layouts: ops/dsx_paddle_ops.cc and csrc/include/dsx/*.h). The op library is ONE shared object
built by `paddle.utils.cpp_extension.load` from ops/dsx_paddle_ops.cc plus the csrc CPU kernels it
calls (csrc/cpu/gemm_weight_only.cc, gemm_fp8.cc, quant_fp8.cc), compiled into it with
csrc/include on the include path and libdsx_cpu's flags (-O3 -march=native -ffp-contract=off
-fno-fast-math -fopenmp). So it does not depend on libdsx_cpu at run time, and a Paddle
Inference process only has to load this one file (`load_ops()` before `create_predictor`).

Cache: DSX_CACHE_DIR (default ~/.cache/dsx) / paddle_ops / <key>, key = sha256 of those sources,
csrc/include, the Paddle version and the CPU flags; a built library is loaded without compiling.
A build is serialized by a file lock. Failure to build or load raises DsxError.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import logging
import warnings
from pathlib import Path

from ds_export.errors import DsxError
from ds_export.native.build import CSRC, _cpu_fingerprint, cache_root

NAME = "dsx_paddle_ops"
OP_SOURCE = Path(__file__).resolve().parent / "ops" / f"{NAME}.cc"
KERNELS = ("gemm_weight_only.cc", "gemm_fp8.cc", "quant_fp8.cc")
CFLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fno-fast-math", "-fopenmp", "-std=c++17"]
_loaded: dict[str, object] = {}  # library path -> op module (loading twice re-registers the ops)


def sources() -> list[Path]:
    return [OP_SOURCE] + [CSRC / "cpu" / k for k in KERNELS]


def library_key() -> str:
    import paddle

    h = hashlib.sha256()
    for f in sources() + sorted(p for p in (CSRC / "include").rglob("*") if p.is_file()):
        h.update(f.name.encode())
        h.update(f.read_bytes() if f.is_file() else b"<missing>")  # _build names missing sources
    h.update(" ".join(CFLAGS).encode() + paddle.__version__.encode() + _cpu_fingerprint().encode())
    return h.hexdigest()[:16]


def build_dir() -> Path:
    return cache_root().parent / "paddle_ops" / library_key()


def library_path() -> Path:
    """Where the op library for the current sources lives (it may not be built yet)."""
    return build_dir() / NAME / f"{NAME}.so"


def _build(bdir: Path):
    from paddle.utils import cpp_extension

    missing = [str(p) for p in sources() if not p.is_file()]
    if missing:
        raise DsxError(f"dsx Paddle ops: sources missing: {', '.join(missing)}",
                       hint="reinstall dsx from a complete source tree")
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return cpp_extension.load(name=NAME, sources=[str(p) for p in sources()],
                                      extra_include_paths=[str(CSRC / "include")], extra_cxx_cflags=CFLAGS,
                                      extra_ldflags=["-fopenmp"], build_directory=str(bdir), verbose=False)
    except Exception as e:  # compiler missing, compile error, ...
        tail = " | ".join(log.getvalue().strip().splitlines()[-3:])
        raise DsxError(f"dsx Paddle ops: building {NAME} in {bdir} failed: {type(e).__name__}: {e} {tail}"[:600],
                       hint="check that g++ and Paddle's headers are installed; "
                            "the full log comes from paddle.utils.cpp_extension.load(verbose=True)") from None


@contextlib.contextmanager
def _quiet_logs():
    """Paddle's cpp_extension and setuptools log every compiler command / load at INFO."""
    loggers = [logging.getLogger(n) for n in ("utils.cpp_extension", "", "setuptools", "distutils")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "No ccache found" at import
            yield
    finally:
        for lg, lv in zip(loggers, levels):
            lg.setLevel(lv)


def load_ops():
    """The op module (built on first use, then loaded from the cache); registers the ops in Paddle."""
    if _loaded:  # one op library per process: Paddle registers ops globally, a second load would abort
        return next(iter(_loaded.values()))
    path = library_path()
    with _quiet_logs():
        return _load(path)


def _load(path: Path):
    bdir = build_dir()
    bdir.mkdir(parents=True, exist_ok=True)
    with open(bdir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.is_file():
            from paddle.utils.cpp_extension.extension_utils import _import_module_from_library

            try:
                mod = _import_module_from_library(NAME, str(path.parent), False)
            except Exception as e:
                raise DsxError(f"dsx Paddle ops: cannot load {path}: {type(e).__name__}: {e}"[:600],
                               hint=f"delete {bdir} to rebuild it") from None
        else:
            mod = _build(bdir)
    if not path.is_file():
        raise DsxError(f"dsx Paddle ops: the build gave no {path}", hint=f"delete {bdir} and retry")
    _loaded[str(path)] = mod
    return mod
