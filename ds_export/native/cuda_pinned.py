"""Pinned (page-locked) host memory and stream ordering, on top of ds_export.native.cuda.

ds_export.native.cuda loads the CUDA runtime and offers device arrays, streams and
events; this module adds what an overlapped host <-> device pipeline also needs:
``PinnedBuffer`` (cudaHostAlloc / cudaFreeHost, with numpy views), asynchronous
copies between raw addresses, ``stream_wait_event`` and ``event_synchronize``.
Copies from and to pinned memory run on the copy engines at full PCIe speed and
truly asynchronously; from pageable memory they would not.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from ds_export.native import cuda

P, SZ, U32 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint


@functools.lru_cache(maxsize=1)
def _rt():
    """The runtime functions this module uses, bound on their own function objects."""
    rt = cuda.cudart()
    sigs = {
        "cudaHostAlloc": ([ctypes.POINTER(P), SZ, U32], ctypes.c_int),
        "cudaFreeHost": ([P], ctypes.c_int),
        "cudaStreamWaitEvent": ([P, P, U32], ctypes.c_int),
        "cudaEventSynchronize": ([P], ctypes.c_int),
        "cudaMemcpyAsync": ([P, P, SZ, ctypes.c_int, P], ctypes.c_int),
        "cudaMemsetAsync": ([P, ctypes.c_int, SZ, P], ctypes.c_int),
    }
    fns = {}
    for name, (args, res) in sigs.items():
        fn = ctypes.CFUNCTYPE(res, *args)((name, rt))
        fns[name] = fn
    return fns


class PinnedBuffer:
    """``nbytes`` of page-locked host memory; ``view(dtype, shape, offset)`` gives numpy views.

    Views do not keep the buffer alive: the owner keeps the PinnedBuffer while they are used.
    """

    def __init__(self, nbytes: int):
        self.nbytes = int(nbytes)
        p = P()
        cuda.rt_check(_rt()["cudaHostAlloc"](ctypes.byref(p), max(self.nbytes, 1), 0), f"cudaHostAlloc({self.nbytes})")
        self.ptr = p.value
        self._bytes = np.ctypeslib.as_array((ctypes.c_uint8 * max(self.nbytes, 1)).from_address(self.ptr))

    def view(self, dtype, shape, offset: int = 0) -> np.ndarray:
        dtype = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        end = offset + count * dtype.itemsize
        if offset < 0 or end > self.nbytes:
            raise ValueError(f"pinned view [{offset}, {end}) outside the {self.nbytes}-byte buffer")
        return self._bytes[offset:end].view(dtype).reshape(shape)

    def __del__(self):
        if getattr(self, "ptr", None):
            _rt()["cudaFreeHost"](self.ptr)
            self.ptr = None


def memcpy_async(dst: int, src: int, nbytes: int, kind: int, stream: cuda.Stream) -> None:
    """cudaMemcpyAsync between raw addresses (kind: cuda.H2D, cuda.D2H, cuda.D2D)."""
    if nbytes:
        cuda.rt_check(_rt()["cudaMemcpyAsync"](dst, src, nbytes, kind, stream.handle), "cudaMemcpyAsync")


def memset_async(dst: int, value: int, nbytes: int, stream: cuda.Stream) -> None:
    if nbytes:
        cuda.rt_check(_rt()["cudaMemsetAsync"](dst, value, nbytes, stream.handle), "cudaMemsetAsync")


def stream_wait_event(stream: cuda.Stream, event: cuda.Event) -> None:
    """Work queued on ``stream`` after this call waits for ``event``'s recorded work."""
    cuda.rt_check(_rt()["cudaStreamWaitEvent"](stream.handle, event.handle, 0), "cudaStreamWaitEvent")


def event_synchronize(event: cuda.Event) -> None:
    """Block the calling thread (the GIL released) until ``event``'s work is done."""
    cuda.rt_check(_rt()["cudaEventSynchronize"](event.handle), "cudaEventSynchronize")
