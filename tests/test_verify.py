"""dsx verify: passes on correct conversions, fails naming the culprit on planted faults."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from ds_export.cli.app import main
from ds_export.errors import UsageError
from ds_export.formats import weight_only
from ds_export.io.checkpoint import Checkpoint
from ds_export.io.manifest import Manifest
from ds_export.io.safetensors_file import SafetensorsFile
from ds_export.io.writer import atomic_write_json, write_file
from ds_export.verify import verify

EXPERT = "model.layers.1.mlp.experts.{}.gate_proj.weight"


@pytest.fixture(scope="module")
def outputs(tiny_fp8, tmp_path_factory):
    root = tmp_path_factory.mktemp("v")
    runs = {
        "mix": ["--type", "a8w8_fp8_wint4", "--mtp-type", "a8w8_fp8"],
        "int8g128": ["--type", "weight_only_int8", "--group-size", "128"],
        "bf16": ["--type", "bf16"],
        "fp8": ["--type", "a8w8_fp8"],
    }
    for name, args in runs.items():
        assert main(["quantize", str(tiny_fp8), "--out", str(root / name), "-q", *args]) == 0
    return root


@pytest.fixture
def mix_copy(outputs, tmp_path):
    shutil.copytree(outputs / "mix", tmp_path / "mix")
    return tmp_path / "mix"


@pytest.mark.parametrize("name", ["mix", "int8g128", "bf16", "fp8"])
def test_correct_conversions_pass(outputs, tiny_fp8, name, capsys):
    rep = verify(outputs / name, tiny_fp8)
    assert rep["ok"], rep["findings"] or [w for w in rep["weights"] if not w["ok"]]
    assert rep["weights"] and not rep["findings"]
    assert main(["verify", str(outputs / name), "--reference", str(tiny_fp8)]) == 0
    assert "all checks passed" in capsys.readouterr().out


def _rewrite_shard(root, tensor, change):
    """Rewrite the shard holding `tensor` with change(dict) applied, and re-record its hash (a converter bug,
    not disk corruption: integrity passes, numerics must catch it)."""
    ck = Checkpoint.open(root)
    rel = ck.weight_map[tensor]
    f = SafetensorsFile(root / rel)
    ts = {n: np.array(f.get(n)) for n in f.tensors}
    f.close()
    ck.close()
    change(ts)
    write_file(root / rel, ts, {"format": "pt"})
    m = Manifest.load(root)
    m.record_file(rel)


def _bad(rep):
    return [w["name"] for w in rep["weights"] if not w["ok"]]


def test_flipped_byte_fails_naming_the_file(mix_copy, tiny_fp8, capsys):
    shard = sorted(mix_copy.glob("model-*.safetensors"))[1]
    with open(shard, "r+b") as f:
        f.seek(shard.stat().st_size // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x10]))
    rep = verify(mix_copy, tiny_fp8)
    assert not rep["ok"] and any(shard.name == x["where"] and "sha256" in x["problem"] for x in rep["findings"])
    assert main(["verify", str(mix_copy), "--reference", str(tiny_fp8)]) == 1
    err = capsys.readouterr().err
    assert shard.name in err and len(err.strip().splitlines()) == 1


def test_swapped_experts_are_caught(mix_copy, tiny_fp8):
    def swap(ts):
        a, b = EXPERT.format(0), EXPERT.format(1)
        ts[a], ts[b] = ts[b], ts[a]
        ts[a + "_scale"], ts[b + "_scale"] = ts[b + "_scale"], ts[a + "_scale"]

    _rewrite_shard(mix_copy, EXPERT.format(0), swap)
    rep = verify(mix_copy, tiny_fp8)
    assert not rep["findings"] and set(_bad(rep)) == {EXPERT.format(0), EXPERT.format(1)}


def test_wrong_scale_is_caught(mix_copy, tiny_fp8):
    name = "model.layers.2.self_attn.o_proj.weight"

    def scale(ts):
        ts[name + "_scale_inv"] = ts[name + "_scale_inv"] * np.float32(2)

    _rewrite_shard(mix_copy, name, scale)
    assert _bad(verify(mix_copy, tiny_fp8)) == [name]


def _flip_low_bit(name, at=None):
    def change(ts):
        b = ts[name].reshape(-1).view(np.uint8)
        b[b.size // 2 if at is None else at] ^= 1
    return change


@pytest.mark.parametrize("run,name", [
    ("mix", EXPERT.format(3)),  # one int4 code's low bit
    ("mix", EXPERT.format(3) + "_scale"),  # the last mantissa bit of one bf16 scale
    ("int8g128", "model.layers.2.self_attn.o_proj.weight"),  # one int8 code by 1
    ("bf16", "model.layers.2.self_attn.o_proj.weight"),  # one bf16 weight converted from FP8, by one ulp
    ("bf16", "model.layers.1.mlp.gate.weight"),  # the router kept in float32: a copy
])
def test_a_change_the_gate_cannot_see_is_caught_by_its_bytes(outputs, tiny_fp8, tmp_path, run, name):
    """A fault inside the quantization error (a flipped low bit of one code or scale, with the manifest re-hashed: a
    converter or memory fault, not the disk) passed: the SQNR stays far above its gate. The stored bytes are now
    compared with dsx's own conversion of the reference, which names the tensor and the first byte that differs."""
    from ds_export.models import deepseek_v3 as ds
    from ds_export.verify.weights import check_weights

    target = tmp_path / run
    shutil.copytree(outputs / run, target)
    weight = name.removesuffix("_scale")
    _rewrite_shard(target, name, _flip_low_bit(name))
    with Checkpoint.open(target) as ck, Checkpoint.open(tiny_fp8) as ref:
        cfg = ds.DeepseekV3Config.from_dict(ck.config)
        by_sqnr = {s.name: s for s in check_weights(ck, ref, cfg)}
        assert by_sqnr[weight].ok and by_sqnr[weight].reproduced is None  # (what verify saw before)
    rep = verify(target, tiny_fp8, samples=0)
    assert _bad(rep) == [weight] and not rep["findings"]
    w = next(w for w in rep["weights"] if w["name"] == weight)
    assert w["reproduced"] is False and "not the bytes dsx quantize writes from the reference" in w["problem"]
    assert re.search(rf"first difference: {re.escape(name)} byte \d+", w["problem"]), w["problem"]
    assert sum(x["reproduced"] is True for x in rep["weights"]) == len(rep["weights"]) - 1


