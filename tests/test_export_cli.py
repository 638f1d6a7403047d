"""dsx export + dsx generate on the tiny checkpoint: the saved programs, greedy decoding, speculation."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from ds_export.cli.app import main
from ds_export.export import runtime
from ds_export.io.checkpoint import Checkpoint
from ds_export.io.manifest import Manifest

pytest.importorskip("paddle")
PROMPTS = [[0, 5, 9, 17, 33, 2], [0, 44, 3, 2, 250, 7]]
IDS = ";".join(",".join(map(str, p)) for p in PROMPTS)


@pytest.fixture(scope="module")
def exported(tiny_fp8, tmp_path_factory):
    out = tmp_path_factory.mktemp("exp") / "tiny-export"
    assert main(["export", str(tiny_fp8), "--out", str(out), "--speculate", "--max-seq-len", "128", "-q"]) == 0
    return out


def test_layout_and_config(exported):
    for f in ("model.json", "model.pdiparams", "config.json", "tokenizer.json", "mtp/model.json",
              "mtp/model.pdiparams", "mtp/config.json", "dsx-manifest.json"):
        assert (exported / f).is_file(), f
    cfg = json.loads((exported / "config.json").read_text())
    assert cfg["infer_model_max_seq_len"] == 128 and cfg["mla_use_matrix_absorption"] is True
    assert cfg["speculate_method"] == "mtp" and "quantization_config" not in cfg
    mcfg = json.loads((exported / "mtp" / "config.json").read_text())
    assert mcfg["num_hidden_layers"] == 1 and mcfg["mtp_source_layer"] == 3
    assert not exported.with_name(exported.name + ".partial").exists()


def test_prompt_logits_match_transformers_and_the_draft_reference(exported, tiny_fp8, tmp_path):
    torch = pytest.importorskip("torch")
    from reference_hf import build_reference, reference_forward
    from test_export_model import mtp_reference

    npz = tmp_path / "l.npz"
    assert main(["generate", str(exported), "--input-ids", IDS, "--max-new-tokens", "1", "--dump-logits", str(npz),
                 "-q"]) == 0
    got = np.load(npz)
    assert got["base_logits"].shape == (2, 6, 512) and got["mtp_logits"].shape == (2, 5, 512)
    hf = build_reference(tiny_fp8)
    ck = Checkpoint.open(tiny_fp8)
    from ds_export.models import deepseek_v3 as ds

    cfg = ds.DeepseekV3Config.from_dict(ck.config)
    for b, p in enumerate(PROMPTS):
        ref, h = reference_forward(hf, p)
        assert np.abs(got["base_logits"][b] - ref).max() / np.abs(ref).max() < 1e-4
        with torch.no_grad():
            mref, _ = mtp_reference(ck, cfg, hf, np.array(p[1:]), h[:-1])
        assert np.abs(got["mtp_logits"][b] - mref).max() / np.abs(mref).max() < 1e-4


def _greedy_reference(tiny_fp8, prompt, n):
    import torch
    from reference_hf import build_reference

    hf = build_reference(tiny_fp8)
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


@pytest.mark.parametrize("k", [1, 3])
def test_speculation_gives_the_same_greedy_output(exported, tiny_fp8, k, capsys):
    assert main(["generate", str(exported), "--input-ids", IDS, "--max-new-tokens", "10", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(["generate", str(exported), "--input-ids", IDS, "--max-new-tokens", "10", "--speculate", str(k),
                 "--json"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert spec["tokens"] == plain["tokens"] and plain["base_steps"] == 9
    assert 0 <= spec["acceptance_rate"] <= 1 and spec["drafted"] > 0
    if k == 1:
        assert plain["tokens"][0] == _greedy_reference(tiny_fp8, PROMPTS[0], 10)


def test_a_perfect_draft_is_fully_accepted(exported):
    """Machinery check: a draft that knows the greedy continuation gets every token accepted,
    so each base step yields K + 1 tokens and the output is unchanged."""
    sess = runtime.Session(exported, speculate=True)
    plain = runtime.generate(sess, PROMPTS, 20)  # the oracle knows more than the run will need
    full = [p + t for p, t in zip(PROMPTS, plain.tokens)]
    real_mtp = sess.mtp

    def oracle(ids, hidden, cache_lens, cache):
        lg, h, cache = real_mtp(ids, hidden, cache_lens, cache)  # real shapes, hidden and cache
        lg = np.full_like(lg, -1e9)
        for b in range(ids.shape[0]):
            for i in range(ids.shape[1]):
                pos = int(cache_lens[b]) + i + 2  # draft position p predicts token p + 2
                if pos < len(full[b]):
                    lg[b, i, full[b][pos]] = 0
        return lg, h, cache

    sess.mtp = oracle
    k = 3
    res = runtime.generate(sess, PROMPTS, 12, speculate=k)
    assert res.tokens == [t[:12] for t in plain.tokens]
    assert res.accepted == res.drafted and res.base_steps == 3  # 1 token from the prefill + 3 x (K + 1)
    assert res.to_json()["tokens_per_base_step"] == k + 1


def test_a_draft_that_is_always_wrong_yields_one_token_a_step(exported):
    """None accepted: each verification step commits the base model's own token only, so 1.0 tokens a base step
    (the prefill's token is not a step's: counting it read 12 / 11 = 1.09)."""
    sess = runtime.Session(exported, speculate=True)
    plain = runtime.generate(sess, PROMPTS, 16)
    full = [p + t for p, t in zip(PROMPTS, plain.tokens)]
    real_mtp = sess.mtp

    def wrong(ids, hidden, cache_lens, cache):
        lg, h, cache = real_mtp(ids, hidden, cache_lens, cache)
        lg = np.full_like(lg, -1e9)
        for b in range(ids.shape[0]):
            for i in range(ids.shape[1]):
                pos = int(cache_lens[b]) + i + 2
                lg[b, i, (full[b][pos] + 1) % lg.shape[-1]] = 0  # never the greedy token
        return lg, h, cache

    sess.mtp = wrong
    res = runtime.generate(sess, PROMPTS, 12, speculate=2)
    assert res.tokens == [t[:12] for t in plain.tokens]
    assert res.accepted == 0 and res.base_steps == 11
    rep = res.to_json()
    assert rep["acceptance_rate"] == 0 and rep["tokens_per_base_step"] == 1.0


def test_errors(exported, tiny_fp8, tmp_path, capsys):
    assert main(["export", str(tiny_fp8), "--out", str(exported)]) == 2  # exists, no --force
    assert "exists" in capsys.readouterr().err
    assert main(["export", str(tiny_fp8), "--out", str(tmp_path / "x"), "--tp", "3"]) == 2
    capsys.readouterr()
    # (--draft-tokens was ignored without --speculate: the config said 0 draft tokens)
    assert main(["export", str(tiny_fp8), "--out", str(tmp_path / "x"), "--draft-tokens", "3"]) == 2
    assert "--draft-tokens 3 without --speculate" in capsys.readouterr().err and not (tmp_path / "x").exists()
    assert main(["generate", str(exported), "--input-ids", "1,x"]) == 2
    assert main(["generate", str(exported), "--input-ids", "0,1", "--max-new-tokens", "500"]) == 2
    assert "max sequence length" in capsys.readouterr().err
    broken = tmp_path / "broken"
    shutil.copytree(exported, broken)
    (broken / "dsx-manifest.json").unlink()
    assert main(["generate", str(broken), "--input-ids", "0,1"]) == 1
    assert "not a complete dsx export" in capsys.readouterr().err
    wo = tmp_path / "wo"
    assert main(["quantize", str(tiny_fp8), "--out", str(wo), "--type", "weight_only_int8", "-q"]) == 0
    # a quantize output has a complete manifest too, and no programs: generate said "internal error: KeyError"
    assert main(["generate", str(wo), "--input-ids", "0,1"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a dsx quantize output, not an export" in err and "dsx export" in err, err
    # the source checkpoint, or a path that is not there, were "not a complete dsx export (no dsx-manifest.json)"
    qc_path = wo / "config.json"
    for path, want in ((tiny_fp8, "a checkpoint, not an export (export it first: dsx export"),
                       (tmp_path / "nowhere", "nowhere: does not exist (expected a dsx export)"),
                       (qc_path, "config.json: not a directory")):
        assert main(["generate", str(path), "--input-ids", "0,1"]) == 1
        err = capsys.readouterr().err
        assert want in err and err.count("\n") == 1, err
    # a recipe entry that contradicts the stored tensors
    cfg = json.loads(qc_path.read_text())
    cfg["quantization_config"]["types_by_role"]["q_b"] = {"type": "weight_only_int4", "group_size": -1}
    qc_path.write_text(json.dumps(cfg))
    assert main(["export", str(wo), "--out", str(tmp_path / "e")]) != 0
    assert "do not fit int4" in capsys.readouterr().err


def test_inspect_summarizes_an_export(exported, tiny_fp8, capsys):
    """dsx inspect EXPORT said "neither model.safetensors.index.json nor model.safetensors found": an export is
    summarized from its manifest and config."""
    assert main(["inspect", str(exported), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["kind"] == "export" and s["complete"] and s["source"] == str(tiny_fp8)
    assert s["max_seq_len"] == 128 and s["tensor_parallel_degree"] == 1 and s["speculate"] == "mtp"
    assert s["files"] == len(json.loads((exported / "dsx-manifest.json").read_text())["files"]) and s["total_bytes"] > 0
    assert main(["inspect", str(exported)]) == 0
    out = capsys.readouterr().out
    assert "a dsx export of" in out and "speculation: mtp, 1 draft token(s)" in out


def test_verify_of_an_export_says_where_it_goes(exported, tiny_fp8, capsys):
    """dsx verify EXPORT said "neither model.safetensors.index.json nor model.safetensors found"."""
    assert main(["verify", str(exported)]) == 2
    err = capsys.readouterr().err
    assert "a dsx export; verify checks a converted checkpoint" in err and f"--export {exported}" in err
    assert f"dsx verify {tiny_fp8} --reference ORIGINAL" in err, err


def test_force_removes_only_an_export(exported, tiny_fp8, tmp_path, capsys):
    """--force removes OUT whole before the new export takes its place: given a directory that is not an export (a
    home directory by mistake), the source, or one holding the source, it deleted them. Refused, untouched; an
    export or an empty directory is replaced."""
    import shutil

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    src = tmp_path / "src"
    shutil.copytree(tiny_fp8, src)
    for out, want in ((mine, "not a dsx export"), (src, "is the source checkpoint"),
                      (tmp_path, "holds the source checkpoint")):
        assert main(["export", str(src), "--out", str(out), "--force", "-q"]) == 2
        assert want in capsys.readouterr().err
    assert (mine / "notes.txt").read_text() == "keep"
    with Checkpoint.open(src):
        pass
    again = tmp_path / "again"
    shutil.copytree(exported, again)
    (tmp_path / "empty").mkdir()
    for out in (again, tmp_path / "empty"):
        assert main(["export", str(src), "--out", str(out), "--force", "--max-seq-len", "64", "-q"]) == 0
        assert json.loads((out / "config.json").read_text())["infer_model_max_seq_len"] == 64


def test_generate_refuses_an_edit_that_keeps_the_size(exported, tmp_path, capsys):
    """generate compared only sizes with the manifest: config.json's eos_token_id 1 -> 2, or a flipped byte of a
    parameter file, ran as if intact. Files up to HASHED_ON_LOAD are hashed before loading (the tiny export's are all
    small); the untouched copy still runs."""
    import shutil

    from ds_export.export.exporter import HASHED_ON_LOAD

    for rel in ("config.json", "model.pdiparams", "mtp/model.json"):
        out = tmp_path / rel.replace("/", "_")
        shutil.copytree(exported, out)
        assert (out / rel).stat().st_size <= HASHED_ON_LOAD
        b = bytearray((out / rel).read_bytes())
        if rel == "config.json":
            b = bytearray(bytes(b).replace(b'"eos_token_id": 1,', b'"eos_token_id": 2,', 1))
            assert b != (exported / rel).read_bytes()
        else:
            b[len(b) // 2] ^= 4
        (out / rel).write_bytes(bytes(b))
        assert main(["generate", str(out), "--input-ids", "0,5", "--max-new-tokens", "1", "-q"]) == 1
        err = capsys.readouterr().err
        assert f"{rel}: sha256 differs from the manifest" in err and "run dsx export again" in err, err
    assert main(["generate", str(exported), "--input-ids", "0,5", "--max-new-tokens", "1", "-q"]) == 0


@pytest.mark.parametrize("tensor,value,dtype", [
    ("model.layers.1.self_attn.q_a_proj.weight", b"\x7f", "float32"),  # an e4m3 NaN code: dequantized
    ("model.layers.1.self_attn.q_a_proj.weight", b"\x7f", "bfloat16"),  # the same, dequantized straight to bf16
    ("model.layers.1.self_attn.q_a_proj.weight", b"\xff", "float16"),  # (-NaN) through float32, then cast
    ("model.layers.2.input_layernorm.weight", b"\x80\x7f", "float32"),  # a bf16 +Inf norm weight
    ("model.layers.2.input_layernorm.weight", b"\x80\x7f", "bfloat16"),  # the same, written as it is stored
    ("lm_head.weight", b"\xc0\xff", "bfloat16"),  # a bf16 NaN in the head, transposed as it is written
])
def test_a_non_finite_weight_is_refused_naming_it(tiny_fp8, tmp_path, capsys, tensor, value, dtype):
    """A NaN / Inf weight (an e4m3 NaN code, a bf16 Inf) in an export's source went into the programs, whose logits
    were then NaN, exit 0. Refused, naming the shard and the tensor; nothing is published."""
    from headers import set_bytes

    src = tmp_path / "src"
    shutil.copytree(tiny_fp8, src)
    shard = set_bytes(src, tensor, 100, value)
    assert main(["export", str(src), "--out", str(tmp_path / "e"), "--max-seq-len", "64", "--dtype", dtype,
                 "-q"]) == 1
    err = capsys.readouterr().err
    assert f"{shard}: tensor {tensor!r}: 1 NaN or Inf value(s)" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "e").exists()


def test_a_value_beyond_float16_is_refused_not_written_as_inf(tiny_fp8, tmp_path, capsys):
    """A bf16 weight of 65536 exported with --dtype float16 (largest 65504) was cast to Inf and written: programs whose
    logits are NaN, exit 0."""
    from headers import set_bytes

    src = tmp_path / "src"
    shutil.copytree(tiny_fp8, src)
    tensor = "model.layers.2.post_attention_layernorm.weight"
    shard = set_bytes(src, tensor, 6, b"\x80\x47")  # bf16 65536, element 3
    assert main(["export", str(src), "--out", str(tmp_path / "e"), "--max-seq-len", "64", "--dtype", "float16",
                 "-q"]) == 1
    err = capsys.readouterr().err
    assert (f"{shard}: tensor {tensor!r}: 1 value(s) beyond float16's range (the first at flat index 3, 65536) "
            "(export with --dtype bfloat16 or float32)") in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "e").exists()
    assert main(["export", str(src), "--out", str(tmp_path / "b"), "--max-seq-len", "64", "--dtype", "bfloat16",
                 "-q"]) == 0


def test_a_16bit_export_writes_the_source_bits_of_same_dtype_tensors(tiny_fp8, tmp_path):
    """A bf16 tensor exported as bfloat16 is written as it is stored (no float32 round trip), a Linear's transposed
    to Paddle's [in, out]: the embedding and the head, bit for bit against the source read by numpy."""
    from ds_export.export.pdiparams import read_params

    ck = Checkpoint.open(tiny_fp8)
    embed = np.asarray(ck.get("model.embed_tokens.weight")).view(np.uint16)
    head = np.asarray(ck.get("lm_head.weight")).view(np.uint16)
    assert main(["export", str(tiny_fp8), "--out", str(tmp_path / "e"), "--max-seq-len", "64", "--dtype", "bfloat16",
                 "-q"]) == 0
    written = [a.view(np.uint16) for a in read_params(tmp_path / "e" / "model.pdiparams") if a.dtype.itemsize == 2]
    assert any(a.shape == embed.shape and np.array_equal(a, embed) for a in written)
    assert any(a.shape == head.T.shape and np.array_equal(a, head.T) for a in written)
    assert not any(a.shape == head.shape and np.array_equal(a, head) for a in written)  # (not left untransposed)


