"""formats/_arrays.py: the non-finite count on 16-bit floats' bits and the row-blocked transposed copy, against
numpy's own isfinite (through float32) and .T."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ds_export.formats._arrays import _transpose_fn, count_non_finite, transposed, transposed_ref


@pytest.mark.parametrize("piece", [1 << 18, 64, 7])  # (the values are checked a piece at a time)
@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16, np.float32])
def test_count_non_finite_matches_isfinite(dtype, piece):
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((37, 129)) * 100).astype(dtype)
    assert count_non_finite(a, piece) == (0, -1)
    flat = a.reshape(-1)
    for i, v in ((5, np.inf), (700, -np.inf), (4000, np.nan), (4001, -np.nan)):
        flat[i] = v
    ref = ~np.isfinite(a.astype(np.float32).reshape(-1))
    assert count_non_finite(a, piece) == (int(ref.sum()), int(np.argmax(ref))) == (4, 5)
    flat[5] = 1
    assert count_non_finite(a, piece) == (3, 700)  # (the first in a later piece)
    assert count_non_finite(a[:, ::2], piece) == (1, 31 * 65 + 1)  # (a strided view: row-major order; 4001 kept)
    assert count_non_finite(np.zeros((0, 3), dtype), piece) == (0, -1)
    # every 16-bit pattern: the bits test against isfinite through float32
    if a.dtype.itemsize == 2:
        every = np.arange(1 << 16, dtype=np.uint16).view(a.dtype)
        assert count_non_finite(every, piece)[0] == int((~np.isfinite(every.astype(np.float32))).sum())


@pytest.mark.parametrize("shape,rows", [((1, 1), 32), ((33, 7), 32), ((64, 129), 32), ((100, 3), 7), ((5, 40), 64)])
def test_transposed_ref_is_a_contiguous_T(shape, rows):
    a = np.arange(np.prod(shape), dtype=np.uint16).reshape(shape).view(ml_dtypes.bfloat16)
    t = transposed_ref(a, rows)
    assert t.flags.c_contiguous and t.dtype == a.dtype and t.shape == shape[::-1]
    assert np.array_equal(t.view(np.uint16), a.view(np.uint16).T)


@pytest.mark.parametrize("dtype", [np.uint8, ml_dtypes.float8_e4m3fn, ml_dtypes.bfloat16, np.float16, np.float32,
                                   np.int32, np.float64, "S3"])
@pytest.mark.parametrize("shape", [(1, 1), (0, 5), (5, 0), (15, 17), (16, 16), (33, 7), (517, 1029)])
def test_transposed_native_matches_the_reference_bit_for_bit(dtype, shape):
    """csrc's blocked transpose (1, 2, 4, 8-byte elements, tiles of 16 and ragged edges) against transposed_ref on
    random bits; another element size (3 bytes) takes the reference; a strided input is copied first."""
    rng = np.random.default_rng(list(shape))
    dt = np.dtype(dtype)
    a = rng.integers(0, 256, (*shape, dt.itemsize), dtype=np.uint8).view(dt).reshape(shape)
    t = transposed(a)
    assert t.flags.c_contiguous and t.dtype == dt and t.shape == shape[::-1]
    assert t.tobytes() == transposed_ref(a).tobytes() == np.ascontiguousarray(a.T).tobytes()
    if shape[1] > 2:
        view = a[:, 1::2]
        assert transposed(view).tobytes() == np.ascontiguousarray(view.T).tobytes()


def test_transpose_kernel_refuses_what_it_cannot_move():
    from ds_export.native import ptr

    a, out = np.zeros((4, 6), np.uint8), np.zeros((6, 4), np.uint8)
    fn = _transpose_fn()
    assert fn(ptr(a), 4, 6, 1, ptr(out)) == 0
    assert fn(ptr(a), 4, 2, 3, ptr(out)) == -1  # (3-byte elements)
    assert fn(ptr(a), -1, 6, 1, ptr(out)) == -1
    assert fn(None, 4, 6, 1, ptr(out)) == -1
    assert fn(None, 0, 6, 1, None) == 0  # (nothing to move)