def test_a_copy_whose_bytes_differ_but_decode_equal_fails(mix_copy, tiny_fp8):
    """An FP8 weight kept as the source's copy, one +0 code (0x00) made -0 (0x80): the values are equal, so the copy's
    SQNR is exact and it passed; its bytes are not the source's."""
    with Checkpoint.open(mix_copy) as ck:
        name, at = next((n, int(np.flatnonzero(ck.raw(n) == 0)[0])) for n in ck.names()
                        if ck.info(n).dtype == "F8_E4M3" and np.any(ck.raw(n) == 0))

    def negate_zero(ts):
        b = ts[name].reshape(-1).view(np.uint8)
        assert b[at] == 0
        b[at] = 0x80

    _rewrite_shard(mix_copy, name, negate_zero)
    rep = verify(mix_copy, tiny_fp8, samples=0)
    w = next(w for w in rep["weights"] if w["name"] == name)
    assert _bad(rep) == [name] and w["sqnr_db"] is None  # (exact: infinite, written as null)
    assert w["reproduced"] is False and "its bytes are the reference's, copied" in w["problem"], w


def test_bytes_are_compared_only_for_a_dsx_quantize_output_of_the_reference(outputs, tiny_fp8, tmp_path):
    """Another tool's conversion (no dsx manifest), or a reference that is not the output's source, is judged by its
    numbers alone: other bytes are no fault there."""
    plain = tmp_path / "plain"
    shutil.copytree(outputs / "int8g128", plain)
    (plain / "dsx-manifest.json").unlink()
    rep = verify(plain, tiny_fp8, samples=0)
    assert not _bad(rep) and "bytes" not in rep["checked"] and all(w["reproduced"] is None for w in rep["weights"])
    other = tmp_path / "other"
    shutil.copytree(tiny_fp8, other)
    idx = json.loads((other / "model.safetensors.index.json").read_text())
    idx["metadata"]["copied_by"] = "someone"  # (the same weights, another index: not the recorded source)
    (other / "model.safetensors.index.json").write_text(json.dumps(idx))
    rep = verify(outputs / "int8g128", other, samples=0)
    assert rep["reference_is_source"] is False and "bytes" not in rep["checked"]


