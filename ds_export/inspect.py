"""`dsx inspect`: what a checkpoint holds, by role, computed from headers only."""

from __future__ import annotations

from pathlib import Path

from ds_export.io.checkpoint import Checkpoint
from ds_export.io.dtypes import SHORT
from ds_export.models import deepseek_v3 as ds


def summarize(path: str | Path) -> dict:
    export = summarize_export(path)
    if export is not None:
        return export
    with Checkpoint.open(path, partial=True) as ck:
        cfg = ds.DeepseekV3Config.from_dict(ck.config, source=str(Path(path) / "config.json"))
        infos = {t.name: t for t in ck.infos()}
        # (every tensor the index lists: in a partial checkpoint a present scale's weight may be in an absent shard)
        roles = ds.map_tensors(list(infos) + list(ck.absent), cfg, source=str(path))
        ds.check_fp8_partners(roles, {n: t.dtype for n, t in infos.items()}, source=str(path))
        ds.check_shapes({n: t.shape for n, t in infos.items() if t.dtype != "I8"}, cfg, source=str(path))  # (I8: packed)
        ds.check_block_scales(roles, {n: (t.dtype, tuple(t.shape)) for n, t in infos.items()},
                              cfg.fp8_block or ds.FP8_BLOCK, source=str(path))
        by_role: dict[tuple[bool, str], dict] = {}
        order = {r: i for i, r in enumerate(ds.ROLES)}
        for n, t in infos.items():
            r = roles[n]
            ent = by_role.setdefault((r.mtp, r.role), {"tensors": 0, "bytes": 0, "params": 0, "dtypes": set()})
            ent["bytes"] += t.nbytes
            if r.kind in ("scale_inv", "scale"):
                ent["dtypes"].add(f"{SHORT.get(t.dtype, t.dtype)} scale")
                continue
            ent["tensors"] += 1
            ent["params"] += t.numel
            ent["dtypes"].add(SHORT.get(t.dtype, t.dtype))
        types = (ck.config.get("quantization_config") or {}).get("types_by_role") or {}
        for (mtp, role), ent in by_role.items():
            t = types.get(("mtp." if mtp else "") + role, {}).get("type")
            if t == "weight_only_int4" and "int8" in ent["dtypes"]:  # two nibbles per int8 byte
                ent["dtypes"] = {"int4 (packed in int8)" if d == "int8" else d for d in ent["dtypes"]}
                ent["params"] *= 2
        experts = {r.expert for r in roles.values() if r.expert is not None}
        mtp_layers = sorted({r.layer for r in roles.values() if r.mtp})
        rows = [{"role": ("mtp:" if mtp else "") + role, **v, "dtypes": " + ".join(sorted(v["dtypes"], key=lambda d: ("scale" in d, d)))}
                for (mtp, role), v in sorted(by_role.items(), key=lambda kv: (kv[0][0], order[kv[0][1]]))]
        return {
            "path": str(path),
            "architecture": (ck.config.get("architectures") or ["?"])[0],
            "model_type": ck.config.get("model_type"),
            "num_hidden_layers": cfg.num_hidden_layers,
            "routed_experts": cfg.n_routed_experts,
            "experts_present": len(experts),
            "mtp_layers": mtp_layers,
            "quantization_config": ck.config.get("quantization_config"),
            "shards": len(ck.shards),
            "missing_shards": len(ck.missing_shards),
            "tensors": len(infos),
            "total_bytes": sum(t.nbytes for t in infos.values()),
            "params": sum(r["params"] for r in by_role.values()),
            "roles": rows,
        }


def summarize_export(path: str | Path) -> dict | None:
    """A dsx export's summary from its manifest and config.json (it holds programs, not safetensors); None for
    anything else."""
    import json

    from ds_export.io.manifest import export_manifest

    path = Path(path)
    m = export_manifest(path)
    if m is None:
        return None
    cfg = json.loads((path / "config.json").read_text()) if (path / "config.json").is_file() else {}
    mtp = path / "mtp" / "config.json"
    mcfg = json.loads(mtp.read_text()) if mtp.is_file() else {}
    return {"kind": "export", "path": str(path), "complete": m.complete, "source": m.run.get("source"),
            "dtype": cfg.get("infer_model_dtype", m.run.get("dtype")),
            "tensor_parallel_degree": cfg.get("tensor_parallel_degree", m.run.get("tp")),
            "num_hidden_layers": cfg.get("num_hidden_layers"), "quant_type": cfg.get("quant_type"),
            "max_seq_len": cfg.get("infer_model_max_seq_len"), "block_size": cfg.get("infer_model_block_size"),
            "speculate": cfg.get("speculate_method"), "draft_tokens": cfg.get("speculate_max_draft_token_num"),
            "mtp_quant_type": mcfg.get("quant_type") if mcfg else None, "custom_ops": cfg.get("dsx_custom_ops"),
            "files": len(m.files), "total_bytes": sum(int(e.get("size", 0)) for e in m.files.values())}
