"""The DeepSeek-V3 model map against the real release's facts (shared/deepseek-r1-catalog.md)."""

from __future__ import annotations

import pytest

from ds_export.errors import ModelMapError
from ds_export.models import deepseek_v3 as ds
from ds_export.tiny import REAL_CONFIG


@pytest.fixture(scope="module")
def real():
    return ds.DeepseekV3Config.from_dict(REAL_CONFIG)


@pytest.fixture(scope="module")
def real_tensors(real):
    return {t.name: t for t in ds.expected_tensors(real)}


def test_real_release_counts(real_tensors):
    # The public report of DeepSeek-R1: 91,991 tensors, 684,531,386,000 elements, 641.30 GiB of files
    # (tensor data plus about 16 MB of JSON headers).
    ts = list(real_tensors.values())
    assert len(ts) == 91_991
    assert sum(t.nbytes // {"F8_E4M3": 1, "BF16": 2, "F32": 4}[t.dtype] for t in ts) == 684_531_386_000
    assert abs(sum(t.nbytes for t in ts) / 2**30 - 641.30) < 0.02


@pytest.mark.parametrize("name,shape,dtype", [
    ("lm_head.weight", (129280, 7168), "BF16"),
    ("model.layers.0.mlp.gate_proj.weight_scale_inv", (144, 56), "F32"),
    ("model.layers.0.mlp.down_proj.weight_scale_inv", (56, 144), "F32"),
    ("model.layers.7.self_attn.q_b_proj.weight", (24576, 1536), "F8_E4M3"),
    ("model.layers.7.self_attn.kv_a_proj_with_mqa.weight_scale_inv", (5, 56), "F32"),
    ("model.layers.7.self_attn.kv_b_proj.weight_scale_inv", (256, 4), "F32"),
    ("model.layers.7.self_attn.o_proj.weight_scale_inv", (56, 128), "F32"),
    ("model.layers.9.mlp.experts.255.down_proj.weight_scale_inv", (56, 16), "F32"),
    ("model.layers.61.eh_proj.weight", (7168, 14336), "BF16"),
    ("model.layers.61.shared_head.head.weight", (129280, 7168), "BF16"),
    ("model.layers.60.mlp.gate.e_score_correction_bias", (256,), "F32"),
])
def test_catalog_shapes(real_tensors, name, shape, dtype):
    t = real_tensors[name]
    assert (t.shape, t.dtype) == (shape, dtype)


def test_roles(real):
    c = lambda n: ds.classify(n, real)  # noqa: E731
    r = c("model.layers.61.mlp.experts.17.up_proj.weight")
    assert (r.role, r.layer, r.expert, r.mtp, r.quantizable, r.tp_split) == ("expert_up", 61, 17, True, True, "col")
    r = c("model.layers.3.mlp.experts.0.down_proj.weight_scale_inv")
    assert (r.kind, r.weight_name, r.mtp, r.quantizable) == ("scale_inv", "model.layers.3.mlp.experts.0.down_proj.weight", False, False)
    assert c("model.layers.2.mlp.down_proj.weight").role == "dense_down"
    assert c("model.layers.2.self_attn.o_proj.weight").tp_split == "row"
    assert c("model.layers.5.self_attn.kv_a_proj_with_mqa.weight").tp_split is None
    assert c("model.embed_tokens.weight").tp_split == "vocab"
    assert c("model.layers.61.eh_proj.weight").role == "mtp_eh_proj"
    assert c("model.layers.4.mlp.gate.e_score_correction_bias").kind == "bias"
    assert not c("model.layers.4.mlp.gate.weight").quantizable
    assert c("model.layers.61.shared_head.head.weight").role == "mtp_head"


@pytest.mark.parametrize("name", [
    "model.layers.62.input_layernorm.weight",          # beyond MTP layers
    "model.layers.5.mlp.gate_proj.weight",             # dense name in an MoE layer
    "model.layers.1.mlp.experts.0.up_proj.weight",     # expert in a dense layer
    "model.layers.5.mlp.experts.256.up_proj.weight",   # expert id out of range
    "model.layers.5.eh_proj.weight",                   # MTP-only tensor in a base layer
    "model.layers.5.input_layernorm.weight_scale_inv",  # scale of a norm
    "model.layers.5.self_attn.q_b_proj.bias",
    "transformer.h.0.attn.weight",
])
def test_unknown_names_are_errors(real, name):
    with pytest.raises(ModelMapError, match="tensor"):
        ds.classify(name, real)


def test_mtp_layers_follow_config():
    cfg = dict(REAL_CONFIG, num_hidden_layers=10, num_nextn_predict_layers=2)
    c = ds.DeepseekV3Config.from_dict(cfg)
    assert list(c.mtp_layers) == [10, 11]
    assert ds.classify("model.layers.11.enorm.weight", c).mtp
    with pytest.raises(ModelMapError):
        ds.classify("model.layers.61.enorm.weight", c)


@pytest.mark.parametrize("patch,msg", [
    ({"model_type": "llama"}, "model_type"),
    ({"hidden_size": None}, "hidden_size"),
    ({"n_group": 3}, "divisible"),
    ({"topk_group": 9}, "topk_group"),
    ({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128]}}, "weight_block_size"),
    ({"hidden_size": True}, "non-integer keys hidden_size"),
    ({"n_shared_experts": "1"}, "n_shared_experts '1': expected a non-negative integer or null"),
    ({"q_lora_rank": 1536.0}, "q_lora_rank 1536.0"),
    ({"num_nextn_predict_layers": -1}, "num_nextn_predict_layers -1"),
    # (a size of 0 or less was an internal error in dsx tiny and export; 0 where counting starts at 1 was read as 1)
    ({"num_attention_heads": -2}, "num_attention_heads -2: sizes and counts are at least 1"),
    ({"qk_rope_head_dim": 0}, "qk_rope_head_dim 0: sizes and counts are at least 1"),
    ({"first_k_dense_replace": -1}, "first_k_dense_replace -1"),
    ({"topk_group": 0}, "topk_group 0: expected a non-negative integer or null .* at least 1"),
    ({"n_group": 0}, "n_group 0"),
    ({"q_lora_rank": 0}, "q_lora_rank 0"),
    ({"moe_layer_freq": False}, "moe_layer_freq False"),
    ({"rope_theta": "x"}, "rope_theta 'x': expected a positive number"),
    ({"routed_scaling_factor": "2.5"}, "routed_scaling_factor '2.5'"),
    ({"rms_norm_eps": float("nan")}, "rms_norm_eps nan: expected a non-negative number"),
    ({"norm_topk_prob": "yes"}, "norm_topk_prob 'yes': expected true or false"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings 'false'"),  # (was read as True)
    ({"max_position_embeddings": "4096"}, "max_position_embeddings '4096': expected a positive integer"),
    ({"eos_token_id": 129280}, r"eos_token_id 129280: expected a token id in 0..129279 \(vocab_size 129280\)"),
    ({"eos_token_id": -1}, "eos_token_id -1"),
    ({"eos_token_id": [1, 200000]}, r"eos_token_id \[1, 200000\]"),
    ({"eos_token_id": []}, r"eos_token_id \[\]"),
    ({"bos_token_id": "0"}, "bos_token_id '0'"),
    ({"rope_scaling": 5}, "rope_scaling 5: expected a mapping or null"),
    ({"rope_scaling": {"type": "yarn"}}, "rope_scaling.factor None: expected a positive number"),
    ({"rope_scaling": {**REAL_CONFIG["rope_scaling"], "factor": "40"}}, r"rope_scaling.factor '40'"),
    ({"rope_scaling": {**REAL_CONFIG["rope_scaling"], "original_max_position_embeddings": 0}},
     "rope_scaling.original_max_position_embeddings 0"),
    ({"rope_scaling": {**REAL_CONFIG["rope_scaling"], "mscale": None, "beta_fast": "32"}}, "rope_scaling.beta_fast '32'"),
])
def test_bad_config(patch, msg):
    with pytest.raises(ModelMapError, match=msg):
        ds.DeepseekV3Config.from_dict(dict(REAL_CONFIG, **patch))


