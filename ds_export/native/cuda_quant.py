"""GPU conversion path of `dsx quantize --device cuda`: the kernels of csrc/cuda/quant_convert.cu.

Every result is bit-identical with the CPU call it replaces (tests/gpu/test_quant_cuda.py):

====================================  ====================================================
CudaConverter method                  CPU equivalent (ds_export.formats)
====================================  ====================================================
fp8_to_weight_only_rows               weight_only.quantize_rows_native(
                                        fp8_block.dequant_native(w, s, block, "bfloat16",
                                        rows), n_out, rows, bits, group, arch)
rows_to_weight_only_rows (bf16/f32)   weight_only.quantize_rows_native(w_rows, ...)
fp8_dequant_rows                      fp8_block.dequant_native(w, s, block, out_dtype, rows)
to_fp8_rows (f32/bf16)                fp8_block.quantize_native(w, block, rows)
fp8_requant_rows                      fp8_block.quantize_native(fp8_block.dequant_native(
                                        w, s, src_block, "float32", rows), block)
====================================  ====================================================

Layouts are those of the CPU functions: FP8 as uint8 bits (float8_e4m3fn accepted),
bf16 as ml_dtypes.bfloat16; weight-only output (qbytes int8 flat, the chunk's bytes of
Paddle's qweight; scale bf16 [rows] or [ceil(K/group), rows]).

Each job is built (and checked, with DsxError messages) by a module function
(``fp8_to_weight_only_job`` ...), so checks need no GPU. ``CudaConverter`` owns two
slots of pinned host + device buffers and three streams (copy-in, compute, copy-out);
``convert_chunks(jobs)`` pipelines them: while chunk i computes, chunk i+1's bytes
travel host -> device and chunk i-1's results device -> host, and the host stages the
next chunk into pinned memory (numpy copies on a small thread pool) meanwhile.
"""

from __future__ import annotations

import ctypes
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import ml_dtypes
import numpy as np

from ds_export.errors import DsxError
from ds_export.formats import fp8_block, weight_only

BF16 = np.dtype(ml_dtypes.bfloat16)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
F32, QC_BF16, QC_FP8 = 0, 1, 2  # DSX_QC_* of csrc/include/dsx/quant_cuda.h
OUT_F32, OUT_BF16 = 0, 1  # DSX_FP8_OUT_*
ENONFINITE = -10
_ALIGN = 256


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------- jobs (pure numpy: checkable without a GPU)


@dataclass
class Job:
    """One chunk: host arrays to upload, outputs to allocate, a launcher and a finisher.

    launch(fns, in_ptrs, out_ptrs, status_ptr, stream_handle) -> C return code;
    finish(out_views, status) -> the result tuple (raises DsxError on a bad status).
    """

    what: str
    inputs: list
    outputs: list  # [(shape, dtype)]
    launch: Callable
    finish: Callable


def _fp8(w, what: str) -> np.ndarray:
    a = np.asarray(w)
    if a.dtype == E4M3:
        a = a.view(np.uint8)
    if a.dtype != np.uint8 or a.ndim != 2:
        raise DsxError(f"{what}: expected a 2-D float8_e4m3fn (or uint8 bits) array, got {a.dtype} {list(a.shape)}")
    return a


def _block(block, what: str) -> tuple[int, int]:
    return fp8_block._block(block, what)  # noqa: SLF001 - one validator for block sizes


def _rows(rows, n: int, what: str, align: int = 1, ragged_end: bool = False) -> tuple[int, int]:
    r0, r1 = (0, n) if rows is None else (int(rows[0]), int(rows[1]))
    if not 0 <= r0 <= r1 <= n:
        raise DsxError(f"{what}: row range ({r0}, {r1}) is outside 0..{n}")
    if r0 % align or (r1 % align and not (ragged_end and r1 == n)):
        end = f" (or end at {n})" if ragged_end else ""
        raise DsxError(f"{what}: row range ({r0}, {r1}) must start and end on multiples of {align}{end}")
    return r0, r1


def _chunk(w: np.ndarray, n: int, r0: int, r1: int, what: str) -> np.ndarray:
    """Rows r0..r1 of `w`, which is the whole [n, K] tensor or just those rows."""
    if w.shape[0] == n:
        w = w[r0:r1]
    elif w.shape[0] != r1 - r0:
        raise DsxError(f"{what}: {w.shape[0]} rows fit neither the tensor ({n} rows) nor the chunk ({r0}, {r1})")
    return w


