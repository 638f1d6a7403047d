"""dsx quantize end to end on the tiny checkpoint: roles, Paddle byte-identity, passthrough, resume, safety."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading

import ml_dtypes
import numpy as np
import pytest

from ds_export.cli.app import main
from ds_export.errors import DsxError
from ds_export.io.checkpoint import Checkpoint
from ds_export.io.manifest import Manifest
from ds_export.io.writer import sha256_file
from ds_export.quant import engine, plan as plan_mod


def _quantize(src, out, *args):
    rc = main(["quantize", str(src), "--out", str(out), "--quiet", *args])
    assert rc == 0
    return Checkpoint.open(out)


def _dequant_f32(ck, name):
    """Independent FP8 dequant (ml_dtypes decode x expanded block scale)."""
    q = ck.get(name).astype(np.float32)
    s = ck.get(name + "_scale_inv")
    return q * np.repeat(np.repeat(s, 128, 0), 128, 1)[: q.shape[0], : q.shape[1]]


@pytest.fixture(scope="module")
def mixed(tiny_fp8, tmp_path_factory):
    out = tmp_path_factory.mktemp("q") / "mix"
    return _quantize(tiny_fp8, out, "--type", "a8w8_fp8_wint4", "--mtp-type", "a8w8_fp8")


def test_mixed_recipe_assigns_roles(mixed, tiny_fp8):
    src = Checkpoint.open(tiny_fp8)
    qc = mixed.config["quantization_config"]
    assert qc["quant_type"] == "a8w8_fp8_wint4" and qc["mtp_quant_type"] == "a8w8_fp8" and qc["pre_quantized"]
    for name in src.names():
        if name.endswith("_scale_inv"):
            continue
        info = mixed.info(name)
        if ".mlp.experts." in name and ".layers.3." not in name:  # routed experts of the base model
            assert info.dtype == "I8" and info.shape[0] * 2 == src.info(name).shape[0], name
            assert mixed.info(name + "_scale").dtype == "BF16"
        elif name.endswith(("proj.weight", "proj_with_mqa.weight")):  # every other Linear, eh_proj included
            assert info.dtype == "F8_E4M3", name
            assert mixed.info(name + "_scale_inv").dtype == "F32"
        elif name.endswith("mlp.gate.weight") or name.endswith("e_score_correction_bias"):
            assert info.dtype == "F32", name
        else:
            assert info.dtype == "BF16", name
    assert not [n for n in mixed.names() if n.endswith("_scale") and ".layers.3." in n]  # MTP experts are FP8


def test_fp8_passthrough_is_bit_exact(mixed, tiny_fp8):
    src = Checkpoint.open(tiny_fp8)
    for name in [n for n in src.names() if "self_attn" in n and src.info(n).dtype in ("F8_E4M3", "F32")]:
        assert mixed.raw(name).tobytes() == src.raw(name).tobytes(), name


def test_weight_only_is_byte_identical_to_paddle(mixed, tiny_fp8):
    paddle = pytest.importorskip("paddle")
    src = Checkpoint.open(tiny_fp8)
    for name in ["model.layers.1.mlp.experts.0.gate_proj.weight", "model.layers.2.mlp.experts.15.down_proj.weight"]:
        w_bf16 = _dequant_f32(src, name).astype(ml_dtypes.bfloat16)
        x = paddle.to_tensor(w_bf16.T.astype(np.float32)).astype("bfloat16")
        q, s = paddle.nn.quant.weight_quantize(x, algo="weight_only_int4", arch=90, group_size=-1)
        assert mixed.get(name).tobytes() == q.numpy().tobytes(), name
        assert mixed.raw(name + "_scale").tobytes() == s.view(paddle.uint16).numpy().tobytes(), name


@pytest.mark.parametrize("args,bits,group", [
    (["--type", "weight_only_int8"], 8, -1),
    (["--type", "weight_only_int4", "--group-size", "128", "--arch", "80"], 4, 128),
])
def test_weight_only_types_match_paddle(tiny_fp8, tmp_path, args, bits, group):
    paddle = pytest.importorskip("paddle")
    out = _quantize(tiny_fp8, tmp_path / "o", *args, "--no-mtp")
    src = Checkpoint.open(tiny_fp8)
    name = "model.layers.0.self_attn.o_proj.weight"
    w_bf16 = _dequant_f32(src, name).astype(ml_dtypes.bfloat16)
    x = paddle.to_tensor(w_bf16.T.astype(np.float32)).astype("bfloat16")
    arch = 80 if "80" in args else 90
    q, s = paddle.nn.quant.weight_quantize(x, algo=f"weight_only_int{bits}", arch=arch, group_size=group)
    assert out.get(name).tobytes() == q.numpy().tobytes()
    assert out.raw(name + "_scale").tobytes() == s.view(paddle.uint16).numpy().tobytes()
    assert not [n for n in out.names() if ".layers.3." in n]  # --no-mtp
    assert out.config["quantization_config"]["weightonly_group_size"] == group


def test_bf16_type_dequantizes_exactly(tiny_fp8, tmp_path):
    out = _quantize(tiny_fp8, tmp_path / "b", "--type", "bf16")
    src = Checkpoint.open(tiny_fp8)
    assert "quantization_config" not in out.config
    name = "model.layers.1.self_attn.kv_a_proj_with_mqa.weight"
    ref = _dequant_f32(src, name).astype(ml_dtypes.bfloat16)  # RNE
    assert out.get(name).tobytes() == ref.tobytes()
    assert not [n for n in out.names() if n.endswith("_scale_inv")]


def test_fp8_from_bf16_source_within_e4m3_rounding(tiny_bf16, tmp_path):
    out = _quantize(tiny_bf16, tmp_path / "f", "--type", "a8w8_fp8")
    src = Checkpoint.open(tiny_bf16)
    name = "model.layers.0.mlp.down_proj.weight"
    w = src.get(name).astype(np.float64)
    deq = _dequant_f32(out, name).astype(np.float64)
    err = np.abs(deq - w)
    s = np.repeat(np.repeat(out.get(name + "_scale_inv"), 128, 0), 128, 1)[: w.shape[0], : w.shape[1]]
    # e4m3 has 3 mantissa bits: error at most half an ulp = 2^-4 relative (subnormal step 2^-10 x scale).
    assert (err <= np.maximum(np.abs(w) * 2.0**-4, s * 2.0**-10) * (1 + 1e-6)).all()
    sqnr = 10 * np.log10((w**2).sum() / (err**2).sum())
    assert 25 < sqnr < 40


def test_mtp_only_writes_just_the_draft(tiny_fp8, tmp_path):
    out = _quantize(tiny_fp8, tmp_path / "m", "--type", "weight_only_int8", "--mtp-only")
    assert out.names() and all(n.startswith("model.layers.3.") for n in out.names())
    assert out.config["quantization_config"]["selection"] == "mtp"


def test_dry_run_writes_nothing(tiny_fp8, tmp_path, capsys):
    assert main(["quantize", str(tiny_fp8), "--out", str(tmp_path / "d"), "--type", "a8w8_fp8_wint4",
                 "--dry-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["bytes_out"] < plan["bytes_in"] and not (tmp_path / "d").exists()


# ----------------------------------------------------------- resume, safety ----

_KILL = textwrap.dedent("""
    import os, signal, sys
    from ds_export.io.checkpoint import Checkpoint
    from ds_export.quant import engine, plan as plan_mod
    ck = Checkpoint.open(sys.argv[1])
    p = plan_mod.build(ck, plan_mod.load_recipe("a8w8_fp8_wint4", None, arch=None, group_size=None, mtp_type=None))
    n = [0]
    def on_shard(f):
        n[0] += 1
        if n[0] == 2:
            os.kill(os.getpid(), signal.SIGKILL)
    engine.run(ck, p, sys.argv[2], engine.Options(workers=1), on_shard=on_shard)
