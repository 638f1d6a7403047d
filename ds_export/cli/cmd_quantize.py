"""dsx quantize: parse options, plan the conversion, run it shard by shard under a progress bar, print the
summary."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ds_export.cli.options import Device, DryRun, Force, Json, OutDir, Quiet, Workers
from ds_export.cli.output import Out
from ds_export.cli.progress import QuantizeBar
from ds_export.errors import UsageError
from ds_export.units import human_bytes


def quantize(
    src: Annotated[Path, typer.Argument(help="Source checkpoint (official FP8 or bf16).", show_default=False)],
    out: OutDir = Path("out"),
    type_: Annotated[str | None, typer.Option("--type", help="bf16 | weight_only_int8 | weight_only_int4 | a8w8_fp8 | a8w8_fp8_wint4.")] = None,
    arch: Annotated[int | None, typer.Option("--arch", help="Paddle weight-only layout: 80, 89 or 90 (default 90).")] = None,
    group_size: Annotated[int | None, typer.Option("--group-size", help="-1 (per channel, default), 64 or 128.")] = None,
    mtp_type: Annotated[str | None, typer.Option("--mtp-type", help="Quant type of the MTP layer(s) (default: --type).")] = None,
    mtp_only: Annotated[bool, typer.Option("--mtp-only", help="Write only the MTP draft.")] = False,
    no_mtp: Annotated[bool, typer.Option("--no-mtp", help="Write only the base model.")] = False,
    recipe: Annotated[Path | None, typer.Option("--recipe", help="YAML recipe of rules (see docs/recipes.md).")] = None,
    workers: Workers = None,
    num_nodes: Annotated[int | None, typer.Option("--num-nodes", help="Split the shards over this many nodes sharing --out "
                                                  "(default: PADDLE_TRAINERS_NUM or 1).")] = None,
    node_rank: Annotated[int | None, typer.Option("--node-rank", help="This node's rank (default: PADDLE_TRAINER_ID or 0).")] = None,
    memory_mb: Annotated[int, typer.Option("--memory-mb", help="Scratch memory for row chunks, over all workers (MiB).")] = 768,
    device: Device = "cpu",
    gpus: Annotated[str | None, typer.Option("--gpus", help="With --device cuda: GPU indices, e.g. 0,1 (default: all "
                                             "visible). Up to 4 worker processes per GPU (--workers sets the total); output identical to the CPU path.")] = None,
    dry_run: DryRun = False,
    force: Force = False,
    json: Json = False,
    quiet: Quiet = False,
) -> None:
    """Convert weights shard by shard in bounded memory, byte-identical to Paddle's layouts, resumable.

    Examples:
      dsx quantize /data/DeepSeek-R1 --out /data/R1-wint4 --type weight_only_int4 --mtp-type weight_only_int8
      dsx quantize build/tiny --out build/tiny-mix --type a8w8_fp8_wint4 --dry-run
    """
    from ds_export.io.checkpoint import Checkpoint
    from ds_export.io.manifest import require_finished
    from ds_export.quant import engine, plan as plan_mod

    o = Out(json, quiet)
    if mtp_only and no_mtp:
        raise UsageError("--mtp-only and --no-mtp exclude each other")
    from ds_export.quant.backend import parse_gpus

    gpu_ids = parse_gpus(device, gpus)
    if memory_mb < 16:
        raise UsageError("--memory-mb must be at least 16")
    if workers is not None and workers < 1:
        raise UsageError("--workers must be at least 1")
    n_nodes, rank = engine.node_from_env(num_nodes, node_rank)
    rec = plan_mod.load_recipe(type_, recipe, arch=arch, group_size=group_size, mtp_type=mtp_type)
    # --mtp-only works on a partial source too (e.g. `dsx download --only mtp`).
    require_finished(src, "dsx quantize")
    with Checkpoint.open(src, partial=mtp_only) as ck:
        p = plan_mod.build(ck, rec, selection="mtp" if mtp_only else "base" if no_mtp else "all")
        if dry_run:
            o.result(p.to_json())
            _print_plan(o, p)
            return
        rep = QuantizeBar(o)
        with rep:
            res = engine.run(ck, p, out, engine.Options(workers=workers, force=force, memory_budget=memory_mb << 20,
                                                         num_nodes=n_nodes, node_rank=rank,
                                                         gpus=tuple(gpu_ids)), rep)
    res["seconds"] = rep.elapsed()
    o.result(res)
    if not res["complete"]:
        o.print(f"node {rank} of {n_nodes}: its {res['shards']} shards are done; the output is published when the "
                "last node finishes")
        return
    _print_summary(o, p)
    o.print(f"wrote {res['shards']} shards to {out} ({human_bytes(res['bytes_out'])}; converted {res['converted']}, "
            f"verified and kept {res['skipped']}) in {res['seconds']:.1f} s, "
            f"{res['bytes_in'] / max(res['seconds'], 1e-9) / 1e9:.2f} GB/s of input")


def _print_summary(o: Out, p) -> None:
    """The final table: what each target type got, in and out."""
    from rich.table import Table

    rows: dict[str, list] = {}
    for t in p.tasks():
        r = rows.setdefault(_label(t), [0, 0, 0])
        r[0] += 1
        r[1] += t.bytes_in
        r[2] += t.bytes_out
    tab = Table(title=f"{p.recipe['name']}" + (f" (MTP: {p.recipe['mtp']})" if p.recipe.get("mtp") else ""),
                show_edge=False)
    for c in ("written as", "tensors", "bytes in", "bytes out"):
        tab.add_column(c, justify="left" if c == "written as" else "right")
    for label, (n, bi, bo) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
        tab.add_row(label, str(n), human_bytes(bi), human_bytes(bo))
    o.print(tab)


def _print_plan(o: Out, p) -> None:
    from rich.table import Table

    from ds_export.models.deepseek_v3 import ROLES

    order = {r: i for i, r in enumerate(ROLES)}
    rows: dict[tuple, list] = {}
    for t in p.tasks():
        k = (t.mtp, order[t.role], ("mtp:" if t.mtp else "") + t.role, t.src_dtype, _label(t))
        r = rows.setdefault(k, [0, 0, 0])
        r[0] += 1
        r[1] += t.bytes_in
        r[2] += t.bytes_out
    tab = Table(title=f"plan: {p.recipe['name']} on {p.source} ({p.selection})", show_edge=False)
    for c in ("role", "source", "target", "tensors", "bytes in", "bytes out"):
        tab.add_column(c, justify="right" if c in ("tensors", "bytes in", "bytes out") else "left")
    for (_, _, role, sd, tt), (n, bi, bo) in sorted(rows.items()):
        tab.add_row(role, sd, tt, str(n), human_bytes(bi), human_bytes(bo))
    o.print(tab)
    o.print(f"{len(p.shards)} output shards, {human_bytes(p.bytes_in)} in, {human_bytes(p.bytes_out)} out; "
            f"plan {p.digest()[:12]}")


def _label(t) -> str:
    tt = t.target.type
    if tt.startswith("weight_only"):
        g = t.target.group_size
        tt = tt.replace("weight_only_", "w") + (" per-channel" if g == -1 else f" g{g}") + f" sm{t.target.arch}"
    return tt + (" (copy)" if t.passthrough else "")
