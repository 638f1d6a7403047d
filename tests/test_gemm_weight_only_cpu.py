"""CPU weight-only GEMM (csrc/cpu/gemm_weight_only.cc) against float64 numpy.

Reference: x (bf16 -> float64) @ dequantize_ref(qweight, scale)^T in float64, where
dequantize_ref (ds_export/formats/weight_only.py) undoes Paddle's layout step by step.
Bound (include/dsx/gemm_weight_only.h): the kernel's products are exact in fp32, its sums
round: |acc - ref| <= E = (K/8 + 3) * 2^-24 * sum|x||w|, and the bf16 output adds at
most 2^-8 |acc|; so |out - ref| <= 2^-8 (|ref| + E) + E elementwise. Planted layout
faults (nibble order, in-word byte order, tile interleave) must break that bound.
"""

from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import pytest

from ds_export.errors import DsxError
from ds_export.formats import weight_only as wo
from ds_export.native import gemm_weight_only as G

BF16 = ml_dtypes.bfloat16

# (M, N, K): M = 1, 3, 17, 64 and ragged N/K multiples of 64 (int4 K % 128 == 64 included)
SHAPES = [(1, 64, 64), (3, 192, 320), (17, 128, 448), (64, 320, 192), (2, 576, 1088), (130, 64, 128)]
LAYOUTS = [(bits, group) for bits in (8, 4) for group in (-1, 64, 128)]


def make(m, n, k, bits, group, seed=0):
    rng = np.random.default_rng([seed, m, n, k, bits, group + 1])
    w = (rng.standard_normal((n, k)) * rng.uniform(0.5, 2.0, (n, 1))).astype(BF16)
    q, s = wo.quantize_ref(w, bits, group, 90)
    x = rng.standard_normal((m, k)).astype(BF16)
    return x, q, s


def within_bound(out, x, wd):
    """Elementwise: does `out` satisfy the documented fp32-accumulation + bf16 bound?"""
    x64, got = x.astype(np.float64), out.astype(np.float64)
    ref, mag = x64 @ wd.T, np.abs(x64) @ np.abs(wd).T
    e = (x.shape[1] / 8 + 3) * 2.0**-24 * mag
    return np.abs(got - ref) <= 2.0**-8 * (np.abs(ref) + e) + e, ref


@pytest.mark.parametrize("bits,group", LAYOUTS)
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_matches_float64(m, n, k, bits, group):
    x, q, s = make(m, n, k, bits, group)
    out = G.gemm_weight_only(x, q, s, bits, group, 90)
    assert out.dtype == BF16 and out.shape == (m, n)
    ok, ref = within_bound(out, x, wo.dequantize_ref(q, s, bits, group, 90, k).astype(np.float64))
    assert ok.all(), f"{(~ok).sum()} outside the bound, first at {np.argwhere(~ok)[0]}"
    # and almost always exactly the correctly rounded bf16 of the float64 result
    exact = out.view(np.uint16) == ref.astype(np.float32).astype(BF16).view(np.uint16)
    assert exact.mean() > 0.99


def test_deepseek_k_and_thread_independence():
    """K = 7168 (hidden size) with int4 group 128; 1 and 2 threads give the same bytes."""
    x, q, s = make(4, 256, 7168, 4, 128)
    one = G.gemm_weight_only(x, q, s, 4, 128, 90, threads=1)
    two = G.gemm_weight_only(x, q, s, 4, 128, 90, threads=2)
    assert np.array_equal(one.view(np.uint16), two.view(np.uint16))
    ok, _ = within_bound(one, x, wo.dequantize_ref(q, s, 4, 128, 90, 7168).astype(np.float64))
    assert ok.all()


def test_archs_with_identical_bytes_agree():
    x, q, s = make(3, 128, 256, 8, -1)
    outs = [G.gemm_weight_only(x, q, s, 8, -1, arch).view(np.uint16) for arch in (80, 89, 90)]
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])


# ---------------------------------------------------------------- planted faults


def _swap_nibbles(q):
    u = q.view(np.uint8)
    return ((u >> 4) | (u << 4)).astype(np.uint8).view(np.int8)


