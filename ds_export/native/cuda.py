"""CUDA kernels of csrc/cuda/ from Python with neither torch nor cupy.

Loads the CUDA runtime (libcudart) and libdsx_cuda.so through ctypes. Offers:

- device memory: :class:`DeviceArray` (``to_device``, ``empty``, ``.numpy()``), freed when
  collected; :class:`Stream`, :class:`Event` (timing), :class:`Graph` (capture/replay);
- device-level kernel calls (``*_device``): DeviceArray in, DeviceArray out, asynchronous
  on a stream, no allocation except the GEMM workspace you may pass in;
- numpy conveniences (``gemm_fp8_nt``, ``gemm_fp8_grouped_nt_contiguous``,
  ``act_quant_fp8``, ``mtp_accept_greedy``): upload, run, download, same signatures and
  checks as ds_export.native.kernels.

``available()`` says whether a CUDA device can be used; it builds nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import os
import sys

import numpy as np

from ds_export.errors import DsxError
from ds_export.native import check, process_switch, switched
from ds_export.native import kernels as K

P, I64, I32, SZ = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_size_t
H2D, D2H, D2D = 1, 2, 3


def _cudart_candidates() -> list[str]:
    names = ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]
    found = ctypes.util.find_library("cudart")
    dirs = ["/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib"]
    for p in sys.path:
        dirs += glob.glob(os.path.join(p, "nvidia", "cu1*", "lib")) + glob.glob(os.path.join(p, "nvidia", "cuda_runtime", "lib"))
    return ([found] if found else []) + names + [os.path.join(d, n) for d in dirs for n in names]


@functools.lru_cache(maxsize=1)
def cudart() -> ctypes.CDLL:
    """The CUDA runtime, loaded RTLD_GLOBAL so libdsx_cuda.so binds to this same copy."""
    for cand in _cudart_candidates():
        try:
            rt = ctypes.CDLL(cand, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
        for name, args in {
            "cudaMalloc": [ctypes.POINTER(P), SZ], "cudaFree": [P], "cudaMemcpy": [P, P, SZ, I32],
            "cudaMemcpyAsync": [P, P, SZ, I32, P], "cudaMemsetAsync": [P, I32, SZ, P],
            "cudaGetDeviceCount": [ctypes.POINTER(I32)], "cudaDeviceSynchronize": [], "cudaSetDevice": [I32],
            "cudaStreamCreate": [ctypes.POINTER(P)], "cudaStreamDestroy": [P], "cudaStreamSynchronize": [P],
            "cudaEventCreate": [ctypes.POINTER(P)], "cudaEventDestroy": [P], "cudaEventRecord": [P, P],
            "cudaEventSynchronize": [P], "cudaEventElapsedTime": [ctypes.POINTER(ctypes.c_float), P, P],
            "cudaStreamBeginCapture": [P, I32], "cudaStreamEndCapture": [P, ctypes.POINTER(P)],
            "cudaGraphInstantiate": [ctypes.POINTER(P), P, ctypes.c_ulonglong], "cudaGraphLaunch": [P, P],
            "cudaGraphExecDestroy": [P], "cudaGraphDestroy": [P], "cudaGetLastError": [],
        }.items():
            fn = getattr(rt, name)
            fn.argtypes, fn.restype = args, I32
        rt.cudaGetErrorString.argtypes, rt.cudaGetErrorString.restype = [I32], ctypes.c_char_p
        return rt
    raise DsxError("CUDA runtime (libcudart) not found: install the CUDA toolkit or the nvidia-cuda-runtime wheel")


def rt_check(err: int, what: str) -> None:
    if err != 0:
        msg = cudart().cudaGetErrorString(err).decode()
        raise DsxError(f"CUDA call {what} failed: {msg} (error {err})")


def available() -> bool:
    """True when the CUDA runtime loads and sees at least one device (builds nothing)."""
    try:
        n = I32(0)
        return cudart().cudaGetDeviceCount(ctypes.byref(n)) == 0 and n.value > 0
    except (DsxError, OSError):
        return False


def device_count() -> int:
    n = I32(0)
    rt_check(cudart().cudaGetDeviceCount(ctypes.byref(n)), "cudaGetDeviceCount")
    return n.value


def set_device(index: int) -> None:
    """Make GPU `index` current for the calling host thread (CUDA keeps the device per thread)."""
    rt_check(cudart().cudaSetDevice(int(index)), f"cudaSetDevice({index})")


@functools.lru_cache(maxsize=1)
def lib() -> ctypes.CDLL:
    """libdsx_cuda.so for the current sources (built on first use by build_cuda)."""
    from ds_export.native.build_cuda import build_cuda

    cudart()
    return ctypes.CDLL(str(build_cuda()))


@functools.lru_cache(maxsize=None)
def _fn(name: str, *argtypes):
    fn = getattr(lib(), name)
    fn.argtypes, fn.restype = list(argtypes), ctypes.c_int
    return fn


class DeviceArray:
    """A C-contiguous device buffer with a numpy shape and dtype; freed on collection."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(int(s) for s in shape), np.dtype(dtype)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        p = P()
        rt_check(cudart().cudaMalloc(ctypes.byref(p), max(self.nbytes, 1)), f"cudaMalloc({self.nbytes})")
        self.ptr = p.value

    def __del__(self):
        if getattr(self, "ptr", None):
            cudart().cudaFree(self.ptr)
            self.ptr = None

    def upload(self, a: np.ndarray, stream: Stream | None = None) -> DeviceArray:
        a = np.ascontiguousarray(a)
        if a.nbytes != self.nbytes:
            raise DsxError(f"upload: {a.nbytes} bytes into a {self.nbytes}-byte device array")
        if stream is None:
            rt_check(cudart().cudaMemcpy(self.ptr, a.ctypes.data, a.nbytes, H2D), "cudaMemcpy H2D")
        else:  # the caller keeps `a` alive until the stream is synchronized
            rt_check(cudart().cudaMemcpyAsync(self.ptr, a.ctypes.data, a.nbytes, H2D, stream.handle), "cudaMemcpyAsync")
        return self

    def numpy(self) -> np.ndarray:
        out = np.empty(self.shape, self.dtype)
        rt_check(cudart().cudaMemcpy(out.ctypes.data, self.ptr, self.nbytes, D2H), "cudaMemcpy D2H")
        return out

    def fill_bytes(self, value: int, stream: Stream | None = None) -> DeviceArray:
        rt_check(cudart().cudaMemsetAsync(self.ptr, value, self.nbytes, stream.handle if stream else None), "cudaMemset")
        return self