def test_a_scale_of_an_integer_dtype_is_named_not_decoded(outputs, mix_copy, tiny_fp8, tmp_path, capsys):
    """A block scale declared I32 (the same 4 bytes a value) stopped verify with "dequant_ref: scale_inv must be a 2-D
    float32 array, got int32", naming neither file nor tensor; in the target it is now that tensor's finding, in the
    reference a one-line error naming it."""
    from headers import set_dtype

    name = "model.layers.3.mlp.experts.15.gate_proj.weight"  # (the MTP layer's: FP8 in the mix)
    set_dtype(mix_copy, name + "_scale_inv", "I32")
    rep = verify(mix_copy, tiny_fp8, samples=0)
    assert f"its scale {name}_scale_inv is I32, expected F32" in next(w["problem"] for w in rep["weights"]
                                                                        if w["name"] == name)
    assert main(["verify", str(mix_copy), "--reference", str(tiny_fp8), "-q"]) == 1
    assert f"{name}_scale_inv: is I32 [2, 2], its type a8w8_fp8 implies F32" in capsys.readouterr().err
    ref = tmp_path / "ref"
    shutil.copytree(tiny_fp8, ref)
    set_dtype(ref, name + "_scale_inv", "I32")
    assert main(["verify", str(outputs / "mix"), "--reference", str(ref), "-q"]) == 1
    err = capsys.readouterr().err
    assert f"the reference's {name}: its scale {name}_scale_inv is I32, expected F32" in err, err
    assert len(err.strip().splitlines()) == 1


def test_wrong_arch_layout_is_caught(mix_copy, tiny_fp8):
    name = EXPERT.format(5)
    src = Checkpoint.open(tiny_fp8)
    from ds_export.formats import fp8_block

    w = fp8_block.dequant_ref(src.get(name), src.get(name + "_scale_inv")).astype(weight_only.BF16)

    def arch70(ts):
        q, s = weight_only.quantize_ref(w, 4, -1, 70)  # V100 layout under a config that says arch 90
        assert q.shape == ts[name].shape
        ts[name] = q

    _rewrite_shard(mix_copy, name, arch70)
    assert _bad(verify(mix_copy, tiny_fp8)) == [name]


def test_truncated_file_fails(mix_copy, tiny_fp8):
    shard = sorted(mix_copy.glob("model-*.safetensors"))[-1]
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 10)
    rep = verify(mix_copy, tiny_fp8)
    assert not rep["ok"] and any(x["where"] == shard.name for x in rep["findings"])


def test_stale_config_key_fails(outputs, tiny_fp8, tmp_path):
    root = tmp_path / "int8"
    shutil.copytree(outputs / "int8g128", root)
    cfg = json.loads((root / "config.json").read_text())
    cfg["quantization_config"]["weight_block_size"] = [128, 128]  # left over from the FP8 source
    atomic_write_json(root / "config.json", cfg)
    Manifest.load(root).record_file("config.json")
    rep = verify(root, tiny_fp8)
    assert [f["problem"] for f in rep["findings"]] == [
        "quantization_config.weight_block_size is present without FP8 tensors"]


def test_missing_tensor_fails(mix_copy, tiny_fp8):
    name = "model.layers.0.self_attn.q_a_layernorm.weight"
    _rewrite_shard(mix_copy, name, lambda ts: ts.pop(name))
    idx = json.loads((mix_copy / "model.safetensors.index.json").read_text())
    del idx["weight_map"][name]
    idx["metadata"].pop("total_size")
    atomic_write_json(mix_copy / "model.safetensors.index.json", idx)
    Manifest.load(mix_copy).record_file("model.safetensors.index.json")
    rep = verify(mix_copy, tiny_fp8)
    assert any(f["where"] == name and f["problem"].startswith("missing") for f in rep["findings"])


def test_incomplete_run_fails(mix_copy, tiny_fp8):
    m = Manifest.load(mix_copy)
    m.complete = False
    m.save()
    rep = verify(mix_copy, tiny_fp8)
    assert any("not complete" in f["problem"] for f in rep["findings"])