def _swap_word_bytes_1_2(q):
    b = q.view(np.uint8).reshape(-1, 4).copy()
    b[:, [1, 2]] = b[:, [2, 1]]
    return b.reshape(q.shape).view(np.int8)


def _swap_interleaved_channels(q, k):
    """Swap the 64-element segments of the first two channels of every column tile."""
    b = q.view(np.uint8).reshape(-1, 2, 64).copy()  # int8: (tile of 2 channels) x 64 bytes
    return b[:, ::-1].reshape(q.shape).view(np.int8)


@pytest.mark.parametrize("fault", ["nibble_order", "word_byte_order", "tile_interleave"])
def test_planted_layout_fault_is_caught(fault):
    bits = 4 if fault == "nibble_order" else 8
    m, n, k = 3, 128, 256
    x, q, s = make(m, n, k, bits, -1)
    wd = wo.dequantize_ref(q, s, bits, -1, 90, k).astype(np.float64)
    bad_q = {"nibble_order": _swap_nibbles, "word_byte_order": _swap_word_bytes_1_2,
             "tile_interleave": lambda a: _swap_interleaved_channels(a, k)}[fault](q)
    ok, _ = within_bound(G.gemm_weight_only(x, bad_q, s, bits, -1, 90), x, wd)
    assert ok.mean() < 0.5, f"{fault}: the planted fault went unnoticed ({ok.mean():.2%} within bound)"


# ---------------------------------------------------------------- input checks


def test_empty_m():
    _, q, s = make(1, 64, 128, 8, -1)
    out = G.gemm_weight_only(np.zeros((0, 128), BF16), q, s, 8, -1, 90)
    assert out.shape == (0, 64) and out.dtype == BF16


@pytest.mark.parametrize("case,match", [
    ("x_float32", "x: expected bfloat16"),
    ("x_wrong_k", "qweight: expected int8"),
    ("q_wrong_shape", "qweight: expected int8"),
    ("scale_wrong_group", "scale: expected shape"),
    ("arch70", "arch 70 bytes are row-major"),
    ("bits3", "bits"),
    ("k_not_64", "multiples of 64"),
    ("scale_float32", "scale: expected bfloat16"),
])
def test_bad_inputs_raise_dsx_error(case, match):
    x, q, s = make(2, 64, 128, 4, 64)
    args = dict(x=x, qweight=q, scale=s, bits=4, group_size=64, arch=90)
    if case == "x_float32":
        args["x"] = x.astype(np.float32)
    elif case == "x_wrong_k":
        args["x"] = np.zeros((2, 192), BF16)
        args["scale"] = np.zeros((3, 64), BF16)
    elif case == "q_wrong_shape":
        args["qweight"] = np.zeros((64, 128), np.int8)  # the int8 shape given for int4
    elif case == "scale_wrong_group":
        args["group_size"] = 128
    elif case == "arch70":
        args["arch"] = 70
    elif case == "bits3":
        args["bits"] = 3
    elif case == "k_not_64":
        args.update(x=np.zeros((2, 96), BF16), qweight=np.zeros((32, 96), np.int8), scale=np.zeros((2, 64), BF16))
    elif case == "scale_float32":
        args["scale"] = s.astype(np.float32)
    with pytest.raises(DsxError, match=match):
        G.gemm_weight_only(**args)


def test_c_abi_rejects_bad_shapes():
    """The C entry point itself checks (DSX_EINVAL = -1), whatever the wrapper does."""
    fn = G._cpu_fn()
    buf = (ctypes.c_uint8 * 64)()
    p = ctypes.addressof(buf)
    assert fn(p, p, p, p, 1, 64, 96, 8, -1, 90, 0) == -1  # K % 64
    assert fn(p, p, p, p, 1, 64, 64, 8, -1, 70, 0) == -1  # arch 70
    assert fn(p, p, p, p, 1, 64, 64, 8, 32, 90, 0) == -1  # group 32
    assert fn(None, None, None, None, 1, 64, 64, 8, -1, 90, 0) == -1  # null pointers
    assert fn(None, None, None, None, 0, 64, 64, 8, -1, 90, 0) == 0  # M == 0: nothing to do
