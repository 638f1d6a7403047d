"""The DeepSeek-R1 metadata shipped in tests/data/deepseek-r1 as a header-faithful sparse checkpoint."""

from __future__ import annotations

from pathlib import Path

from ds_export.run.metadata import sparse_from_metadata

N_SHARDS = 163
R1_METADATA = Path(__file__).parent / "data" / "deepseek-r1"


def make_sparse_r1(root: Path) -> Path:
    return sparse_from_metadata(R1_METADATA, root)