def test_a_nan_code_in_a_kept_fp8_weight_is_refused(tiny_fp8, tmp_path, capsys):
    """A dsx quantize output's FP8 weight is exported as it is (the FP8 op's operand, never decoded): a NaN code there
    (manifest re-hashed: written wrong, not the disk) went into the program."""
    from headers import set_bytes

    q = tmp_path / "q"
    assert main(["quantize", str(tiny_fp8), "--out", str(q), "--type", "a8w8_fp8", "-q"]) == 0
    tensor = "model.layers.1.self_attn.o_proj.weight"
    set_bytes(q, tensor, 10, b"\xff")
    assert main(["export", str(q), "--out", str(tmp_path / "e"), "--max-seq-len", "64", "-q"]) == 1
    err = capsys.readouterr().err
    assert f"tensor {tensor!r}: 1 NaN or Inf value(s) (the first at flat index 10)" in err, err


def test_force_replaces_an_export_whose_manifest_is_damaged(exported, tiny_fp8, tmp_path, capsys):
    """generate on an export whose dsx-manifest.json is damaged says to export again with --force, and --force
    refused the directory as "not a dsx export". One that holds nothing but an export's files is replaced; one with
    a file of the user's beside them is still refused, untouched."""
    import shutil

    out = tmp_path / "e"
    shutil.copytree(exported, out)
    (out / "dsx-manifest.json").write_text("[")
    assert main(["generate", str(out), "--input-ids", "0,5", "--max-new-tokens", "1", "-q"]) == 1
    assert "with --force" in capsys.readouterr().err
    (out / "notes.txt").write_text("mine")
    assert main(["export", str(tiny_fp8), "--out", str(out), "--force", "--max-seq-len", "64", "-q"]) == 2
    assert "not a dsx export" in capsys.readouterr().err and (out / "notes.txt").is_file()
    (out / "notes.txt").unlink()
    assert main(["export", str(tiny_fp8), "--out", str(out), "--force", "--max-seq-len", "64", "-q"]) == 0
    assert json.loads((out / "config.json").read_text())["infer_model_max_seq_len"] == 64


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_16bit_export_runs_under_paddle_inference(tiny_fp8, tmp_path, dtype):
    """A bf16 / fp16 export (16-bit parameters and cache) through the predictor equals the dygraph model
    of that dtype, whose distance to transformers is tested in test_export_model."""
    from ds_export.export.modeling import DeepseekV3ForInference
    from ds_export.export.weights import load_weights

    e = tmp_path / dtype
    assert main(["export", str(tiny_fp8), "--out", str(e), "--dtype", dtype, "--speculate", "--max-seq-len",
                 "128", "-q"]) == 0
    got = tmp_path / "b.npz"
    assert main(["generate", str(e), "--input-ids", IDS, "--max-new-tokens", "4", "--speculate", "1",
                 "--dump-logits", str(got), "-q"]) == 0
    assert runtime.Session(e).cache(1, 1).dtype.name == dtype
    m = DeepseekV3ForInference(load_weights(tiny_fp8, dtype, include_mtp=False), 128)
    ref, _, _ = m.step(np.array(PROMPTS), np.zeros(2, np.int64), m.empty_cache(2))
    ref = ref.numpy()
    b = np.load(got)["base_logits"]
    assert np.abs(b - ref).max() / np.abs(ref).max() < 1e-6


