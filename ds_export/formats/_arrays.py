"""Array views the format references share."""

from __future__ import annotations

import ml_dtypes
import numpy as np


# 16-bit floats: NaN and Inf are the values whose exponent bits are all ones
_EXPONENT_16 = {np.dtype(ml_dtypes.bfloat16): 0x7F80, np.dtype(np.float16): 0x7C00}


def count_non_finite(values: np.ndarray) -> tuple[int, int]:
    """(how many NaN / Inf values, the flat index of the first) of a float or bf16 array."""
    mask = _EXPONENT_16.get(values.dtype)
    if mask is not None:  # (on the bits: np.isfinite on ml_dtypes' bfloat16 converts each value to float32)
        bad = (values.reshape(-1).view(np.uint16) & mask) == mask
    else:
        bad = ~np.isfinite(values.reshape(-1))
    n = int(np.count_nonzero(bad))
    return n, (int(np.argmax(bad)) if n else -1)


def transposed(a: np.ndarray, rows: int = 32) -> np.ndarray:
    """a.T of a 2-D array as a new C-contiguous array, copied `rows` source rows at a time: numpy's whole-array
    transposed copy strides through memory a column at a time (a vocabulary-sized head: 3x slower on the dev VM)."""
    n, k = a.shape
    out = np.empty((k, n), a.dtype)
    for i in range(0, n, rows):
        out[:, i:i + rows] = a[i:i + rows].T
    return out


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
