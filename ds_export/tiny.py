"""`dsx tiny`: a small but faithful DeepSeek-V3 checkpoint, deterministic from a seed.

Same on-disk layout as the official release (shared/formats.md): real config
keys, several shards + index, FP8 e4m3 Linear weights with 128x128
`weight_scale_inv` (ragged edge blocks included), bf16 norms / embeddings /
lm_head / router, fp32 e_score_correction_bias, one MTP layer whose tensors sit
in the last shard, and weight / scale_inv pairs that straddle a shard boundary.
Tensor values depend only on (seed, tensor name), never on the write order.
"""

from __future__ import annotations

import copy
import difflib
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ds_export.errors import DsxError, UsageError
from ds_export.interrupt import Stopped, ignore_sigint, wait_for_workers
from ds_export.io.dirlock import exclusive
from ds_export.io.dtypes import ST_TO_NP
from ds_export.io.writer import Entry, ShardWriter, atomic_write_json, atomic_write_text, free_bytes, write_index
from ds_export.models import deepseek_v3 as ds
from ds_export.tiny_tokenizer import tokenizer_files
from ds_export.units import human_bytes

# The real DeepSeek-V3/R1 config (shared/deepseek-r1-catalog.md); presets override sizes only.
REAL_CONFIG: dict = {
    "architectures": [ds.ARCHITECTURE], "model_type": "deepseek_v3",
    "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                 "AutoModel": "modeling_deepseek.DeepseekV3Model",
                 "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"},
    "attention_bias": False, "attention_dropout": 0.0, "aux_loss_alpha": 0.001,
    "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3,
    "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "moe_intermediate_size": 2048,
    "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                                            "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                            "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": True,
    "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
    "transformers_version": "4.46.3", "use_cache": True, "v_head_dim": 128, "vocab_size": 129280,
}

# Every dim is a multiple of 64 (Paddle's weight-only kernels need it); kv_a (192 rows),
# q_a (192), moe_intermediate (192) and intermediate (320) give ragged 128x128 FP8 blocks.
TINY = dict(hidden_size=256, intermediate_size=320, moe_intermediate_size=192, num_hidden_layers=3,
            first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=192,
            kv_lora_rank=128, qk_nope_head_dim=64, qk_rope_head_dim=64, v_head_dim=64, vocab_size=512,
            n_routed_experts=16, n_group=4, topk_group=2, num_experts_per_tok=4, n_shared_experts=1)
# DeepSeek-V3's real per-tensor dimensions with few layers and experts (benchmarks).
# (groups of two experts at least: DeepSeek's router ranks a group by its two best)
REAL_DIMS = dict(num_hidden_layers=2, first_k_dense_replace=1, n_routed_experts=8, n_group=4, topk_group=4,
                 num_experts_per_tok=8)


@dataclass(frozen=True)
class TinySpec:
    preset: str = "tiny"  # "tiny" | "real-dims"
    dtype: str = "fp8"  # "fp8" | "bf16"
    seed: int = 0
    layers: int | None = None
    experts: int | None = None
    shard_mb: float | None = None
    overrides: tuple[tuple[str, object], ...] = ()  # extra config.json values, e.g. (("hidden_size", 2048),)