def test_optional_settings_may_be_null_or_absent():
    c = ds.DeepseekV3Config.from_dict(dict(REAL_CONFIG, n_shared_experts=None, num_nextn_predict_layers=None,
                                           rope_scaling=None, rope_theta=None, norm_topk_prob=None))
    assert (c.n_shared_experts, c.num_nextn_predict_layers) == (0, 0)
    ds.DeepseekV3Config.from_dict({k: v for k, v in REAL_CONFIG.items() if k not in (
        "rope_scaling", "rope_theta", "rms_norm_eps", "routed_scaling_factor", "max_position_embeddings")})
    ds.DeepseekV3Config.from_dict(dict(REAL_CONFIG, eos_token_id=[1, 129279], bos_token_id=None))
    ds.DeepseekV3Config.from_dict(dict(REAL_CONFIG, rope_scaling={"type": "yarn", "factor": 40.0,
                                                                  "original_max_position_embeddings": 4096}))


def test_shapes_agree_with_the_config(real, real_tensors):
    """check_shapes: R1's own shapes pass; a config.json that does not describe the weights (an edited width, a
    vocabulary, shared experts the config says are absent) is refused naming the tensor, the keys and the shape."""
    shapes = {n: t.shape for n, t in real_tensors.items()}
    ds.check_shapes(shapes, real, source="r1")
    ds.check_shapes({n: s for n, s in shapes.items() if ".layers.61." in n}, real, source="r1")  # a partial one
    for patch, msg in [
        ({"intermediate_size": 3}, r"r1: model.layers.0.mlp.gate_proj.weight is \[18432, 7168\], but config.json "
                                   r"\(hidden_size 7168, intermediate_size 3\) implies \[3, 7168\]; 8 more tensors"),
        ({"vocab_size": 1000}, r"model.embed_tokens.weight is \[129280, 7168\].*vocab_size 1000"),
        ({"n_shared_experts": 2}, r"shared_experts.gate_proj.weight is \[2048, 7168\].*n_shared_experts 2"),
        ({"kv_lora_rank": 256}, r"kv_a_layernorm.weight is \[512\], but config.json \(kv_lora_rank 256\) implies "
                                r"\[256\]"),
        ({"n_shared_experts": None}, r"model.layers.3.mlp.shared_experts.gate_proj.weight is not a tensor of the "
                                     r"model config.json describes.*; 176 more"),  # (59 MoE layers x 3)
    ]:
        cfg = ds.DeepseekV3Config.from_dict(dict(REAL_CONFIG, **patch))
        with pytest.raises(ModelMapError, match=msg):
            ds.check_shapes(shapes, cfg, source="r1")


