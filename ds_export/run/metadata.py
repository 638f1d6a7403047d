"""Header-faithful stand-ins for a checkpoint known only by its config.json and index.

`materialize_sparse` writes every shard of the index with its real safetensors
header (shapes and dtypes from the model map) and a hole for data: planning,
dry runs and inspect then see the real checkpoint's layout at no disk cost.
`synthesize_index` makes an index for a config when none is at hand (shards in
layer order, the MTP layer in the last ones).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from ds_export.errors import CheckpointError
from ds_export.io.checkpoint import INDEX_NAME
from ds_export.io.writer import Entry, build_header, write_index
from ds_export.models import deepseek_v3 as ds

# Metadata shipped with dsx for the checkpoints its recipes deploy (config.json as released; the index generated from
# the model map, shards as in the release): dry runs of those recipes plan offline without --metadata.
BUNDLED = {"deepseek-ai/DeepSeek-R1": Path(__file__).resolve().parents[1] / "data" / "deepseek-r1"}


def synthesize_index(config: dict, n_shards: int = 163) -> dict[str, str]:
    cfg = ds.DeepseekV3Config.from_dict(config)
    ts = ds.expected_tensors(cfg)
    target = sum(t.nbytes for t in ts) / n_shards
    base, mtp = [t for t in ts if not t.role.mtp], [t for t in ts if t.role.mtp]
    n_mtp = max(1, min(n_shards // 30, len(mtp))) if mtp else 0
    groups, cur, size = [], [], 0
    for t in base:
        cur.append(t)
        size += t.nbytes
        if size >= target and len(groups) < n_shards - n_mtp - 1:
            groups.append(cur)
            cur, size = [], 0
    groups.append(cur)
    if mtp:
        per = -(-len(mtp) // n_mtp)
        groups += [mtp[i:i + per] for i in range(0, len(mtp), per)]
    n = len(groups)
    return {t.name: f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i, g in enumerate(groups) for t in g}


def read_index(path: Path) -> dict:
    """model.safetensors.index.json, or its .gz."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def materialize_sparse(config: dict, weight_map: dict[str, str], out: Path) -> Path:
    """config.json + index + sparse shards with real headers in `out` (which must not hold shards)."""
    cfg = ds.DeepseekV3Config.from_dict(config)
    expected = {t.name: t for t in ds.expected_tensors(cfg)}
    unknown = sorted(set(weight_map) - set(expected))
    if unknown:
        raise CheckpointError(f"index names {unknown[0]} (and {len(unknown) - 1} more), which the config does "
                              "not describe")
    out.mkdir(parents=True, exist_ok=True)
    by_file: dict[str, list] = {}
    for name, f in weight_map.items():
        by_file.setdefault(f, []).append(expected[name])
    total = 0
    for f, ts in sorted(by_file.items()):
        head = build_header([Entry(t.name, t.dtype, t.shape) for t in ts], {"format": "pt"})
        data = sum(t.nbytes for t in ts)
        with open(out / f, "wb") as fh:
            fh.write(head)
            fh.truncate(len(head) + data)
        total += data
    (out / "config.json").write_text(json.dumps(config, indent=2))
    write_index(out, weight_map, total)
    return out


def sparse_from_metadata(src: Path, out: Path) -> Path:
    """A metadata-only source (config.json + index[.gz], no shards) as a sparse checkpoint in `out`."""
    idx = next((p for p in (src / INDEX_NAME, src / (INDEX_NAME + ".gz")) if p.exists()), None)
    if idx is None:
        raise CheckpointError(f"{src}: no {INDEX_NAME}(.gz) to plan from")
    config = json.loads((src / "config.json").read_text())
    return materialize_sparse(config, read_index(idx)["weight_map"], out)
