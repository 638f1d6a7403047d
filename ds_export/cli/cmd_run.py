"""dsx run (issue: recipes). Options are final; the implementation lands with that issue."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ds_export.cli.options import DryRun, Json, Quiet
from ds_export.errors import NotImplementedYet


def run(
    recipe: Annotated[Path, typer.Argument(help="A recipe, e.g. recipes/tiny.yaml.", show_default=False)],
    workdir: Annotated[Path | None, typer.Option("--workdir", help="Where every step writes (default: ./dsx-work/<recipe>).")] = None,
    from_step: Annotated[str | None, typer.Option("--from-step", help="download | quantize | export | verify.")] = None,
    until_step: Annotated[str | None, typer.Option("--until-step", help="Stop after this step.")] = None,
    dry_run: DryRun = False,
    json: Json = False,
    quiet: Quiet = False,
) -> None:
    """Run a whole deployment from a recipe: download -> quantize (base + MTP) -> export -> verify, resuming
    from whatever is already complete and verified.

    Examples:
      dsx run recipes/tiny.yaml
      dsx run recipes/r1-wint4-tp8.yaml --dry-run
    """
    raise NotImplementedYet("dsx run is not implemented yet")