def test_the_report_and_the_last_line_say_what_was_checked(outputs, tiny_fp8, capsys):
    """Without --reference verify checks integrity only and said "all checks passed" all the same: the report lists
    what it checked and the CLI says what was not."""
    target = outputs / "mix"
    assert verify(target)["checked"] == ["files", "tensors", "config"]
    assert verify(target, tiny_fp8, samples=1)["checked"] == ["files", "tensors", "config", "weights", "bytes",
                                                              "kernels"]
    assert verify(target, tiny_fp8, samples=0)["checked"] == ["files", "tensors", "config", "weights", "bytes"]
    assert main(["verify", str(target)]) == 0
    out = capsys.readouterr().out
    assert "all checks passed (files, tensors, config)" in out and "integrity only" in out and "--reference" in out
    assert main(["verify", str(target), "--reference", str(tiny_fp8), "--samples", "1"]) == 0
    out = capsys.readouterr().out
    assert "all checks passed (files, tensors, config, weights, bytes, kernels)" in out, out
    assert "integrity only" not in out


def test_kernel_checks_run_and_pass(outputs, tiny_fp8):
    rep = verify(outputs / "mix", tiny_fp8)
    kinds = {k["kernel"] for k in rep["kernels"]}
    assert {"block fp8 gemm (cpu)", "weight_only_int4 gemm (cpu)", "grouped fp8 gemm (MoE, cpu)", "mtp accept (cpu)"} <= kinds
    assert all(k["ok"] and k["kernel_err"] < 8e-3 for k in rep["kernels"])
    int4 = [k for k in rep["kernels"] if k["kernel"] == "weight_only_int4 gemm (cpu)"]
    assert all(12 < k["quant_sqnr_db"] < 25 for k in int4)  # INT4 per channel: the quantization error users see


def test_broken_kernel_is_caught(outputs, tiny_fp8, monkeypatch, capsys):
    """A weight-only GEMM that reads the layout with bytes 1 and 2 of each word swapped (a wrong interleave)."""
    from ds_export.native import gemm_weight_only as gw

    real = gw.gemm_weight_only

    def wrong_interleave(x, qweight, scale, bits, group_size=-1, arch=90, **kw):
        q = np.ascontiguousarray(qweight).view(np.uint8).reshape(-1, 4)[:, [0, 2, 1, 3]]
        return real(x, q.reshape(qweight.shape).view(np.int8), scale, bits, group_size, arch, **kw)

    monkeypatch.setattr(gw, "gemm_weight_only", wrong_interleave)
    rep = verify(outputs / "mix", tiny_fp8)
    bad = [k for k in rep["kernels"] if not k["ok"]]
    assert bad and all(k["kernel"] == "weight_only_int4 gemm (cpu)" for k in bad)
    assert all(w["ok"] for w in rep["weights"])  # the stored weights are fine: only the kernel is wrong
    assert main(["verify", str(outputs / "mix"), "--reference", str(tiny_fp8)]) == 1
    assert "weight_only_int4 gemm (cpu)" in capsys.readouterr().err


@pytest.fixture(scope="module")
def latent512(tmp_path_factory):
    """The tiny model with DeepSeek-V3's 512-d latent (the MLA kernel's shape), FP8 and INT4 conversions."""
    from ds_export.tiny import TinySpec, write_tiny

    root = tmp_path_factory.mktemp("v512")
    write_tiny(root / "src", TinySpec(overrides=(("kv_lora_rank", 512),)))
    for name, t in (("fp8", "a8w8_fp8"), ("int4", "weight_only_int4")):
        assert main(["quantize", str(root / "src"), "--out", str(root / name), "--type", t, "--no-mtp", "-q"]) == 0
    return root


def test_mla_decode_kernel_check_with_absorbed_kv_b(latent512):
    reps = {n: verify(latent512 / n, latent512 / "src", samples=2) for n in ("fp8", "int4")}
    for n, rep in reps.items():
        mla = [k for k in rep["kernels"] if k["kernel"].startswith("mla decode (cpu")]
        assert len(mla) == 2 and rep["ok"], n  # 2 sampled layers
        assert all(k["kernel_err"] < 8e-3 for k in mla)
    sq = {n: min(k["quant_sqnr_db"] for k in r["kernels"] if k["role"] == "kv_b") for n, r in reps.items()}
    assert sq["fp8"] > 25 and 8 < sq["int4"] < sq["fp8"] - 10, sq  # FP8 kv_b passes through; INT4 costs ~20 dB


