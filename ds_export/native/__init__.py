"""The seam to csrc/: loads libdsx_cpu through ctypes and checks its ABI.

Kernel wrappers (ds_export/native/*.py) declare their ctypes signatures with
`bind()` and check inputs in Python, so a bad call is a clear DsxError rather
than a crash inside C++.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools

import numpy as np

from ds_export.errors import DsxError

ABI_VERSION = 1

_ERRORS = {-1: "invalid argument or shape", -2: "out of memory", -3: "CUDA runtime error"}


@functools.lru_cache(maxsize=1)
def lib() -> ctypes.CDLL:
    from ds_export.native.build import build_cpu

    path = build_cpu()
    so = ctypes.CDLL(str(path))
    so.dsx_abi_version.restype = ctypes.c_int
    got = so.dsx_abi_version()
    if got != ABI_VERSION:
        raise DsxError(f"{path} has kernel ABI {got}, this dsx expects {ABI_VERSION}: remove {path.parent} and rerun")
    return so


def bind(name: str, *argtypes) -> ctypes._CFuncPtr:
    fn = getattr(lib(), name)
    fn.argtypes = list(argtypes)
    fn.restype = ctypes.c_int
    return fn


def check(rc: int, what: str) -> None:
    if rc != 0:
        raise DsxError(f"kernel {what} failed: {_ERRORS.get(rc, f'code {rc}')}")


def ptr(a: np.ndarray) -> ctypes.c_void_p:
    """Raw pointer of a C-contiguous array (the caller keeps `a` alive)."""
    if not a.flags.c_contiguous:
        raise DsxError("internal: kernel inputs must be C-contiguous")
    return ctypes.c_void_p(a.ctypes.data)


P = ctypes.c_void_p
I64 = ctypes.c_int64
I32 = ctypes.c_int
F32 = ctypes.c_float


def process_switch(fn, on: bool | None, what: str) -> bool:
    """A kernel library's process-wide switch (fn(1 | 0) sets it, fn(-1) only asks; it returns the state before, or
    a DSX_E* code): the state before the call as a bool."""
    rc = fn(-1 if on is None else int(bool(on)))
    if rc < 0:  # (0 and 1 are states, not errors)
        check(rc, what)
    return rc == 1


@contextlib.contextmanager
def switched(switch, on: bool):
    """switch(on) inside the block (switch: a process_switch front end), the state before after it, also when the
    block raises."""
    before = switch(on)
    try:
        yield
    finally:
        switch(before)
