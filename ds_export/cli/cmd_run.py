"""dsx run: load a recipe and run `ds_export.run.pipeline` (the long steps with their commands' progress bars),
then print the steps' report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ds_export.cli.options import DryRun, Json, Quiet
from ds_export.cli.output import Out
from ds_export.units import human_bytes


def run(
    recipe: Annotated[Path, typer.Argument(help="A recipe, e.g. recipes/tiny.yaml.", show_default=False)],
    workdir: Annotated[Path | None, typer.Option("--workdir", help="Where every step writes (default: ./dsx-work/<recipe>).")] = None,
    from_step: Annotated[str | None, typer.Option("--from-step", help="download | quantize | export | verify.")] = None,
    until_step: Annotated[str | None, typer.Option("--until-step", help="Stop after this step.")] = None,
    metadata: Annotated[Path | None, typer.Option("--metadata", help="With --dry-run: plan from a config.json + "
                                                  "model.safetensors.index.json[.gz] instead of a download "
                                                  "(DeepSeek-R1's come with dsx).")] = None,
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
    from ds_export.run import pipeline
    from ds_export.run.recipe import load

    o = Out(json, quiet)
    dep = load(recipe)
    wd = workdir or Path("dsx-work") / dep.name
    if dry_run:
        plan = pipeline.dry_run(dep, wd, metadata=metadata)
        o.result(plan)
        _print_dry(o, plan)
        return
    res = pipeline.run(dep, wd, from_step=from_step, until_step=until_step, say=o.print, progress=_reporters(o))
    o.result(res)
    if o.human:
        _print_report(o, res)
    o.print(f"[green]{dep.name}: done[/] ({', '.join(res['steps'])}) in {wd}")


def _reporters(o: Out):
    """The progress bars of the steps that have one: those of dsx download, quantize, export and verify."""
    from ds_export.cli.progress import DownloadBar, ExportBar, QuantizeBar, VerifyBar

    bars = {"download": DownloadBar, "quantize": QuantizeBar, "export": ExportBar, "verify": VerifyBar}

    def progress(step: str):
        return bars[step](o) if step in bars else None
    return progress


def _summary(step: str, r: dict) -> str:
    """One line of what a step did, from its result."""
    if r.get("skipped"):
        return "already complete, kept"
    if step == "download":
        if "tensors" in r:
            return f"tiny checkpoint: {r['tensors']} tensors, {human_bytes(r.get('bytes', 0))}"
        return f"{r.get('files')} files at commit {str(r.get('commit', ''))[:12]}"
    if step == "quantize":
        return f"{r.get('shards')} shards ({r.get('converted')} converted)"
    if step == "export":
        return f"{r.get('files')} files, {human_bytes(r.get('bytes', 0))}"
    if step == "verify":
        e = r.get("e2e") or {}
        return f"{r.get('weights')} weights, {r.get('kernels')} kernel checks passed" + (
            f"; KL {e['kl_mean']:.3f}, top-1 {e['top1_agreement']:.2f}" if e else "")
    if step == "generate":
        acc = r.get("acceptance_rate")
        return f"{len(r['tokens'][0])} tokens" + (f", acceptance {acc:.0%}" if acc is not None else "") + (
            f" on {r['ranks']} ranks" if r.get("ranks", 1) > 1 else "")
    return ", ".join(f"{k} {v}" for k, v in r.items() if isinstance(v, (int, float, str)))[:80]


def _print_report(o: Out, res: dict) -> None:
    from rich.table import Table

    t = Table(title=f"{res['recipe']}: final report", show_edge=False)
    for c in ("step", "seconds", "result"):
        t.add_column(c, justify="right" if c == "seconds" else "left")
    for step, r in res["steps"].items():
        t.add_row(step, f"{res['seconds'].get(step, 0):.1f}", _summary(step, r))
    t.add_row("total", f"{res['seconds'].get('total', 0):.1f}", "")
    o.print(t)


def _print_dry(o: Out, p: dict) -> None:
    from ds_export.run.pipeline import MEASURED_GBPS

    q, e = p["quantize"], p["export"]
    o.print(f"[bold]{p['recipe']}[/] ({p['source']}) in {p['workdir']}; planned from {p['planned_from']}")
    o.print(f"  download: {human_bytes(p['download_bytes'])}")
    o.print(f"  quantize: {q['type']} (MTP: {q['mtp'] or 'not kept'}), {human_bytes(q['bytes_in'])} -> "
            f"{human_bytes(q['bytes_out'])} in {q['shards']} shards, about {p['estimated_quantize_s'] / 60:.0f} min "
            f"at the measured {MEASURED_GBPS} GB/s")
    o.print(f"  export: tp {e['tp']}{' + MTP draft' if e['speculate'] else ''}: {', '.join(e['layout'][:3])}"
            f"{' ...' if len(e['layout']) > 3 else ''}; {human_bytes(max(e['bytes_per_rank']))} per rank")
    o.print(f"  disk: about {human_bytes(p['disk_bytes'])}")
    if p["serving"]:
        o.print("  serving: " + ", ".join(f"{k} {v}" for k, v in p["serving"].items()))