def test_broken_mla_kernel_is_caught(latent512, monkeypatch):
    """An MLA kernel that drops the causal limit of the new tokens (every query sees the whole cache)."""
    from ds_export.native import mla_decode as md

    real = md.mla_decode

    def no_causal(q, kv_cache, page_table, cache_lens, scale, **kw):
        out = [real(q[:, i:i + 1], kv_cache, page_table, cache_lens, scale, **kw) for i in range(q.shape[1])]
        return np.concatenate([o for o, _ in out], 1), np.concatenate([s for _, s in out], 1)

    monkeypatch.setattr(md, "mla_decode", no_causal)
    rep = verify(latent512 / "fp8", latent512 / "src", samples=1)
    bad = [k for k in rep["kernels"] if not k["ok"]]
    assert bad and all(k["kernel"].startswith("mla decode") for k in bad) and not rep["ok"]


def test_device_cuda_without_a_gpu_is_a_clear_error(outputs, tiny_fp8, capsys, monkeypatch):
    from ds_export.native import cuda

    if cuda.available():
        pytest.skip("a GPU is here: tests/gpu/test_verify_cuda.py covers --device cuda")
    import ds_export.verify as v

    read = []
    real = v.check_weights
    monkeypatch.setattr(v, "check_weights", lambda *a, **k: read.append(1) or real(*a, **k))  # (hours on R1)
    assert main(["verify", str(outputs / "mix"), "--reference", str(tiny_fp8), "--device", "cuda"]) == 2
    assert "--device cuda: no CUDA GPU" in capsys.readouterr().err
    assert not read  # (refused before the weights are read, not after)


def test_html_and_json_reports(outputs, tiny_fp8, tmp_path):
    from html.parser import HTMLParser

    h, j = tmp_path / "r.html", tmp_path / "r.json"
    assert main(["verify", str(outputs / "mix"), "--reference", str(tiny_fp8), "--html", str(h), "--report", str(j),
                 "-q"]) == 0
    page = h.read_text()
    HTMLParser().feed(page)  # parses
    assert page.count("<svg") == 2 and "All checks passed (files, tensors, config, weights, bytes, kernels)" in page
    assert "weight_only_int4 expert_up" in page and "Integrity only" not in page
    assert main(["verify", str(outputs / "mix"), "--html", str(h), "-q"]) == 0  # no reference: says so
    assert "All checks passed (files, tensors, config). Integrity only" in h.read_text()
    rep = json.loads(j.read_text())
    assert rep["ok"] and len(rep["weights"]) > 100


def test_html_report_of_a_failure(mix_copy, tiny_fp8, tmp_path):
    shard = sorted(mix_copy.glob("model-*.safetensors"))[0]
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 1)
    assert main(["verify", str(mix_copy), "--reference", str(tiny_fp8), "--html", str(tmp_path / "r.html")]) == 1
    assert "FAILED" in (tmp_path / "r.html").read_text()


def test_gate_file(outputs, tiny_fp8, tmp_path, capsys):
    g = tmp_path / "g.yaml"
    g.write_text("min_sqnr_db:\n  weight_only_int4: 30\n")  # stricter than INT4 per channel can reach
    assert main(["verify", str(outputs / "mix"), "--reference", str(tiny_fp8), "--gate", str(g)]) == 1
    assert "below the weight_only_int4 gate of 30" in capsys.readouterr().err
    g.write_text("min_sqnr_db:\n  int4: 30\n")
    assert main(["verify", str(outputs / "mix"), "--reference", str(tiny_fp8), "--gate", str(g)]) == 2
    capsys.readouterr()
    assert main(["verify", str(outputs / "mix"), "--gate", str(tmp_path / "none.yaml")]) == 2
    assert "none.yaml: gate file not found" in capsys.readouterr().err  # (was "recipe not found")


@pytest.mark.parametrize("text,msg", [
    ("min_sqnr_db:\n  weight_only_int4: .nan\n", "min_sqnr_db.weight_only_int4 is nan, expected a finite number"),
    ("min_sqnr_db:\n  weight_only_int4: thirty\n", "min_sqnr_db.weight_only_int4 is 'thirty'"),
    ("kernel_max_rel_err: .inf\n", "kernel_max_rel_err is inf"),
    ("e2e_max_kl: true\n", "e2e_max_kl is True"),
    ("e2e_min_top1: null\n", "e2e_min_top1 is None"),
])
def test_a_gate_that_is_not_a_finite_number_is_refused(tmp_path, text, msg):
    """A NaN gate passed everything (every comparison with NaN is false), a string was an internal error."""
    from ds_export.verify import load_gates

    g = tmp_path / "g.yaml"
    g.write_text(text)
    with pytest.raises(UsageError, match=re.escape(msg)):
        load_gates(g)
    g.write_text("min_sqnr_db:\n  weight_only_int4: 30\nkernel_max_rel_err: 0.01\ne2e_min_top1: 1\n")
    assert load_gates(g) == {"min_sqnr_db": {"weight_only_int4": 30.0}, "kernel_max_rel_err": 0.01,
                             "e2e_min_top1": 1.0}


