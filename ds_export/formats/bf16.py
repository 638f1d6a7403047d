"""bfloat16: float32 -> bf16 rounding (round to nearest even), reference and native.

Used wherever dsx writes bf16 from float32 values, e.g. `dsx quantize --type bf16`
dequantizing an FP8 checkpoint: bf16 = RNE(float32 product). NaN stays NaN
(canonical quiet NaN 0x7FC0 with the input's sign, as ml_dtypes does); values
that round past the largest finite bf16 become +-inf; float32 subnormals are
rounded like any other value (no flush to zero).

Layout: any shape, element for element; bf16 is returned as ml_dtypes.bfloat16
(its bits are `.view(np.uint16)`).
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np

from ds_export.errors import DsxError

BF16 = np.dtype(ml_dtypes.bfloat16)


def _as_f32(x, what: str) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype != np.float32:
        raise DsxError(f"{what}: expected a float32 array, got {a.dtype}; cast it with .astype(np.float32) first")
    return a


def to_bf16_ref(x) -> np.ndarray:
    """float32 array -> ml_dtypes.bfloat16 array of the same shape (ml_dtypes' own RNE cast)."""
    a = _as_f32(x, "to_bf16_ref")
    with np.errstate(invalid="ignore"):  # numpy warns on NaN casts; the NaN is kept
        return a.astype(BF16)


@functools.lru_cache(maxsize=1)
def _kernel():
    from ds_export.native import I64, P, bind

    return bind("dsx_f32_to_bf16", P, I64, P)


def to_bf16_native(x) -> np.ndarray:
    """float32 array -> ml_dtypes.bfloat16 via the C++ kernel; bit-identical to to_bf16_ref."""
    from ds_export.native import check, ptr

    a = np.ascontiguousarray(_as_f32(x, "to_bf16_native"))
    out = np.empty(a.shape, dtype=np.uint16)
    check(_kernel()(ptr(a), a.size, ptr(out)), "dsx_f32_to_bf16")
    return out.view(BF16)
