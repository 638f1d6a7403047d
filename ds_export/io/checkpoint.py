"""A Hugging Face sharded safetensors checkpoint: index + shards + config.

`Checkpoint.open(dir)` validates everything up front (index entries, every
shard header, index <-> header agreement) so no work starts on a source that
would fail hours later. Tensors are then read lazily, zero-copy.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ds_export.errors import CheckpointError
from ds_export.io.safetensors_file import SafetensorsFile, TensorInfo
from ds_export.values import is_int

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


def _load_json(path: Path, what: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: {what} not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: {what} is not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: {what} must be a JSON object")
    return obj


def _safe_shard_path(root: Path, rel: str, index: Path) -> Path:
    if not isinstance(rel, str) or not rel or os.path.isabs(rel):
        raise CheckpointError(f"{index}: weight_map entry {rel!r} is not a relative file name")
    try:
        p = (root / rel).resolve()
    except (RuntimeError, OSError) as e:  # (Python 3.11 raises RuntimeError for a symlink loop)
        raise CheckpointError(f"{root / rel}: cannot be resolved ({e}); expected a .safetensors file",
                              hint="replace the link with the file") from None
    if root.resolve() not in p.parents:
        raise CheckpointError(f"{index}: weight_map entry {rel!r} points outside the checkpoint directory")
    return p


@dataclass
class Checkpoint:
    root: Path
    config: dict
    shards: dict[str, SafetensorsFile]  # file name (relative) -> shard
    weight_map: dict[str, str]  # tensor name -> file name
    index_metadata: dict = field(default_factory=dict)
    missing_shards: list[str] = field(default_factory=list)  # with partial=True: listed but absent
    absent: dict[str, str] = field(default_factory=dict)  # with partial=True: the tensors of those (name -> file)

    @classmethod
    def open(cls, root: str | os.PathLike, *, need_config: bool = True, partial: bool = False) -> "Checkpoint":
        """partial: accept an index whose shards are not all present (e.g. `dsx download --only mtp`):
        the tensors of missing shards are dropped. Shards that are present are validated as always."""
        root = Path(root)
        if not root.is_dir():
            raise CheckpointError(f"{root}: not a directory", hint="pass a checkpoint directory with config.json")
        config = _load_json(root / "config.json", "config.json") if need_config or (root / "config.json").exists() else {}
        index_path = root / INDEX_NAME
        missing: list[str] = []
        absent: dict[str, str] = {}
        if index_path.exists():
            index = _load_json(index_path, "index")
            wm = index.get("weight_map")
            if not isinstance(wm, dict) or not wm:
                raise CheckpointError(f"{index_path}: missing or empty weight_map")
            files = sorted(set(wm.values()), key=str)
            missing = [rel for rel in files if not _safe_shard_path(root, rel, index_path).exists()]
            if missing and not partial:
                raise CheckpointError(f"{index_path}: lists {missing[0]}, which is missing"
                                      + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""),
                                      hint="the download is incomplete: rerun `dsx download`")
            if missing:
                files = [f for f in files if f not in missing]
                absent = {n: f for n, f in wm.items() if f in missing}
                wm = {n: f for n, f in wm.items() if f not in missing}
                if not files:
                    raise CheckpointError(f"{root}: none of the shards its index lists is present")
            shards = {rel: SafetensorsFile(root / rel) for rel in files}
            meta = index.get("metadata") or {}
            if not isinstance(meta, dict):
                raise CheckpointError(f"{index_path}: metadata is {type(meta).__name__} {meta!r:.40}, not a mapping",
                                      hint="the index is damaged: re-download it")
        elif (root / SINGLE_NAME).exists():
            shards = {SINGLE_NAME: SafetensorsFile(root / SINGLE_NAME)}
            wm = {name: SINGLE_NAME for name in shards[SINGLE_NAME].tensors}
            meta = {}
        else:
            raise CheckpointError(f"{root}: neither {INDEX_NAME} nor {SINGLE_NAME} found")
        ck = cls(root, config, shards, dict(wm), meta, missing, absent)
        ck._cross_check()
        return ck

    def _cross_check(self) -> None:
        seen: dict[str, str] = {}
        for rel, shard in self.shards.items():
            for name in shard.tensors:
                if name in seen:
                    raise CheckpointError(f"{self.root}: tensor {name!r} is stored in both {seen[name]} and {rel}")
                seen[name] = rel
                if self.weight_map.get(name) != rel:
                    raise CheckpointError(
                        f"{self.root / rel}: holds tensor {name!r} which the index maps to {self.weight_map.get(name)}")
        for name, rel in self.weight_map.items():
            if name not in seen:
                raise CheckpointError(f"{self.root / rel}: index lists tensor {name!r} but the shard does not hold it")
        total = self.index_metadata.get("total_size")
        if total is not None and not is_int(total):
            raise CheckpointError(f"{self.root / INDEX_NAME}: metadata.total_size is {total!r:.40}, not a byte count",
                                  hint="the index is damaged: re-download it")
        if isinstance(total, int) and not self.missing_shards:
            have = sum(t.nbytes for s in self.shards.values() for t in s.tensors.values())
            if total != have:
                raise CheckpointError(f"{self.root / INDEX_NAME}: metadata.total_size is {total}, tensors sum to {have}")

    # --- access -------------------------------------------------------------
    def names(self) -> list[str]:
        return list(self.weight_map)

    def __contains__(self, name: str) -> bool:
        return name in self.weight_map

    def shard_of(self, name: str) -> SafetensorsFile:
        try:
            return self.shards[self.weight_map[name]]
        except KeyError:
            raise CheckpointError(f"{self.root}: no tensor named {name!r}") from None

    def info(self, name: str) -> TensorInfo:
        return self.shard_of(name).info(name)

    def get(self, name: str) -> np.ndarray:
        return self.shard_of(name).get(name)

    def raw(self, name: str) -> np.ndarray:
        return self.shard_of(name).raw(name)

    def infos(self) -> list[TensorInfo]:
        return [self.info(n) for n in self.weight_map]

    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.infos())

    def close(self) -> None:
        for s in self.shards.values():
            s.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
