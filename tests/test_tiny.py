"""The bundled tiny checkpoint has the official layout (shared/formats.md)."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from ds_export.errors import UsageError
from ds_export.io.checkpoint import Checkpoint
from ds_export.io.writer import sha256_file
from ds_export.models import deepseek_v3 as ds
from ds_export.tiny import TinySpec, make_config, write_tiny
from ds_export.tiny_tokenizer import decode, encode


def test_layout_matches_the_model_map(tiny_fp8):
    ck = Checkpoint.open(tiny_fp8)
    cfg = ds.DeepseekV3Config.from_dict(ck.config)
    expected = {t.name: t for t in ds.expected_tensors(cfg)}
    assert set(ck.names()) == set(expected)
    for n, t in expected.items():
        info = ck.info(n)
        assert (info.shape, info.dtype) == (t.shape, t.dtype), n
    roles = ds.map_tensors(ck.names(), cfg)
    ds.check_fp8_partners(roles, {n: ck.info(n).dtype for n in ck.names()})
    assert len(ck.shards) >= 4
    assert ck.config["quantization_config"]["weight_block_size"] == [128, 128]
    assert list(cfg.mtp_layers) == [cfg.num_hidden_layers]


def test_official_conventions(tiny_fp8):
    ck = Checkpoint.open(tiny_fp8)
    cfg = ds.DeepseekV3Config.from_dict(ck.config)
    L = cfg.num_hidden_layers - 1
    kv_a = ck.info(f"model.layers.{L}.self_attn.kv_a_proj_with_mqa.weight")
    assert kv_a.shape[0] % 128 != 0  # ragged FP8 blocks, like the real 576-row kv_a
    assert ck.info(f"model.layers.{L}.self_attn.kv_a_proj_with_mqa.weight_scale_inv").shape == (2, 2)
    assert ck.info(f"model.layers.{L}.mlp.gate.e_score_correction_bias").dtype == "F32"
    assert ck.info(f"model.layers.{L}.mlp.gate.weight").dtype == "BF16"
    assert ck.info("lm_head.weight").dtype == "BF16"
    # A companion in another shard than its weight (as in the real release).
    split = [n for n in ck.names() if n.endswith("_scale_inv") and ck.weight_map[n] != ck.weight_map[n[:-10]]]
    assert split
    # The MTP layer sits in the last shard(s), alone.
    mtp_files = {ck.weight_map[n] for n in ck.names() if n.startswith(f"model.layers.{cfg.num_hidden_layers}.")}
    base_files = {ck.weight_map[n] for n in ck.names() if not n.startswith(f"model.layers.{cfg.num_hidden_layers}.")}
    assert not mtp_files & base_files and max(mtp_files) == max(ck.weight_map.values())
    for f in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (tiny_fp8 / f).exists()
    idx = json.loads((tiny_fp8 / "model.safetensors.index.json").read_text())
    assert idx["metadata"]["total_size"] == ck.total_bytes()


def test_fp8_blocks_follow_the_official_quant(tiny_fp8):
    """scale_inv = block amax / 448: the largest |fp8 value| in each block is 448 (or within one e4m3 step)."""
    ck = Checkpoint.open(tiny_fp8)
    for n in [n for n in ck.names() if n.endswith("kv_a_proj_with_mqa.weight") or n.endswith("o_proj.weight")]:
        q = ck.get(n).astype(np.float32)
        s = ck.get(n + "_scale_inv")
        assert s.dtype == np.float32 and (s > 0).all()
        for bi in range(s.shape[0]):
            for bj in range(s.shape[1]):
                blk = np.abs(q[bi * 128:(bi + 1) * 128, bj * 128:(bj + 1) * 128])
                assert 416 <= blk.max() <= 448
        deq = q * np.repeat(np.repeat(s, 128, 0), 128, 1)[: q.shape[0], : q.shape[1]]
        assert 0.2 < deq.std() * np.sqrt(q.shape[1]) < 5  # ~1/sqrt(in) weights with varied block scales


def test_deterministic_and_seeded(tiny_fp8, tmp_path):
    write_tiny(tmp_path / "again")
    for f in sorted(tiny_fp8.glob("*")):
        assert sha256_file(f) == sha256_file(tmp_path / "again" / f.name), f.name
    write_tiny(tmp_path / "seed1", TinySpec(seed=1))
    a = Checkpoint.open(tiny_fp8).get("model.embed_tokens.weight")
    b = Checkpoint.open(tmp_path / "seed1").get("model.embed_tokens.weight")
    assert a.tobytes() != b.tobytes()


def test_parallel_shard_writers_write_the_same_bytes(tiny_fp8, tmp_path):
    """Worker processes write whole shards; a scale_inv whose weight sits in an earlier shard is
    recomputed there from (seed, name): every file equals the one-process checkpoint's."""
    ck = Checkpoint.open(tiny_fp8)
    assert [n for n in ck.names() if n.endswith("_scale_inv") and ck.weight_map[n] != ck.weight_map[n[:-10]]]
    seen = []
    write_tiny(tmp_path / "par", workers=3, progress=lambda t: seen.append(t.name))
    assert sorted(seen) == sorted(ck.names())
    for f in sorted(tiny_fp8.glob("*")):
        assert sha256_file(f) == sha256_file(tmp_path / "par" / f.name), f.name


