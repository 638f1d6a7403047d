"""dsx export (issue: export). Options are final; the implementation lands with that issue."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ds_export.cli.options import Force, Json, OutDir, Quiet
from ds_export.errors import NotImplementedYet


def export(
    src: Annotated[Path, typer.Argument(help="A `dsx quantize` output or an original checkpoint.", show_default=False)],
    out: OutDir = Path("export"),
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel degree: writes rank_{r}/ per rank.")] = 1,
    speculate: Annotated[bool, typer.Option("--speculate", help="Also export the MTP draft into OUT/mtp/.")] = False,
    dtype: Annotated[str, typer.Option("--dtype", help="bfloat16 | float16 | float32.")] = "bfloat16",
    max_seq_len: Annotated[int, typer.Option("--max-seq-len", help="Longest sequence the cache holds.")] = 8192,
    block_size: Annotated[int, typer.Option("--block-size", help="KV-cache page size in tokens.")] = 64,
    force: Force = False,
    json: Json = False,
    quiet: Quiet = False,
) -> None:
    """Write Paddle static-graph inference models (per TP rank) with MLA weight absorption, plus the MTP draft.

    Examples:
      dsx export build/tiny-mix --out build/tiny-export --speculate
      dsx export /data/R1-wint4 --out /data/R1-infer --tp 8 --speculate
    """
    raise NotImplementedYet("dsx export is not implemented yet")