def test_a_second_export_into_the_same_out_is_refused_while_the_first_runs(tiny_fp8, tmp_path, capsys):
    """Two exports into one OUT cleared and wrote the same OUT.partial: the first hashed the second's half-written
    files into its manifest and moved them to OUT. The second is refused while another process holds OUT.partial's
    lock; a later export clears what a killed one left there (stray files are not in its output)."""
    from dir_lock import held_by_another_process

    out = tmp_path / "e"
    staging = tmp_path / "e.partial"
    staging.mkdir()
    (staging / "model.pdiparams").write_bytes(b"left by a killed export")
    (staging / "stray").mkdir()
    (staging / "stray" / "x").write_text("x")
    with held_by_another_process(staging):
        assert main(["export", str(tiny_fp8), "--out", str(out), "--max-seq-len", "64", "-q"]) == 2
        err = capsys.readouterr().err
        assert "e.partial: another dsx process is writing or reading it now (dsx export writes it alone)" in err, err
        assert (staging / "stray" / "x").is_file() and not out.exists()  # (the holder's files untouched)
    assert main(["export", str(tiny_fp8), "--out", str(out), "--max-seq-len", "64", "-q"]) == 0
    assert not staging.exists() and not (out / "stray").exists()
    from ds_export.export.exporter import check_export

    m = check_export(out)
    on_disk = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()} - {"dsx-manifest.json"}
    assert on_disk == set(m.files) and all(m.verify_file(f) is None for f in m.files)