def test_bf16_variant(tiny_bf16):
    ck = Checkpoint.open(tiny_bf16)
    assert "quantization_config" not in ck.config
    assert not [n for n in ck.names() if n.endswith("_scale_inv")]
    assert {ck.info(n).dtype for n in ck.names()} == {"BF16", "F32"}
    assert ck.get("model.layers.0.self_attn.o_proj.weight").dtype == ml_dtypes.bfloat16


def test_real_dims_config():
    cfg = ds.DeepseekV3Config.from_dict(make_config(TinySpec("real-dims", layers=2, experts=4)))
    assert (cfg.hidden_size, cfg.vocab_size, cfg.moe_intermediate_size, cfg.n_routed_experts) == (7168, 129280, 2048, 4)
    assert cfg.kv_lora_rank + cfg.qk_rope_head_dim == 576
    assert cfg.num_experts_per_tok <= 4 and cfg.n_routed_experts % cfg.n_group == 0


def test_refuses_non_empty_dir(tmp_path):
    (tmp_path / "x").write_text("keep me")
    with pytest.raises(UsageError, match="not empty"):
        write_tiny(tmp_path)
    assert (tmp_path / "x").read_text() == "keep me"


@pytest.mark.parametrize("spec,want", [(TinySpec(seed=-5), "--seed -5: expected a non-negative integer"),
                                       (TinySpec(shard_mb=-1), "--shard-mb -1: expected a size above 0"),
                                       (TinySpec(experts=1), "--experts must be at least 2")])
def test_a_bad_spec_is_refused_before_the_directory_is_made(tmp_path, spec, want):
    """--seed -5 was an internal error (numpy seeds are non-negative), --shard-mb -1 wrote one tensor a shard, and a
    refused spec still left its empty OUT behind."""
    with pytest.raises(UsageError, match=want):
        write_tiny(tmp_path / "t", spec)
    assert not (tmp_path / "t").exists()


def test_tokenizer_round_trip(tiny_fp8):
    text = "DeepSeek: 深度求索 ✓"
    assert decode(encode(text)) == text
    tok = json.loads((tiny_fp8 / "tokenizer.json").read_text())
    assert tok["model"]["vocab"]["<｜begin▁of▁sentence｜>"] == 0 and len(tok["model"]["vocab"]) == 258
    tokenizers = pytest.importorskip("tokenizers")
    t = tokenizers.Tokenizer.from_file(str(tiny_fp8 / "tokenizer.json"))
    assert t.encode(text).ids == encode(text)


def test_ctrl_c_stops_the_shard_writers_at_their_next_chunk(tmp_path):
    """dsx tiny -j 2, Ctrl-C to the process group (as a terminal sends it) once the first shard is being written: the
    worker processes leave it to the main one, which tells them to stop and cancels the queued shards, so dsx exits
    at once with 130 and one line; before, the pool's shutdown wrote every remaining shard first (14 of 16 MiB here)
    and the message was lost (Typer's Exit(130) came back as a return value)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "t"
    proc = subprocess.Popen([sys.executable, "-m", "ds_export.cli.app", "tiny", str(out), "--layers", "24", "--experts",
                             "64", "--shard-mb", "16", "-j", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: (signal.signal(signal.SIGINT, signal.SIG_DFL), os.setpgrp()))
    try:
        deadline = time.monotonic() + 120
        while not list(out.glob("model-*")):
            assert time.monotonic() < deadline and proc.poll() is None, "no shard was ever started"
            time.sleep(0.02)
        shards = int(next(out.glob("model-*")).name.split("-of-")[1][:5])
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130 and len(err.strip().splitlines()) == 1
    assert "interrupted" in err and "incomplete checkpoint" in err, err
    complete = list(out.glob("model-*.safetensors"))
    assert shards >= 10 and len(complete) <= shards // 2, (len(complete), shards)
    assert not list(out.glob("*.partial")) and not (out / "model.safetensors.index.json").exists()


def test_a_checkpoint_that_cannot_fit_is_refused_before_writing(tmp_path, monkeypatch, capsys):
    """`dsx tiny --real-dims` writes GBs: a full disk was found at a shard written halfway, an empty OUT left
    behind. Refused first, naming the size and the free space."""
    from ds_export import tiny
    from ds_export.cli.app import main

    monkeypatch.setattr(tiny, "free_bytes", lambda p: 1 << 20)
    assert main(["tiny", str(tmp_path / "t"), "-q"]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 't'}: the checkpoint takes" in err and "only 1.00 MiB free" in err, err
    assert not (tmp_path / "t").exists()


def test_a_second_tiny_into_the_same_directory_is_refused_while_the_first_writes(tmp_path, capsys):
    """Two `dsx tiny OUT` at once (two specs) each found OUT empty and wrote: one's index over the other's shards.
    The second is refused while the first holds OUT's lock; a reader (dsx quantize of it) is refused too."""
    from dir_lock import held_by_another_process

    from ds_export.cli.app import main

    out = tmp_path / "t"
    out.mkdir()
    with held_by_another_process(out):
        assert main(["tiny", str(out), "-q"]) == 2
        err = capsys.readouterr().err
        assert "another dsx process is writing or reading it now (dsx tiny writes it alone)" in err, err
        assert list(out.iterdir()) == []
    assert main(["tiny", str(out), "-q"]) == 0
