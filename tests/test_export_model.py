"""dsx export, numerical core: the Paddle DeepSeek-V3 step function and MTP draft on the tiny checkpoint.

References: transformers' DeepseekV3ForCausalLM in float32 (tests/reference_hf.py) for the base
model, and a float64 numpy implementation below (naive, non-absorbed MLA) for the MTP draft.
Error figure everywhere: max |out - ref| / max |ref|.
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from ds_export.errors import CheckpointError, DsxError
from ds_export.export import modeling
from ds_export.export.modeling import DeepseekV3ForInference, ModelSpec, noaux_tc_route, yarn_get_mscale
from ds_export.export.mtp import MTPDraft
from ds_export.export.weights import load_weights
from ds_export.formats import fp8_block
from ds_export.io.checkpoint import Checkpoint
from ds_export.models.deepseek_v3 import DeepseekV3Config

torch = pytest.importorskip("torch")
reference_hf = pytest.importorskip("reference_hf")

TOL32 = 1e-4
TOL_BF16 = 3e-2
MAX_LEN = 32
LENS = (16, 11)  # full lengths of the two test sequences


def rel(out, ref) -> float:
    return float(np.abs(np.asarray(out, np.float64) - ref).max() / np.abs(ref).max())


@pytest.fixture(scope="module")
def seqs():
    rng = np.random.default_rng(7)
    return [rng.integers(2, 512, n).tolist() for n in LENS]


@pytest.fixture(scope="module")
def hf(tiny_fp8):
    return reference_hf.build_reference(tiny_fp8)


@pytest.fixture(scope="module")
def hf_out(hf, seqs):
    return [reference_hf.reference_forward(hf, s) for s in seqs]


@pytest.fixture(scope="module")
def w32(tiny_fp8):
    return load_weights(tiny_fp8, "float32")


@pytest.fixture(scope="module")
def model32(w32):
    return DeepseekV3ForInference(w32, MAX_LEN)


def padded(rows, width):
    out = np.zeros((len(rows), width), np.int64)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


def prefill(model, seqs, lens):
    """Ragged prefill of seqs[b][:lens[b]] (right-padded) -> (logits, hidden, cache) as numpy + cache."""
    ids = padded([s[:n] for s, n in zip(seqs, lens)], max(lens))
    lg, h, cache = model.step(ids, np.zeros(len(seqs), np.int64), model.empty_cache(len(seqs)))
    return lg.numpy(), h.numpy(), cache


# ------------------------------------------------------------ base model ----

def test_reference_reads_config_like_deepseek(tiny_fp8, hf, model32):
    c = hf.config
    assert c.rope_interleave is True
    assert c.rope_parameters["rope_type"] == "yarn" and c.rope_parameters["factor"] == 40
    att = hf.model.layers[0].self_attn
    m = yarn_get_mscale(40, 1.0)
    assert att.scaling == pytest.approx(128 ** -0.5 * m * m, rel=1e-12)
    assert model32.spec.softmax_scale == pytest.approx(att.scaling, rel=1e-12)
    assert m * m == pytest.approx(1.874, abs=1e-3)


def test_prefill_ragged_batch_matches_transformers(model32, seqs, hf_out):
    lg, h, _ = prefill(model32, seqs, LENS)
    errs = []
    for b, n in enumerate(LENS):
        errs += [rel(lg[b, :n], hf_out[b][0]), rel(h[b, :n], hf_out[b][1])]
    print("prefill float32 rel (logits, hidden per seq):", ["%.2e" % e for e in errs])
    assert max(errs) < TOL32


def test_decode_and_verify_through_cache(model32, seqs, hf_out):
    """Prefill 8 / 5 tokens, two 1-token decode steps, a 3-token verify step, one more decode step."""
    lens = [8, 5]
    lg, _, cache = prefill(model32, seqs, lens)
    worst = max(rel(lg[b, :n], hf_out[b][0][:n]) for b, n in enumerate(lens))
    for s in (1, 1, 3, 1):
        ids = np.array([[seqs[b][lens[b] + i] for i in range(s)] for b in range(2)])
        lg, _, cache = model32.step(ids, np.array(lens), cache)
        for b in range(2):
            worst = max(worst, rel(lg.numpy()[b], hf_out[b][0][lens[b]:lens[b] + s]))
        lens = [n + s for n in lens]
    print(f"decode/verify through cache, worst rel vs full-sequence transformers: {worst:.2e}")
    assert worst < TOL32


def test_bf16_source_checkpoint_matches_transformers(tiny_bf16, seqs):
    """An original bf16 (not FP8) checkpoint loads too; float32 model vs transformers on it."""
    ref = reference_hf.reference_forward(reference_hf.build_reference(tiny_bf16), seqs[1])[0]
    lg, _, _ = prefill(DeepseekV3ForInference(load_weights(tiny_bf16), MAX_LEN), seqs[1:], LENS[1:])
    err = rel(lg[0], ref)
    print(f"bf16 source checkpoint, float32 model: rel {err:.2e}")
    assert err < TOL32


def test_bf16_variant_within_bf16_tolerance(tiny_fp8, seqs, hf_out):
    m16 = DeepseekV3ForInference(load_weights(tiny_fp8, "bfloat16"), MAX_LEN)
    assert m16.layers[0].attn.q_b.weight.dtype == paddle.bfloat16 and m16.empty_cache(1).dtype == paddle.bfloat16
    lg, _, cache = prefill(m16, seqs, [12, 7])
    errs = [rel(lg[b, :n], hf_out[b][0][:n]) for b, n in enumerate([12, 7])]
    lg1, _, _ = m16.step(np.array([[seqs[0][12]], [seqs[1][7]]]), np.array([12, 7]), cache)
    errs += [rel(lg1.numpy()[b], hf_out[b][0][n:n + 1]) for b, n in enumerate([12, 7])]
    print("bf16 rel vs float32 transformers:", ["%.2e" % e for e in errs])
    assert max(errs) < TOL_BF16
    assert max(errs) > 1e-4  # it really ran in bf16


def test_routing_exercises_group_limits(tiny_fp8, model32, seqs, hf):
    """Router inputs of the first MoE layer: group limiting changes the picks for some tokens,
    and our router agrees with transformers' DeepseekV3TopkRouter on the same inputs."""
    moe = model32.layers[1].mlp
    seen = []
    hidden = model32.spec.hidden
    hook = moe.register_forward_pre_hook(lambda layer, args: seen.append(args[0].numpy().reshape(-1, hidden)))
    try:
        prefill(model32, seqs, LENS)
    finally:
        hook.remove()
    x = seen[0]
    sp = model32.spec
    idx, w = noaux_tc_route(paddle.matmul(paddle.to_tensor(x), moe.router), moe.router_bias, sp.n_group,
                            sp.topk_group, sp.top_k, sp.norm_topk_prob, sp.routed_scaling_factor)
    idx, w = idx.numpy(), w.numpy()
    choice = 1 / (1 + np.exp(-(x.astype(np.float64) @ moe.router.numpy()))) + moe.router_bias.numpy()
    plain = np.argsort(-choice, axis=1)[:, :sp.top_k]
    differs = [t for t in range(len(x)) if set(plain[t]) != set(idx[t])]
    groups = idx // (sp.n_experts // sp.n_group)
    assert all(len(set(g)) <= sp.topk_group for g in groups)
    assert len(differs) >= 1, "group limiting never changed a pick: the test model does not exercise it"
    with torch.no_grad():
        _, hw, hidx = hf.model.layers[1].mlp.gate(torch.from_numpy(x))
    order, horder = np.argsort(idx, axis=1), np.argsort(hidx.numpy(), axis=1)
    assert (np.take_along_axis(idx, order, 1) == np.take_along_axis(hidx.numpy(), horder, 1)).all()
    assert rel(np.take_along_axis(w, order, 1), np.take_along_axis(hw.numpy(), horder, 1)) < 1e-6
    print(f"group limit changed the expert set for {len(differs)}/{len(x)} tokens")


