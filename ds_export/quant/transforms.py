"""Per-tensor transforms: read a source weight in row chunks, convert, stream the outputs to a writer.

Memory per call is bounded by `chunk_bytes` (source rows decoded at a time)
plus the small scale tensors (assembled, then written after their weight).
Weight-only arch 70 is the exception: its layout interleaves every channel
into each K row, so one packed tensor is assembled before it is written.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ds_export.errors import CheckpointError, DsxError
from ds_export.formats import bf16 as bf16_fmt
from ds_export.formats import fp8_block, weight_only
from ds_export.formats._arrays import count_non_finite
from ds_export.io.checkpoint import Checkpoint
from ds_export.io.dtypes import ST_TO_NP
from ds_export import formats
from ds_export.quant.backend import CpuBackend
from ds_export.quant.plan import Task

Write = Callable[[str, np.ndarray], None]
Progress = Callable[[int], None]


def _chunk_rows(task: Task, chunk_bytes: int, align: int) -> int:
    row = max(1, int(np.prod(task.shape[1:], dtype=np.int64))) * 4  # float32 scratch per row
    rows = max(align, (chunk_bytes // row) // align * align)
    return rows


def _src_rows(ck: Checkpoint, task: Task, r0: int, r1: int, dtype: str, be: CpuBackend) -> np.ndarray:
    """Source rows [r0, r1) decoded to 'float32' or 'bfloat16' (FP8: value x block scale_inv; NaN codes refused)."""
    if task.src_scale:
        _refuse_nan_codes(ck, task, ck.get(task.src)[r0:r1], r0 * int(task.shape[-1]))
        return be.dequant(ck.get(task.src), ck.get(task.src_scale), task.src_block, dtype, (r0, r1))
    a = ck.get(task.src)
    if a.ndim:
        a = a[r0:r1]
    if dtype == "bfloat16":
        if a.dtype == ST_TO_NP["BF16"]:
            return a
        return bf16_fmt.to_bf16_native(a.astype(np.float32))
    return a.astype(np.float32)


def _copy_raw(ck: Checkpoint, name: str, out_name: str, write: Write, chunk_bytes: int, progress: Progress,
              values_of: Task | None = None) -> None:
    """The tensor's bytes as they are; values_of: they are that task's weight (e4m3, bf16, float32), whose NaN /
    Inf values are refused."""
    raw = ck.raw(name)
    if values_of is not None and values_of.src_dtype != "F8_E4M3":
        item = ST_TO_NP[values_of.src_dtype].itemsize
        chunk_bytes = max(item, chunk_bytes // item * item)  # (whole values a chunk)
    for a in range(0, max(raw.size, 1), chunk_bytes):
        part = raw[a:a + chunk_bytes]
        if values_of is not None and values_of.src_dtype == "F8_E4M3":
            _refuse_nan_codes(ck, values_of, part, a)
        elif values_of is not None:
            _refuse_non_finite(ck, values_of, part.view(ST_TO_NP[values_of.src_dtype]), a // item)
        write(out_name, part)
        progress(part.size)


def _refuse_non_finite(ck: Checkpoint, task: Task, values: np.ndarray, at: int) -> None:
    """A bf16 / float32 source weight copied or cast must hold no NaN or Inf, as an FP8 one no NaN code: it poisons
    every output it reaches (a bf16 copy of a NaN norm weight went out, exit 0; the weight-only and FP8 paths refuse
    them in their own kernels). `at`: the flat index of values[0] in the weight."""
    if values.dtype.kind != "f" and values.dtype != ST_TO_NP["BF16"]:
        return
    n, first = count_non_finite(values)
    if not n:
        return
    k = int(np.prod(task.shape[1:])) if len(task.shape) > 1 else 1
    first = divmod(at + first, k)
    where = f"[{first[0]}, {first[1]}]" if len(task.shape) > 1 else f"[{first[0]}]"
    raise CheckpointError(
        f"{ck.shard_of(task.src).path}: tensor {task.src!r}: {n} NaN or Inf value(s) in its "
        f"{task.src_dtype} weight, the first at {where}; it cannot be converted",
        hint="the source checkpoint is corrupt: download it again, dsx download checks every file's sha256")


def _refuse_nan_codes(ck: Checkpoint, task: Task, codes: np.ndarray, at: int) -> None:
    """An FP8 source's weight codes copied or cast as they are must hold no NaN (0x7F / 0xFF): a NaN weight poisons
    every output it reaches, and nothing downstream of dsx quantize would notice (the weight-only and FP8 requant
    paths refuse them in their own kernels). `at`: the flat index of codes[0] in the weight."""
    n, first = fp8_block.count_nan_native(codes)
    if n:
        k = int(task.shape[-1]) if task.shape else 1
        where = divmod(at + first, k)
        raise CheckpointError(
            f"{ck.shard_of(task.src).path}: tensor {task.src!r}: {n} NaN code(s) (e4m3 0x7F / 0xFF) in its FP8 weight, "
            f"the first at [{where[0]}, {where[1]}]; it cannot be converted",
            hint="the source checkpoint is corrupt: download it again, dsx download checks every file's sha256")


# The largest block scale whose product with e4m3's largest value (448) stays a finite float32.
MAX_BLOCK_SCALE = float(np.finfo(np.float32).max) / 448


def _check_scales(ck: Checkpoint, task: Task) -> None:
    """An FP8 source's block scales must be finite and keep 448 x scale a finite float32: a NaN or Inf scale turns
    its whole block into NaN / Inf in every output (copied as it is, or decoded into bf16 and weight-only values),
    which nothing downstream would notice, and so does one that large (1e37 was cast into bf16 Inf, exit 0)."""
    s = np.asarray(ck.get(task.src_scale))
    bad = ~(np.abs(s) <= MAX_BLOCK_SCALE)  # (NaN compares False)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise CheckpointError(
            f"{ck.shard_of(task.src_scale).path}: tensor {task.src_scale!r}: {int(bad.sum())} of {s.size} block "
            f"scales are NaN, Inf or above {MAX_BLOCK_SCALE:.3g}, where 448 x scale overflows float32 (the first at "
            f"block {list(first)}: {float(s[first])}); the weight {task.src!r} it scales cannot be converted",
            hint="the source checkpoint is corrupt: download it again, dsx download checks every file's sha256")


def convert(ck: Checkpoint, task: Task, write: Write, *, chunk_bytes: int = 64 << 20,
            backend: CpuBackend | None = None, progress: Progress = lambda n: None) -> None:
    """Produce every output of `task`, in plan order, through `write(name, array)`."""
    be = backend or CpuBackend()
    t = task.target.type
    outs = task.outputs
    try:
        if task.src_scale:
            _check_scales(ck, task)
        if task.passthrough:
            _copy_raw(ck, task.src, outs[0].name, write, chunk_bytes, progress,
                      task if task.src_dtype in ("F8_E4M3", "BF16", "F32", "F16") else None)
            if task.src_scale:
                _copy_raw(ck, task.src_scale, outs[1].name, write, chunk_bytes, progress)
        elif t in ("bf16", "float32"):
            _cast(ck, task, write, chunk_bytes, progress, "bfloat16" if t == "bf16" else "float32", be)
        elif t == "a8w8_fp8":
            _to_fp8(ck, task, write, chunk_bytes, progress, be)
        elif formats.get(t).bits:
            _to_weight_only(ck, task, write, chunk_bytes, progress, be)
        else:
            raise DsxError(f"{task.src}: no transform for target {t!r}")
    except DsxError as e:
        if task.src in str(e):
            raise
        # (a format's own check knows rows and values, not the tensor: name it and its file)
        raise type(e)(f"{ck.shard_of(task.src).path}: tensor {task.src!r}: {e}", hint=e.hint) from e
    finally:
        for n in (task.src, task.src_scale):
            if n:
                ck.shard_of(n).advise_done(n)


def _row_bytes(task: Task) -> int:
    return int(np.prod(task.shape[1:], dtype=np.int64)) * ST_TO_NP[task.src_dtype].itemsize if task.shape else 0


def _cast(ck, task, write, chunk_bytes, progress, dtype, be):
    name = task.outputs[0].name

    def rows(r0: int, r1: int) -> np.ndarray:
        if not task.src_scale:  # (no kernel between a bf16 / float32 source and its cast: its values checked here)
            a = ck.get(task.src)
            _refuse_non_finite(ck, task, a[r0:r1] if a.ndim else a, r0 * int(np.prod(task.shape[1:])))
        return np.ascontiguousarray(_src_rows(ck, task, r0, r1, dtype, be))

    if len(task.shape) < 2:
        write(name, rows(0, task.shape[0] if task.shape else 0))
        progress(task.bytes_in)
        return
    n = task.shape[0]
    step = _chunk_rows(task, chunk_bytes, 128)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        write(name, rows(r0, r1))
        progress((r1 - r0) * _row_bytes(task))
    _scale_progress(task, progress)


def _scale_progress(task: Task, progress: Progress) -> None:
    if task.src_scale:
        progress(task.bytes_in - task.shape[0] * _row_bytes(task))


def _to_fp8(ck, task, write, chunk_bytes, progress, be):
    if len(task.shape) != 2:
        raise DsxError(f"{task.src}: a8w8_fp8 needs a 2-D Linear weight, got shape {list(task.shape)}")
    n = task.shape[0]
    bn = fp8_block.BLOCK[0]
    step = _chunk_rows(task, chunk_bytes, bn)
    scales = []
    # bf16 sources quantize from bf16; FP8 sources from the float32 product (no bf16 rounding on the way).
    dtype = "float32" if task.src_scale or task.src_dtype == "F32" else "bfloat16"
    ranges = [(r0, min(n, r0 + step)) for r0 in range(0, n, step)]
    if task.src_scale:  # dequantizing the chunk is itself a backend call: one chunk at a time
        results = (be.to_fp8(_src_rows(ck, task, r0, r1, dtype, be)) for r0, r1 in ranges)
    else:
        results = be.to_fp8_chunks(_src_rows(ck, task, r0, r1, dtype, be) for r0, r1 in ranges)
    for (r0, r1), (q, s) in zip(ranges, results, strict=True):
        write(task.outputs[0].name, q)
        scales.append(s)
        progress((r1 - r0) * _row_bytes(task))
    write(task.outputs[1].name, np.concatenate(scales, axis=0))
    _scale_progress(task, progress)


def _to_weight_only(ck, task, write, chunk_bytes, progress, be):
    if len(task.shape) != 2:
        raise DsxError(f"{task.src}: weight-only needs a 2-D Linear weight, got shape {list(task.shape)}")
    n, k = task.shape
    tg = task.target
    bits = formats.get(tg.type).bits
    step = _chunk_rows(task, chunk_bytes, 64)
    scales = []
    whole = None
    if tg.arch == 70:  # arch 70 interleaves every channel into each K row: assemble the tensor first
        shapes = weight_only.packed_shapes(n, k, bits, tg.group_size, tg.arch)
        whole = (np.empty(shapes["qweight"]["shape"], np.int8), np.empty(shapes["scale"]["shape"], weight_only.BF16))
    ranges = [(r0, min(n, r0 + step)) for r0 in range(0, n, step)]
    # Paddle's input is the bf16 weight: FP8 sources are dequantized and rounded to bf16 first
    # (fused into the quantizer for arch >= 75, bit-identical to doing it separately).
    if whole is not None:  # CPU kernels only (the GPU path needs chunk-local outputs)
        for r0, r1 in ranges:
            w = _src_rows(ck, task, r0, r1, "bfloat16", be)
            weight_only.quantize_native(w, bits, tg.group_size, tg.arch, out=whole, rows=(r0, r1),
                                        threads=be.threads)
            progress((r1 - r0) * _row_bytes(task))
    else:
        if task.src_scale:
            results = be.fp8_to_weight_only_chunks(ck.get(task.src), ck.get(task.src_scale), task.src_block, ranges,
                                                   bits, tg.group_size, tg.arch)
        else:
            results = be.rows_to_weight_only_chunks(((_src_rows(ck, task, r0, r1, "bfloat16", be), (r0, r1))
                                                     for r0, r1 in ranges), n, bits, tg.group_size, tg.arch)
        for (r0, r1), (q, s) in zip(ranges, results, strict=True):
            write(task.outputs[0].name, q)  # channels' bytes are contiguous in Paddle's layout: stream them
            scales.append(s)
            progress((r1 - r0) * _row_bytes(task))
    if whole is not None:
        write(task.outputs[0].name, whole[0])
        write(task.outputs[1].name, whole[1])
    else:
        write(task.outputs[1].name, np.concatenate(scales, axis=-1))
    _scale_progress(task, progress)
