"""dsx verify: parse options, call `ds_export.verify.verify` (progress bars on a terminal), print the report; a
failure exits non-zero."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ds_export.cli.options import Device, Json, Quiet
from ds_export.cli.output import Out
from ds_export.cli.progress import VerifyBar
from ds_export.errors import DsxError, UsageError


def verify(
    target: Annotated[Path, typer.Argument(help="A converted checkpoint (or export) to check.", show_default=False)],
    reference: Annotated[Path | None, typer.Option("--reference", help="The source checkpoint to compare weights with.")] = None,
    export_dir: Annotated[Path | None, typer.Option("--export", help="An exported model to run end to end.")] = None,
    device: Device = "cpu",
    samples: Annotated[int, typer.Option("--samples", help="Layers sampled for kernel numerics.")] = 4,
    experts: Annotated[int | None, typer.Option("--experts", help="Routed experts checked per layer (default: all).")] = None,
    report: Annotated[Path | None, typer.Option("--report", help="Write a JSON report.")] = None,
    html: Annotated[Path | None, typer.Option("--html", help="Write an HTML report with plots.")] = None,
    gate: Annotated[Path | None, typer.Option("--gate", help="YAML file of pass/fail thresholds.")] = None,
    workers: Annotated[int | None, typer.Option("--workers", "-j", help="Threads hashing files and comparing weights "
                                                "(default: one per core, at most 16).", show_default=False)] = None,
    json: Json = False,
    quiet: Quiet = False,
) -> None:
    """Prove a conversion is intact (sizes, sha256, tensors, config) and numerically sound (weights, kernels,
    logits). Exit code 0 only when every gate passes.

    Examples:
      dsx verify build/tiny-mix --reference build/tiny
      dsx verify /data/R1-wint4 --reference /data/DeepSeek-R1 --device cuda --html report.html
    """
    from ds_export.io.writer import atomic_write_json, check_file_target
    from ds_export.verify import verify as run_verify

    o = Out(json, quiet)
    if workers is not None and workers < 1:
        raise UsageError("--workers must be at least 1")
    if export_dir is not None and reference is None:
        raise UsageError("--export needs --reference (the unquantized logits come from the reference checkpoint)")
    for path, option in ((report, "--report"), (html, "--html")):
        check_file_target(path, option)
    from ds_export.verify import load_gates

    gates = load_gates(gate) if gate is not None else None
    with VerifyBar(o) as progress:
        rep = run_verify(target, reference, expert_sample=experts, samples=samples, gates=gates, export=export_dir,
                         device=device, workers=workers, progress=progress)
    if report is not None:
        atomic_write_json(report, rep)
    if html is not None:
        from ds_export.io.writer import atomic_write_text
        from ds_export.verify.html import render

        atomic_write_text(html, render(rep))
    o.result(rep)
    if o.human:
        _print(o, rep)
    if not rep["ok"]:
        first = rep["findings"][0] if rep["findings"] else None
        bad = [w for w in rep["weights"] if not w["ok"]]
        kbad = [k for k in rep["kernels"] if not k["ok"]]
        if first:
            what = f"{first['where']}: {first['problem']}"
        elif rep.get("e2e") and not rep["e2e"]["ok"]:
            e = rep["e2e"]
            what = (f"export {export_dir}: KL {e['kl_mean']:.3f} (max {e['max_kl']}), top-1 agreement "
                    f"{e['top1_agreement']:.2f} (min {e['min_top1']}) against the reference logits")
        elif bad:
            what = _weight_problem(bad[0])
        else:
            what = (f"{kbad[0]['kernel']} on {kbad[0]['tensor']}: error {kbad[0]['kernel_err']:.2e} vs float64 on its "
                    "own inputs (a kernel or layout bug)")
        n = len(rep["findings"]) + len(bad) + len(kbad) + int(bool(rep.get("e2e")) and not rep["e2e"]["ok"])
        raise DsxError(f"verify failed ({n} problem{'s' if n > 1 else ''}); first: {what}",
                       hint=_NOT_SOURCE if bad and rep.get("reference_is_source") is False else None)


_NOT_SOURCE = ("--reference is not the checkpoint this output was converted from (its index and headers differ "
               "from the fingerprint dsx quantize recorded): pass that checkpoint")


def _weight_problem(w: dict) -> str:
    if w.get("problem"):
        return f"{w['name']}: {w['problem']}"
    sq = "-inf" if w["sqnr_db"] is None else f"{w['sqnr_db']:.1f}"  # (None here: a reference of zeros)
    if w["gate"] == float("inf"):
        return (f"{w['name']}: stored in the source's format ({w['format']}) but not bit-identical to it (SQNR "
                f"{sq} dB); quantize it again, or check --reference")
    return f"{w['name']}: SQNR {sq} dB below the {w['format']} gate of {w['gate']:g} dB"


def _print(o: Out, rep: dict) -> None:
    from rich.table import Table

    for f in rep["findings"]:
        o.print(f"[red]FAIL[/] {f['check']}: {f['where']}: {f['problem']}")
    if rep.get("reference_is_source") is False:
        o.print("[yellow]note[/]: the reference's index and headers differ from those of the source this output was "
                "converted from (a resharded copy, or another checkpoint); the weights are compared tensor by tensor")
    if rep["by_format"]:
        t = Table(title="weights vs reference (min SQNR per format and role; `exact` = bit-identical; bytes: the "
                        "stored bytes against dsx's conversion of the reference)", show_edge=False)
        for c in ("format", "role", "n", "SQNR dB", "gate", "min cos", "bytes", "ok"):
            t.add_column(c, justify="left" if c in ("format", "role") else "right")
        for g in rep["by_format"].values():
            sq = (f"{g['min_sqnr_db']:.1f}" if g["min_sqnr_db"] is not None
                  else "exact" if g["exact"] == g["tensors"] else "-")
            gate = "exact" if g["gate_db"] == float("inf") else f">={g['gate_db']:.0f}"
            t.add_row(_short(g["format"]), g["role"], str(g["tensors"]), sq, gate,
                      "-" if g["min_cosine"] is None else f"{g['min_cosine']:.4f}",
                      f"[red]{g['differ']} differ[/]" if g.get("differ") else "same" if g.get("reproduced") else "-",
                      "[green]ok[/]" if not g["failed"] else f"[red]{g['failed']} bad[/]")
        o.print(t)
    if rep["kernels"]:
        t = Table(title=f"kernels (csrc, {rep.get('device', 'cpu').upper()}): error vs float64 on the kernel's own "
                        "inputs, and quantization SQNR",
                  show_edge=False)
        for c in ("kernel", "tensor", "kernel err", "quant SQNR dB", "ok"):
            t.add_column(c, justify="left" if c in ("kernel", "tensor") else "right")
        for k in rep["kernels"]:
            sq = "-" if k["quant_sqnr_db"] is None else f"{k['quant_sqnr_db']:.1f}"
            t.add_row(k["kernel"], k["tensor"].replace("model.layers.", "L"), f"{k['kernel_err']:.1e}", sq,
                      "[green]ok[/]" if k["ok"] else "[red]FAIL[/]")
        o.print(t)
    if rep.get("e2e"):
        e = rep["e2e"]
        o.print(f"end to end on {e['tokens']} tokens: KL {e['kl_mean']:.4f}, top-1 agreement {e['top1_agreement']:.2f}, "
                f"perplexity {e['ppl_export']:.2f} vs {e['ppl_reference']:.2f} (delta {e['ppl_delta']:+.2f})"
                + (f", MTP acceptance {e['mtp_acceptance_rate']:.0%}" if "mtp_acceptance_rate" in e else ""))
    if not rep["ok"]:
        o.print("[red]verify: FAILED[/]")
        return
    checked = rep.get("checked") or []
    o.print(f"[green]verify: all checks passed[/] ({', '.join(checked)})")
    if "weights" not in checked:
        o.print("[yellow]note[/]: integrity only; the weights, kernels and logits need --reference SOURCE (the "
                "checkpoint it was converted from; --export DIR adds the logits)")


def _short(fmt: str) -> str:
    return {"a8w8_fp8": "fp8", "weight_only_int8": "int8", "weight_only_int4": "int4", "float32": "fp32",
            "weight_only_int8/g": "int8 grp", "weight_only_int4/g": "int4 grp"}.get(fmt, fmt)