def test_end_to_end_logits_of_an_export(outputs, tiny_fp8, tmp_path, capsys):
    from ds_export.tiny import TinySpec, write_tiny

    exp = tmp_path / "exp"
    assert main(["export", str(outputs / "mix"), "--out", str(exp), "--speculate", "--max-seq-len", "320", "-q"]) == 0
    rep = verify(outputs / "mix", tiny_fp8, export=exp, samples=1)
    e = rep["e2e"]
    assert rep["ok"] and e["ok"] and e["tokens"] > 200
    assert e["kl_mean"] < 0.3 and e["top1_agreement"] > 0.3 and abs(e["ppl_delta"]) < 0.2 * e["ppl_reference"]
    assert 0 <= e["mtp_acceptance_rate"] <= 1
    assert rep["checked"][-2:] == ["export files", "end to end"]
    # The export's own files are hashed (a flipped byte in its parameters gave a KL figure at best, and only when the
    # reference fits in memory): named, and no logits run.
    import shutil

    flipped = tmp_path / "flipped"
    shutil.copytree(exp, flipped)
    params = flipped / "model.pdiparams"
    b = bytearray(params.read_bytes())
    b[len(b) // 2] ^= 0x40
    params.write_bytes(bytes(b))
    bad = verify(outputs / "mix", tiny_fp8, export=flipped, samples=0)
    assert not bad["ok"] and bad["e2e"] is None and "end to end" not in bad["checked"]
    assert [(f["where"], "sha256" in f["problem"]) for f in bad["findings"]] == [(f"{flipped}/model.pdiparams", True)]
    # An export of another conversion than the target (its recorded source files differ): named as such.
    other_q = tmp_path / "other-q"
    assert main(["quantize", str(tiny_fp8), "--out", str(other_q), "--type", "a8w8_fp8", "-q"]) == 0
    stale = verify(other_q, tiny_fp8, export=exp, samples=0)
    assert not stale["ok"] and "whose files differ from" in stale["findings"][0]["problem"], stale["findings"]
    # A planted fault: an export of other weights (another seed) next to correct quantized weights.
    write_tiny(tmp_path / "other", TinySpec(seed=1))
    wrong = tmp_path / "wrong-exp"
    assert main(["export", str(tmp_path / "other"), "--out", str(wrong), "--max-seq-len", "320", "-q"]) == 0
    capsys.readouterr()
    assert main(["verify", str(outputs / "mix"), "--reference", str(tiny_fp8), "--export", str(wrong),
                 "--samples", "0"]) == 1
    assert "KL" in capsys.readouterr().err
    # A model too big for the float32 reference on this host: a clear error, not an out-of-memory kill.
    import ds_export.verify.e2e as e2e

    import ds_export.verify as V

    real, real_weights, weighed = e2e.memory_available, V.check_weights, []
    e2e.memory_available = lambda: 2**20
    V.check_weights = lambda *a, **k: weighed.append(1) or real_weights(*a, **k)
    try:
        assert main(["verify", str(outputs / "mix"), "--reference", str(tiny_fp8), "--export", str(exp),
                     "--samples", "0"]) == 1
    finally:
        e2e.memory_available, V.check_weights = real, real_weights
    err = capsys.readouterr().err
    assert "the end-to-end check runs the float32 model" in err and "GiB are available" in err
    assert not weighed  # (refused before the weight checks, hours on R1, not after them)


class _Recorder:
    """A ds_export.progress.Reporter that keeps what it is told (advance comes from worker threads too)."""

    def __init__(self):
        import threading

        self.lock, self.phases = threading.Lock(), []

    def phase(self, what, total, unit="bytes"):
        with self.lock:
            self.phases.append(entry := [what, total, unit, 0])

        def advance(n):
            with self.lock:
                entry[3] += n
        return advance


@pytest.mark.parametrize("name", ["mix", "fp8"])
def test_progress_counts_every_phase_to_its_total(outputs, tiny_fp8, name):
    """Each check announces its phase with what it will read (bytes) or do (checks) and counts exactly that; the
    kernels' bar counts to the report's kernel lines (it said 46 checks beside a report of 45); the report is the
    one a run without a reporter gives."""
    rec = _Recorder()
    rep = verify(outputs / name, tiny_fp8, progress=rec)
    assert rep["ok"]
    assert [p[0].split(" (")[0] for p in rec.phases] == ["sha256", "weights", "kernels"]
    assert all(done == total > 0 for _, total, _, done in rec.phases), rec.phases
    m = Manifest.load(outputs / name)
    files, weights, kernels = rec.phases
    assert files[1] == sum(e["size"] for e in m.files.values()) and files[2] == "bytes"
    with Checkpoint.open(outputs / name) as ck, Checkpoint.open(tiny_fp8) as ref:
        assert weights[1] == sum(ck.info(w["name"]).nbytes + ref.info(w["name"]).nbytes for w in rep["weights"])
    assert kernels[2] == "checks" and kernels[1] == len(rep["kernels"]) > 4
    quiet = verify(outputs / name, tiny_fp8)
    assert rep["weights"] == quiet["weights"] and rep["kernels"] == quiet["kernels"]


@pytest.mark.parametrize("which", [0, -1])
def test_a_shard_that_fails_its_hash_is_reported_alone(mix_copy, tiny_fp8, which):
    """Shards are hashed beside the weight check; one that fails makes the report the files' findings alone (no
    weight or kernel figure, though its tensors were read beside the hash), and no kernel check runs."""
    shard = sorted(mix_copy.glob("model-*.safetensors"))[which]
    with open(shard, "r+b") as f:
        f.seek(-1, 2)
        b = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([b[0] ^ 1]))
    rec = _Recorder()
    rep = verify(mix_copy, tiny_fp8, progress=rec)
    assert not rep["ok"] and rep["weights"] == [] and rep["kernels"] == [] and rep["by_format"] == {}
    assert [f["where"] for f in rep["findings"]] == [shard.name] and "sha256" in rep["findings"][0]["problem"]
    assert [p[0].split(" (")[0] for p in rec.phases] == ["sha256", "weights"]  # no kernels after a failed file
    assert rec.phases[0][3] == rec.phases[0][1]


