"""Array views the format references share."""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np


# 16-bit floats: NaN and Inf are the values whose exponent bits are all ones
_EXPONENT_16 = {np.dtype(ml_dtypes.bfloat16): 0x7F80, np.dtype(np.float16): 0x7C00}


def count_non_finite(values: np.ndarray, piece: int = 1 << 18) -> tuple[int, int]:
    """(how many NaN / Inf values, the flat index of the first) of a float or bf16 array.

    Checked `piece` values at a time into scratch arrays that stay in cache: whole-array temporaries (a bool and, for
    16-bit floats, a bits array the size of the tensor) cost fresh pages a call, which made this a third of an FP8
    checkpoint's bf16 export (fifty-eighth session's profile)."""
    flat = values.reshape(-1)
    mask = _EXPONENT_16.get(values.dtype)
    if mask is not None:  # (on the bits: np.isfinite on ml_dtypes' bfloat16 converts each value to float32)
        flat = flat.view(np.uint16)
        bits = np.empty(min(piece, flat.size), np.uint16)
    bad = np.empty(min(piece, flat.size), np.bool_)
    n, first = 0, -1
    for i in range(0, flat.size, piece):
        x = flat[i:i + piece]
        b = bad[:x.size]
        if mask is not None:
            t = bits[:x.size]
            np.bitwise_and(x, mask, out=t)
            np.equal(t, mask, out=b)
        else:
            np.isfinite(x, out=b)
            np.logical_not(b, out=b)
        c = int(np.count_nonzero(b))
        if c and first < 0:
            first = i + int(np.argmax(b))
        n += c
    return n, first


def transposed_ref(a: np.ndarray, rows: int = 16) -> np.ndarray:
    """a.T of a 2-D array as a new C-contiguous array, copied `rows` source rows at a time: numpy's whole-array
    transposed copy strides through memory a column at a time (a vocabulary-sized head: 3x slower on the dev VM).
    The reference of `transposed`."""
    n, k = a.shape
    out = np.empty((k, n), a.dtype)
    for i in range(0, n, rows):
        out[:, i:i + rows] = a[i:i + rows].T
    return out


def transposed(a: np.ndarray) -> np.ndarray:
    """a.T of a 2-D array as a new C-contiguous array: the C++ blocked transpose (dsx_transpose_rowmajor, csrc/cpu/
    layout.cc: 0.173 s for a 7168x18432 bf16 weight on one thread where transposed_ref took 0.215, and it spreads
    over the OpenMP threads), the same bits; transposed_ref for elements of other sizes."""
    from ds_export.native import check, ptr

    if a.ndim != 2 or a.dtype.itemsize not in (1, 2, 4, 8) or a.dtype.hasobject:
        return transposed_ref(a)
    a = np.ascontiguousarray(a)
    out = np.empty(a.shape[::-1], a.dtype)
    check(_transpose_fn()(ptr(a), a.shape[0], a.shape[1], a.dtype.itemsize, ptr(out)), "dsx_transpose_rowmajor")
    return out


@functools.lru_cache(maxsize=None)
def _transpose_fn():
    from ds_export.native import I64, P, bind

    return bind("dsx_transpose_rowmajor", P, I64, I64, I64, P)


def column_blocks(a: np.ndarray, size: int) -> np.ndarray:
    """The whole `size`-wide column blocks of the 2-D array `a` as a view [rows, blocks, size], to scale in place.
    (Setting `.shape`, which refuses to copy, is deprecated from NumPy 2.5; reshape may copy, which would drop the
    writes: a copy is refused here instead.)"""
    n, k = a.shape
    whole = k // size
    v = a[:, :whole * size].reshape(n, whole, size)
    if v.size and not np.may_share_memory(v, a):
        raise AssertionError("column_blocks: reshape copied")  # (splitting the last axis is always a view)
    return v
