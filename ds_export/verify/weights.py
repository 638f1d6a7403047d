"""Weight numerics: dequantize each stored weight independently and compare it with the reference weight.

The stored side is decoded with numpy (FP8: `fp8_block.dequant_ref`; weight-only:
`weight_only.decoder`, dequantize_ref's numbers read tile by tile, tested equal to
it bit for bit), never with the quantizer's compiled path; the reference side is
the source weight in float64 (FP8: value x block scale_inv).
Metrics per tensor: relative Frobenius error, SQNR (dB), max abs error, cosine,
and the share of saturated elements (codes at the format's limit). Each format
has an expected range (docs/numerics.md); a tensor outside it is flagged.
"""

from __future__ import annotations

import math
import os
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ds_export.errors import DsxError
from ds_export.formats import fp8_block, weight_only
from ds_export.io.checkpoint import Checkpoint
from ds_export.models import deepseek_v3 as ds
from ds_export.progress import QUIET, Reporter

# Minimum SQNR (dB) per stored format, on DeepSeek-like weights (docs/numerics.md gives the reasoning).
# "exact" formats must reproduce the reference bit for bit (copies).
MIN_SQNR = {
    "bf16": 45.0,
    "float32": 120.0,
    "a8w8_fp8": 25.0,
    "weight_only_int8": 33.0,
    "weight_only_int8/g": 35.0,
    "weight_only_int4": 13.0,
    "weight_only_int4/g": 15.0,
}


@dataclass
class WeightStat:
    name: str
    role: str
    layer: int | None
    mtp: bool
    format: str
    rel_fro: float
    sqnr_db: float
    max_abs: float
    cosine: float
    saturated: float  # share of elements at the format's largest code
    gate: float  # the minimum SQNR this format must reach (inf: a copy of the source, bit-identical)
    ok: bool
    problem: str = ""  # why it failed where the SQNR does not say it (a shape, NaN / Inf values, other bytes)
    reproduced: bool | None = None  # the stored bytes are dsx's conversion of the reference (None: not compared)

    def to_json(self) -> dict:
        d = asdict(self)
        d["sqnr_db"] = None if math.isinf(self.sqnr_db) else self.sqnr_db
        return d


# Tensors are compared in parts of whole rows, each part decoded and reduced on its own (float64 sums), so memory
# stays bounded by the part size times the worker count, not by the largest tensor in float64 (R1's embedding alone is
# 7.4 GB there), and the parts of a tensor run on the worker threads side by side (numpy releases the GIL in its loops).
PART_ELEMENTS = 1 << 19
ROW_ALIGN = 128  # parts start on FP8 blocks and whole weight-only tiles
SCRATCH_ELEMENTS = 4 * PART_ELEMENTS  # parts up to this size are decoded into buffers each thread keeps

_scratch_local = threading.local()


def _scratch(key: str, size: int, dtype) -> np.ndarray | None:
    """This thread's buffer `key` (at least `size` elements, flat), reused part after part: a new array of a part's
    size costs the kernel's zeroing of its pages every time, as much as the decode of the part (numpy 2, 4 MB of
    float64). None above SCRATCH_ELEMENTS (a row wider than a part, an arch-70 weight read whole): those parts get
    arrays of their own, which are freed after them."""
    if size > SCRATCH_ELEMENTS:
        return None
    bufs = _scratch_local.__dict__
    buf = bufs.get(key)
    if buf is None or buf.size < size or buf.dtype != dtype:
        buf = bufs[key] = np.empty(size, dtype)  # (grows to the largest part a thread has seen)
    return buf


def _out(buf: np.ndarray | None, shape) -> np.ndarray:
    """A float64 array of `shape`: a view of buf (flat, large enough) if given, else a new one."""
    return np.empty(shape) if buf is None else buf[: math.prod(shape)].reshape(shape)


