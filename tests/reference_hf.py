"""Reference: transformers' DeepseekV3ForCausalLM (CPU torch, float32) on a checkpoint's weights.

Built from config.json (quantization_config dropped) and a float32 state dict made here:
FP8 weights dequantized by `fp8_block.dequant_ref` (numpy + ml_dtypes: value x scale_inv of
its 128x128 block, ragged edges included), bf16 widened exactly. transformers' own FP8
loader is not used: it derives the block size as dim / scale blocks, wrong on ragged shapes.
Routed experts are stacked into its fused layout (gate_up_proj [E, 2I, H], down_proj [E, H, I]).
The MTP layer (index num_hidden_layers) is not part of this model.
"""

from __future__ import annotations

import re

import numpy as np
import torch
import transformers

from ds_export.formats import fp8_block
from ds_export.io.checkpoint import Checkpoint

_EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")


def hf_config(raw: dict) -> transformers.DeepseekV3Config:
    c = {k: v for k, v in raw.items() if k not in ("quantization_config", "auto_map")}
    cfg = transformers.DeepseekV3Config(**c)
    cfg._attn_implementation = "eager"
    return cfg


def _float32(ck: Checkpoint, name: str) -> np.ndarray:
    if ck.info(name).dtype == "F8_E4M3":
        block = tuple(ck.config["quantization_config"]["weight_block_size"])
        return fp8_block.dequant_ref(ck.get(name), ck.get(name + "_scale_inv"), block)
    return np.asarray(ck.get(name), dtype=np.float32)


def hf_state_dict(ck: Checkpoint) -> dict[str, torch.Tensor]:
    n_layers = ck.config["num_hidden_layers"]
    sd: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[int, dict[str, np.ndarray]]] = {}
    for name in ck.names():
        if name.endswith("_scale_inv"):
            continue
        m = re.match(r"^model\.layers\.(\d+)\.", name)
        if m and int(m.group(1)) >= n_layers:
            continue  # MTP layer
        em = _EXPERT.match(name)
        if em:
            experts.setdefault(em.group(1), {}).setdefault(int(em.group(2)), {})[em.group(3)] = _float32(ck, name)
            continue
        sd[name] = torch.from_numpy(_float32(ck, name).copy())
    for prefix, per in experts.items():
        ids = sorted(per)
        sd[prefix + ".gate_up_proj"] = torch.from_numpy(
            np.stack([np.concatenate([per[e]["gate"], per[e]["up"]], axis=0) for e in ids]))
        sd[prefix + ".down_proj"] = torch.from_numpy(np.stack([per[e]["down"] for e in ids]))
    return sd


def build_reference(ckpt_dir) -> transformers.DeepseekV3ForCausalLM:
    ck = Checkpoint.open(ckpt_dir)
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(hf_config(ck.config)).float().eval()
    missing, unexpected = model.load_state_dict(hf_state_dict(ck), strict=False)
    if missing or unexpected:
        raise RuntimeError(f"reference state dict mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return model


@torch.no_grad()
def reference_forward(model, ids) -> tuple[np.ndarray, np.ndarray]:
    """One unpadded sequence -> (logits [S, V], hidden after the final norm [S, H]), float32."""
    x = torch.tensor([list(ids)], dtype=torch.long)
    h = model.model(input_ids=x).last_hidden_state
    return model.lm_head(h)[0].numpy(), h[0].numpy()
