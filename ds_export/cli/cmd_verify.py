"""dsx verify (issue: verify). Options are final; the implementation lands with that issue."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ds_export.cli.options import Device, Json, Quiet
from ds_export.errors import NotImplementedYet


def verify(
    target: Annotated[Path, typer.Argument(help="A converted checkpoint (or export) to check.", show_default=False)],
    reference: Annotated[Path | None, typer.Option("--reference", help="The source checkpoint to compare weights with.")] = None,
    export_dir: Annotated[Path | None, typer.Option("--export", help="An exported model to run end to end.")] = None,
    device: Device = "cpu",
    samples: Annotated[int, typer.Option("--samples", help="Layers sampled for kernel numerics.")] = 4,
    report: Annotated[Path | None, typer.Option("--report", help="Write a JSON report.")] = None,
    html: Annotated[Path | None, typer.Option("--html", help="Write an HTML report with plots.")] = None,
    gate: Annotated[Path | None, typer.Option("--gate", help="YAML file of pass/fail thresholds.")] = None,
    json: Json = False,
    quiet: Quiet = False,
) -> None:
    """Prove a conversion is intact (sizes, sha256, tensors, config) and numerically sound (weights, kernels,
    logits). Exit code 0 only when every gate passes.

    Examples:
      dsx verify build/tiny-mix --reference build/tiny
      dsx verify /data/R1-wint4 --reference /data/DeepSeek-R1 --device cuda --html report.html
    """
    raise NotImplementedYet("dsx verify is not implemented yet")
