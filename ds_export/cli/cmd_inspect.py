"""dsx inspect: summarize a checkpoint from its headers."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ds_export.cli.options import Json, Quiet
from ds_export.cli.output import Out
from ds_export.units import human_bytes


def inspect(
    path: Annotated[Path, typer.Argument(help="Checkpoint directory (config.json + index + shards).", show_default=False)],
    json: Json = False,
    quiet: Quiet = False,
) -> None:
    """Summarize a DeepSeek-V3 checkpoint: layers, experts, MTP, dtypes and bytes per role, quantization.
    Every header is validated and every tensor name mapped to its role; anything unknown is an error.
    A dsx export is summarized from its manifest and config (source, quant type, dtype, tp, speculation).

    Examples:
      dsx inspect build/tiny
      dsx inspect /data/DeepSeek-R1 --json
    """
    from ds_export.inspect import summarize

    out = Out(json, quiet)
    s = summarize(path)
    out.result(s)
    if not out.human:
        return
    if s.get("kind") == "export":
        out.print(f"[bold]{s['path']}[/]: a dsx export{'' if s['complete'] else ' [red](not complete)[/]'} of "
                  f"{s['source']}: {s['quant_type']}, {s['num_hidden_layers']} layers, {s['dtype']}, "
                  f"tp {s['tensor_parallel_degree']}, max_seq_len {s['max_seq_len']}, block {s['block_size']}")
        spec = (f"{s['speculate']}, {s['draft_tokens']} draft token(s), draft {s['mtp_quant_type']}"
                if s["speculate"] else "none")
        out.print(f"speculation: {spec}" + (f"; custom ops {s['custom_ops']}" if s["custom_ops"] else ""))
        out.print(f"{s['files']} files, {human_bytes(s['total_bytes'])}")
        return
    qc = s["quantization_config"]
    if not qc:
        qdesc = "none (unquantized)"
    elif qc.get("quant_method") == "dsx":
        qdesc = (f"dsx {qc.get('quant_type')} (MTP: {qc.get('mtp_quant_type')}), selection {qc.get('selection')}"
                 + (f", weight-only arch {qc['weightonly_arch']} group {qc['weightonly_group_size']}"
                    if "weightonly_arch" in qc else ""))
    else:
        qdesc = ", ".join(f"{k}={v}" for k, v in qc.items())
    out.print(f"[bold]{s['path']}[/]: {s['architecture']} ({s['model_type']}), {s['num_hidden_layers']} layers, "
              f"{s['experts_present']}/{s['routed_experts']} routed experts, MTP layers {s['mtp_layers'] or 'none'}")
    out.print(f"quantization: {qdesc}")
    t = Table(show_edge=False)
    for col, just in (("role", "left"), ("dtypes", "left"), ("tensors", "right"), ("params", "right"), ("bytes", "right")):
        t.add_column(col, justify=just)
    for r in s["roles"]:
        t.add_row(r["role"], r["dtypes"], str(r["tensors"]), f"{r['params']:,}", human_bytes(r["bytes"]))
    out.print(t)
    if s["missing_shards"]:
        out.print(f"[yellow]partial checkpoint[/]: {s['missing_shards']} shards listed in the index are absent "
                  "(e.g. `dsx download --only mtp`); only the tensors present are summarized")
    out.print(f"{s['tensors']} tensors in {s['shards']} shards, {s['params']:,} parameters, {human_bytes(s['total_bytes'])}")
