"""dsx download: parse options, call `ds_export.download.download`, show progress and the summary."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ds_export.cli.options import Json, Quiet
from ds_export.cli.output import Out
from ds_export.cli.progress import DownloadBar
from ds_export.units import human_bytes


def download(
    repo_id: Annotated[str, typer.Argument(help="Hugging Face repo id, e.g. deepseek-ai/DeepSeek-R1.", show_default=False)],
    revision: Annotated[str, typer.Option("--revision", help="Branch, tag or commit; resolved to a commit once and pinned.")] = "main",
    local_dir: Annotated[Path | None, typer.Option("--local-dir", help="Target directory (default: ./<repo name>).")] = None,
    only: Annotated[str, typer.Option("--only", help="all | base | mtp | config: select shards by role from the index.")] = "all",
    include: Annotated[list[str] | None, typer.Option("--include", help="Extra glob of files to fetch (repeatable).")] = None,
    exclude: Annotated[list[str] | None, typer.Option("--exclude", help="Glob of files to skip (repeatable).")] = None,
    workers: Annotated[int, typer.Option("--workers", "-j", help="Files downloaded in parallel.")] = 8,
    verify: Annotated[bool, typer.Option("--verify/--no-verify", help="Check sizes, sha256 and safetensors headers.")] = True,
    replace: Annotated[bool, typer.Option("--replace", help="Fetch again, in place, files already in --local-dir "
                                          "that no dsx download recorded and that differ from the hub's (without "
                                          "it they stop the run: another checkpoint's files are never deleted).")] = False,
    json: Json = False,
    quiet: Quiet = False,
) -> None:
    """Fetch a checkpoint that is complete, sha256-verified and resumable across crashes (HTTP Range).

    The endpoint comes from HF_ENDPOINT (mirrors work), the token from HF_TOKEN or `hf auth login`.
    Rerun the same command after an interruption: finished files are kept, partial ones continue.

    Examples:
      dsx download deepseek-ai/DeepSeek-R1 --local-dir /data/DeepSeek-R1
      dsx download deepseek-ai/DeepSeek-R1 --only mtp --local-dir /data/R1-mtp
      dsx download deepseek-ai/DeepSeek-R1 --only config --local-dir /data/R1-meta --json
    """
    from ds_export.download import Interrupted, Options, download as run_download

    o = Out(json, quiet)
    target = local_dir if local_dir is not None else Path(repo_id.rstrip("/").split("/")[-1])
    opts = Options(revision=revision, only=only, include=tuple(include or ()), exclude=tuple(exclude or ()),
                   workers=workers, verify=verify, replace=replace)
    try:
        with DownloadBar(o) as rep:
            res = run_download(repo_id, target, opts, rep)
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted; finished and partial files stay in {target}",
                          hint="rerun the same command to resume") from None
    o.result(res)
    n_new = len(res["downloaded"])
    o.print(f"{res['repo_id']}@{res['commit'][:12]} -> {res['local_dir']}: {res['files']} files "
            f"({human_bytes(res['bytes_total'])}); fetched {n_new}, already complete {res['already_complete']}, "
            f"{human_bytes(res['bytes_downloaded'])} in {res['seconds']:.1f} s"
            + (f", resumed {len(res['resumed'])}" if res["resumed"] else "")
            + (f", refetched after a mismatch {len(res['refetched'])}" if res["refetched"] else "")
            + ("" if res["verified"] else " (not verified: --no-verify)"))