def test_each_shard_is_hashed_as_its_weights_are_read(mix_copy, tiny_fp8, monkeypatch):
    """The weight check takes the shards in name order and starts each one's hash as it reaches it, before reading
    any of its tensors (so on R1 the two reads of a shard meet in the page cache, and the disk gives it once)."""
    from ds_export.verify import weights as W
    from ds_export.verify.integrity import FileChecks

    events, real_rows, real_reading = [], W._stored_rows, FileChecks.reading

    def stored_rows(ck, name, *a):
        events.append(("read", ck.info(name).file.name))
        return real_rows(ck, name, *a)

    def reading(self, file):
        events.append(("hash", Path(file).name))
        return real_reading(self, file)

    monkeypatch.setattr(W, "_stored_rows", stored_rows)
    monkeypatch.setattr(FileChecks, "reading", reading)
    rep = verify(mix_copy, tiny_fp8, samples=0)
    assert rep["ok"]
    names = [w["name"] for w in rep["weights"]]
    with Checkpoint.open(mix_copy) as ck:  # the report keeps the target's order, whatever order the shards took
        order = {n: i for i, n in enumerate(ck.names())}
        by_file = sorted(names, key=lambda n: (ck.info(n).file.name, ck.info(n).begin))
    assert names == sorted(names, key=order.get) != by_file
    shards = [f for kind, f in events if kind == "hash"]
    assert shards == sorted(set(shards)) and len(shards) > 1
    for i, (kind, f) in enumerate(events):
        if kind == "read":
            assert ("hash", f) in events[:i]
            assert all(g <= f for k, g in events[:i] if k == "read")  # shard by shard, never back


def test_files_hashed_first_without_a_reference_or_with_a_file_missing(mix_copy, tiny_fp8):
    rec = _Recorder()
    assert verify(mix_copy, progress=rec)["ok"]
    assert [p[0].split(" (")[0] for p in rec.phases] == ["sha256"]
    shard = sorted(mix_copy.glob("model-*.safetensors"))[1]
    shard.unlink()
    rep = verify(mix_copy, tiny_fp8)
    assert not rep["ok"] and [f["where"] for f in rep["findings"]] == [shard.name] and rep["weights"] == []
    assert "missing" in rep["findings"][0]["problem"]


