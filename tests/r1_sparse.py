"""A header-faithful DeepSeek-R1 checkpoint made of sparse files (no data, ~20 MB of headers on disk).

Every tensor of the real release (from the model map, which reproduces its
91,991 tensors exactly), packed into 163 shards in layer order with the MTP
layer in the last shards; data regions are holes. Good for planning, dry runs
and inspect at the real scale; reading tensor values gives zeros.
"""

from __future__ import annotations

import json
from pathlib import Path

from ds_export.io.writer import Entry, build_header, write_index
from ds_export.models import deepseek_v3 as ds
from ds_export.tiny import REAL_CONFIG

N_SHARDS = 163


def make_sparse_r1(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    cfg = ds.DeepseekV3Config.from_dict(REAL_CONFIG)
    ts = ds.expected_tensors(cfg)
    total = sum(t.nbytes for t in ts)
    base = [t for t in ts if not t.role.mtp]
    mtp = [t for t in ts if t.role.mtp]
    target = total / N_SHARDS
    groups: list[list[ds.ExpectedTensor]] = []
    cur, size = [], 0
    for t in base:
        cur.append(t)
        size += t.nbytes
        if size >= target and len(groups) < N_SHARDS - 5:
            groups.append(cur)
            cur, size = [], 0
    groups.append(cur)
    per = -(-len(mtp) // (N_SHARDS - len(groups)))
    groups += [mtp[i:i + per] for i in range(0, len(mtp), per)]
    n = len(groups)
    weight_map = {}
    for i, g in enumerate(groups):
        name = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        head = build_header([Entry(t.name, t.dtype, t.shape) for t in g], {"format": "pt"})
        with open(root / name, "wb") as f:
            f.write(head)
            f.truncate(len(head) + sum(t.nbytes for t in g))
        weight_map.update({t.name: name for t in g})
    (root / "config.json").write_text(json.dumps(REAL_CONFIG, indent=2))
    write_index(root, weight_map, total)
    return root
