"""Option types shared by every command (one definition, same spelling everywhere)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

Json = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout instead of tables.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing but errors.")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Print the plan and exit without writing anything.")]
Force = Annotated[bool, typer.Option("--force", help="Overwrite an output directory written by a different run.")]
OutDir = Annotated[Path, typer.Option("--out", "-o", help="Output directory.", show_default=False)]
Workers = Annotated[int | None, typer.Option("--workers", "-j", help="Shards converted at once (default: one per core; with --device cuda, worker processes: up to 4 a GPU, one per 4 cores).")]
Device = Annotated[str, typer.Option("--device", help="cpu or cuda.")]