def _scale_rows(s, n: int, k: int, bn: int, bk: int, r0: int, r1: int, what: str) -> np.ndarray:
    """Scale rows covering weight rows r0..r1 from the full [ceil(n/bn), ceil(k/bk)] scale_inv (or those rows)."""
    a = np.asarray(s)
    full, lo, hi = (_cdiv(n, bn), _cdiv(k, bk)), r0 // bn, _cdiv(r1, bn)
    if a.dtype != np.float32 or a.ndim != 2 or a.shape[1] != full[1] or a.shape[0] not in (full[0], hi - lo):
        raise DsxError(
            f"{what}: scale_inv must be float32 {list(full)} for a [{n}, {k}] weight with block ({bn}, {bk}) "
            f"(or its rows {lo}..{hi}), got {a.dtype} {list(a.shape)}"
        )
    return a[lo:hi] if a.shape[0] == full[0] else a


def _wo_check(n_out: int, k: int, bits: int, group: int, arch: int, what: str) -> None:
    weight_only.check_args(n_out, k, bits, group, arch, name=what)
    if arch == 70:
        raise DsxError(f"{what}: arch 70 interleaves all channels of each K row; the GPU path needs arch >= 75")


def _wo_outputs(rows: int, k: int, bits: int, group: int) -> list:
    sshape = (rows,) if group == -1 else (_cdiv(k, group), rows)
    return [((rows * k * bits // 8,), np.int8), (sshape, np.uint16)]


def _wo_finish(r0: int, r1: int, what: str):
    def finish(outs, status):
        if status == ENONFINITE:
            raise DsxError(f"{what} rows {r0}..{r1}: NaN or Inf found; weight-only quantization refuses non-finite weights")
        _status(status, what)
        return outs[0], outs[1].view(BF16)

    return finish


def _status(status: int, what: str) -> None:
    if status:
        raise DsxError(f"{what}: the kernel reported error {status}")


def fp8_to_weight_only_job(w_fp8, scale_inv, block, n_out: int, rows, bits: int, group: int = -1,
                           arch: int = 90) -> Job:
    """FP8 rows (+ block scale_inv) -> weight-only: dequant, round to bf16, quantize (chunk-local outputs)."""
    what = "fp8_to_weight_only"
    w = _fp8(w_fp8, what)
    n, k = int(n_out), w.shape[1]
    _wo_check(n, k, bits, group, arch, what)
    bn, bk = _block(block, what)
    r0, r1 = _rows(rows, n, what, weight_only.ROW_ALIGN)
    if r0 == r1:
        raise DsxError(f"{what}: empty row range ({r0}, {r1})")
    w = _chunk(w, n, r0, r1, what)
    s = _scale_rows(scale_inv, n, k, bn, bk, r0, r1, what)

    def launch(f, ip, op, st, stream):
        return f["wo"](ip[0], QC_FP8, ip[1], bn, bk, n, k, r0, r1, bits, group, arch, op[0], op[1], st, stream)

    return Job(what, [w, s], _wo_outputs(r1 - r0, k, bits, group), launch, _wo_finish(r0, r1, what))


def rows_to_weight_only_job(w_rows, n_out: int, rows, bits: int, group: int = -1, arch: int = 90) -> Job:
    """bf16 or float32 rows -> weight-only (float32 is rounded to bf16 first, as the CPU path does)."""
    what = "rows_to_weight_only"
    w = np.asarray(w_rows)
    if w.ndim != 2 or w.dtype not in (BF16, np.dtype(np.float32)):
        raise DsxError(f"{what}: takes a 2-D bfloat16 or float32 array, got {w.dtype} {list(w.shape)}")
    n, k = int(n_out), w.shape[1]
    _wo_check(n, k, bits, group, arch, what)
    r0, r1 = _rows(rows, n, what, weight_only.ROW_ALIGN)
    if r0 == r1:
        raise DsxError(f"{what}: empty row range ({r0}, {r1})")
    w = _chunk(w, n, r0, r1, what)
    kind = QC_BF16 if w.dtype == BF16 else F32

    def launch(f, ip, op, st, stream):
        return f["wo"](ip[0], kind, None, 0, 0, n, k, r0, r1, bits, group, arch, op[0], op[1], st, stream)

    return Job(what, [w], _wo_outputs(r1 - r0, k, bits, group), launch, _wo_finish(r0, r1, what))


def fp8_dequant_job(w_fp8, scale_inv, block=(128, 128), rows=None, out_dtype: str = "bfloat16") -> Job:
    """FP8 -> bf16 or float32 rows [r1 - r0, K] (any row range); w_fp8 is the full [N, K] tensor."""
    what = "fp8_dequant"
    if out_dtype not in ("bfloat16", "float32"):
        raise DsxError(f"{what}: out_dtype must be 'bfloat16' or 'float32', got {out_dtype!r}")
    w = _fp8(w_fp8, what)
    n, k = w.shape
    bn, bk = _block(block, what)
    r0, r1 = _rows(rows, n, what)
    s = _scale_rows(scale_inv, n, k, bn, bk, r0, r1, what)
    bf = out_dtype == "bfloat16"

    def launch(f, ip, op, st, stream):
        return f["deq"](ip[0], ip[1], n, k, bn, bk, r0, r1, OUT_BF16 if bf else OUT_F32, op[0], stream)

    def finish(outs, status):
        _status(status, what)
        return outs[0].view(BF16) if bf else outs[0]

    return Job(what, [w[r0:r1], s], [((r1 - r0, k), np.uint16 if bf else np.float32)], launch, finish)


def _fp8_quant_job(what, w, kind, src_scale, src_block, block, rows, n) -> Job:
    k = w.shape[1]
    bn, bk = _block(block, what)
    r0, r1 = _rows(rows, n, what, bn, ragged_end=True)
    w = _chunk(w, n, r0, r1, what)
    sbn, sbk = src_block
    ins = [w] if src_scale is None else [w, src_scale]
    outs = [((r1 - r0, k), np.uint8), ((_cdiv(r1, bn) - r0 // bn, _cdiv(k, bk)), np.float32)]

    def launch(f, ip, op, st, stream):
        sp = ip[1] if src_scale is not None else None
        return f["fq"](ip[0], kind, sp, sbn, sbk, n, k, bn, bk, r0, r1, op[0], op[1], st, stream)

    def finish(o, status):
        if status:
            raise DsxError(f"{what}: input [{n}, {k}] has inf/NaN values in rows {r0}..{r1}; "
                           "FP8 block quantization needs finite weights")
        return o[0], o[1]

    return Job(what, ins, outs, launch, finish)


def to_fp8_job(w, block=(128, 128), rows=None) -> Job:
    """float32 / bfloat16 [N, K] (rows r0..r1, block aligned) -> (e4m3 bits, float32 scale_inv) of the chunk."""
    a = np.asarray(w)
    if a.ndim != 2 or a.dtype not in (BF16, np.dtype(np.float32)):
        raise DsxError(f"to_fp8: expected a 2-D float32 or bfloat16 array, got {a.dtype} {list(a.shape)}")
    return _fp8_quant_job("to_fp8", a, QC_BF16 if a.dtype == BF16 else F32, None, (1, 1), block, rows, a.shape[0])


def fp8_requant_job(w_fp8, scale_inv, src_block, block=(128, 128), rows=None) -> Job:
    """FP8 with `src_block` scales -> float32 -> FP8 with `block` scales (no pass-through shortcut)."""
    what = "fp8_requant"
    w = _fp8(w_fp8, what)
    n, k = w.shape
    sbn, sbk = _block(src_block, what)
    r0, r1 = _rows(rows, n, what, _block(block, what)[0], ragged_end=True)
    s = _scale_rows(scale_inv, n, k, sbn, sbk, r0, r1, what)
    return _fp8_quant_job(what, w, QC_FP8, s, (sbn, sbk), block, (r0, r1), n)


# ---------------------------------------------------------------- the converter (GPU)


_P, _I64, _I32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
# key -> (C entry point of libdsx_cuda, argument types); csrc/include/dsx/quant_cuda.h
ENTRY_POINTS = {
    "deq": ("dsx_fp8_block_dequant_rowmajor_rows_cuda", [_P, _P, _I64, _I64, _I64, _I64, _I64, _I64, _I32, _P, _P]),
    "wo": ("dsx_wo_quantize_rowmajor_nk_rows_cuda",
           [_P, _I32, _P, _I64, _I64, _I64, _I64, _I64, _I64, _I32, _I32, _I32, _P, _P, _P, _P]),
    "fq": ("dsx_fp8_block_quant_rowmajor_rows_cuda",
           [_P, _I32, _P, _I64, _I64, _I64, _I64, _I64, _I64, _I64, _I64, _P, _P, _P, _P]),
}


def bind_entry_points(lib: ctypes.CDLL, names: dict | None = None) -> dict:
    """{key: ctypes function} for ENTRY_POINTS in `lib` (names: other symbols with the same signatures)."""
    out = {}
    for key, (name, args) in ENTRY_POINTS.items():
        f = getattr(lib, (names or {}).get(key, name))
        f.argtypes, f.restype = args, ctypes.c_int
        out[key] = f
    return out


def _layout(sizes) -> tuple[list[int], int]:
    offs, total = [], 0
    for s in sizes:
        offs.append(total)
        total += _cdiv(int(s), _ALIGN) * _ALIGN
    return offs, max(total, _ALIGN)


class _Slot:
    """One pipeline stage's buffers: pinned in/out, device in/out, and its three events."""

    def __init__(self, cuda):
        self.cap_in = self.cap_out = 0
        self.pin_in = self.pin_out = self.dev_in = self.dev_out = None
        self.ev_in, self.ev_comp, self.ev_out = cuda.Event(), cuda.Event(), cuda.Event()
        self.job = None
        self.out_offs: list[int] = []

    def reserve(self, cuda, pinned, n_in: int, n_out: int) -> None:
        if n_in > self.cap_in:
            self.pin_in = self.dev_in = None
            self.cap_in = _cdiv(n_in, 1 << 20) << 20
            self.pin_in, self.dev_in = pinned.PinnedBuffer(self.cap_in), cuda.empty((self.cap_in,), np.uint8)
        if n_out > self.cap_out:
            self.pin_out = self.dev_out = None
            self.cap_out = _cdiv(n_out, 1 << 20) << 20
            self.pin_out, self.dev_out = pinned.PinnedBuffer(self.cap_out), cuda.empty((self.cap_out,), np.uint8)


class CudaConverter:
    """Owns the GPU pipeline: 2 slots of pinned + device buffers (grown on demand), 3 streams.

    lib: a loaded libdsx_cuda (ctypes.CDLL) to use instead of ds_export.native.cuda.lib();
    staging_threads: threads for the host copies into and out of pinned memory;
    poison: fill each output buffer with 0xA5 bytes before its kernel (tests: an element
    the kernel does not write shows up). Not thread-safe; one pipeline at a time (starting
    one abandons an unfinished earlier one).
    """

    def __init__(self, *, lib: ctypes.CDLL | None = None, staging_threads: int = 8, poison: bool = False):
        from ds_export.native import cuda, cuda_pinned

        if not cuda.available():
            raise DsxError("no CUDA device visible: use the CPU path (dsx quantize --device cpu)")
        self._cuda, self._pinned = cuda, cuda_pinned
        self._fns = bind_entry_points(lib if lib is not None else cuda.lib())
        self._s_in, self._s_comp, self._s_out = cuda.Stream(), cuda.Stream(), cuda.Stream()
        self._slots = [_Slot(cuda), _Slot(cuda)]
        self._threads = max(1, int(staging_threads))
        self._pool = ThreadPoolExecutor(self._threads) if self._threads > 1 else None
        self._poison = poison
        self._gen = 0  # the current convert_chunks pipeline

    def close(self) -> None:
        self._gen += 1  # an unfinished pipeline cannot resume
        self._reset()
        if self._pool:
            self._pool.shutdown()
            self._pool = None

    def __enter__(self) -> CudaConverter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- host copies, split over the pool for large arrays
    def _copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        d, s = dst.reshape(-1), np.ascontiguousarray(src).reshape(-1).view(np.uint8)
        parts = 1 if self._pool is None else min(self._threads, s.size >> 20)  # at least 1 MB a piece
        if parts <= 1:
            np.copyto(d, s)
            return
        cuts = np.linspace(0, s.size, parts + 1).astype(np.int64)
        list(self._pool.map(lambda i: np.copyto(d[cuts[i]:cuts[i + 1]], s[cuts[i]:cuts[i + 1]]), range(parts)))

    def _submit(self, slot: _Slot, job: Job) -> None:
        cuda, pin = self._cuda, self._pinned
        in_offs, n_in = _layout(a.nbytes for a in job.inputs)
        out_sizes = [int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize for shape, dt in job.outputs]
        out_offs, n_out = _layout(out_sizes + [4])
        slot.reserve(cuda, pin, n_in, n_out)
        for a, off in zip(job.inputs, in_offs):
            self._copy(slot.pin_in.view(np.uint8, (a.nbytes,), off), a)
        pin.memcpy_async(slot.dev_in.ptr, slot.pin_in.ptr, n_in, cuda.H2D, self._s_in)
        slot.ev_in.record(self._s_in)
        pin.stream_wait_event(self._s_comp, slot.ev_in)
        status = slot.dev_out.ptr + out_offs[-1]
        if self._poison:
            pin.memset_async(slot.dev_out.ptr, 0xA5, n_out, self._s_comp)
        pin.memset_async(status, 0, 4, self._s_comp)
        rc = job.launch(self._fns, [slot.dev_in.ptr + o for o in in_offs], [slot.dev_out.ptr + o for o in out_offs],
                        status, self._s_comp.handle)
        if rc != 0:
            raise DsxError(f"{job.what}: CUDA kernel launch failed (code {rc}); the arguments passed the Python checks")
        slot.ev_comp.record(self._s_comp)
        pin.stream_wait_event(self._s_out, slot.ev_comp)
        pin.memcpy_async(slot.pin_out.ptr, slot.dev_out.ptr, n_out, cuda.D2H, self._s_out)
        slot.ev_out.record(self._s_out)
        slot.job, slot.out_offs = job, out_offs

    def _collect(self, slot: _Slot, copy: bool):
        self._pinned.event_synchronize(slot.ev_out)
        job, offs = slot.job, slot.out_offs
        slot.job = None
        status = int(slot.pin_out.view(np.int32, (1,), offs[-1])[0])
        views = [slot.pin_out.view(dt, shape, off) for (shape, dt), off in zip(job.outputs, offs)]
        if copy:
            fresh = [np.empty(v.shape, v.dtype) for v in views]
            for f, v in zip(fresh, views):
                self._copy(f.view(np.uint8), v.view(np.uint8))
            views = fresh
        return job.finish(views, status)

    def _reset(self) -> None:
        """Wait for all queued work and forget the slots' jobs."""
        for s in (self._s_in, self._s_comp, self._s_out):
            s.synchronize()
        for s in self._slots:
            s.job = None

    def _current(self, gen: int) -> None:
        if gen != self._gen:
            raise DsxError("CudaConverter: this convert_chunks pipeline was superseded by a newer one on the same "
                           "converter (run one pipeline at a time, or use one converter per pipeline)")

    def convert_chunks(self, jobs: Iterable[Job], *, copy: bool = True) -> Iterator:
        """Run jobs through the pipeline; yields each job's result, in order.

        copy=False yields views into pinned memory, valid until the next item is requested.
        Starting a new pipeline (or run()) on this converter abandons an unfinished earlier
        one: its queued work is waited for and dropped, and resuming it raises DsxError.
        """
        self._gen += 1
        gen = self._gen
        self._reset()
        order: deque[_Slot] = deque()
        try:
            for i, job in enumerate(jobs):
                self._current(gen)
                slot = self._slots[i % 2]
                if slot.job is not None:
                    res = self._collect(order.popleft(), copy)
                    if copy:  # queue the next chunk before handing this result over
                        self._submit(slot, job)
                        order.append(slot)
                        yield res
                        continue
                    yield res
                    self._current(gen)
                self._submit(slot, job)
                order.append(slot)
            while order:
                self._current(gen)
                yield self._collect(order.popleft(), copy)
        finally:
            if gen == self._gen:
                self._reset()

    def run(self, job: Job):
        """One job, synchronously."""
        return list(self.convert_chunks([job]))[0]

    # -- the CPU-shaped calls
    def fp8_to_weight_only_rows(self, w_fp8_rows, scale_inv, block, n_out, rows, bits, group=-1, arch=90):
        """(qbytes int8, scale bf16) of channels rows=(r0, r1): see fp8_to_weight_only_job."""
        return self.run(fp8_to_weight_only_job(w_fp8_rows, scale_inv, block, n_out, rows, bits, group, arch))

    def rows_to_weight_only_rows(self, w_rows, n_out, rows, bits, group=-1, arch=90):
        return self.run(rows_to_weight_only_job(w_rows, n_out, rows, bits, group, arch))

    def fp8_dequant_rows(self, w_fp8, scale_inv, block=(128, 128), rows=None, out_dtype="bfloat16"):
        return self.run(fp8_dequant_job(w_fp8, scale_inv, block, rows, out_dtype))

    def to_fp8_rows(self, w, block=(128, 128), rows=None):
        return self.run(to_fp8_job(w, block, rows))

    def fp8_requant_rows(self, w_fp8, scale_inv, src_block, block=(128, 128), rows=None):
        return self.run(fp8_requant_job(w_fp8, scale_inv, src_block, block, rows))
