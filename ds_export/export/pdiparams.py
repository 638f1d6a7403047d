"""Paddle's combined parameter file (`model.pdiparams`), written one tensor at a time.

`paddle.jit.save` writes every persistable variable of the program, sorted by name, with
`save_combine`. Each tensor is (little-endian):

    uint32 0                     version
    uint64 0                     LoD levels (none for parameters)
    uint32 0                     tensor version
    int32  n                     size of the TensorDesc message
    n bytes                      VarType.TensorDesc: field 1 data_type (varint), field 2 dims
                                 (one varint per dimension, not packed)
    the raw row-major data

`write_params` produces the same bytes from (name, array-producing thunk) pairs without holding
more than one tensor, so a model bigger than memory can be saved layer by layer; `read_params`
parses a file back (tests compare both with Paddle's own output bit for bit).
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Callable, Iterable
from pathlib import Path

import ml_dtypes
import numpy as np

from ds_export.errors import DsxError
from ds_export.io.writer import WriteBehind, write_hashed

# VarType.Type values (paddle/fluid/framework/framework.proto)
DTYPES = {np.dtype(np.bool_): 0, np.dtype(np.int16): 1, np.dtype(np.int32): 2, np.dtype(np.int64): 3,
          np.dtype(np.float16): 4, np.dtype(np.float32): 5, np.dtype(np.float64): 6, np.dtype(np.uint8): 20,
          np.dtype(np.int8): 21, np.dtype(ml_dtypes.bfloat16): 22, np.dtype(ml_dtypes.float8_e4m3fn): 32}
NUMPY = {v: k for k, v in DTYPES.items()}


def _varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    try:
        code = DTYPES[np.dtype(dtype)]
    except KeyError:
        raise DsxError(f"pdiparams: dtype {dtype} has no Paddle VarType here") from None
    desc = b"\x08" + _varint(code) + b"".join(b"\x10" + _varint(int(d)) for d in shape)
    return struct.pack("<IQIi", 0, 0, 0, len(desc)) + desc


def write_params(path: str | os.PathLike, tensors: Iterable[tuple[str, Callable[[], np.ndarray], tuple, np.dtype]],
                 *, chunk: int = 64 << 20, written: Callable[[int], None] | None = None,
                 hashed: Callable[[str], None] | None = None, behind: int | None = None) -> int:
    """Write (name, thunk, shape, dtype) in the given order (Paddle's: sorted by name); returns bytes.

    Each thunk is called once, its array checked against the declared shape and dtype, written,
    and dropped; written(n): told each tensor's bytes once they are written (in the caller's thread); hashed(hex):
    the file's sha256, of the bytes as they were written (the manifest records it without reading the file again).

    Write-behind: one writer thread writes a tensor (and one more hashes it beside the writes: io.writer.write_hashed)
    while the caller's thread makes the next one (all release the GIL: hashlib and file writes on large buffers,
    numpy's casts and the native kernels), so an export costs about the largest of the three instead of their sum.
    At most two tensors are alive, and two only while their bytes together stay within `behind` (default: the largest
    declared tensor's bytes, at least 64 MiB, so the peak stays about the synchronous writer's; larger pairs take
    turns; 0: never overlap). The first failure of either side stops the file; a failed write surfaces at the next
    tensor.
    """
    tensors = list(tensors)  # (the thunks stay lazy)
    sizes = [int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize for _, _, shape, dtype in tensors]
    if behind is None:
        behind = max([64 << 20] + sizes)
    sha = hashlib.sha256()
    with open(path, "wb") as f:
        def put(arr: np.ndarray) -> None:  # (the writer thread's part; it hashes in one more thread as it writes)
            write_hashed(f.write, sha, header(arr.dtype, arr.shape))
            write_hashed(f.write, sha, arr.reshape(-1).view(np.uint8), chunk)

        writer = WriteBehind(put, depth=1, name="dsx-pdiparams")
        pending = None  # (the bytes of the tensor in the writer's hands)

        def settle() -> None:
            nonlocal pending
            writer.flush()
            if pending is not None and written is not None:
                written(pending)
            pending = None

        try:
            for (name, thunk, shape, dtype), size in zip(tensors, sizes):
                if (pending or 0) + size > behind:
                    settle()  # (the pair would not fit: the previous tensor first)
                arr = np.ascontiguousarray(thunk())
                if tuple(arr.shape) != tuple(shape) or arr.dtype != np.dtype(dtype):
                    raise DsxError(f"pdiparams: {name} produced {arr.dtype} {list(arr.shape)}, the program declares "
                                   f"{np.dtype(dtype)} {list(shape)}")
                settle()
                writer.put(arr)
                pending = arr.nbytes
                del arr
            settle()
        finally:
            writer.drain()
        total = f.tell()
    if hashed is not None:
        hashed(sha.hexdigest())
    return total


def read_params(path: str | os.PathLike) -> list[np.ndarray]:
    """All tensors of a combined file, in file order (for tests and inspection)."""
    b = Path(path).read_bytes()
    off, out = 0, []
    while off < len(b):
        _, lod, _, n = struct.unpack_from("<IQIi", b, off)
        if lod:
            raise DsxError(f"{path}: a tensor with LoD levels at byte {off}: not a parameter file")
        off += 20
        desc, off = b[off:off + n], off + n
        i, code, dims = 0, None, []
        while i < len(desc):
            tag = desc[i]
            i += 1
            v, sh = 0, 0
            while True:
                c = desc[i]
                i += 1
                v |= (c & 0x7F) << sh
                sh += 7
                if not c & 0x80:
                    break
            if tag == 0x08:
                code = v
            elif tag == 0x10:
                dims.append(v)
        dt = NUMPY[code]
        size = int(np.prod(dims, dtype=np.int64)) * dt.itemsize
        out.append(np.frombuffer(b, dt, size // dt.itemsize, off).reshape(dims))
        off += size
    return out
