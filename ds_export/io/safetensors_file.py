"""A lazy, validating reader for one .safetensors file.

Layout (the safetensors spec): an 8-byte little-endian header length N, N
bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__":
{str: str}}, then the data region; offsets are relative to the data region.

We parse the header ourselves, validate all of it before any tensor is used,
and map tensors zero-copy from an mmap: reading a tensor never loads the
shard, and the pages it touches are file pages the kernel can drop.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ds_export.errors import CheckpointError
from ds_export.io.dtypes import ST_TO_NP, itemsize

MAX_HEADER = 100 * 1024 * 1024  # the official library's limit


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # safetensors dtype name, e.g. "F8_E4M3"
    shape: tuple[int, ...]
    begin: int  # absolute file offset of the first byte
    end: int  # absolute file offset past the last byte
    file: Path

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def _bad(path: Path, what: str) -> CheckpointError:
    return CheckpointError(f"{path}: {what}", hint="the file is corrupt or truncated: re-download or regenerate it")


def read_header(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str], int]:
    """Parse and validate a header. Returns (tensors, metadata, data_start)."""
    path = Path(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise _bad(path, f"file is {size} bytes, too short for a safetensors header")
            (hlen,) = struct.unpack("<Q", head)
            if hlen > MAX_HEADER or hlen + 8 > size:
                raise _bad(path, f"header length {hlen} is impossible for a file of {size} bytes")
            raw = f.read(hlen)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise CheckpointError(f"{path}: is a directory, expected a .safetensors file") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _bad(path, f"header is not valid JSON ({e.__class__.__name__})") from None
    if not isinstance(header, dict):
        raise _bad(path, "header is not a JSON object")
    data_start = 8 + hlen
    data_len = size - data_start
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise _bad(path, "__metadata__ must map strings to strings")
    tensors: dict[str, TensorInfo] = {}
    for name, ent in header.items():
        tensors[name] = _parse_entry(path, name, ent, data_start, data_len)
    _check_coverage(path, tensors, data_start, data_len)
    return tensors, meta, data_start


def _parse_entry(path: Path, name: str, ent, data_start: int, data_len: int) -> TensorInfo:
    if not isinstance(ent, dict) or not {"dtype", "shape", "data_offsets"} <= ent.keys():
        raise _bad(path, f"tensor {name!r}: entry needs dtype, shape and data_offsets")
    dtype, shape, offs = ent["dtype"], ent["shape"], ent["data_offsets"]
    if dtype not in ST_TO_NP:
        raise _bad(path, f"tensor {name!r}: unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise _bad(path, f"tensor {name!r}: shape {shape!r} is not a list of non-negative integers")
    if (not isinstance(offs, list) or len(offs) != 2 or not all(isinstance(o, int) for o in offs)
            or not 0 <= offs[0] <= offs[1]):
        raise _bad(path, f"tensor {name!r}: data_offsets {offs!r} are not [begin, end] with begin <= end")
    expect = itemsize(dtype)
    for d in shape:
        expect *= d
    if offs[1] - offs[0] != expect:
        raise _bad(path, f"tensor {name!r}: {dtype} {shape} needs {expect} bytes, data_offsets span {offs[1] - offs[0]}")
    if offs[1] > data_len:
        raise _bad(path, f"tensor {name!r}: data ends at byte {offs[1]} of a {data_len}-byte data region (truncated file?)")
    return TensorInfo(name, dtype, tuple(shape), data_start + offs[0], data_start + offs[1], path)


def _check_coverage(path: Path, tensors: dict[str, TensorInfo], data_start: int, data_len: int) -> None:
    """Tensors must not overlap, and (as the spec requires) must cover the data region exactly."""
    pos = data_start
    for t in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if t.begin < pos:
            raise _bad(path, f"tensor {t.name!r} overlaps the tensor before it")
        if t.begin > pos:
            raise _bad(path, f"{t.begin - pos} unaccounted bytes before tensor {t.name!r}")
        pos = t.end
    if pos != data_start + data_len:
        raise _bad(path, f"{data_start + data_len - pos} bytes after the last tensor that no header entry describes")


class SafetensorsFile:
    """One validated shard. Tensors are numpy views into a read-only mmap."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.tensors, self.metadata, self.data_start = read_header(self.path)
        self._mm: mmap.mmap | None = None

    def _map(self) -> mmap.mmap:
        if self._mm is None:
            with open(self.path, "rb") as f:
                if os.fstat(f.fileno()).st_size == 0:
                    raise _bad(self.path, "empty file")
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return self._mm

    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise CheckpointError(f"{self.path}: no tensor named {name!r}") from None

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a uint8 view (no copy)."""
        t = self.info(name)
        return np.frombuffer(self._map(), dtype=np.uint8, count=t.nbytes, offset=t.begin)

    def get(self, name: str) -> np.ndarray:
        """The tensor as a typed numpy view (bf16/fp8 through ml_dtypes), no copy."""
        t = self.info(name)
        arr = np.frombuffer(self._map(), dtype=ST_TO_NP[t.dtype], count=t.numel, offset=t.begin)
        return arr.reshape(t.shape)

    def advise_done(self, name: str) -> None:
        """Tell the kernel we are done with a tensor's pages (keeps page cache pressure low)."""
        if self._mm is None:
            return
        t = self.info(name)
        page = mmap.PAGESIZE
        start = (t.begin // page) * page
        try:
            self._mm.madvise(mmap.MADV_DONTNEED, start, t.end - start)
        except (AttributeError, OSError, ValueError):
            pass

    def close(self) -> None:
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                # numpy views still alive: leave the map to the garbage collector.
                pass
            self._mm = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
