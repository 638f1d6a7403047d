"""dsx tiny: write the bundled tiny DeepSeek-V3 checkpoint (no network)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ds_export.cli.options import Json, Quiet
from ds_export.cli.output import Out
from ds_export.errors import Interrupted, UsageError
from ds_export.units import human_bytes


def tiny(
    out_dir: Annotated[Path, typer.Argument(help="Directory to create (must be empty or absent).", show_default=False)],
    dtype: Annotated[str, typer.Option("--dtype", help="fp8 (the official block-scaled layout) or bf16.")] = "fp8",
    real_dims: Annotated[bool, typer.Option("--real-dims", help="DeepSeek-V3's real tensor dimensions "
                                            "(hidden 7168, vocab 129280, ...) with few layers/experts: several GB, for benchmarks.")] = False,
    layers: Annotated[int | None, typer.Option("--layers", help="Override num_hidden_layers.")] = None,
    experts: Annotated[int | None, typer.Option("--experts", help="Override n_routed_experts.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Values depend only on the seed and tensor names.")] = 0,
    shard_mb: Annotated[float | None, typer.Option("--shard-mb", help="Target shard size in MiB (default: about 1/5 of the model).")] = None,
    workers: Annotated[int | None, typer.Option("--workers", "-j", help="Processes writing shards at once (default: one per core for "
                                                "checkpoints of 256 MiB or more, else 1); the bytes do not depend on it.")] = None,
    json: Json = False,
    quiet: Quiet = False,
) -> None:
    """Write a small but faithful DeepSeek-V3 checkpoint: official names, sharded safetensors, FP8 128x128
    block scales (ragged edges included), bf16 norms/embeddings, an MTP layer, tokenizer and configs.

    Examples:
      dsx tiny build/tiny
      dsx tiny build/tiny-bf16 --dtype bf16
      dsx tiny build/real --real-dims --layers 2 --experts 8
    """
    from ds_export.tiny import TinySpec, write_tiny

    out = Out(json, quiet)
    if workers is not None and workers < 1:
        raise UsageError("--workers must be at least 1")
    spec = TinySpec("real-dims" if real_dims else "tiny", dtype, seed, layers, experts, shard_mb)
    try:
        res = write_tiny(out_dir, spec, workers=workers)
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted; {out_dir} holds an incomplete checkpoint (no index)",
                          hint="remove it and rerun") from None
    res.pop("config")
    out.result(res)
    out.print(f"wrote {res['tensors']} tensors in {res['shards']} shards ({human_bytes(res['bytes'])}) to {out_dir}")
