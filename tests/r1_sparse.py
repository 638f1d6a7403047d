"""The DeepSeek-R1 metadata dsx ships (ds_export/data/deepseek-r1) as a header-faithful sparse checkpoint."""

from __future__ import annotations

from pathlib import Path

from ds_export.run.metadata import BUNDLED, sparse_from_metadata

N_SHARDS = 163
R1_METADATA = BUNDLED["deepseek-ai/DeepSeek-R1"]


def make_sparse_r1(root: Path) -> Path:
    return sparse_from_metadata(R1_METADATA, root)