def _fp8_f64(codes: np.ndarray, scales: np.ndarray, block, out: np.ndarray | None) -> np.ndarray:
    """dequant_ref of an FP8 part (float32, as the format defines it) widened to float64, into `out` if given."""
    tmp = _scratch("f32", codes.size, np.float32) if out is not None else None
    return _widen(fp8_block.dequant_ref(codes, scales, block,
                                        out=None if tmp is None else tmp[: codes.size].reshape(codes.shape)), out)


def _widen(a: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """A bf16 / float32 part in float64, into `out` if given."""
    if out is None:
        return a.astype(np.float64)
    res = _out(out, a.shape)
    np.copyto(res, a)
    return res


def default_workers() -> int:
    return max(1, min(16, os.cpu_count() or 1))


class _Shape(Exception):
    """A stored tensor whose shape does not belong to its reference; args[0]: its format label; args[1], if given,
    what is wrong instead (a scale's dtype)."""


def _scale_dtype(ck: Checkpoint, name: str, suffix: str) -> str | None:
    """What is wrong with the dtype of weight `name`'s scale (ds.SCALE_DTYPES), or None (an I32 block scale was read
    as integers, or stopped verify with an error naming neither file nor tensor)."""
    dt, want = ck.info(name + suffix).dtype, ds.SCALE_DTYPES[suffix]
    return None if dt == want else f"its scale {name + suffix} is {dt}, expected {want}"


def _fp8_block_size(ck: Checkpoint) -> tuple[int, int]:
    return tuple((ck.config.get("quantization_config") or {}).get("weight_block_size") or fp8_block.BLOCK)


def _reference_rows(ck: Checkpoint, name: str):
    """(shape, row alignment, rows(r0, r1, out=None) -> float64): the source weight, FP8 sources as value x block
    scale_inv. out: a flat float64 buffer to decode into (a view of it is returned), else a new array."""
    info = ck.info(name)
    if info.dtype == "F8_E4M3":
        wrong = _scale_dtype(ck, name, ds.SCALE_SUFFIX)
        if wrong:
            raise DsxError(f"{ck.root}: the reference's {name}: {wrong}",
                           hint="the reference checkpoint is damaged or not in DeepSeek's format")
        block = _fp8_block_size(ck)
        q, s, bn = ck.get(name), ck.get(name + ds.SCALE_SUFFIX), int(block[0])
        return tuple(info.shape), bn, lambda r0, r1, out=None: _fp8_f64(q[r0:r1], s[r0 // bn: -(-r1 // bn)], block,
                                                                        out)
    a = np.atleast_1d(ck.get(name))
    return tuple(info.shape), 1, lambda r0, r1, out=None: _widen(a[r0:r1], out)


def reference_f64(ck: Checkpoint, name: str) -> np.ndarray:
    """The source weight in float64 (FP8 sources: decoded value x block scale_inv, exactly)."""
    shape, _, rows = _reference_rows(ck, name)
    return rows(0, shape[0] if shape else 1).reshape(shape)


def _wo_params(target: Checkpoint, name: str, ref_shape: tuple[int, int]) -> tuple[int, int, int]:
    n, k = ref_shape
    q = target.info(name)
    s = target.info(name + ds.WO_SCALE_SUFFIX)
    bits = 8 if q.shape[0] == n else 4
    group = -1 if len(s.shape) == 1 else (64 if s.shape[0] == -(-k // 64) else 128)
    arch = int((target.config.get("quantization_config") or {}).get("weightonly_arch", 90))
    return bits, group, arch


def _stored_rows(target: Checkpoint, name: str, ref_shape):
    """(format label, row alignment, rows(r0, r1, out=None) -> (float64 values, saturated count)); _Shape when the
    stored tensor cannot hold a weight of ref_shape. out: as for _reference_rows."""
    info = target.info(name)
    if info.dtype == "F8_E4M3":
        if tuple(info.shape) != tuple(ref_shape):
            raise _Shape("a8w8_fp8")
        wrong = _scale_dtype(target, name, ds.SCALE_SUFFIX)
        if wrong:
            raise _Shape("a8w8_fp8", wrong)
        q, s = target.get(name), target.get(name + ds.SCALE_SUFFIX)
        bn = fp8_block.BLOCK[0]

        def fp8_rows(r0, r1, out=None):
            part = q[r0:r1]
            return (_fp8_f64(part, s[r0 // bn: -(-r1 // bn)], fp8_block.BLOCK, out),
                    _e4m3_saturated(part.view(np.uint8) & 0x7F))
        return "a8w8_fp8", bn, fp8_rows
    if info.dtype == "I8" and name + ds.WO_SCALE_SUFFIX in target:
        if len(ref_shape) != 2:
            raise _Shape("I8")
        n, k = ref_shape
        bits, group, arch = _wo_params(target, name, ref_shape)
        label = f"weight_only_int{bits}" + ("/g" if group != -1 else "")
        try:
            want = weight_only.packed_shapes(n, k, bits, group, arch)
        except DsxError:
            raise _Shape(label) from None
        if (tuple(info.shape) != tuple(want["qweight"]["shape"])
                or tuple(target.info(name + ds.WO_SCALE_SUFFIX).shape) != tuple(want["scale"]["shape"])):
            raise _Shape(label)
        wrong = _scale_dtype(target, name, ds.WO_SCALE_SUFFIX)
        if wrong:
            raise _Shape(label, wrong)
        qw, sc = target.get(name), target.get(name + ds.WO_SCALE_SUFFIX)

        def wo_rows(r0, r1, out=None):
            if (r0, r1) == (0, n):
                qp, sp = qw, sc
            else:  # arch >= 75: whole tiles of rows, cut from the bytes (arch 70 is read in one part)
                plan = weight_only.slice_plan(n, k, bits, group, arch, rows=(r0, r1))
                qp, sp = weight_only.slice_packed(qw, bits, arch, k, plan), weight_only.slice_scale(sc, plan)
            decode = weight_only.decoder(r1 - r0, k, bits, group, arch)
            return decode(qp, sp, out), weight_only.bound_count(qp, bits)
        return label, (n if arch == 70 else ROW_ALIGN), wo_rows
    label = {"BF16": "bf16", "F32": "float32"}.get(info.dtype, info.dtype)
    if tuple(info.shape) != tuple(ref_shape):
        raise _Shape(label)
    a = np.atleast_1d(target.get(name))
    return label, 1, lambda r0, r1, out=None: (_widen(a[r0:r1], out), 0)


def _copy_rows(reference: Checkpoint, target: Checkpoint, name: str):
    """rows(r0, r1) -> saturated count, or None where those rows are not a finite byte copy of the reference; None
    itself when the stored tensor is not a candidate copy (an FP8 weight with the reference's blocks, or bf16 from bf16).

    A copy's bytes equal to the reference's (its block scales' too) decode to the same values, so its figures are
    exact without decoding either side; NaN / Inf codes (and a part that differs) go through the decode instead.
    """
    ri, ti = reference.info(name), target.info(name)
    if ri.dtype != ti.dtype or ri.dtype not in ("F8_E4M3", "BF16") or tuple(ri.shape) != tuple(ti.shape) \
            or not ri.shape or (ri.dtype == "F8_E4M3" and len(ri.shape) != 2):
        return None
    cols = int(np.prod(ri.shape[1:]))  # (1 for a vector: its rows are elements)
    a, b = reference.raw(name), target.raw(name)
    if ri.dtype == "BF16":
        def bf16_rows(r0, r1):
            x, y = a[r0 * cols * 2: r1 * cols * 2], b[r0 * cols * 2: r1 * cols * 2]
            if not np.array_equal(x, y) or np.any((x.view(np.uint16) & 0x7F80) == 0x7F80):  # exponent all ones
                return None
            return 0
        return bf16_rows
    sn = name + ds.SCALE_SUFFIX
    if sn not in reference or sn not in target or _fp8_block_size(reference) != tuple(fp8_block.BLOCK):
        return None
    rs, ts = reference.info(sn), target.info(sn)
    if (rs.dtype, tuple(rs.shape)) != (ts.dtype, tuple(ts.shape)) or rs.dtype != "F32" or len(rs.shape) != 2:
        return None
    sa, sb, bn = reference.get(sn), target.get(sn), fp8_block.BLOCK[0]

    def fp8_rows(r0, r1):
        x, y = a[r0 * cols: r1 * cols], b[r0 * cols: r1 * cols]
        s0, s1 = sa[r0 // bn: -(-r1 // bn)], sb[r0 // bn: -(-r1 // bn)]
        if not (np.array_equal(x, y) and np.array_equal(s0.view(np.uint32), s1.view(np.uint32))):
            return None
        mag = x & 0x7F
        if np.any(mag == 0x7F) or not np.isfinite(s0).all():  # e4m3 NaN codes
            return None
        return _e4m3_saturated(mag)
    return fp8_rows


def _e4m3_saturated(magnitudes: np.ndarray) -> int:
    """How many e4m3 codes (sign bit cleared) are at the format's largest value, |448| (0x7E)."""
    return int(np.count_nonzero(magnitudes == 0x7E))


def stored_f64(target: Checkpoint, name: str, ref_shape) -> tuple[np.ndarray, str, float]:
    """(decoded weight, format label, saturated share)."""
    try:
        fmt, _, rows = _stored_rows(target, name, ref_shape)
    except _Shape as e:
        raise DsxError(f"{target.info(name).file}: {name} " + (f"is stored with {e.args[1]}" if len(e.args) > 1 else (
                       f"is {target.info(name).dtype} {list(target.info(name).shape)}, which cannot hold the "
                       f"reference's weight of shape {list(ref_shape)}")) + "; check --reference, or convert the "
                       "weight again with dsx quantize") from None
    w, sat = rows(0, ref_shape[0] if len(ref_shape) else 1)
    return w.reshape(ref_shape), fmt, sat / max(1, w.size)


def _metrics(e2: float, r2: float, g2: float, rg: float, mx: float) -> tuple[float, float, float, float]:
    rel = math.sqrt(e2 / r2) if r2 else (0.0 if e2 == 0 else math.inf)
    sqnr = math.inf if e2 == 0 else (10 * math.log10(r2 / e2) if r2 else -math.inf)
    denom = math.sqrt(r2 * g2)
    cos = rg / denom if denom else (1.0 if e2 == 0 else 0.0)
    return rel, sqnr, mx, cos


def compare(ref: np.ndarray, got: np.ndarray) -> tuple[float, float, float, float]:
    """(relative Frobenius error, SQNR dB, max abs error, cosine)."""
    err = got - ref
    return _metrics(float((err * err).sum()), float((ref * ref).sum()), float((got * got).sum()),
                    float((ref * got).sum()), float(np.abs(err).max()) if err.size else 0.0)


def _part_sums(ref_rows, got_rows, r0: int, r1: int, cols: int) -> np.ndarray:
    """[sum err^2, sum ref^2, sum got^2, sum ref*got, max |err|, saturated] of rows r0..r1 (of `cols` elements each).

    The products are summed by einsum, not BLAS: a BLAS dot may start threads of its own, which fight the workers.
    """
    size = (r1 - r0) * cols
    ref = ref_rows(r0, r1, _scratch("ref", size, np.float64)).reshape(-1)
    got, sat = got_rows(r0, r1, _scratch("got", size, np.float64))
    got = got.reshape(-1)
    r2, g2, rg = (float(np.einsum("i,i->", a, b)) for a, b in ((ref, ref), (got, got), (ref, got)))
    with np.errstate(invalid="ignore"):  # Inf - Inf: the NaN is the finding
        err = np.subtract(got, ref, out=got)  # got is this part's own array
    e2 = float(np.einsum("i,i->", err, err))
    mx = float(np.maximum(err.max(), -err.min())) if err.size else 0.0  # NaN if any error is NaN
    return np.array([e2, r2, g2, rg, mx, sat], np.float64)


def _parts(rows: int, cols: int, align: int) -> list[tuple[int, int]]:
    if rows <= 0:
        return [(0, 0)]
    step = max(align, PART_ELEMENTS // max(1, cols) // align * align)
    return [(r, min(rows, r + step)) for r in range(0, rows, step)]


def check_weights(target: Checkpoint, reference: Checkpoint, cfg: ds.DeepseekV3Config,
                  *, expert_sample: int | None = None, gates: dict | None = None,
                  workers: int | None = None, progress: Reporter = QUIET,
                  on_file: Callable[[Path], None] | None = None, reproduce: bool = False) -> list[WeightStat]:
    """Compare every quantizable weight present in both (routed experts: the first `expert_sample` per layer).

    reproduce: also convert each reference weight again as dsx quantize does (the format and group size read from
    the stored tensors, the arch from the config) and require the stored bytes to be exactly those: a change the
    SQNR gate cannot see (a flipped bit of one int4 code, one scale's last mantissa bit) fails the tensor. For a dsx
    quantize output converted from this reference.

    workers: threads that decode and reduce the tensors' row parts (default: the cores, at most 16); the result
    does not depend on it beyond float64 summation order. progress: told each tensor's bytes (stored and
    reference) as it finishes. on_file(shard): called as the check starts on each of the target's shards (verify
    hashes the shard then, beside the reads: integrity.FileChecks.reading); with it the shards are read one after
    another in name order, each one's tensors in file order (the stats keep the target's order).
    """
    gate_of = {**MIN_SQNR, **(gates or {})}
    stats: list[WeightStat] = []
    todo = []
    for name in target.names():
        r = ds.classify(name, cfg)
        if r.kind != "weight" or name not in reference:
            continue
        if expert_sample is not None and r.expert is not None and r.expert >= expert_sample:
            continue
        todo.append((name, r))
    if on_file is not None:
        todo.sort(key=lambda t: (target.info(t[0]).file.name, target.info(t[0]).begin))

    def nbytes(name: str) -> int:
        return target.info(name).nbytes + reference.info(name).nbytes

    advance = progress.phase(f"weights ({len(todo)} tensors)", sum(nbytes(n) for n, _ in todo))

    def finish(item: _Item) -> None:
        stats.append(_finish(item, reference, target, gate_of, pool))
        advance(nbytes(item.name))

    workers = workers or default_workers()
    ref_infos = {t.name: t for t in reference.infos()} if reproduce else {}
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dsx-verify")
    try:
        window: deque = deque()  # tensors whose parts are queued or running, oldest first
        depth = 2 * workers
        shard = None
        for name, r in todo:
            if on_file is not None and target.info(name).file != shard:
                shard = target.info(name).file
                on_file(shard)
            shape, ref_align, ref_rows = _reference_rows(reference, name)
            try:
                fmt, got_align, got_rows = _stored_rows(target, name, shape)
            except _Shape as e:
                t = target.info(name)
                window.append(_Item(name, r, e.args[0], problem=e.args[1] if len(e.args) > 1 else (
                    f"stored as {t.dtype} {list(t.shape)}, which cannot hold the reference's weight of shape "
                    f"{list(shape)}")))
            else:
                align = math.lcm(ref_align, got_align)
                rows = shape[0] if shape else 1
                cols = int(np.prod(shape[1:])) if len(shape) > 1 else 1
                parts = _parts(rows, cols, align)
                copy = _copy_rows(reference, target, name)
                if copy is not None:  # bytes first; the decode only if some part is not a finite copy
                    futs = [pool.submit(copy, r0, r1) for r0, r1 in parts]
                    decode = (ref_rows, got_rows, parts, cols)
                else:
                    futs = [pool.submit(_part_sums, ref_rows, got_rows, r0, r1, cols) for r0, r1 in parts]
                    decode = None
                task = _reconversion(reference, target, r, fmt, shape, ref_infos) if reproduce else None
                repro = "" if task is None else "copy" if task.passthrough and copy is not None else "job"
                if repro == "job":  # (a copy's byte comparison above is its reconversion already)
                    futs.append(pool.submit(_reproduce, reference, target, task))
                window.append(_Item(name, r, fmt, futs, rows * cols, decode, repro=repro))
            while sum(len(w.futs) for w in window) > depth and len(window) > 1:
                finish(window.popleft())
        while window:
            finish(window.popleft())
    finally:  # on an error or an interrupt, queued parts are dropped, not run
        pool.shutdown(wait=True, cancel_futures=True)
    if on_file is not None:
        at = {name: i for i, name in enumerate(target.names())}
        stats.sort(key=lambda s: at[s.name])
    return stats


class _Item(NamedTuple):
    """A tensor in check_weights' window: its parts' futures (sums, or byte comparisons where `decode` is set)."""
    name: str
    role: ds.TensorRole
    fmt: str
    futs: list | tuple = ()
    size: int = 0
    decode: tuple | None = None  # (ref_rows, got_rows, parts, cols): a candidate copy, decoded if its bytes are not one
    problem: str = ""  # set: the tensor failed before any part was read (its stored shape)
    repro: str = ""  # "job": futs' last one is _reproduce's; "copy": the bytes compared as a copy are the reproduction


def _finish(item: _Item, reference: Checkpoint, target: Checkpoint, gate_of: dict,
            pool: ThreadPoolExecutor) -> WeightStat:
    name, r, fmt, futs, size, decode, problem, repro = item
    if problem:
        return WeightStat(name, r.role, r.layer, r.mtp, fmt, math.inf, -math.inf, math.inf, 0.0, 0.0, 0.0, False,
                          problem)
    differs = futs[-1].result() if repro == "job" else None  # (None: the same bytes)
    futs = futs[:-1] if repro == "job" else futs
    stat, copied = _stat(item._replace(futs=futs), reference, target, gate_of, pool)
    if repro == "copy" and not copied:  # (bytes that differ but decode equal: -0.0 for +0.0)
        differs = _not_the_bytes(fmt, "its bytes are the reference's, copied")
    if repro:
        stat.reproduced = differs is None
        if differs is not None and stat.ok:  # (a failed SQNR or NaN is the clearer message)
            stat.ok, stat.problem = False, differs
    return stat


def _stat(item: _Item, reference: Checkpoint, target: Checkpoint, gate_of: dict,
          pool: ThreadPoolExecutor) -> tuple[WeightStat, bool]:
    """The tensor's figures, and whether its bytes were found a finite copy of the reference's."""
    name, r, fmt, futs, size, decode, _, _ = item
    gate = gate_of.get(fmt, 0.0)
    # A stored tensor of the source's own format must be the source itself (passthrough copies).
    src_dtype = reference.info(name).dtype
    same = (fmt == "a8w8_fp8" and src_dtype == "F8_E4M3") or (fmt == "bf16" and src_dtype == "BF16")
    if decode is not None:  # a candidate copy compared by bytes
        sats = [f.result() for f in futs]
        if all(s is not None for s in sats):
            sat = sum(sats) / size if size else 0.0
            return WeightStat(name, r.role, r.layer, r.mtp, fmt, 0.0, math.inf, 0.0, 1.0, sat,
                              math.inf if same else gate, True), True
        ref_rows, got_rows, parts, cols = decode
        futs = [pool.submit(_part_sums, ref_rows, got_rows, r0, r1, cols) for r0, r1 in parts]
    sums = np.zeros(6)
    for f in futs:
        part = f.result()
        sums[:4] += part[:4]
        sums[4] = np.maximum(sums[4], part[4])  # (a NaN stays NaN)
        sums[5] += part[5]
    rel, sqnr, mx, cos = _metrics(*(float(v) for v in sums[:5]))
    sat = float(sums[5]) / size if size else 0.0
    problem = ("the reference holds NaN or Inf values" if not math.isfinite(sums[1])
               else "the stored weight holds NaN or Inf values" if not math.isfinite(sums[2]) or math.isnan(mx)
               else "")
    ok = sqnr == math.inf if same and _same_blocks(reference, target, name) else sqnr >= gate
    return WeightStat(name, r.role, r.layer, r.mtp, fmt, rel, sqnr, mx, cos, sat, math.inf if same else gate,
                      ok and not problem, problem), False


class _Differs(Exception):
    pass


def _reconversion(reference: Checkpoint, target: Checkpoint, r: ds.TensorRole, fmt: str, shape,
                  ref_infos: dict):
    """The plan task that converts the reference's r.name into the stored format (read from the stored tensors),
    or None where the format is not one dsx writes from it."""
    from ds_export.quant.plan import task_for
    from ds_export.quant.recipe import Target

    if fmt.startswith("weight_only_int"):
        bits, group, arch = _wo_params(target, r.name, shape)
        t = Target(f"weight_only_int{bits}", group, arch)
    elif fmt in ("a8w8_fp8", "bf16", "float32"):
        t = Target(fmt)
    else:
        return None
    try:
        return task_for(reference, r, t, ref_infos, _fp8_block_size(reference))
    except DsxError:  # (a source dsx quantize refuses: the reference's own checks say why)
        return None


def _reproduce(reference: Checkpoint, target: Checkpoint, task) -> str | None:
    """None when converting the reference as the task says writes the stored bytes exactly, else where the first
    difference is. Streams: each piece the conversion writes is compared with the stored bytes at its offset."""
    from ds_export.quant.backend import CpuBackend
    from ds_export.quant.transforms import convert

    at: dict[str, int] = {}

    def write(out: str, data: np.ndarray) -> None:
        b = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        o = at.get(out, 0)
        if out not in target:
            raise _Differs(f"{out} is not stored")
        got = target.raw(out).reshape(-1)[o:o + b.size]
        bad = np.flatnonzero(got != b[:got.size])
        if bad.size:
            raise _Differs(f"{out} byte {o + int(bad[0])}")
        if got.size != b.size:
            raise _Differs(f"{out} ends at byte {o + got.size}, the conversion writes more")
        at[out] = o + b.size

    try:
        convert(reference, task, write, chunk_bytes=16 << 20, backend=CpuBackend(threads=1))
    except _Differs as e:
        diff = e.args[0]
    except DsxError:  # (a reference dsx cannot convert, NaN codes: the SQNR check reports its values)
        return None
    else:
        short = next((e.name for e in task.outputs if at.get(e.name, 0) != target.info(e.name).nbytes), None)
        if short is None:
            return None
        diff = f"{short} holds {target.info(short).nbytes} bytes, the conversion {at.get(short, 0)}"
    return _not_the_bytes(task.target.type, f"first difference: {diff}")


def _not_the_bytes(fmt: str, how: str) -> str:
    return (f"within the {fmt} gate, but not the bytes dsx quantize writes from the reference ({how}): written wrong "
            "(a memory or device fault, an edit with its manifest rewritten) or by another tool or dsx version; "
            "quantize it again")


def _same_blocks(reference: Checkpoint, target: Checkpoint, name: str) -> bool:
    sn = name + ds.SCALE_SUFFIX
    if sn in reference and sn in target:
        return reference.info(sn).shape == target.info(sn).shape
    return sn not in reference and sn not in target