def test_partners(real):
    names = ["model.layers.5.self_attn.o_proj.weight_scale_inv"]
    with pytest.raises(ModelMapError, match="has no weight"):
        ds.map_tensors(names, real)
    roles = ds.map_tensors(["model.layers.5.self_attn.o_proj.weight"], real)
    with pytest.raises(ModelMapError, match="no model.layers.5.self_attn.o_proj.weight_scale_inv"):
        ds.check_fp8_partners(roles, {"model.layers.5.self_attn.o_proj.weight": "F8_E4M3"})


def test_gemm_shapes_per_rank(real):
    """The weight GEMMs a tensor-parallel rank of R1 runs, against the catalog's Linear shapes ([out, in]):
    q_a 1536x7168, q_b 24576x1536, kv_a 576x7168, kv_b 32768x512, o_proj 7168x16384, dense gate/up
    18432x7168 and down 7168x18432, shared/routed expert gate/up 2048x7168 and down 7168x2048, MTP eh_proj
    7168x14336; "col" roles divide N by tp, "row" roles divide K, q_a / kv_a / eh_proj are replicated;
    gate + up also fused (2N)."""
    def want(tp):
        return {(1536, 7168), (24576 // tp, 1536), (576, 7168), (32768 // tp, 512), (7168, 16384 // tp),
                (18432 // tp, 7168), (36864 // tp, 7168), (7168, 18432 // tp), (2048 // tp, 7168),
                (4096 // tp, 7168), (7168, 2048 // tp), (7168, 14336)}
    for tp in (1, 2, 4, 8):
        assert set(ds.gemm_shapes(real, tp)) == want(tp), tp
    names = ds.gemm_shapes(real, 8)
    assert names[(7168, 256)] == ("shared_down", "expert_down")
    assert names[(4608, 7168)] == ("dense_gate_up",) and names[(2304, 7168)] == ("dense_gate/up",)
    with pytest.raises(ModelMapError, match="kv_b: N = 32768 is not divisible by tp 3"):
        ds.gemm_shapes(real, 3)
