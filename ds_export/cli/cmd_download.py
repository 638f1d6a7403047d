"""dsx download (issue: download). Options are final; the implementation lands with that issue."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ds_export.cli.options import Json, Quiet, Workers
from ds_export.errors import NotImplementedYet


def download(
    repo_id: Annotated[str, typer.Argument(help="Hugging Face repo id, e.g. deepseek-ai/DeepSeek-R1.", show_default=False)],
    revision: Annotated[str, typer.Option("--revision", help="Branch, tag or commit; resolved to a commit once and pinned.")] = "main",
    local_dir: Annotated[Path | None, typer.Option("--local-dir", help="Target directory (default: ./<repo name>).")] = None,
    only: Annotated[str, typer.Option("--only", help="all | base | mtp | config: select shards by role from the index.")] = "all",
    include: Annotated[list[str] | None, typer.Option("--include", help="Extra glob of files to fetch (repeatable).")] = None,
    exclude: Annotated[list[str] | None, typer.Option("--exclude", help="Glob of files to skip (repeatable).")] = None,
    workers: Workers = None,
    verify: Annotated[bool, typer.Option("--verify/--no-verify", help="Check sizes, sha256 and safetensors headers.")] = True,
    json: Json = False,
    quiet: Quiet = False,
) -> None:
    """Fetch a checkpoint that is complete, sha256-verified and resumable across crashes (HTTP Range).

    Examples:
      dsx download deepseek-ai/DeepSeek-R1 --local-dir /data/DeepSeek-R1
      dsx download deepseek-ai/DeepSeek-R1 --only mtp --local-dir /data/R1-mtp
    """
    raise NotImplementedYet("dsx download is not implemented yet")
