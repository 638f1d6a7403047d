"""End to end, for models that fit: the exported program's logits against the unquantized reference.

On a bundled text (ds_export/data/eval.txt, encoded with the export's tokenizer when the
`tokenizers` package is there, else the tiny model's byte tokenizer): per-position KL(ref || export),
top-1 agreement, and the perplexity of both on the text itself. With an MTP draft in the export,
the draft acceptance rate of speculative greedy decoding on the text's start. The reference is the
float32 Paddle model on the reference checkpoint's weights (FP8 decoded exactly), the same model
that matches transformers' DeepseekV3ForCausalLM to 1e-6 in the tests.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

# Defaults: generous, to catch broken exports rather than grade quantization (docs/numerics.md).
E2E_MAX_KL = 1.0
E2E_MIN_TOP1 = 0.15
TEXT = Path(__file__).resolve().parents[1] / "data" / "eval.txt"


def _tokens(export_dir: Path, vocab: int, limit: int) -> list[int]:
    text = TEXT.read_text(encoding="utf-8")
    ids = None
    tok = export_dir / "tokenizer.json"
    if tok.exists():
        try:
            import tokenizers

            ids = tokenizers.Tokenizer.from_file(str(tok)).encode(text).ids
        except Exception:  # noqa: BLE001 - fall back to the byte tokenizer
            ids = None
    if ids is None:
        from ds_export.tiny_tokenizer import encode

        ids = encode(text)
    return [i for i in ids if i < vocab][:limit]


def memory_needed(reference: str | Path) -> int:
    """Bytes the float32 reference model of an end-to-end check holds (its elements x 4, plus a third)."""
    from ds_export.io.checkpoint import Checkpoint

    with Checkpoint.open(reference) as ck:
        return sum(t.numel for t in ck.infos()) * 4 * 4 // 3


def memory_available() -> int:
    from ds_export.procmem import memory_available

    return memory_available() or 0


def fits(reference: str | Path) -> bool:
    """Whether the end-to-end check of this model fits in half the memory available now."""
    return memory_needed(reference) <= memory_available() // 2


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def require_fit(reference: str | Path) -> None:
    """The float32 reference model must fit in memory (verify asks before its hours of weight checks, too)."""
    from ds_export.errors import DsxError

    if not fits(reference):
        raise DsxError(f"{reference}: the end-to-end check runs the float32 model, about "
                       f"{memory_needed(reference) / 2**30:.0f} GiB, and {memory_available() / 2**30:.0f} GiB are "
                       "available", hint="run it on a bigger host, or verify without --export (weights and kernels)")


def check_export(export_dir: str | Path, reference: str | Path, *, max_kl: float = E2E_MAX_KL,
                 min_top1: float = E2E_MIN_TOP1) -> dict:
    import paddle

    from ds_export.export.exporter import check_export as check_complete
    from ds_export.export.modeling import DeepseekV3ForInference
    from ds_export.export.runtime import generate_any
    from ds_export.export.weights import load_weights

    export_dir = Path(export_dir)
    check_complete(export_dir)
    require_fit(reference)
    cfg = json.loads((export_dir / "config.json").read_text())
    has_draft = (export_dir / "mtp" / "config.json").exists()
    ids = _tokens(export_dir, int(cfg["vocab_size"]), int(cfg["infer_model_max_seq_len"]) - 8)
    x = np.array([ids], np.int64)
    _, logits = generate_any(export_dir, [ids], 1, dump_logits=True)  # one process per rank when tp > 1
    got = logits["base_logits"]
    tp = int(cfg.get("tensor_parallel_degree") or 1)
    w = load_weights(reference, "float32", include_mtp=False)
    ref_model = DeepseekV3ForInference(w, len(ids) + 1)
    ref, _, _ = ref_model.step(x, np.zeros(1, np.int64), ref_model.empty_cache(1))
    ref = ref.numpy()[0]
    got = got[0].astype(np.float32)
    lr, lg = _log_softmax(ref), _log_softmax(got)
    kl = float((np.exp(lr) * (lr - lg)).sum(-1).mean())
    top1 = float((ref.argmax(-1) == got.argmax(-1)).mean())
    nxt = np.array(ids[1:])
    ppl_ref = math.exp(-float(lr[np.arange(len(nxt)), nxt].mean()))
    ppl_got = math.exp(-float(lg[np.arange(len(nxt)), nxt].mean()))
    res = {"tokens": len(ids), "kl_mean": kl, "top1_agreement": top1, "ppl_reference": ppl_ref,
           "ppl_export": ppl_got, "ppl_delta": ppl_got - ppl_ref, "max_kl": max_kl, "min_top1": min_top1,
           "tp": tp}
    if has_draft:
        spec, _ = generate_any(export_dir, [ids[:16]], 16, speculate=1)
        res["mtp_acceptance_rate"] = spec.get("accepted", 0) / max(1, spec.get("drafted", 0))
        res["tokens_per_base_step"] = spec.get("tokens_per_base_step")
    res["ok"] = bool(kl <= max_kl and top1 >= min_top1 and math.isfinite(ppl_got))
    del paddle
    return res