@pytest.mark.parametrize("fault", ["rope_not_interleaved", "no_mscale"])
def test_planted_fault_is_detected(w32, seqs, hf_out, monkeypatch, fault):
    m = DeepseekV3ForInference(w32, MAX_LEN)
    if fault == "rope_not_interleaved":
        def rotate_half(x, cos, sin):  # rotates (x[i], x[i + R/2]) instead of (x[2i], x[2i+1])
            x0, x1 = paddle.chunk(x, 2, axis=-1)
            return paddle.concat([x0 * cos - x1 * sin, x1 * cos + x0 * sin], axis=-1)
        monkeypatch.setattr(modeling, "rotate_interleaved", rotate_half)
    else:
        for layer in m.layers:
            layer.attn.softmax_scale = w32.cfg.qk_head_dim ** -0.5
    lg, _, _ = prefill(m, seqs, LENS)
    err = max(rel(lg[b, :n], hf_out[b][0]) for b, n in enumerate(LENS))
    print(f"planted fault {fault}: rel {err:.2e}")
    assert err > 100 * TOL32


def test_step_and_load_errors(tiny_fp8, model32):
    with pytest.raises(DsxError, match="exceed max_len"):
        model32.step(np.ones((1, 4), np.int64), np.array([MAX_LEN - 2]), model32.empty_cache(1))
    with pytest.raises(DsxError, match="cache shape"):
        model32.step(np.ones((2, 4), np.int64), np.array([0, 0]), model32.empty_cache(1))
    ck = Checkpoint.open(tiny_fp8)
    for name in ("model.layers.1.self_attn.kv_b_proj.weight", "model.layers.1.self_attn.kv_b_proj.weight_scale_inv"):
        ck.weight_map.pop(name)
    with pytest.raises(CheckpointError, match="layer 1 lacks model.layers.1.self_attn.kv_b_proj.weight"):
        load_weights(ck)
    with pytest.raises(DsxError, match="dtype"):
        load_weights(tiny_fp8, "int8")