def test_a_header_that_does_not_parse_is_reported_by_its_hash(mix_copy, tiny_fp8):
    shard = sorted(mix_copy.glob("model-*.safetensors"))[0]
    with open(shard, "r+b") as f:
        f.seek(8)
        f.write(b"#")  # the JSON header's first byte, same size
    rep = verify(mix_copy, tiny_fp8)
    assert not rep["ok"] and [f["where"] for f in rep["findings"]] == [shard.name]
    assert "sha256" in rep["findings"][0]["problem"]


def test_cli_progress_is_drawn_on_a_terminal_only():
    import io

    from rich.console import Console

    from ds_export.cli.progress import VerifyBar
    from ds_export.cli.output import Out

    def drawn(terminal: bool, **out) -> str:
        o = Out(**out)
        buf = io.StringIO()
        o.err = Console(file=buf, force_terminal=terminal, width=120)
        with VerifyBar(o) as p:
            files = p.phase("sha256 (3 files)", 3 << 20)
            kernels = p.phase("kernels (cpu)", 7, "checks")
            files(3 << 20)
            kernels(7)
        return buf.getvalue()

    shown = drawn(True)
    assert "sha256 (3 files)" in shown and "3.00 MiB/3.00 MiB" in shown and "7/7 checks" in shown
    assert drawn(False) == "" and drawn(True, json=True) == "" and drawn(True, quiet=True) == ""


def test_file_checks_start_the_right_hash_however_the_root_is_given(mix_copy, monkeypatch):
    """reading(file) finds a shard whether the root is given relative or absolute (a relative root must not miss
    every shard), starts its hash and those of the listed files before it, and nothing for an unlisted file."""
    from ds_export.verify.integrity import FileChecks

    monkeypatch.chdir(mix_copy.parent)
    for root in (Path(mix_copy.name), mix_copy):
        with FileChecks(root) as files, Checkpoint.open(root) as ck:
            shard = ck.info(sorted(ck.names())[-1]).file
            files.reading(root / "not-listed.safetensors")
            assert files.futures == {}
            files.reading(shard)
            assert sorted(files.futures) == [r for r in files.rels if r <= shard.name]
            assert files.finish() == []


def test_report_paths_are_checked_before_the_work(outputs, tiny_fp8, tmp_path, monkeypatch, capsys):
    """--report / --html naming a directory or a path in a missing directory failed at the very end, after every
    check had run (hours on R1; "." was an internal error): refused first, nothing checked."""
    import ds_export.verify as v

    ran = []
    monkeypatch.setattr(v, "verify", lambda *a, **k: ran.append(1))
    for args, want in ((["--report", str(tmp_path)], "--report " + str(tmp_path) + ": is a directory"),
                       (["--report", "."], "--report .: is a directory"),
                       (["--html", str(tmp_path / "no" / "r.html")], "the directory " + str(tmp_path / "no") +
                        " does not exist")):
        assert main(["verify", str(outputs / "mix"), "--reference", str(tiny_fp8), *args, "-q"]) == 2
        assert want in capsys.readouterr().err
    assert not ran


@pytest.mark.parametrize("args,want", [(["--experts", "-1"], "--experts -1: expected at least 1"),
                                       (["--experts", "0"], "--experts 0: expected at least 1"),
                                       (["--samples", "-2"], "--samples -2: expected 0")])
def test_experts_and_samples_below_their_range_are_refused(outputs, tiny_fp8, capsys, args, want):
    """--experts -1 (read as "all", the usual convention) or 0 skipped every routed expert, 97% of R1's weights,
    and the report said ok; --samples -2 ran no kernel check without a word."""
    assert main(["verify", str(outputs / "mix"), "--reference", str(tiny_fp8), *args, "-q"]) == 2
    assert want in capsys.readouterr().err


def test_a_reference_that_is_the_target_itself_is_refused(outputs, tmp_path, capsys):
    """Every weight is bit-identical to itself: verify PATH --reference PATH passed whatever PATH held. Refused, also
    through another spelling of the same directory (a symlink)."""
    mix = outputs / "mix"
    assert main(["verify", str(mix), "--reference", str(mix), "-q"]) == 2
    err = capsys.readouterr().err
    assert f"--reference {mix}: is {mix} itself" in err and len(err.strip().splitlines()) == 1
    (tmp_path / "link").symlink_to(mix)
    assert main(["verify", str(mix), "--reference", str(tmp_path / "link"), "-q"]) == 2
    assert "itself" in capsys.readouterr().err