def test_the_lock_follows_a_directory_renamed_while_it_was_taken(tmp_path, monkeypatch):
    """An export finishing renames its locked OUT.partial to OUT: a second one that opened OUT.partial just before
    held a lock on OUT after it, not on the new OUT.partial; it takes the new directory's lock instead."""
    import fcntl
    import os

    from ds_export.io import dirlock

    root = tmp_path / "s.partial"
    real = fcntl.flock
    calls = []

    def flock(fd, op):
        calls.append(fd)
        if len(calls) == 1:  # (the first holder finishes between our open and our lock)
            os.rename(root, tmp_path / "s")
        return real(fd, op)

    monkeypatch.setattr(dirlock.fcntl, "flock", flock)
    with dirlock.exclusive(root, "dsx export"):
        assert root.is_dir() and len(calls) == 2
        st, held = os.stat(root), os.fstat(calls[-1])
        assert (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def test_an_export_being_read_is_not_replaced(exported, tiny_fp8, tmp_path, capsys):
    """export --force removed OUT whole while a dsx verify --export (or a generate) read its files: refused while a
    reader holds OUT, before anything is written; the export there is unchanged."""
    from dir_lock import held_by_another_process

    out = tmp_path / "e"
    shutil.copytree(exported, out)
    before = sorted(p.name for p in out.iterdir())
    with held_by_another_process(out, reader=True):
        assert main(["export", str(tiny_fp8), "--out", str(out), "--force", "--max-seq-len", "64", "-q"]) == 2
        err = capsys.readouterr().err
        assert f"{out}: another dsx process is writing or reading it now (dsx export --force writes it alone)" in err
    assert sorted(p.name for p in out.iterdir()) == before and not (tmp_path / "e.partial").exists()
    assert json.loads((out / "config.json").read_text())["infer_model_max_seq_len"] == 128
    with held_by_another_process(out):  # (an export --force replacing it: generate does not load it meanwhile)
        assert main(["generate", str(out), "--input-ids", "0,5", "--max-new-tokens", "1", "-q"]) == 2
        assert f"{out}: a dsx process is writing it now; dsx generate reads it" in capsys.readouterr().err


def test_force_through_a_symlink_replaces_the_directory_it_points_to(exported, tiny_fp8, tmp_path, capsys,
                                                                       monkeypatch):
    """OUT given as a symlink to an export (exports kept on another disk): --force wrote the whole export, then
    failed with "Cannot call rmtree on a symbolic link" and left OUT.partial. The export it points to is replaced
    there, the link kept."""
    real = tmp_path / "disk" / "e"
    real.parent.mkdir()
    shutil.copytree(exported, real)
    link = tmp_path / "e"
    link.symlink_to(real)
    assert main(["export", str(tiny_fp8), "--out", str(link), "--force", "--max-seq-len", "64", "-q"]) == 0
    assert link.is_symlink() and link.resolve() == real.resolve()
    assert json.loads((real / "config.json").read_text())["infer_model_max_seq_len"] == 64
    assert sorted(p.name for p in tmp_path.iterdir()) == ["disk", "e"]
    assert sorted(p.name for p in real.parent.iterdir()) == ["e"]
    monkeypatch.chdir(real)  # ("--out ." from inside the export: an internal error, "'.' has an empty name")
    assert main(["export", str(tiny_fp8), "--out", ".", "--force", "--max-seq-len", "32", "-q"]) == 0
    assert json.loads((real / "config.json").read_text())["infer_model_max_seq_len"] == 32
    assert sorted(p.name for p in real.parent.iterdir()) == ["e"]


def test_an_export_that_cannot_fit_is_refused_before_writing(tiny_fp8, tmp_path, monkeypatch, capsys):
    """An export of R1 writes hundreds of GB: one whose weights alone exceed the free space failed with ENOSPC hours
    in. Refused before the first byte, naming the need (a lower bound: the weights' bytes) and the free space; the
    bound is below what an export really writes (checked on tiny exports of each kind in tests/test_export_tp.py)."""
    from collections import namedtuple

    from ds_export.export import exporter

    du = namedtuple("du", "total used free")
    monkeypatch.setattr(exporter.shutil, "disk_usage", lambda p: du(10**9, 10**9 - 10**6, 10**6))
    out = tmp_path / "e"
    assert main(["export", str(tiny_fp8), "--out", str(out), "--max-seq-len", "64", "-q"]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path}: the export needs more than" in err and "976.56 KiB free" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "nothing is left: no OUT, no OUT.partial"


def test_a_failed_export_leaves_no_staging_and_the_old_one_whole(exported, tiny_fp8, tmp_path, monkeypatch, capsys):
    """A failure while writing (disk full, a rank's error) left OUT.partial, up to hundreds of GB, behind; and --force
    removed the old OUT before the new one took its place, so a kill in between left half of it. Now the staging
    directory goes on any failure, the old export moves aside by a rename and comes back if the new one cannot take
    its place, and one left aside by a killed export is removed next time (only an export: anything else is
    refused)."""
    import errno
    import os

    from ds_export.export import exporter

    out = tmp_path / "e"
    shutil.copytree(exported, out)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(exporter, "_manifest", full)
        assert main(["export", str(tiny_fp8), "--out", str(out), "--force", "--max-seq-len", "64", "-q"]) == 1
        # (named: the write raised it without a path; the CLI's generic "rerunning resumes" is not true of an export;
        # --force needs room for both exports at once)
        err = capsys.readouterr().err
        assert f"{out}: the disk is full" in err and "an export starts over" in err and "resumes" not in err, err
        assert "remove it first" in err and len(err.strip().splitlines()) == 1, err
        assert main(["export", str(tiny_fp8), "--out", str(tmp_path / "new"), "--max-seq-len", "64", "-q"]) == 1
        err = capsys.readouterr().err
        assert "new: the disk is full" in err and "--force" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e"]
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before

    real_replace, moved = os.replace, []

    def publish_fails(a, b):
        if str(a) == str(out):
            moved.append(b)  # (the old export aside)
        if str(a).endswith("e.partial") and str(b) == str(out):  # (the new export into OUT's place)
            raise OSError(errno.EIO, "Input/output error")
        return real_replace(a, b)

    with monkeypatch.context() as m:
        m.setattr(os, "replace", publish_fails)
        assert main(["export", str(tiny_fp8), "--out", str(out), "--force", "--max-seq-len", "64", "-q"]) == 1
        assert "Input/output error" in capsys.readouterr().err
    assert moved and {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before  # (moved back)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e"]

    shutil.copytree(exported, tmp_path / "e.replaced")  # (as an export killed between its renames leaves it)
    assert main(["export", str(tiny_fp8), "--out", str(out), "--force", "--max-seq-len", "64", "-q"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e"]
    (tmp_path / "e.replaced").mkdir()
    (tmp_path / "e.replaced" / "mine.txt").write_text("keep")
    assert main(["export", str(tiny_fp8), "--out", str(out), "--force", "--max-seq-len", "32", "-q"]) == 2
    assert "e.replaced: in the way" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e", "e.replaced"]
    assert (tmp_path / "e.replaced" / "mine.txt").read_text() == "keep"
    assert json.loads((out / "config.json").read_text())["infer_model_max_seq_len"] == 64


def test_generate_checks_its_output_paths_first(exported, tmp_path, capsys):
    """--dump-logits "." was an internal error after decoding ('.' has no name), a path in a missing directory an
    OS error after it: both refused before the programs load; so are token ids outside the vocabulary (an internal
    error from Paddle's embedding)."""
    for args, want in ((["--dump-logits", "."], "--dump-logits .: is a directory"),
                       (["--report", str(tmp_path / "no" / "r.json")], "does not exist"),
                       (["--input-ids", "0,512"], "token id 512: outside the model's vocabulary 0..511"),
                       (["--input-ids", "0;-3"], "token id -3: outside"),
                       # (read as 0,5 before: a token lost in a copy went unnoticed)
                       (["--input-ids", "0,,5"], "'0,,5': an empty token id"),
                       (["--input-ids", "0,5,"], "'0,5,': an empty token id")):
        assert main(["generate", str(exported), "--input-ids", "0,5", "--max-new-tokens", "1", *args, "-q"]) == 2
        assert want in capsys.readouterr().err


def test_block_size_below_one_is_refused(tiny_fp8, tmp_path, capsys):
    """--block-size 0 or -3 was written into config.json as given, for the server's paged cache to fail on."""
    for b in ("0", "-3"):
        assert main(["export", str(tiny_fp8), "--out", str(tmp_path / "e"), "--block-size", b, "-q"]) == 2
        assert f"--block-size {b}: expected" in capsys.readouterr().err
    assert not (tmp_path / "e").exists()


def test_max_seq_len_beyond_the_models_context_is_refused(tiny_fp8, tmp_path, capsys):
    """--max-seq-len 100000000 was an internal error (MemoryError building a 23.8 GiB rope table); anything above
    config.json's max_position_embeddings (163840 for V3/R1) is beyond what the rope is made for."""
    longest = json.loads((tiny_fp8 / "config.json").read_text())["max_position_embeddings"]
    for n in (longest + 1, 100_000_000):
        assert main(["export", str(tiny_fp8), "--out", str(tmp_path / "e"), "--max-seq-len", str(n), "-q"]) == 2
        err = capsys.readouterr().err
        assert f"--max-seq-len {n}: above the model's max_position_embeddings {longest}" in err, err
        assert "internal error" not in err and len(err.strip().splitlines()) == 1
    assert sorted(tmp_path.iterdir()) == []


def test_a_program_damaged_in_place_is_one_line_naming_it(exported, tmp_path, capsys):
    """A model.json that Paddle's loader cannot read reached the user as "internal error: RuntimeError:
    std::exception". (generate now hashes the programs against the manifest, which catches a file damaged after the
    export; the manifest is rewritten here to match, as for a program written wrong in the first place.)"""
    bad = tmp_path / "bad"
    shutil.copytree(exported, bad)
    text = bytearray((bad / "model.json").read_bytes())
    text[:8] = b"XXXXXXXX"
    (bad / "model.json").write_bytes(bytes(text))
    Manifest.load(bad).record_file("model.json")
    assert main(["generate", str(bad), "--input-ids", "0,1", "--max-new-tokens", "1", "-q"]) == 1
    err = capsys.readouterr().err
    assert f"{bad / 'model'}.json / .pdiparams: Paddle Inference cannot load this program" in err, err
    assert "internal error" not in err and len(err.strip().splitlines()) == 1 and "dsx verify" in err, err


def test_a_failed_rank_job_names_the_cause_not_the_ranks_stopped_after_it(tmp_path, monkeypatch):
    """paddle.distributed.launch stops the other ranks with SIGTERM once one fails; dsx handles SIGTERM as Ctrl-C, so
    their logs end "dsx: error: interrupted ...": the job's error is the failed rank's line, whichever log sorts
    first."""
    import subprocess

    from ds_export.export import runtime

    logs = {"workerlog.0": "starting\ndsx: error: interrupted; partial outputs were left unpublished\n",
            "workerlog.1": "dsx: error: rank_1/model.json / .pdiparams: Paddle Inference cannot load\n"}

    def fake_launch(cmd, **kw):
        log = Path(cmd[cmd.index("--log_dir") + 1])
        log.mkdir()
        for name, text in logs.items():
            (log / name).write_text(text)
        return subprocess.CompletedProcess(cmd, 1, "", "")

    monkeypatch.setattr(runtime.subprocess, "run", fake_launch)
    with pytest.raises(runtime.DsxError, match="cannot load") as e:
        runtime.launch_ranks(2, ["generate", "x"], tmp_path / "log")
    assert "interrupted" not in str(e.value)
    logs["workerlog.1"] = "no error line\n"  # (only a stopped rank said anything: that line, not nothing)
    with pytest.raises(runtime.DsxError, match="interrupted"):
        runtime.launch_ranks(2, ["generate", "x"], tmp_path / "log2")


def test_prompt_is_the_tiny_tokenizers_and_refused_for_another_model(exported, tmp_path, capsys):
    """--prompt encodes with dsx's byte-level tokenizer (the tiny model's): the same tokens as its ids given with
    --input-ids. On another model's export (R1's tokenizer.json) those ids were fed in silently, wrong for it."""
    from ds_export.tiny_tokenizer import encode

    outs = []
    for args in (["--prompt", "DeepSeek"], ["--input-ids", ",".join(map(str, encode("DeepSeek")))]):
        assert main(["generate", str(exported), *args, "--max-new-tokens", "3", "--json"]) == 0
        outs.append(json.loads(capsys.readouterr().out)["tokens"])
    assert outs[0] == outs[1] and len(outs[0][0]) == 3
    other = tmp_path / "other"
    shutil.copytree(exported, other)
    (other / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": {}}}')  # (not the tiny one)
    assert main(["generate", str(other), "--prompt", "DeepSeek", "--max-new-tokens", "3"]) == 2
    err = capsys.readouterr().err
    assert "--prompt: " in err and "not the tiny model's export" in err and "--input-ids" in err, err


def test_a_stop_that_paddle_turns_into_another_error_is_still_an_interruption(tiny_fp8, tmp_path, monkeypatch,
                                                                              capsys):
    """SIGTERM (or Ctrl-C) landing inside Paddle's graph tracing came out of it as "SystemError: ... returned a result
    with an exception set": an internal error, exit 1, where a stop was asked for (seen once in CI, a tp 1 export
    stopped 2 s in). A failure that follows a stop signal is the stop's: exit 143 with the interruption's one line,
    nothing left behind; in any command."""
    import os
    import signal
    import time

    from ds_export import interrupt, tiny
    from ds_export.export import exporter

    def stopped_inside_a_c_extension(*a, **k):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        except KeyboardInterrupt:  # (as Paddle's C++ does with the exception the signal handler set)
            raise SystemError("<class 'UnicodeDecodeError'> returned a result with an exception set") from None

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    interrupt.handle_stop_signals()  # (what the dsx process does at its entry)
    try:
        monkeypatch.setattr(exporter, "_write_rank", stopped_inside_a_c_extension)
        out = tmp_path / "e"
        assert main(["export", str(tiny_fp8), "--out", str(out), "--max-seq-len", "64", "-q"]) == 143
        err = capsys.readouterr().err
        assert "interrupted" in err and "was not written" in err and len(err.strip().splitlines()) == 1, err
        assert sorted(tmp_path.iterdir()) == []
        interrupt._terminated[0] = interrupt._stopped[0] = False
        monkeypatch.setattr(tiny, "write_tiny", stopped_inside_a_c_extension)
        assert main(["tiny", str(tmp_path / "t"), "-q"]) == 143
        err = capsys.readouterr().err
        assert "interrupted" in err and "internal error" not in err and len(err.strip().splitlines()) == 1, err
    finally:
        signal.signal(signal.SIGTERM, before[0])
        signal.signal(signal.SIGINT, before[1])
        interrupt._terminated[0] = interrupt._stopped[0] = False


def test_generate_prints_nothing_but_its_result(exported):
    """`import paddle` warned "No ccache found ..." on stderr at every dsx generate (the export path silenced it,
    generate's did not); a fresh process with -q writes nothing to stderr."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "ds_export.cli.app", "generate", str(exported), "--input-ids", "0,5",
                        "--max-new-tokens", "1", "-q"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stderr == "", r.stderr