# ----------------------------------------------------------------- MTP ----

class NumpyDecoderLayer:
    """float64 numpy DeepSeek-V3 decoder layer (naive MLA: K and V expanded from the latent)."""

    def __init__(self, ck: Checkpoint, cfg: DeepseekV3Config, layer: int, inv_freq, rope_amp, softmax_scale):
        self.ck, self.cfg, self.p = ck, cfg, f"model.layers.{layer}."
        self.inv_freq, self.amp, self.scale = np.float64(inv_freq), rope_amp, softmax_scale
        self.eps = cfg.raw["rms_norm_eps"]

    def w(self, name):
        name = self.p + name
        if self.ck.info(name).dtype == "F8_E4M3":
            return fp8_block.dequant_ref(self.ck.get(name), self.ck.get(name + "_scale_inv")).astype(np.float64)
        return np.asarray(self.ck.get(name), np.float64)

    def norm(self, x, name):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * self.w(name)

    def rope(self, x, pos):  # interleaved pairs as complex numbers, like DeepSeek's reference model.py
        z = (x[..., 0::2] + 1j * x[..., 1::2]) * np.exp(1j * pos[:, None] * self.inv_freq) * self.amp
        return np.stack([z.real, z.imag], axis=-1).reshape(x.shape)

    def attention(self, x):
        c, S, H = self.cfg, len(x), self.cfg.num_attention_heads
        q = (self.norm(x @ self.w("self_attn.q_a_proj.weight").T, "self_attn.q_a_layernorm.weight")
             @ self.w("self_attn.q_b_proj.weight").T).reshape(S, H, -1)
        pos = np.arange(S, dtype=np.float64)
        q_pe = self.rope(q[..., c.qk_nope_head_dim:].transpose(1, 0, 2), pos).transpose(1, 0, 2)
        kv = x @ self.w("self_attn.kv_a_proj_with_mqa.weight").T
        lat = self.norm(kv[:, :c.kv_lora_rank], "self_attn.kv_a_layernorm.weight")
        k_pe = self.rope(kv[:, c.kv_lora_rank:], pos)
        kvb = (lat @ self.w("self_attn.kv_b_proj.weight").T).reshape(S, H, -1)
        k_rot = np.broadcast_to(k_pe[:, None], (S, H, c.qk_rope_head_dim))
        k = np.concatenate([kvb[..., :c.qk_nope_head_dim], k_rot], -1)
        qf = np.concatenate([q[..., :c.qk_nope_head_dim], q_pe], -1)
        sc = np.einsum("shd,thd->hst", qf, k) * self.scale + np.where(np.tri(S) > 0, 0, -np.inf)
        p = np.exp(sc - sc.max(-1, keepdims=True))
        o = np.einsum("hst,thd->shd", p / p.sum(-1, keepdims=True), kvb[..., c.qk_nope_head_dim:])
        return o.reshape(S, -1) @ self.w("self_attn.o_proj.weight").T

    def mlp(self, x, pre):
        g, u = x @ self.w(pre + "gate_proj.weight").T, x @ self.w(pre + "up_proj.weight").T
        return (g / (1 + np.exp(-g)) * u) @ self.w(pre + "down_proj.weight").T

    def moe(self, x):
        c, raw = self.cfg, self.cfg.raw
        s = 1 / (1 + np.exp(-(x @ self.w("mlp.gate.weight").T)))
        choice = s + self.w("mlp.gate.e_score_correction_bias")
        per = c.n_routed_experts // c.n_group
        gs = np.sort(choice.reshape(len(x), c.n_group, per), -1)[..., -2:].sum(-1)
        out = self.mlp(x, "mlp.shared_experts.")
        for t in range(len(x)):
            keep = np.argsort(-gs[t])[:c.topk_group]
            masked = np.full(c.n_routed_experts, -np.inf)
            for g in keep:
                masked[g * per:(g + 1) * per] = choice[t, g * per:(g + 1) * per]
            top = np.argsort(-masked)[:c.num_experts_per_tok]
            wt = s[t, top] / s[t, top].sum() * raw["routed_scaling_factor"]
            for e, we in zip(top, wt):
                out[t] += we * self.mlp(x[t:t + 1], f"mlp.experts.{e}.")[0]
        return out

    def __call__(self, h):
        h = h + self.attention(self.norm(h, "input_layernorm.weight"))
        return h + self.moe(self.norm(h, "post_attention_layernorm.weight"))