def to_device(a: np.ndarray) -> DeviceArray:
    return DeviceArray(a.shape, a.dtype).upload(a)


def empty(shape, dtype) -> DeviceArray:
    return DeviceArray(shape, dtype)


def synchronize() -> None:
    rt_check(cudart().cudaDeviceSynchronize(), "cudaDeviceSynchronize")


class Stream:
    def __init__(self):
        h = P()
        rt_check(cudart().cudaStreamCreate(ctypes.byref(h)), "cudaStreamCreate")
        self.handle = h.value

    def synchronize(self) -> None:
        rt_check(cudart().cudaStreamSynchronize(self.handle), "cudaStreamSynchronize")

    def __del__(self):
        if getattr(self, "handle", None):
            cudart().cudaStreamDestroy(self.handle)
            self.handle = None


class Event:
    def __init__(self):
        h = P()
        rt_check(cudart().cudaEventCreate(ctypes.byref(h)), "cudaEventCreate")
        self.handle = h.value

    def record(self, stream: Stream | None = None) -> Event:
        rt_check(cudart().cudaEventRecord(self.handle, stream.handle if stream else None), "cudaEventRecord")
        return self

    def elapsed_ms(self, end: Event) -> float:
        rt_check(cudart().cudaEventSynchronize(end.handle), "cudaEventSynchronize")
        ms = ctypes.c_float()
        rt_check(cudart().cudaEventElapsedTime(ctypes.byref(ms), self.handle, end.handle), "cudaEventElapsedTime")
        return ms.value

    def __del__(self):
        if getattr(self, "handle", None):
            cudart().cudaEventDestroy(self.handle)
            self.handle = None