""")


def test_resume_after_sigkill_is_byte_identical(tiny_fp8, tmp_path):
    r = subprocess.run([sys.executable, "-c", _KILL, str(tiny_fp8), str(tmp_path / "k")])
    assert r.returncode == -9
    m = Manifest.load(tmp_path / "k")
    assert not m.complete and len(m.files) == 2
    assert not (tmp_path / "k" / "model.safetensors.index.json").exists()  # does not look complete
    ck = Checkpoint.open(tiny_fp8)
    p = plan_mod.build(ck, plan_mod.load_recipe("a8w8_fp8_wint4", None, arch=None, group_size=None, mtp_type=None))
    res = engine.run(ck, p, tmp_path / "k")
    assert res["skipped"] == 2 and res["converted"] == len(p.shards) - 2
    engine.run(ck, p, tmp_path / "clean")
    for f in sorted((tmp_path / "clean").iterdir()):
        if f.name != "dsx-manifest.json":
            assert sha256_file(f) == sha256_file(tmp_path / "k" / f.name), f.name
    assert Manifest.load(tmp_path / "k").complete


class _CtrlCAtFirstChunk(engine.Reporter):
    """Ctrl-C (SIGINT to this process) at the first converted chunk; that worker then waits for the run's stop event,
    so its shard is abandoned at a known point (the other workers may finish theirs first: tiny shards are fast)."""

    def __init__(self, stop):
        self.stop, self.sent, self.done, self.at = stop, False, [], threading.local()
        self.in_flight = None  # the tensor whose chunk sent Ctrl-C
        self.seen = None  # whether that worker saw the stop event (an assert there would only fail its own future)

    def tensor(self, name):
        self.at.name = name

    def advance(self, nbytes):
        if not self.sent:
            self.sent, self.in_flight = True, self.at.name
            os.kill(os.getpid(), signal.SIGINT)
            self.seen = self.stop.wait(10)

    def shard_done(self, file):
        self.done.append(file)


def _published(out):
    return sorted(f.name for f in out.glob("model-*.safetensors"))


def test_ctrl_c_stops_the_workers_at_their_next_chunk_and_resumes(tiny_fp8, tmp_path):
    """Ctrl-C while the workers convert: the main thread sees it as a flag (interrupt.ctrl_c_as_flag), tells the
    workers to stop, and raises KeyboardInterrupt (the CLI's exit 130) once they have: the shard in flight is
    abandoned (no partial file left), shards that finished are recorded, nothing is published; a rerun resumes to the
    same bytes as an uninterrupted run."""
    ck = Checkpoint.open(tiny_fp8)
    p = plan_mod.build(ck, plan_mod.load_recipe("a8w8_fp8_wint4", None, arch=None, group_size=None, mtp_type=None))
    stop = threading.Event()
    rep = _CtrlCAtFirstChunk(stop)
    out = tmp_path / "i"
    with pytest.raises(KeyboardInterrupt):
        engine.run(ck, p, out, engine.Options(workers=2), rep, stop=stop)
    assert rep.seen is True, "the run never set its stop event"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    m = Manifest.load(out)
    assert not m.complete and not (out / "model.safetensors.index.json").exists()
    in_flight = next(s.file for s in p.shards if any(t.src == rep.in_flight for t in s.tasks))
    assert in_flight not in m.files and sorted(m.files) == sorted(rep.done) == _published(out)
    assert not list(out.glob("*.partial"))
    res = engine.run(ck, p, out)
    assert res["skipped"] == len(rep.done) and res["converted"] == len(p.shards) - len(rep.done)
    engine.run(ck, p, tmp_path / "clean")
    for f in sorted((tmp_path / "clean").iterdir()):
        if f.name != "dsx-manifest.json":
            assert sha256_file(f) == sha256_file(out / f.name), f.name


def test_a_failing_worker_stops_the_others_at_their_next_chunk(tiny_fp8, tmp_path, monkeypatch):
    """Planted fault: the first shard taken fails at once. The run raises that failure (not KeyboardInterrupt, not the
    others' abandonment); the second shard's worker, held until the run's stop event is set, abandons its shard
    instead of finishing it; nothing is published and no partial file is left."""
    ck = Checkpoint.open(tiny_fp8)
    p = plan_mod.build(ck, plan_mod.load_recipe("a8w8_fp8_wint4", None, arch=None, group_size=None, mtp_type=None))
    assert len(p.shards) >= 2
    order = sorted(p.shards, key=lambda s: -s.bytes_in)  # (the engine's order: big shards first)
    failing, held = order[0].file, order[1].file
    file_of = {id(t): s.file for s in p.shards for t in s.tasks}
    real, stop, seen, held_in = engine.convert, threading.Event(), [], threading.Event()

    def planted(ck_, task, write, **kw):
        if file_of[id(task)] == failing:
            held_in.wait(10)  # (fails once the other worker holds its shard, so that it has one to abandon)
            raise DsxError(f"planted fault in {failing}")
        if file_of[id(task)] == held and not seen:
            held_in.set()
            seen.append(stop.wait(10))  # (recorded: an assert here would only fail the held worker's own future)
        return real(ck_, task, write, **kw)

    monkeypatch.setattr(engine, "convert", planted)
    out = tmp_path / "f"
    with pytest.raises(DsxError, match="planted fault"):
        engine.run(ck, p, out, engine.Options(workers=2), stop=stop)
    assert seen == [True], "the run never set its stop event"
    m = Manifest.load(out)
    assert not m.complete and not (out / "model.safetensors.index.json").exists()
    assert failing not in m.files and held not in m.files and sorted(m.files) == _published(out)
    assert not list(out.glob("*.partial"))


def test_corrupt_finished_shard_is_redone(mixed):
    out = mixed.root
    shard = sorted(out.glob("model-*.safetensors"))[0]
    good = sha256_file(shard)
    with open(shard, "r+b") as f:
        f.seek(-3, 2)
        f.write(b"\0\1\2")
    src = Checkpoint.open(Manifest.load(out).run["source"])
    rec = plan_mod.load_recipe("a8w8_fp8_wint4", None, arch=None, group_size=None, mtp_type="a8w8_fp8")
    res = engine.run(src, plan_mod.build(src, rec), out)
    assert res["converted"] == 1 and sha256_file(shard) == good


def test_refuses_other_runs_output_without_force(tiny_fp8, tmp_path):
    _quantize(tiny_fp8, tmp_path / "o", "--type", "weight_only_int8")
    rc = main(["quantize", str(tiny_fp8), "--out", str(tmp_path / "o"), "--type", "weight_only_int4", "-q"])
    assert rc == 2
    assert Checkpoint.open(tmp_path / "o").config["quantization_config"]["quant_type"] == "weight_only_int8"
    _quantize(tiny_fp8, tmp_path / "o", "--type", "weight_only_int4", "--force")
    assert Checkpoint.open(tmp_path / "o").config["quantization_config"]["quant_type"] == "weight_only_int4"
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "notes.txt").write_text("mine")
    assert main(["quantize", str(tiny_fp8), "--out", str(tmp_path / "user"), "--type", "bf16", "-q"]) == 2
    _quantize(tiny_fp8, tmp_path / "user", "--type", "bf16", "--force")
    assert (tmp_path / "user" / "notes.txt").read_text() == "mine"  # --force removes only dsx's files


@pytest.mark.parametrize("manifest", ['{"version": 1, "complete": "yes", "run": {}, "files": {}}', "{",
                                      '{"version": 9}'])
def test_force_replaces_an_output_whose_manifest_is_damaged(tiny_fp8, tmp_path, capsys, manifest):
    """Every reader of a damaged (or unreadable, or newer) dsx-manifest.json says to rerun with --force, and --force
    refused it the same way: the directory could only be deleted by hand. Without --force it is still refused; with
    it dsx's files are replaced and the user's kept."""
    out = tmp_path / "o"
    _quantize(tiny_fp8, out, "--type", "weight_only_int8")
    (out / "notes.txt").write_text("mine")
    (out / "dsx-manifest.json").write_text(manifest)
    assert main(["quantize", str(tiny_fp8), "--out", str(out), "--type", "weight_only_int4", "-q"]) == 1
    assert "dsx-manifest.json" in capsys.readouterr().err
    _quantize(tiny_fp8, out, "--type", "weight_only_int4", "--force")
    assert Checkpoint.open(out).config["quantization_config"]["quant_type"] == "weight_only_int4"
    assert Manifest.load(out).complete and (out / "notes.txt").read_text() == "mine"


def test_a_block_scale_of_another_dtype_is_refused_before_converting(tiny_fp8, tmp_path, capsys):
    """A source whose FP8 block scale is declared I32 (the same 4 bytes a value) was converted as integers: a
    weight_only_int4 output at -243 dB, exit 0; dsx export read it the same way. Both refuse it, naming it."""
    import shutil

    from headers import set_dtype

    src = tmp_path / "src"
    shutil.copytree(tiny_fp8, src)
    scale = "model.layers.1.mlp.experts.3.gate_proj.weight_scale_inv"
    set_dtype(src, scale, "I32")
    for cmd in (["inspect", str(src)],
                ["quantize", str(src), "--out", str(tmp_path / "o"), "--type", "weight_only_int4"],
                ["export", str(src), "--out", str(tmp_path / "e")]):
        assert main([*cmd, "-q"]) == 1, cmd
        err = capsys.readouterr().err
        assert f"{scale}" in err and "is I32" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists() and not (tmp_path / "e").exists()
    out = tmp_path / "int4"  # (a weight-only scale declared F16, the same 2 bytes a value, was read as F16)
    _quantize(tiny_fp8, out, "--type", "weight_only_int4")
    set_dtype(out, scale.replace("_scale_inv", "_scale"), "F16")
    assert main(["export", str(out), "--out", str(tmp_path / "e"), "-q"]) == 1
    err = capsys.readouterr().err
    assert "gate_proj.weight_scale, the scale of weight-only tensor" in err, err
    assert "is F16; dsx quantize writes BF16" in err


def test_a_source_of_another_dtype_or_a_quantized_output_is_refused(tiny_fp8, tmp_path, capsys):
    """An FP8 weight declared I8 (the same byte a value) was converted from its bytes read as integers (-61 dB against
    the original, exit 0, both types); a weight-only output given as a source was refused as a shape that is not a
    multiple of 64. Both are refused before any work, naming the tensor and its dtype."""
    import shutil

    from headers import set_dtype

    src = tmp_path / "src"
    shutil.copytree(tiny_fp8, src)
    weight = "model.layers.0.self_attn.q_a_proj.weight"
    set_dtype(src, weight, "I8")
    for t in ("weight_only_int4", "a8w8_fp8"):
        assert main(["quantize", str(src), "--out", str(tmp_path / t), "--type", t, "-q"]) == 1
        err = capsys.readouterr().err
        assert f"{weight} (a weight) is I8; a source checkpoint holds F8_E4M3 block-scaled weights" in err, err
        assert len(err.strip().splitlines()) == 1 and not (tmp_path / t).exists()
    int4 = tmp_path / "int4"
    _quantize(tiny_fp8, int4, "--type", "weight_only_int4")
    assert main(["quantize", str(int4), "--out", str(tmp_path / "again"), "--type", "weight_only_int8", "-q"]) == 1
    err = capsys.readouterr().err
    assert "(a weight) is I8" in err and "a quantized output is not converted again" in err, err


def test_a_block_scale_of_the_wrong_shape_is_refused(tiny_fp8, tmp_path, capsys):
    """A block scale declared [2, 4] for a [512, 192] weight (blocks of 128: [4, 2]) was copied by a8w8_fp8 under the
    output's [4, 2], its values in the wrong order, exit 0; export stopped at it with an internal message naming no
    tensor. inspect, quantize and export refuse it, naming the scale, the weight and the shape its blocks make."""
    import json
    import shutil
    import struct

    src = tmp_path / "src"
    shutil.copytree(tiny_fp8, src)
    index = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    raw = None
    for scale, rel in index.items():
        raw = (src / rel).read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8:8 + n])
        if scale.endswith("_scale_inv") and header[scale]["shape"][0] != header[scale]["shape"][1]:
            break
    shape = header[scale]["shape"]
    header[scale]["shape"] = shape[::-1]
    body = json.dumps(header).encode()
    body += b" " * (-len(body) % 8)
    (src / rel).write_bytes(struct.pack("<Q", len(body)) + body + raw[8 + n:])
    for cmd in (["inspect", str(src)], ["quantize", str(src), "--out", str(tmp_path / "o"), "--type", "a8w8_fp8"],
                ["export", str(src), "--out", str(tmp_path / "e")]):
        assert main([*cmd, "-q"]) == 1, cmd
        err = capsys.readouterr().err
        assert f"block scale {scale} is {shape[::-1]}; {scale[:-len('_scale_inv')]} " in err, err
        assert f"has {shape}" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists() and not (tmp_path / "e").exists()


def test_force_never_deletes_a_source_or_another_checkpoint(tiny_fp8, tmp_path, capsys):
    """dsx quantize SRC --out SRC --force deleted every shard of SRC (they look like the shards dsx writes), and --force
    into another checkpoint's directory deleted its shards: refused, the files untouched."""
    import shutil

    src = tmp_path / "src"
    shutil.copytree(tiny_fp8, src)
    before = sorted(p.name for p in src.iterdir())
    for out in (src, tmp_path / "alias"):
        if out != src:
            out.symlink_to(src)  # (the same directory by another path)
        assert main(["quantize", str(src), "--out", str(out), "--type", "bf16", "--force", "-q"]) == 2
        assert "is the source checkpoint" in capsys.readouterr().err
    other = tmp_path / "other"
    shutil.copytree(tiny_fp8, other)
    assert main(["quantize", str(src), "--out", str(other), "--type", "bf16", "--force", "-q"]) == 2
    err = capsys.readouterr().err
    assert "holds a checkpoint that no dsx run wrote (config.json, model-00001-of-" in err, err
    assert sorted(p.name for p in src.iterdir()) == before == sorted(p.name for p in other.iterdir())
    with Checkpoint.open(src), Checkpoint.open(other):
        pass


def test_a_second_run_into_the_same_output_is_refused_while_the_first_runs(tiny_fp8, tmp_path, capsys):
    """The same command started twice (another terminal, an overlapping job) had two processes truncate, write and
    rename the same shards and overwrite each other's manifest records: the second is refused while another process
    holds the output directory's lock, and runs (resuming) once it is gone."""
    from dir_lock import held_by_another_process

    out = tmp_path / "o"
    out.mkdir()
    with held_by_another_process(out):
        assert main(["quantize", str(tiny_fp8), "--out", str(out), "--type", "bf16", "-q"]) == 2
        err = capsys.readouterr().err
        assert "another dsx process is writing or reading it now (dsx quantize writes it alone)" in err, err
        assert list(out.iterdir()) == []  # (refused before any file: not even a manifest)
    _quantize(tiny_fp8, out, "--type", "bf16")


def test_out_of_disk_fails_before_writing(tiny_fp8, tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    du = namedtuple("du", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: du(10**6, 10**6 - 1000, 1000))
    ck = Checkpoint.open(tiny_fp8)
    p = plan_mod.build(ck, plan_mod.load_recipe("bf16", None, arch=None, group_size=None, mtp_type=None))
    with pytest.raises(DsxError, match=r"needs .*, only 1000 B free"):
        engine.run(ck, p, tmp_path / "o")
    assert not list((tmp_path / "o").glob("model-*"))


def test_bad_source_rejected_before_work(tiny_fp8, tmp_path):
    import shutil

    shutil.copytree(tiny_fp8, tmp_path / "src")
    victim = sorted((tmp_path / "src").glob("model-*.safetensors"))[-1]
    with open(victim, "r+b") as f:
        f.truncate(100)
    assert main(["quantize", str(tmp_path / "src"), "--out", str(tmp_path / "o"), "--type", "bf16", "-q"]) == 1
    assert not (tmp_path / "o").exists()


def _plant(root, pick, value: bytes, at: int = 0) -> tuple[str, str]:
    """Overwrite bytes of the first tensor whose name `pick` accepts, in its shard under root: (shard, tensor)."""
    import struct

    for shard in sorted(root.glob("model-*.safetensors")):
        b = bytearray(shard.read_bytes())
        n = struct.unpack("<Q", b[:8])[0]
        header = json.loads(b[8:8 + n])
        names = [k for k in header if k != "__metadata__" and pick(k, header[k])]
        if names:
            off = 8 + n + header[names[0]]["data_offsets"][0] + at
            b[off:off + len(value)] = value
            shard.write_bytes(bytes(b))
            return shard.name, names[0]
    raise AssertionError("no tensor to plant into")


@pytest.mark.parametrize("bad", [np.nan, np.inf, 1e37, -3.4e38])
@pytest.mark.parametrize("qtype", ["a8w8_fp8", "bf16", "weight_only_int4", "a8w8_fp8_wint4"])
def test_a_non_finite_block_scale_is_refused_naming_it(tiny_fp8, tmp_path, capsys, qtype, bad):
    """A NaN or Inf block scale in an FP8 source turns a whole 128 x 128 block into NaN / Inf: copied as it is (FP8)
    or decoded (bf16, weight-only), it was written without a word; so did a finite one whose product with e4m3's
    448 overflows float32 (1e37: bf16 Inf, exit 0). It is refused, naming the shard and tensor, and the output does
    not look complete."""
    import shutil

    shutil.copytree(tiny_fp8, tmp_path / "src")
    shard, name = _plant(tmp_path / "src", lambda k, v: k.endswith("_scale_inv") and "layers.1." in k,
                         np.array([bad], np.float32).tobytes(), at=4)
    assert main(["quantize", str(tmp_path / "src"), "--out", str(tmp_path / "o"), "--type", qtype, "-q"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and shard in err and repr(name) in err, err
    assert "block scales are NaN, Inf or above 7.6e+35, where 448 x scale overflows float32" in err, err
    assert "block [0, 1]" in err and "download it again" in err
    assert not (tmp_path / "o" / "model.safetensors.index.json").exists()
    m = Manifest.load(tmp_path / "o")
    assert m is None or not m.complete


@pytest.mark.parametrize("qtype", ["a8w8_fp8", "bf16"])
def test_a_nan_code_copied_or_cast_as_it_is_is_refused_naming_it(tiny_fp8, tmp_path, capsys, qtype):
    """An e4m3 NaN code in an FP8 source weight: FP8 kept copied it and bf16 decoded it into a NaN weight, without a
    word. Refused, naming the shard, the tensor and the element; the output does not look complete."""
    import shutil

    shutil.copytree(tiny_fp8, tmp_path / "src")
    shard, name = _plant(tmp_path / "src", lambda k, v: v["dtype"] == "F8_E4M3" and "self_attn.q_a_proj" in k,
                         b"\xff", at=1000)
    with Checkpoint.open(tiny_fp8) as ck:
        k = ck.info(name).shape[1]
    assert main(["quantize", str(tmp_path / "src"), "--out", str(tmp_path / "o"), "--type", qtype, "-q"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and shard in err and repr(name) in err, err
    assert f"1 NaN code(s) (e4m3 0x7F / 0xFF) in its FP8 weight, the first at [{1000 // k}, {1000 % k}]" in err
    assert not (tmp_path / "o" / "model.safetensors.index.json").exists()


@pytest.mark.parametrize("pick,qtype,value", [
    ("input_layernorm", "bf16", b"\xc0\x7f"),  # a bf16 norm weight copied: NaN
    ("embed_tokens", "a8w8_fp8", b"\x80\x7f"),  # the bf16 embedding kept: +Inf
    ("mlp.gate.weight", "a8w8_fp8", b"\x80\xff"),  # the bf16 router cast to float32: -Inf
])
def test_a_non_finite_bf16_value_copied_or_cast_is_refused_naming_it(tiny_bf16, tmp_path, capsys, pick, qtype, value):
    """A NaN / Inf in a bf16 source weight that dsx copies (norms, the embedding) or casts (the router to float32)
    went into the output, exit 0, as an FP8 NaN code no longer does. Refused, naming the shard, tensor and element."""
    import shutil

    shutil.copytree(tiny_bf16, tmp_path / "src")
    shard, name = _plant(tmp_path / "src", lambda k, v: pick in k and v["dtype"] == "BF16", value, at=2 * 70)
    with Checkpoint.open(tiny_bf16) as ck:
        shape = ck.info(name).shape
    assert main(["quantize", str(tmp_path / "src"), "--out", str(tmp_path / "o"), "--type", qtype, "-q"]) == 1
    err = capsys.readouterr().err
    at = f"[{70 // shape[1]}, {70 % shape[1]}]" if len(shape) > 1 else "[70]"
    assert err.count("\n") == 1 and shard in err and repr(name) in err, err
    assert f"1 NaN or Inf value(s) in its BF16 weight, the first at {at}" in err, err
    assert not (tmp_path / "o" / "model.safetensors.index.json").exists()


def test_a_nan_code_in_a_weight_only_conversion_names_the_tensor(tiny_fp8, tmp_path, capsys):
    """An e4m3 NaN code (0x7F) met by the weight-only quantizer: the error names the tensor and its shard (it named
    only the rows)."""
    import shutil

    shutil.copytree(tiny_fp8, tmp_path / "src")
    shard, name = _plant(tmp_path / "src", lambda k, v: v["dtype"] == "F8_E4M3" and "self_attn.q_a_proj" in k,
                         b"\x7f", at=1000)
    assert main(["quantize", str(tmp_path / "src"), "--out", str(tmp_path / "o"), "--type", "weight_only_int8",
                 "-q"]) == 1
    err = capsys.readouterr().err
    assert shard in err and repr(name) in err and "NaN or Inf after the FP8 decode" in err, err


@pytest.mark.parametrize("state", ["interrupted", "other nodes at work"])
@pytest.mark.parametrize("command", ["export", "quantize"])
def test_an_unfinished_output_is_refused_as_a_source(mixed, tmp_path, capsys, state, command):
    """A dsx output its run has not finished, used as the source of dsx export or quantize, is refused in one line
    that says so (its shards may all be present: a --force rerun in progress, or the nodes' own manifests before the
    last node publishes), not read as if it were complete."""
    import shutil

    src = tmp_path / "q"
    shutil.copytree(mixed.root, src)
    manifest = json.loads((src / "dsx-manifest.json").read_text())
    if state == "interrupted":
        manifest["complete"] = False
        (src / "dsx-manifest.json").write_text(json.dumps(manifest))
        want = "dsx-manifest.json is not complete"
    else:
        (src / "dsx-manifest.json").rename(src / "dsx-manifest.node-1-of-2.json")
        want = "only the per-node manifests dsx-manifest.node-1-of-2.json"
    args = ["--type", "bf16"] if command == "quantize" else []
    assert main([command, str(src), "--out", str(tmp_path / "o"), "-q", *args]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{src}: an unfinished dsx output ({want}" in err, err
    assert f"dsx {command} needs a finished one" in err and "resumes" in err
    assert not (tmp_path / "o").exists()


@pytest.fixture(scope="module")
def other_seed(tmp_path_factory):
    """A tiny checkpoint of the same architecture as tiny_fp8, other weights: every header byte the same."""
    from ds_export.tiny import TinySpec, write_tiny

    out = tmp_path_factory.mktemp("seed7") / "tiny"
    write_tiny(out, TinySpec(seed=7))
    return out


def test_the_source_fingerprint_tells_checkpoints_of_one_architecture_apart(tiny_fp8, other_seed, tmp_path):
    """DeepSeek-V3 and R1 share every shape and offset; so do two tiny seeds (their headers are byte for byte the
    same): the fingerprint reads pages of the data too. A copy elsewhere has the same fingerprint; a byte changed in
    a sampled page (the first of a shard's data) changes it."""
    import shutil

    from ds_export.quant.plan import source_fingerprint

    def fp(root):
        with Checkpoint.open(root) as ck:
            return source_fingerprint(ck)

    shards = sorted(tiny_fp8.glob("model-*.safetensors"))
    assert [p.read_bytes()[:200] for p in shards] == [p.read_bytes()[:200] for p in
                                                      sorted(other_seed.glob("model-*.safetensors"))]
    assert fp(tiny_fp8) != fp(other_seed)
    shutil.copytree(tiny_fp8, tmp_path / "copy")
    assert fp(tmp_path / "copy") == fp(tiny_fp8)
    victim = sorted((tmp_path / "copy").glob("model-*.safetensors"))[2]
    b = bytearray(victim.read_bytes())
    b[8 + int.from_bytes(b[:8], "little")] ^= 1
    victim.write_bytes(bytes(b))
    assert fp(tmp_path / "copy") != fp(tiny_fp8)


def test_another_source_into_a_finished_output_is_refused_not_kept(mixed, other_seed, tmp_path, capsys):
    """dsx quantize of another checkpoint of the same architecture (R1 after V3) into an output that holds a
    conversion: it took every shard as finished and kept them ("converted 0, verified and kept 6"), the first
    checkpoint's weights under the second one's name. It is refused, saying why; --force converts anew."""
    import shutil

    out = tmp_path / "mix"
    shutil.copytree(mixed.root, out)
    args = ["quantize", str(other_seed), "--out", str(out), "--type", "a8w8_fp8_wint4", "--mtp-type", "a8w8_fp8", "-q"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "holds a conversion of another source" in err and "--force" in err, err
    assert main([*args, "--force"]) == 0
    with Checkpoint.open(out) as got, Checkpoint.open(mixed.root) as before:
        name = "model.embed_tokens.weight"
        assert not np.array_equal(got.get(name), before.get(name))


def test_verify_says_when_the_reference_is_not_the_source(mixed, tiny_fp8, other_seed, capsys):
    """A failing verify against another checkpoint of the same architecture says that the reference is not the
    source the conversion recorded (instead of only 'quantize it again, or check --reference')."""
    from ds_export.verify import verify

    assert verify(mixed.root, tiny_fp8, samples=0)["reference_is_source"] is True
    assert main(["verify", str(mixed.root), "--reference", str(other_seed), "--samples", "0", "-q"]) == 1
    err = capsys.readouterr().err
    assert "--reference is not the checkpoint this output was converted from" in err, err
    assert main(["verify", str(mixed.root), "--reference", str(other_seed), "--samples", "0"]) == 1
    assert "differ from those of the source this output was converted from" in capsys.readouterr().out


def test_weight_only_refuses_bad_shapes(tmp_path):
    """A shape Paddle's CPU op would corrupt memory on is refused at plan time, naming the tensor."""
    from ds_export.models import deepseek_v3 as ds
    from ds_export.tiny import REAL_CONFIG, TINY

    cfg = ds.DeepseekV3Config.from_dict({**REAL_CONFIG, **TINY, "hidden_size": 200})
    (tmp_path / "t").mkdir()
    ck_names = [t for t in ds.expected_tensors(cfg, fp8=False) if t.name.endswith("o_proj.weight")]
    rec = plan_mod.load_recipe("weight_only_int4", None, arch=None, group_size=None, mtp_type=None)
    with pytest.raises(DsxError, match="model.layers.0.self_attn.o_proj.weight.*multiples of 64"):
        plan_mod._outputs(ck_names[0].name, ck_names[0].shape, "BF16", rec.target(ck_names[0].role))  # noqa: SLF001


@pytest.mark.parametrize("args,msg", [
    (["--type", "int3"], "unknown quant type"),
    (["--type", "../quant/bf16"], "unknown quant type '../quant/bf16'"),  # (a name, not a path to a recipe file)
    ([], "exactly one of --type and --recipe"),
    (["--type", "bf16", "--mtp-only", "--no-mtp"], "exclude each other"),
    (["--type", "weight_only_int4", "--group-size", "32"], "--group-size 32: expected one of -1, 64, 128"),
    (["--type", "weight_only_int4", "--arch", "81"], "--arch 81: expected one of"),
])
def test_cli_usage_errors(tiny_fp8, tmp_path, capsys, args, msg):
    assert main(["quantize", str(tiny_fp8), "--out", str(tmp_path / "o"), *args]) == 2
    assert msg in capsys.readouterr().err


@pytest.mark.parametrize("args,n_fp8", [
    (["--type", "a8w8_fp8", "--arch", "80"], 177),
    (["--type", "a8w8_fp8_wint4", "--arch", "86"], 33),  # the routed experts are int4: the rest is FP8
    (["--type", "weight_only_int4", "--mtp-type", "a8w8_fp8", "--arch", "80"], 57),  # the draft's FP8 alone
])
def test_fp8_weights_for_a_gpu_without_fp8_are_refused(tiny_fp8, tmp_path, capsys, args, n_fp8):
    """--arch names the serving GPU; FP8 weights cannot be served below sm_89: refused at plan time (a dry run
    too), counting the FP8 tensors, with nothing written."""
    for extra in (["--dry-run"], []):
        assert main(["quantize", str(tiny_fp8), "--out", str(tmp_path / "o"), "-q", *args, *extra]) == 2
        err = capsys.readouterr().err
        assert f"arch {args[-1]} with FP8 weights: {n_fp8} tensors" in err and "sm_89 or newer" in err, err
        assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()
    # the same types at arch 89, and weight-only alone at arch 80, plan
    assert main(["quantize", str(tiny_fp8), "--out", str(tmp_path / "o"), "-q", "--dry-run", *args[:-1], "89"]) == 0
    assert main(["quantize", str(tiny_fp8), "--out", str(tmp_path / "o"), "-q", "--dry-run",
                 "--type", "weight_only_int4", "--mtp-type", "weight_only_int8", "--arch", "80"]) == 0


def test_an_fp8_source_kept_by_a_recipe_counts_as_fp8(tiny_fp8, tmp_path, capsys):
    """`keep` of an FP8 source writes FP8: with 128x128 blocks as a8w8_fp8, with other blocks as they are."""
    from ds_export.tiny import REAL_CONFIG, TinySpec, write_tiny

    qc = dict(REAL_CONFIG["quantization_config"], weight_block_size=[64, 64])
    write_tiny(tmp_path / "b64", TinySpec(overrides=(("quantization_config", qc),)))
    r = tmp_path / "keep.yaml"
    for src in (tiny_fp8, tmp_path / "b64"):
        r.write_text("name: keep-all\narch: 80\ndefaults: {linear: keep, other: keep}\n")
        assert main(["quantize", str(src), "--out", str(tmp_path / "o"), "-q", "--dry-run", "--recipe", str(r)]) == 2
        assert "arch 80 with FP8 weights" in capsys.readouterr().err
        r.write_text("name: keep-all\narch: 90\ndefaults: {linear: keep, other: keep}\n")
        assert main(["quantize", str(src), "--out", str(tmp_path / "o"), "-q", "--dry-run", "--recipe", str(r)]) == 0


def test_two_nodes_share_the_work_and_match_one_node(tiny_fp8, tmp_path, monkeypatch):
    args = ["--type", "a8w8_fp8_wint4", "--mtp-type", "weight_only_int8"]
    _quantize(tiny_fp8, tmp_path / "one", *args)
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "2")
    monkeypatch.setenv("PADDLE_TRAINER_ID", "1")  # as paddle.distributed.launch would set it
    assert main(["quantize", str(tiny_fp8), "--out", str(tmp_path / "two"), "-q", *args]) == 0
    node1 = Manifest.load(tmp_path / "two", "dsx-manifest.node-1-of-2.json")
    assert node1.complete and 0 < len(node1.files) < 6
    assert not (tmp_path / "two" / "model.safetensors.index.json").exists()  # not published yet
    assert main(["quantize", str(tiny_fp8), "--out", str(tmp_path / "two"), "-q", "--node-rank", "0", *args]) == 0
    assert Manifest.load(tmp_path / "two").complete
    for f in sorted((tmp_path / "one").iterdir()):
        if not f.name.startswith("dsx-manifest"):
            assert sha256_file(f) == sha256_file(tmp_path / "two" / f.name), f.name
    assert main(["quantize", str(tiny_fp8), "--out", str(tmp_path / "x"), "-q", "--node-rank", "2", *args]) == 2


def test_fp8_source_with_other_blocks_is_requantized(tmp_path):
    from ds_export.tiny import REAL_CONFIG, TinySpec, write_tiny

    qc = dict(REAL_CONFIG["quantization_config"], weight_block_size=[64, 64])
    write_tiny(tmp_path / "src", TinySpec(overrides=(("quantization_config", qc),)))
    src = Checkpoint.open(tmp_path / "src")
    assert src.info("model.layers.0.self_attn.o_proj.weight_scale_inv").shape == (4, 4)
    out = _quantize(tmp_path / "src", tmp_path / "o", "--type", "a8w8_fp8")
    name = "model.layers.0.self_attn.o_proj.weight"
    assert out.info(name + "_scale_inv").shape == (2, 2)
    q = src.get(name).astype(np.float64)
    s = src.get(name + "_scale_inv").astype(np.float64)
    ref = q * np.repeat(np.repeat(s, 64, 0), 64, 1)
    err = np.abs(_dequant_f32(out, name) - ref)
    s128 = np.repeat(np.repeat(out.get(name + "_scale_inv"), 128, 0), 128, 1)
    assert (err <= np.maximum(np.abs(ref) * 2.0**-4, s128 * 2.0**-10) * (1 + 1e-6)).all()


def test_mtp_only_on_a_partial_download(tiny_fp8, tmp_path):
    """`dsx download --only mtp` leaves an index listing absent base shards: --mtp-only still works."""
    import shutil

    src = tmp_path / "mtp-only"
    shutil.copytree(tiny_fp8, src)
    ck = Checkpoint.open(src)
    mtp_files = {f for n, f in ck.weight_map.items() if n.startswith("model.layers.3.")}
    for f in set(ck.weight_map.values()) - mtp_files:
        (src / f).unlink()
    assert main(["quantize", str(src), "--out", str(tmp_path / "o1"), "--type", "bf16", "-q"]) == 1  # needs all
    out = _quantize(src, tmp_path / "o2", "--type", "a8w8_fp8", "--mtp-only")
    assert out.names() and all(n.startswith("model.layers.3.") for n in out.names())
    assert len(Checkpoint.open(src, partial=True).missing_shards) == len(set(ck.weight_map.values()) - mtp_files)


def test_a_partial_download_whose_pairs_straddle_its_absent_shards(tiny_fp8, tmp_path, capsys):
    """A partial checkpoint (the MTP shards plus the one before them, as a download --only mtp of a release whose
    shard boundary falls inside a layer gives): a present block scale whose weight is in an absent shard failed the
    model map ("... weight_scale_inv has no weight ..."), for quantize --mtp-only and inspect alike. Planned now; an
    MTP weight that is converted while its scale is absent is named with the shard to fetch."""
    import shutil

    ck = Checkpoint.open(tiny_fp8)
    wm = ck.weight_map
    mtp_files = {f for n, f in wm.items() if n.startswith("model.layers.3.")}
    before = sorted(f for f in set(wm.values()) if f < min(mtp_files))[-1]  # (the shard before the MTP ones)
    src = tmp_path / "part"
    shutil.copytree(tiny_fp8, src)
    keep = mtp_files | {before}
    for f in set(wm.values()) - keep:
        (src / f).unlink()
    assert any(wm[f"{n}_scale_inv"] == before and wm[n] not in keep for n in wm if f"{n}_scale_inv" in wm), \
        "the fixture has no pair across the kept/absent boundary"
    out = _quantize(src, tmp_path / "o", "--type", "a8w8_fp8", "--mtp-only")
    assert out.names() and all(n.startswith("model.layers.3.") for n in out.names())
    assert main(["inspect", str(src)]) == 0
    capsys.readouterr()
    # an MTP weight whose scale is in the absent shard: named, with the shard
    split = next(n for n in wm if n.startswith("model.layers.3.") and f"{n}_scale_inv" in wm
                 and wm[n] != wm[f"{n}_scale_inv"])
    (src / wm[f"{split}_scale_inv"]).unlink()
    assert main(["quantize", str(src), "--out", str(tmp_path / "o2"), "--type", "a8w8_fp8", "--mtp-only"]) == 1
    err = capsys.readouterr().err
    assert f"{split} is converted, and its block scale {split}_scale_inv is in {wm[split + '_scale_inv']}, which is " \
           "absent" in err, err


@pytest.mark.parametrize("gpus,workers,cores,shards,want", [
    ((0,), None, 16, 8, [0, 0, 0, 0]),        # one GPU, 16 cores: 4 workers share it
    ((0,), None, 2, 8, [0]),                  # few cores: one worker per GPU
    ((0, 1), None, 32, 8, [0, 1] * 4),        # round robin, 4 a GPU
    ((0, 1), None, 32, 3, [0, 1, 0]),         # never more workers than shards...
    ((0, 1), None, 32, 1, [0, 1]),            # ...nor fewer than one a GPU
    ((0, 1), 1, 32, 8, [0, 1]),               # --workers below the GPU count: one a GPU
    ((3,), 6, 4, 8, [3] * 6),                 # --workers sets the total
])
def test_gpu_worker_assignment(gpus, workers, cores, shards, want):
    assert engine.gpu_workers(gpus, workers, cores, shards) == want


class CpuStandInGpu(engine.CpuBackend):
    """What a GPU worker process converts with, on the CPU: runs engine's GPU worker-process path in CI.
    Leaves a mark (gpu id, pid) in $DSX_TEST_GPU_MARKS so the test sees which processes did the work."""

    def __init__(self, gpu: int, threads: int):
        super().__init__(threads)
        import os
        from pathlib import Path

        Path(os.environ["DSX_TEST_GPU_MARKS"], f"{gpu}-{os.getpid()}").touch()


class DyingGpu(CpuStandInGpu):
    """Planted fault: the worker process dies (as on a GPU fault or the OOM killer) in its first conversion."""

    def fp8_to_weight_only(self, *a, **k):
        import os

        os._exit(3)


class GroupSigtermGpu(CpuStandInGpu):
    """SIGTERM to the whole process group (`kill -- -PGID`, a scheduler) at the worker's first conversion: the main
    process gets it, and the worker, whose SIGTERM keeps its default action, ends at once."""

    def fp8_to_weight_only(self, *a, **k):
        import os
        import signal

        os.kill(os.getppid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)


class CtrlCGpu(CpuStandInGpu):
    """Ctrl-C at the worker process's first conversion (SIGINT to the main process, as a terminal would also send
    it to the workers, which leave it to the main one); then it waits for the stop event the main process sets."""

    def fp8_to_weight_only(self, *a, **k):
        import os
        import signal

        from pathlib import Path

        os.kill(os.getppid(), signal.SIGINT)
        seen = engine._local.stop.wait(10)
        Path(os.environ["DSX_TEST_GPU_MARKS"], "stop-seen" if seen else "stop-missed").touch()
        return super().fp8_to_weight_only(*a, **k)


def _gpu_path(ck, out, backend, workers, gpus=(0, 1)):
    p = plan_mod.build(ck, plan_mod.load_recipe("a8w8_fp8_wint4", None, arch=None, group_size=None, mtp_type=None))
    return engine.run(ck, p, out, engine.Options(gpus=gpus, workers=workers, gpu_backend=backend))


def test_gpu_worker_processes_write_the_cpu_bytes(tiny_fp8, tmp_path, monkeypatch):
    """The multi-process path of --device cuda (spawned workers, progress queue, manifest), on the CPU."""
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("DSX_TEST_GPU_MARKS", str(marks))
    ck = Checkpoint.open(tiny_fp8)
    res = _gpu_path(ck, tmp_path / "g", CpuStandInGpu, 3)
    assert res["complete"] and res["workers"] == 3 and res["device"] == "cuda:0,1"
    seen = [m.name.split("-") for m in marks.iterdir()]
    assert sorted(g for g, _ in seen) == ["0", "0", "1"] and len({pid for _, pid in seen}) == 3
    _quantize(tiny_fp8, tmp_path / "c", "--type", "a8w8_fp8_wint4")
    for f in sorted((tmp_path / "c").iterdir()):
        if f.name != "dsx-manifest.json":
            assert sha256_file(f) == sha256_file(tmp_path / "g" / f.name), f.name


def test_ctrl_c_stops_the_gpu_worker_processes_and_resumes(tiny_fp8, tmp_path, monkeypatch):
    """The worker-process path (--device cuda) on Ctrl-C: KeyboardInterrupt (exit 130) once the workers have stopped,
    not a 'GPU worker process died' error; no partial file left, nothing published; a rerun completes."""
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("DSX_TEST_GPU_MARKS", str(marks))
    ck = Checkpoint.open(tiny_fp8)
    with pytest.raises(KeyboardInterrupt):
        _gpu_path(ck, tmp_path / "g", CtrlCGpu, 1, gpus=(0,))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    m = Manifest.load(tmp_path / "g")
    assert not m.complete and not (tmp_path / "g" / "model.safetensors.index.json").exists()
    assert sorted(m.files) == _published(tmp_path / "g") and not list((tmp_path / "g").glob("*.partial"))
    assert (marks / "stop-seen").exists() and not (marks / "stop-missed").exists()
    assert _gpu_path(ck, tmp_path / "g", CpuStandInGpu, 1, gpus=(0,))["complete"]


def test_sigterm_to_the_process_group_is_a_stop_not_a_dead_worker(tiny_fp8, tmp_path, monkeypatch):
    """A SIGTERM to the process group ends the GPU worker processes with the main one: the pool breaks, and that is
    the stop's doing (KeyboardInterrupt, exit 143 in the CLI), not 'a GPU worker process died'; a rerun completes."""
    from ds_export import interrupt

    monkeypatch.setattr(interrupt, "_terminated", [False])  # (process-global: restored after the test)
    monkeypatch.setattr(interrupt, "_stopped", [False])
    (tmp_path / "marks").mkdir()
    monkeypatch.setenv("DSX_TEST_GPU_MARKS", str(tmp_path / "marks"))
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    ck = Checkpoint.open(tiny_fp8)
    try:
        interrupt.handle_stop_signals()
        with pytest.raises(KeyboardInterrupt):
            _gpu_path(ck, tmp_path / "g", GroupSigtermGpu, 1, gpus=(0,))
        assert interrupt.terminated()
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    assert not Manifest.load(tmp_path / "g").complete and not list((tmp_path / "g").glob("*.partial"))
    assert not (tmp_path / "g" / "model.safetensors.index.json").exists()
    assert _gpu_path(ck, tmp_path / "g", CpuStandInGpu, 1, gpus=(0,))["complete"]


def test_a_dead_gpu_worker_is_one_clear_error_and_resumable(tiny_fp8, tmp_path, monkeypatch):
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("DSX_TEST_GPU_MARKS", str(marks))
    ck = Checkpoint.open(tiny_fp8)
    with pytest.raises(DsxError) as e:
        _gpu_path(ck, tmp_path / "g", DyingGpu, 2)
    assert "GPU worker process died" in str(e.value) and "--workers" in e.value.hint
    assert not Manifest.load(tmp_path / "g").complete and not list((tmp_path / "g").glob("*.partial"))
    assert not (tmp_path / "g" / "model.safetensors.index.json").exists()  # does not look complete
    res = _gpu_path(ck, tmp_path / "g", CpuStandInGpu, 2)
    assert res["complete"]
    _quantize(tiny_fp8, tmp_path / "c", "--type", "a8w8_fp8_wint4")
    for f in sorted((tmp_path / "c").iterdir()):
        if f.name != "dsx-manifest.json":
            assert sha256_file(f) == sha256_file(tmp_path / "g" / f.name), f.name


def test_a_directory_is_not_read_while_written_nor_rewritten_while_read(tiny_fp8, tmp_path, capsys):
    """`dsx quantize --force` rewrote a directory that a dsx export or verify was reading (they read a mix of two
    conversions), and an export or verify read one still being written. A reader holds a shared lock, a writer an
    exclusive one: whichever comes second is refused with what to do, before it reads or writes anything."""
    from dir_lock import held_by_another_process

    out = tmp_path / "q"
    _quantize(tiny_fp8, out, "--type", "bf16")
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    with held_by_another_process(out, reader=True):  # (a dsx export or verify reading it)
        assert main(["quantize", str(tiny_fp8), "--out", str(out), "--type", "weight_only_int8", "--force",
                     "-q"]) == 2
        assert "another dsx process is writing or reading it now" in capsys.readouterr().err
        assert main(["verify", str(out), "-q"]) == 0  # (readers together are fine)
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    with held_by_another_process(out):  # (a dsx quantize writing it)
        for args in (["verify", str(out), "--reference", str(tiny_fp8)],
                     ["export", str(out), "--out", str(tmp_path / "e")],
                     ["quantize", str(out), "--out", str(tmp_path / "q2"), "--type", "bf16"]):
            assert main([*args, "-q"]) == 2, args
            err = capsys.readouterr().err
            assert f"{out}: a dsx process is writing it now; dsx {args[0]} reads it once that has finished" in err, err
        assert not (tmp_path / "e").exists() and not (tmp_path / "e.partial").exists()
        assert not (tmp_path / "q2").exists() or not any((tmp_path / "q2").iterdir())
    with held_by_another_process(tiny_fp8):  # (the reference being written: a download into it)
        assert main(["verify", str(out), "--reference", str(tiny_fp8), "-q"]) == 2
        assert f"{tiny_fp8}: a dsx process is writing it now" in capsys.readouterr().err