def mtp_reference(ck, cfg, hf, ids_next, h_base):
    """Draft logits [S, V] and hidden [S, H] for tokens t+1 (ids_next) and base hidden h_base[t], float64."""
    L = cfg.mtp_layers[0]
    att = hf.model.layers[0].self_attn
    lay = NumpyDecoderLayer(ck, cfg, L, hf.model.rotary_emb.inv_freq.numpy(), hf.model.rotary_emb.attention_scaling,
                            att.scaling)
    e = lay.norm(np.asarray(ck.get(f"model.layers.{L}.embed_tokens.weight"), np.float64)[ids_next], "enorm.weight")
    x = np.concatenate([e, lay.norm(np.float64(h_base), "hnorm.weight")], -1) @ lay.w("eh_proj.weight").T
    h = lay.norm(lay(x), "shared_head.norm.weight")
    return h @ lay.w("shared_head.head.weight").T, h


def test_mtp_draft_matches_numpy_float64(tiny_fp8, w32, model32, seqs, hf):
    ck = Checkpoint.open(tiny_fp8)
    cfg = w32.cfg
    _, h_base, _ = prefill(model32, seqs, LENS)
    draft = MTPDraft(w32, MAX_LEN)
    n_draft = [n - 1 for n in LENS]
    refs = [mtp_reference(ck, cfg, hf, np.array(seqs[b][1:n + 1]), h_base[b, :n]) for b, n in enumerate(n_draft)]
    # ragged draft prefill of all but the last 2 positions, then 1-token and a 1-position decode step
    pre = [n - 2 for n in n_draft]
    ids = padded([seqs[b][1:p + 1] for b, p in enumerate(pre)], max(pre))
    hid = np.zeros(ids.shape + (cfg.hidden_size,), np.float32)
    for b, p in enumerate(pre):
        hid[b, :p] = h_base[b, :p]
    lg, hd, cache = draft.step(ids, hid, np.zeros(2, np.int64), draft.empty_cache(2))
    errs = [rel(lg.numpy()[b, :p], refs[b][0][:p]) for b, p in enumerate(pre)]
    errs += [rel(hd.numpy()[b, :p], refs[b][1][:p]) for b, p in enumerate(pre)]
    for _ in range(2):
        ids = np.array([[seqs[b][p + 1]] for b, p in enumerate(pre)])
        hid = np.stack([h_base[b, p:p + 1] for b, p in enumerate(pre)])
        lg, _, cache = draft.step(ids, hid, np.array(pre), cache)
        errs += [rel(lg.numpy()[b], refs[b][0][p:p + 1]) for b, p in enumerate(pre)]
        pre = [p + 1 for p in pre]
    print("MTP draft rel vs numpy float64:", ["%.2e" % e for e in errs])
    assert max(errs) < TOL32
    # planted fault: the hidden-then-embedding concat order is detected
    bad = draft.eh_proj.weight.numpy()
    draft.eh_proj.weight.set_value(np.concatenate([bad[cfg.hidden_size:], bad[:cfg.hidden_size]], 0))
    lg, _, _ = draft.step(np.array([seqs[0][1:9]]), h_base[:1, :8], np.zeros(1, np.int64), draft.empty_cache(1))
    err = rel(lg.numpy()[0], refs[0][0][:8])
    print(f"planted fault MTP concat order: rel {err:.2e}")
    assert err > 100 * TOL32