class Graph:
    """Capture the launches that ``fn(stream)`` makes on a fresh stream; replay with launch()."""

    def __init__(self, fn, stream: Stream, mode: int = 1):  # 1 = cudaStreamCaptureModeThreadLocal
        self.stream = stream
        rt_check(cudart().cudaStreamBeginCapture(stream.handle, mode), "cudaStreamBeginCapture")
        g = P()
        try:
            fn(stream)
        finally:
            err = cudart().cudaStreamEndCapture(stream.handle, ctypes.byref(g))
            if err:
                cudart().cudaGetLastError()  # clear it, so later launches are not blamed
        rt_check(err, "cudaStreamEndCapture (a call in the captured function is not capturable)")
        self.graph, e = g.value, P()
        rt_check(cudart().cudaGraphInstantiate(ctypes.byref(e), self.graph, 0), "cudaGraphInstantiate")
        self.exec = e.value

    def launch(self) -> None:
        rt_check(cudart().cudaGraphLaunch(self.exec, self.stream.handle), "cudaGraphLaunch")

    def __del__(self):
        if getattr(self, "exec", None):
            cudart().cudaGraphExecDestroy(self.exec)
            cudart().cudaGraphDestroy(self.graph)
            self.exec = None


def _h(stream: Stream | None):
    return stream.handle if stream else None


def _need(x: DeviceArray, name: str, shape, dtype) -> None:
    if not isinstance(x, DeviceArray) or x.shape != tuple(shape) or x.dtype != np.dtype(dtype):
        got = (x.shape, x.dtype) if isinstance(x, DeviceArray) else type(x).__name__
        raise DsxError(f"{name}: expected a DeviceArray {tuple(shape)} {np.dtype(dtype)}, got {got}")


def gemm_workspace_bytes(m: int, n: int, k: int, algo: int = 0, experts: int | None = None) -> int:
    out = I64(0)
    if experts is None:
        rc = _fn("dsx_gemm_fp8_nt_workspace_cuda", I64, I64, I64, I32, P)(m, n, k, algo, ctypes.byref(out))
    else:
        fn = _fn("dsx_gemm_fp8_grouped_nt_contiguous_workspace_cuda", I64, I64, I64, I64, I32, P)
        rc = fn(experts, m, n, k, algo, ctypes.byref(out))
    check(rc, f"gemm workspace query (algo {algo})")
    return out.value


def tuned_tables(on: bool | None = None) -> bool:
    """Whether the automatic choices of the block FP8 and weight-only GEMMs consult their measured tables
    (csrc/cuda/*_tuned.inc); with `on`, switch them for the process (DSX_TUNED_TABLES=0 starts it with them
    off). Returns the state before the call: dsx_tuned_tables_cuda."""
    return process_switch(_fn("dsx_tuned_tables_cuda", I32), on, "tuned tables switch")


def rules_only():
    """The measured tables off inside a with-block (the hand-written rules alone decide), as before after."""
    return switched(tuned_tables, False)


# the cards the measured tables are measured on (dsx.h: dsx_tuned_card_cuda's codes)
CARDS = {"h200": 1, "h100": 2}
_CARD_NAMES = {0: None, **{v: k for k, v in CARDS.items()}, 3: "none"}


def tuned_card(card: str | None = "") -> str | None:
    """The card whose measured tables the automatic choices use, forced for the process ("h200" / "h100"; None:
    judged by each device again; "": only ask, the default). Returns the setting before the call (None: judged by
    the device): dsx_tuned_card_cuda."""
    if card not in ("", None, *CARDS):
        raise DsxError(f"tuned tables card: {card!r} is none of {', '.join(CARDS)}")
    code = -1 if card == "" else CARDS.get(card, 0)
    rc = _fn("dsx_tuned_card_cuda", I32)(code)
    if rc < 0:
        check(rc, "tuned tables card")
    return _CARD_NAMES[rc]


def device_card() -> str:
    """The card the current device counts as for the measured tables now ("h200", "h100", or "none": its SM count
    is no table's), forced by tuned_card or judged by its SM count and memory bandwidth: dsx_device_card_cuda."""
    out = I32(0)
    check(_fn("dsx_device_card_cuda", P)(ctypes.byref(out)), "device card")
    return _CARD_NAMES[out.value]


def as_card(card: str | None):
    """tuned_card(card) inside a with-block, the setting before after it (also when the block raises)."""
    return switched(tuned_card, card)


def gemm_fp8_resolve(m: int, n: int, k: int, algo: int = 0) -> int:
    """The algo word an automatic launch runs as on this GPU (the measured table's, where it lists the
    launch; else algo itself): dsx_gemm_fp8_nt_resolve_cuda."""
    out = I32(0)
    check(_fn("dsx_gemm_fp8_nt_resolve_cuda", I64, I64, I64, I32, P)(m, n, k, algo, ctypes.byref(out)),
          f"gemm_fp8 resolve (algo {algo})")
    return out.value


