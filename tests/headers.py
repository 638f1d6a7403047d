"""Test helpers: change a tensor's declared dtype in its shard's header, bytes untouched, or some of its bytes (a
damaged or foreign checkpoint whose sizes still add up)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from ds_export.io.manifest import Manifest


def set_dtype(root: Path, tensor: str, dtype: str) -> Path:
    """Declare `tensor` as `dtype` (same item size) in the shard that holds it, and re-record that shard in the
    directory's dsx manifest if it has one (a converter's fault, not the disk's). Returns the shard."""
    index = json.loads((root / "model.safetensors.index.json").read_text())
    shard = root / index["weight_map"][tensor]
    raw = shard.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header[tensor]["dtype"] = dtype
    body = json.dumps(header).encode()
    body += b" " * (-len(body) % 8)
    shard.write_bytes(struct.pack("<Q", len(body)) + body + raw[8 + n:])
    m = Manifest.load(root)
    if m is not None and shard.name in m.files:
        m.record_file(shard.name)
    return shard


def set_bytes(root: Path, tensor: str, at: int, value: bytes) -> Path:
    """Overwrite `value` at byte `at` of `tensor`'s data, re-recording the shard in the dsx manifest if there is one.
    Returns the shard."""
    index = json.loads((root / "model.safetensors.index.json").read_text())
    shard = root / index["weight_map"][tensor]
    raw = bytearray(shard.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    off = 8 + n + json.loads(raw[8:8 + n])[tensor]["data_offsets"][0] + at
    raw[off:off + len(value)] = value
    shard.write_bytes(bytes(raw))
    m = Manifest.load(root)
    if m is not None and shard.name in m.files:
        m.record_file(shard.name)
    return shard