def test_softmax_scale_and_spec_from_config(w32):
    sp = ModelSpec.from_config(w32.cfg, "float32")
    assert (sp.n_group, sp.topk_group, sp.top_k, sp.routed_scaling_factor) == (4, 2, 4, 2.5)
    assert sp.norm_topk_prob is True and sp.eps == 1e-6


# ------------------------------------------------- paddle.jit.save / inference ----

def _predict(path, arrays):
    from paddle import inference

    cfg = inference.Config(str(path) + ".json", str(path) + ".pdiparams")
    cfg.disable_gpu()
    pred = inference.create_predictor(cfg)
    for name, a in zip(pred.get_input_names(), arrays):
        h = pred.get_input_handle(name)
        h.reshape(list(a.shape))
        h.copy_from_cpu(np.ascontiguousarray(a))
    pred.run()
    return [pred.get_output_handle(n).copy_to_cpu() for n in pred.get_output_names()]


def test_jit_save_runs_under_paddle_inference(tmp_path, w32, seqs, hf_out):
    """The step function and the draft, saved as PIR programs, run with create_predictor on CPU:
    a ragged prefill then a decode step through the returned cache match dygraph and transformers."""
    m = DeepseekV3ForInference(w32, MAX_LEN)
    paddle.jit.save(m, str(tmp_path / "model"), input_spec=m.input_spec())
    lens = [9, 4]
    ids = padded([s[:n] for s, n in zip(seqs, lens)], max(lens))
    cache0 = np.zeros((len(m.layers), 2, MAX_LEN, m.cache_width), np.float32)
    lg, h, cache = _predict(tmp_path / "model", [ids, np.zeros(2, np.int64), cache0])
    dlg, dh, _ = m.step(ids, np.zeros(2, np.int64), paddle.to_tensor(cache0))
    assert rel(lg, dlg.numpy()) < 1e-5 and rel(h, dh.numpy()) < 1e-5
    nxt = np.array([[seqs[b][n]] for b, n in enumerate(lens)])
    lg1, _, _ = _predict(tmp_path / "model", [nxt, np.array(lens, np.int64), cache])
    errs = [rel(lg1[b], hf_out[b][0][n:n + 1]) for b, n in enumerate(lens)]
    errs += [rel(lg[b, :n], hf_out[b][0][:n]) for b, n in enumerate(lens)]
    d = MTPDraft(w32, MAX_LEN)
    paddle.jit.save(d, str(tmp_path / "mtp"), input_spec=d.input_spec())
    hid = np.ascontiguousarray(h[:, :-1])
    args = [ids[:, 1:], hid, np.zeros(2, np.int64), np.zeros((1, 2, MAX_LEN, d.cache_width), np.float32)]
    mlg = _predict(tmp_path / "mtp", args)[0]
    ref = d.step(args[0], args[1], args[2], paddle.to_tensor(args[3]))[0].numpy()
    errs.append(rel(mlg, ref))
    print("paddle.inference rel (decode, prefill vs transformers; MTP vs dygraph):", ["%.2e" % e for e in errs])
    assert max(errs) < TOL32


@pytest.mark.parametrize("patch,msg", [
    ({"n_group": 256}, "n_routed_experts 256 in n_group 256 groups is 1 expert a group"),
    ({"topk_group": 1, "num_experts_per_tok": 40}, r"num_experts_per_tok 40 is more than the topk_group 1 groups it "
                                                    r"picks from hold \(1 x 32\)"),
    ({"qk_rope_head_dim": 63}, "qk_rope_head_dim 63 is odd"),
])
def test_routing_and_rope_settings_the_programs_cannot_run_are_refused(patch, msg):
    """Each was an internal error from Paddle's ops (topk of 2 in a group of 1; a rope over an odd width) in the
    export, or the programs picked experts outside the chosen groups; now export's settings check (and dsx run's,
    before its first step) names the key."""
    from pathlib import Path

    from ds_export.errors import UsageError
    from ds_export.export.exporter import check_settings
    from ds_export.models import deepseek_v3 as ds
    from ds_export.tiny import REAL_CONFIG

    ok = ds.DeepseekV3Config.from_dict(dict(REAL_CONFIG))
    check_settings(ok, tp=8, max_seq_len=4096, speculate=True, source=Path("config.json"))
    cfg = ds.DeepseekV3Config.from_dict(dict(REAL_CONFIG, **patch))
    with pytest.raises(UsageError, match=msg):
        check_settings(cfg, tp=1, max_seq_len=4096, speculate=False, source=Path("config.json"))