def gemm_fp8_nt_device(a, sa, b, sb, out, *, workspace=None, algo=0, stream=None) -> None:
    """out[M, N] bf16 (as uint16) = a[M, K] e4m3 (uint8) x b[N, K]^T with block scales."""
    m, k = a.shape
    n = b.shape[0]
    kb, nb = K.cdiv(k, 128), K.cdiv(n, 128)
    for x, nm, shp, dt in ((a, "a", (m, k), np.uint8), (sa, "sa", (m, kb), np.float32), (b, "b", (n, k), np.uint8),
                           (sb, "sb", (nb, kb), np.float32), (out, "out", (m, n), np.uint16)):
        _need(x, nm, shp, dt)
    ws_ptr, ws_bytes = (workspace.ptr, workspace.nbytes) if workspace is not None else (None, 0)
    fn = _fn("dsx_gemm_fp8_nt_cuda", P, P, P, P, P, I64, I64, I64, P, I64, I32, P)
    check(fn(a.ptr, sa.ptr, b.ptr, sb.ptr, out.ptr, m, n, k, ws_ptr, ws_bytes, algo, _h(stream)), "gemm_fp8_nt_cuda")


def gemm_fp8_grouped_device(a, sa, b, sb, offsets, out, *, workspace=None, algo=0, stream=None) -> None:
    """Grouped GEMM on device arrays; offsets is a device int32 [E+1] array."""
    m, k = a.shape
    e, n, _ = b.shape
    kb, nb = K.cdiv(k, 128), K.cdiv(n, 128)
    for x, nm, shp, dt in ((a, "a", (m, k), np.uint8), (sa, "sa", (m, kb), np.float32), (b, "b", (e, n, k), np.uint8),
                           (sb, "sb", (e, nb, kb), np.float32), (offsets, "offsets", (e + 1,), np.int32),
                           (out, "out", (m, n), np.uint16)):
        _need(x, nm, shp, dt)
    ws_ptr, ws_bytes = (workspace.ptr, workspace.nbytes) if workspace is not None else (None, 0)
    fn = _fn("dsx_gemm_fp8_grouped_nt_contiguous_cuda", P, P, P, P, P, I64, P, I64, I64, I64, P, I64, I32, P)
    rc = fn(a.ptr, sa.ptr, b.ptr, sb.ptr, offsets.ptr, e, out.ptr, m, n, k, ws_ptr, ws_bytes, algo, _h(stream))
    check(rc, "gemm_fp8_grouped_nt_contiguous_cuda")


def act_quant_fp8_device(x, q, s, *, stream=None) -> None:
    m, k = x.shape
    _need(x, "x", (m, k), np.uint16)
    _need(q, "q", (m, k), np.uint8)
    _need(s, "s", (m, K.cdiv(k, 128)), np.float32)
    check(_fn("dsx_act_quant_fp8_cuda", P, P, P, I64, I64, P)(x.ptr, q.ptr, s.ptr, m, k, _h(stream)), "act_quant_fp8_cuda")


def mtp_accept_greedy_device(draft, target, num_draft, accepted, count, *, stream=None) -> None:
    bsz, k = draft.shape
    for x, nm, shp, dt in ((target, "target", (bsz, k + 1), draft.dtype), (num_draft, "num_draft", (bsz,), np.int32),
                           (accepted, "accepted", (bsz, k + 1), draft.dtype), (count, "count", (bsz,), np.int32)):
        _need(x, nm, shp, dt)
    if draft.dtype not in (np.int32, np.int64):
        raise DsxError(f"draft: expected int32 or int64 tokens, got {draft.dtype}")
    name = "dsx_mtp_accept_greedy_i32_cuda" if draft.dtype == np.int32 else "dsx_mtp_accept_greedy_i64_cuda"
    fn = _fn(name, P, P, P, P, P, I64, I64, P)
    check(fn(draft.ptr, target.ptr, num_draft.ptr, accepted.ptr, count.ptr, bsz, k, _h(stream)), name)