def make_config(spec: TinySpec) -> dict:
    cfg = copy.deepcopy(REAL_CONFIG)
    cfg.update(TINY if spec.preset == "tiny" else REAL_DIMS)
    unknown = [k for k, _ in spec.overrides if k not in cfg]
    if unknown:  # (a misspelt key was added to config.json and changed nothing: the checkpoint kept its sizes)
        near = difflib.get_close_matches(unknown[0], cfg, n=1)
        raise UsageError(f"tiny config: {unknown[0]!r} is not a key of DeepSeek-V3's config.json",
                         hint=f"did you mean {near[0]!r}?" if near else "see the keys of ds_export/data/deepseek-r1/"
                                                                       "config.json")
    cfg.update(dict(spec.overrides))
    if spec.layers is not None:
        if spec.layers < 1:
            raise UsageError("--layers must be at least 1")
        cfg["num_hidden_layers"] = spec.layers
        cfg["first_k_dense_replace"] = min(cfg["first_k_dense_replace"], spec.layers - 1) if spec.layers > 1 else 1
    if spec.experts is not None:
        if spec.experts < 2:  # (one expert is no noaux_tc group: the export's router, as DeepSeek's, needs two)
            raise UsageError("--experts must be at least 2 (DeepSeek's router ranks each group of experts by its two "
                             "best)")
        cfg["n_routed_experts"] = spec.experts
        cfg["n_group"] = next(g for g in (cfg["n_group"], 4, 2, 1) if spec.experts % g == 0 and spec.experts // g >= 2)
        cfg["topk_group"] = max(1, min(cfg["topk_group"], cfg["n_group"] // 2 or 1))
        eligible = cfg["topk_group"] * (spec.experts // cfg["n_group"])  # (the experts of the groups picked)
        cfg["num_experts_per_tok"] = min(cfg["num_experts_per_tok"], eligible)
    if spec.dtype == "bf16":
        del cfg["quantization_config"]
    elif spec.dtype != "fp8":
        raise UsageError(f"--dtype {spec.dtype!r}: expected fp8 or bf16")
    return cfg


# ------------------------------------------------------------- values ----

def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def _std(et: ds.ExpectedTensor) -> float:
    if et.role.role in ("embed", "mtp_embed"):
        return 1.0
    return float(et.shape[-1]) ** -0.5


def _fp8_quantize(w: np.ndarray, block: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Official block quant: scale_inv = block amax / 448, value = w / scale_inv rounded to e4m3."""
    from ds_export.formats import fp8_block

    return fp8_block.quantize_native(w, block=block)


def _rows(et: ds.ExpectedTensor, rng: np.random.Generator, r0: int, r1: int) -> np.ndarray:
    """Float32 values of rows [r0, r1) (the rng is consumed in row order)."""
    shape = (r1 - r0,) + tuple(et.shape[1:])
    role = et.role.role
    if role.endswith("norm") or role in ("final_norm", "mtp_enorm", "mtp_hnorm"):
        return (1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    if role == "router_bias":
        return (0.05 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    w = rng.standard_normal(shape, dtype=np.float32) * np.float32(_std(et))
    if len(shape) == 2 and et.dtype == "F8_E4M3":
        # Real checkpoints have block scales that vary across blocks: vary magnitude per 128-row band.
        band = np.exp2(rng.uniform(-1.5, 1.5, size=(-(-shape[0] // 128), 1))).astype(np.float32)
        w *= np.repeat(band, 128, axis=0)[: shape[0]]
    return w


def _tensor_parts(et: ds.ExpectedTensor, seed: int, block, chunk_bytes: int):
    """Yield (stored rows, FP8 scale rows or None) of one tensor in row chunks.

    The chunking is fixed by the tensor's shape and `chunk_bytes` alone, so the rng is consumed the
    same way wherever the tensor is generated (a shard writer regenerating a weight for its scales
    gets the same values as the writer of the weight).
    """
    rng = _rng(seed, et.name)
    rows = et.shape[0]
    row_bytes = max(1, int(np.prod(et.shape[1:], dtype=np.int64)) * 4)
    step = max(128, (chunk_bytes // row_bytes) // 128 * 128)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        vals = _rows(et, rng, r0, r1)
        if et.dtype == "F8_E4M3":
            yield _fp8_quantize(vals, block)
        else:
            yield vals.astype(ST_TO_NP[et.dtype]), None


CHUNK_BYTES = 64 << 20
_stop = None  # a worker process's stop event (write_tiny with workers > 1): checked after every chunk


def _worker_init(stop) -> None:
    """A shard-writing process: Ctrl-C is the main process's to handle (a terminal sends it to the whole process
    group); the main process sets `stop`, which the worker checks after every chunk."""
    global _stop
    ignore_sigint()
    _stop = stop


def _check_stop(path: Path) -> None:
    if _stop is not None and _stop.is_set():
        raise Stopped(path.name)


def _write_shard(path: Path, group: list[ds.ExpectedTensor], weights_of: dict[str, ds.ExpectedTensor],
                 seed: int, block, scales: dict[str, np.ndarray] | None = None) -> list[str]:
    """Write one shard: every tensor streamed in row chunks. `scales` carries the scale_inv of FP8
    weights written but not yet paired (one process writing the shards in order shares it); a
    scale_inv found in neither is recomputed from its weight's (seed, name) values (a worker
    process writing this shard alone). Returns the names."""
    scales = {} if scales is None else scales
    with ShardWriter(path, [Entry(t.name, t.dtype, t.shape) for t in group], {"format": "pt"}) as w:
        for t in group:
            if t.role.kind == "scale_inv":
                s = scales.pop(t.name, None)
                if s is None:  # the weight sits in another shard
                    s = np.concatenate([sc for _, sc in _tensor_parts(weights_of[t.name], seed, block, CHUNK_BYTES)])
                w.write(t.name, s)
                continue
            parts = []
            for q, sc in _tensor_parts(t, seed, block, CHUNK_BYTES):
                _check_stop(path)
                w.write(t.name, q)
                if sc is not None:
                    parts.append(sc)
            if parts:
                scales[t.role.scale_name] = np.concatenate(parts, axis=0)
        w.close()
    return [t.name for t in group]


# ------------------------------------------------------------- layout ----

def plan_shards(tensors: list[ds.ExpectedTensor], cfg: ds.DeepseekV3Config, target: int) -> list[list[ds.ExpectedTensor]]:
    """Group tensors into shards of about `target` bytes; the MTP layer gets its own last shard(s).

    A shard is only closed right after an FP8 weight, so its scale_inv lands in the next shard:
    the official checkpoint has such cross-shard pairs and readers must cope.
    """
    base = [t for t in tensors if not t.role.mtp]
    mtp = [t for t in tensors if t.role.mtp]
    shards: list[list[ds.ExpectedTensor]] = []
    for group in (base, mtp):
        cur: list[ds.ExpectedTensor] = []
        size = 0
        for t in group:
            cur.append(t)
            size += t.nbytes
            if size >= target and t.dtype == "F8_E4M3":
                shards.append(cur)
                cur, size = [], 0
        if cur:
            shards.append(cur)
    return shards


def write_tiny(out: str | Path, spec: TinySpec = TinySpec(), *, progress=None, workers: int | None = None) -> dict:
    """Write the checkpoint into `out` (created; must be empty or absent). Returns a summary.

    Shards are independent (values depend on (seed, name) only), so `workers` processes (default:
    one per core for checkpoints of 256 MiB or more, else 1; at most one per shard) write them
    in parallel; the bytes do not depend on `workers`. `progress(tensor)` is called once per tensor
    as its shard completes.
    """
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"{out}: directory is not empty", hint="choose a new directory or remove it")
    if spec.seed < 0:  # (numpy's seed sequences take non-negative integers only: an internal error before)
        raise UsageError(f"--seed {spec.seed}: expected a non-negative integer")
    if spec.shard_mb is not None and not spec.shard_mb > 0:  # (-1 wrote one tensor a shard)
        raise UsageError(f"--shard-mb {spec.shard_mb:g}: expected a size above 0 MiB")
    raw_cfg = make_config(spec)  # (checks the rest of the spec before OUT is made)
    cfg = ds.DeepseekV3Config.from_dict(raw_cfg, source="tiny config")
    fp8 = spec.dtype == "fp8"
    tensors = ds.expected_tensors(cfg, fp8=fp8)
    total = sum(t.nbytes for t in tensors)
    free = free_bytes(out)
    if total > free:  # (--real-dims writes GBs: a full disk found before, not at a shard written halfway)
        raise DsxError(f"{out}: the checkpoint takes {human_bytes(total)}, only {human_bytes(free)} free",
                       hint="free space, choose another directory, or fewer --layers / --experts")
    # (one dsx tiny into OUT at a time: two with different specs wrote one's index over the other's shards)
    with exclusive(out, "dsx tiny"):  # (creates OUT)
        if any(out.iterdir()):  # (written meanwhile by another)
            raise UsageError(f"{out}: directory is not empty", hint="choose a new directory or remove it")
        return _write(out, spec, raw_cfg, cfg, tensors, total, progress=progress, workers=workers)


def _write(out: Path, spec: TinySpec, raw_cfg: dict, cfg, tensors: list, total: int, *, progress,
           workers: int | None) -> dict:
    """write_tiny's work, OUT locked and empty."""
    target = int(spec.shard_mb * 2**20) if spec.shard_mb else max(total // 5, 1)
    shards = plan_shards(tensors, cfg, target)
    n = len(shards)
    block = cfg.fp8_block or ds.FP8_BLOCK
    weights_of = {t.role.scale_name: t for t in tensors if t.dtype == "F8_E4M3" and t.role.kind != "scale_inv"}
    fnames = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    by_name = {t.name: t for t in tensors}
    if workers is None:
        workers = (os.cpu_count() or 1) if total >= 256 << 20 else 1
    workers = max(1, min(workers, n))
    weight_map: dict[str, str] = {}

    def done(fname: str, names: list[str]) -> None:
        for name in names:
            weight_map[name] = fname
            if progress:
                progress(by_name[name])

    if workers == 1:
        carried: dict[str, np.ndarray] = {}
        for fname, group in zip(fnames, shards):
            done(fname, _write_shard(out / fname, group, weights_of, spec.seed, block, carried))
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        ctx = mp.get_context("spawn")
        stop = ctx.Event()
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_worker_init,
                                 initargs=(stop,)) as pool:
            # Ctrl-C or a worker's failure: the workers stop at their next chunk and the queued shards are cancelled,
            # instead of the pool's shutdown writing every remaining shard first.
            futs = wait_for_workers(lambda: [pool.submit(_write_shard, out / fname, group, weights_of, spec.seed, block)
                                             for fname, group in zip(fnames, shards)], lambda f: f.result(), [stop],
                                    processes=True)
            for fname, fut in zip(fnames, futs):
                done(fname, fut.result())
    for name, text in tokenizer_files(raw_cfg).items():
        atomic_write_text(out / name, text)
    atomic_write_json(out / "generation_config.json",
                      {"_from_model_config": True, "bos_token_id": 0, "eos_token_id": 1, "do_sample": True,
                       "temperature": 0.6, "top_p": 0.95, "transformers_version": "4.46.3"})
    atomic_write_json(out / "config.json", raw_cfg)
    write_index(out, weight_map, total)  # last: its presence marks the checkpoint complete
    return {"path": str(out), "shards": n, "tensors": len(tensors), "bytes": total, "config": raw_cfg}
