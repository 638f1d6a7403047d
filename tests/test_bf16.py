"""float32 -> bfloat16 (RNE): C++ kernel == ml_dtypes' cast, bit for bit, plus a float64 oracle."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ds_export.errors import DsxError
from ds_export.formats import bf16

BF16 = np.dtype(ml_dtypes.bfloat16)

LOW_HALVES = [0x0000, 0x0001, 0x4000, 0x7FFF, 0x8000, 0x8001, 0xBFFF, 0xC000, 0xFFFF]


def sweep_f32() -> np.ndarray:
    """All 2^16 upper halves of float32 (every sign, exponent, NaN payload class) x boundary and random lows."""
    rng = np.random.default_rng(0)
    upper = np.arange(1 << 16, dtype=np.uint32) << 16
    parts = [upper | np.uint32(lo) for lo in LOW_HALVES]
    parts += [upper | rng.integers(0, 1 << 16, size=upper.size, dtype=np.uint32) for _ in range(4)]
    return np.concatenate(parts).view(np.float32)


def first_mismatch(a: np.ndarray, b: np.ndarray):
    bad = np.flatnonzero(a.view(np.uint16).ravel() != b.view(np.uint16).ravel())
    return None if bad.size == 0 else int(bad[0])


def test_native_equals_ml_dtypes_on_dense_sweep():
    x = sweep_f32()
    got, want = bf16.to_bf16_native(x), bf16.to_bf16_ref(x)
    i = first_mismatch(got, want)
    assert i is None, f"x bits {x.view(np.uint32)[i]:#010x}: got {got.view(np.uint16)[i]:#06x}, want {want.view(np.uint16)[i]:#06x}"
    with np.errstate(invalid="ignore"):
        assert first_mismatch(x.astype(BF16), want) is None  # the reference is ml_dtypes' own cast


def test_nan_inf_subnormal_and_overflow():
    bits = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FBFFFFF,  # NaNs stay NaN
                     0x7F800000, 0xFF800000, 0x7F7FFFFF,                          # inf, max -> inf
                     0x00000001, 0x00008000, 0x00018000, 0x80008001], np.uint32)
    got = bf16.to_bf16_native(bits.view(np.float32)).view(np.uint16)
    assert got.tolist() == [0x7FC0, 0xFFC0, 0x7FC0, 0xFFC0, 0x7FC0, 0x7F80, 0xFF80, 0x7F80,
                            0x0000, 0x0000, 0x0002, 0x8001]


def test_finite_results_are_nearest_even_in_float64():
    """Independent of ml_dtypes: the result is the nearest bf16 (ties to an even mantissa)."""
    x = sweep_f32()
    x = x[np.isfinite(x) & (np.abs(x) < 3.3e38)]
    b = bf16.to_bf16_native(x)
    bits = b.view(np.uint16).astype(np.uint32)
    mine = b.astype(np.float64)
    # neighbours of the result, one bf16 step either side, toward and away from zero
    up = (((bits + 1) << 16).astype(np.uint32)).view(np.float32).astype(np.float64)
    dn = (((np.where(bits & 0x7FFF, bits - 1, bits ^ 0x8000)) << 16).astype(np.uint32)).view(np.float32).astype(np.float64)
    err = np.abs(mine - x.astype(np.float64))
    assert (err <= np.abs(up - x)).all() and (err <= np.abs(dn - x)).all()
    tie = (err == np.abs(up - x)) | (err == np.abs(dn - x))
    tie &= err > 0
    assert ((bits[tie] & 1) == 0).all()


def test_planted_fault_truncation_is_detected():
    x = sweep_f32()
    truncated = (x.view(np.uint32) >> 16).astype(np.uint16).view(BF16)
    assert first_mismatch(truncated, bf16.to_bf16_native(x)) is not None


def test_shapes_and_input_checks():
    x = np.random.default_rng(1).standard_normal((3, 5, 7)).astype(np.float32)
    got = bf16.to_bf16_native(x)
    assert got.shape == x.shape and got.dtype == BF16
    assert bf16.to_bf16_native(np.empty((0, 4), np.float32)).shape == (0, 4)
    assert first_mismatch(bf16.to_bf16_native(x[:, ::2]), x[:, ::2].astype(BF16)) is None
    with pytest.raises(DsxError, match="float32"):
        bf16.to_bf16_native(x.astype(np.float64))