def mtp_accept_topp_device(draft, candidates, num_candidates, sampled, num_draft, accepted, count, *,
                           stream=None) -> None:
    bsz, k = draft.shape
    c = candidates.shape[2] if len(candidates.shape) == 3 else 0
    for x, nm, shp, dt in ((candidates, "candidates", (bsz, k + 1, c), draft.dtype),
                           (num_candidates, "num_candidates", (bsz, k + 1), np.int32),
                           (sampled, "sampled", (bsz, k + 1), draft.dtype), (num_draft, "num_draft", (bsz,), np.int32),
                           (accepted, "accepted", (bsz, k + 1), draft.dtype), (count, "count", (bsz,), np.int32)):
        _need(x, nm, shp, dt)
    if draft.dtype not in (np.int32, np.int64):
        raise DsxError(f"draft: expected int32 or int64 tokens, got {draft.dtype}")
    name = "dsx_mtp_accept_topp_i32_cuda" if draft.dtype == np.int32 else "dsx_mtp_accept_topp_i64_cuda"
    fn = _fn(name, P, P, P, P, P, P, P, I64, I64, I64, P)
    check(fn(draft.ptr, candidates.ptr, num_candidates.ptr, sampled.ptr, num_draft.ptr, accepted.ptr, count.ptr,
             bsz, k, c, _h(stream)), name)


# ---- numpy conveniences: upload, run, download (synchronous) ----

def gemm_fp8_nt(a, sa, b, sb, *, algo: int = 0) -> np.ndarray:
    a, sa, b, sb, m, n, k = K.check_gemm_nt(a, sa, b, sb)
    out = empty((m, n), np.uint16).fill_bytes(0xFF)  # poison: every element must be written
    ws_bytes = gemm_workspace_bytes(m, n, k, algo)
    ws = empty((ws_bytes,), np.uint8) if ws_bytes else None
    dev = [to_device(x) for x in (a, sa, b, sb)]  # kept alive until the download syncs
    gemm_fp8_nt_device(*dev, out, workspace=ws, algo=algo)
    return out.numpy().view(K.BF16)


def gemm_fp8_grouped_nt_contiguous(a, sa, b, sb, offsets, *, algo: int = 0) -> np.ndarray:
    a, sa, b, sb, off, e, m, n, k = K.check_gemm_grouped(a, sa, b, sb, offsets)
    out = empty((m, n), np.uint16).fill_bytes(0xFF)
    ws_bytes = gemm_workspace_bytes(m, n, k, algo, experts=e)
    ws = empty((ws_bytes,), np.uint8) if ws_bytes else None
    dev = [to_device(x) for x in (a, sa, b, sb, off)]
    gemm_fp8_grouped_device(*dev, out, workspace=ws, algo=algo)
    return out.numpy().view(K.BF16)


def act_quant_fp8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """bf16 [M, K] -> (float8_e4m3fn [M, K], float32 scales [M, ceil(K/128)]), scale = amax/448."""
    if not isinstance(x, np.ndarray) or x.dtype != K.BF16 or x.ndim != 2 or x.shape[1] == 0:
        raise DsxError(f"x: expected a bfloat16 [M, K] array with K > 0, got {getattr(x, 'dtype', type(x))} {getattr(x, 'shape', '')}")
    m, k = x.shape
    q = empty((m, k), np.uint8).fill_bytes(0xFF)
    s = empty((m, K.cdiv(k, 128)), np.float32).fill_bytes(0xFF)
    xd = to_device(np.ascontiguousarray(x).view(np.uint16))
    act_quant_fp8_device(xd, q, s)
    return q.numpy().view(K.FP8), s.numpy()


def mtp_accept_greedy(draft, target, num_draft) -> tuple[np.ndarray, np.ndarray]:
    draft, target, nd, bsz, k, dt = K.check_mtp(draft, target, num_draft)
    acc = empty((bsz, k + 1), dt).fill_bytes(0x7F)
    cnt = empty((bsz,), np.int32).fill_bytes(0x7F)
    dev = [to_device(x) for x in (draft, target, nd)]
    mtp_accept_greedy_device(*dev, acc, cnt)
    return acc.numpy(), cnt.numpy()


def mtp_accept_topp(draft, candidates, num_candidates, sampled, num_draft) -> tuple[np.ndarray, np.ndarray]:
    draft, cand, nc, sampled, nd, bsz, k, c, dt = K.check_mtp_topp(draft, candidates, num_candidates, sampled,
                                                                    num_draft)
    acc = empty((bsz, k + 1), dt).fill_bytes(0x7F)
    cnt = empty((bsz,), np.int32).fill_bytes(0x7F)
    dev = [to_device(x) for x in (draft, cand, nc, sampled, nd)]
    mtp_accept_topp_device(*dev, acc, cnt)
    return acc.numpy(), cnt.numpy()
