"""dsx export: parse options, call `ds_export.export.exporter.export` (each TP rank, and the MTP draft with
--speculate), print the summary."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ds_export.cli.options import Force, Json, OutDir, Quiet
from ds_export.cli.output import Out
from ds_export.cli.progress import ExportBar
from ds_export.errors import UsageError
from ds_export.units import human_bytes


def export(
    src: Annotated[Path, typer.Argument(help="A `dsx quantize` output or an original checkpoint.", show_default=False)],
    out: OutDir = Path("export"),
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel degree: writes rank_{r}/ per rank.")] = 1,
    speculate: Annotated[bool, typer.Option("--speculate", help="Also export the MTP draft into OUT/mtp/.")] = False,
    dtype: Annotated[str, typer.Option("--dtype", help="float32, bfloat16 or float16 (16-bit arithmetic is emulated on CPU: float32 math, rounded).")] = "float32",
    max_seq_len: Annotated[int, typer.Option("--max-seq-len", help="Longest sequence the cache holds (at most the model's max_position_embeddings, 163840 for V3/R1).")] = 4096,
    draft_tokens: Annotated[int | None, typer.Option("--draft-tokens", help="With --speculate: draft tokens per step the export is set up for (1..5; default 1).", show_default=False)] = None,
    block_size: Annotated[int, typer.Option("--block-size", help="KV-cache page size in tokens.")] = 64,
    workers: Annotated[int | None, typer.Option("--workers", "-j", help="Ranks exported at once for --tp > 1, each by a process of its own (default: as many as the cores and the available memory allow; 1: one after another).", show_default=False)] = None,
    force: Force = False,
    json: Json = False,
    quiet: Quiet = False,
) -> None:
    """Write Paddle static-graph inference models (per TP rank) with MLA weight absorption, plus the MTP draft.

    Examples:
      dsx export build/tiny-mix --out build/tiny-export --speculate
      dsx export /data/R1-wint4 --out /data/R1-infer --tp 8 --speculate
    """
    from ds_export.export.exporter import export as run_export

    o = Out(json, quiet)
    if draft_tokens is not None and not speculate:  # (it was ignored: the config says 0 draft tokens)
        raise UsageError(f"--draft-tokens {draft_tokens} without --speculate: an export without the MTP draft runs "
                         "no draft tokens", hint="add --speculate to export the draft, or leave --draft-tokens out")
    with ExportBar(o) as progress:
        res = run_export(src, out, dtype=dtype, max_seq_len=max_seq_len, block_size=block_size, tp=tp,
                         speculate=speculate, draft_tokens=1 if draft_tokens is None else draft_tokens, force=force,
                         workers=workers, progress=progress)
    o.result(res)
    o.print(f"exported {len(res['files'])} files ({human_bytes(res['bytes'])}) to {out}"
            + (" with the MTP draft in mtp/" if speculate else ""))
