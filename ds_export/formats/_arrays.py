"""Array views the format references share."""

from __future__ import annotations

import numpy as np


def count_non_finite(values: np.ndarray) -> tuple[int, int]:
    """(how many NaN / Inf values, the flat index of the first) of a float or bf16 array."""
    bad = ~np.isfinite(values.reshape(-1))
    n = int(np.count_nonzero(bad))
    return n, (int(np.argmax(bad)) if n else -1)


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
