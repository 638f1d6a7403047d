"""Streamed export: parameter files written tensor by tensor are Paddle's own bytes, in bounded memory."""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from ds_export.cli.app import main
from ds_export.errors import DsxError
from ds_export.export import pdiparams
from ds_export.tiny import TinySpec, write_tiny

paddle = pytest.importorskip("paddle")


def _program(path: Path) -> str:
    """model.json without the ops' debug-only layer paths ("struct_name": /DecoderLayer/RMSNorm_5/), which
    Paddle's jit.save records and the streamed save leaves out (recording them is quadratic in program size)."""
    t = re.sub(r',\{"AT":\{"#":"0\.a_str","D":"[^"]*"\},"N":"struct_name"\}', "", path.read_text())
    return re.sub(r'\{"AT":\{"#":"0\.a_str","D":"[^"]*"\},"N":"struct_name"\},?', "", t)


def _eager_save(weights, out: Path, speculate: bool) -> None:
    from ds_export.export.modeling import DeepseekV3ForInference
    from ds_export.export.mtp import MTPDraft

    with paddle.utils.unique_name.guard():
        m = DeepseekV3ForInference(weights, 64)
    paddle.jit.save(m, str(out / "model"), input_spec=m.input_spec())
    if speculate:
        with paddle.utils.unique_name.guard():
            d = MTPDraft(weights, 64)
        paddle.jit.save(d, str(out / "mtp" / "model"), input_spec=d.input_spec())


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    root = tmp_path_factory.mktemp("stream")
    write_tiny(root / "src", TinySpec(overrides=(("intermediate_size", 256), ("moe_intermediate_size", 256))))
    assert main(["quantize", str(root / "src"), "--out", str(root / "q"), "--type", "a8w8_fp8_wint4",
                 "--mtp-type", "a8w8_fp8", "-q"]) == 0
    return root


@pytest.mark.parametrize("source,dtype", [("q", "float32"), ("src", "float32"), ("src", "bfloat16"),
                                          ("src", "float16")])
def test_streamed_export_is_paddles_jit_save(mixed, tmp_path, source, dtype):
    """FP8 + INT4 + bf16 + float32 parameters (quantized source), dequantized FP8 (original source)."""
    from ds_export.export.weights import load_weights

    assert main(["export", str(mixed / source), "--out", str(tmp_path / "s"), "--speculate", "--dtype", dtype,
                 "--max-seq-len", "64", "-q"]) == 0
    _eager_save(load_weights(mixed / source, dtype, include_mtp=True), tmp_path / "e", True)
    for f in ("model.pdiparams", "mtp/model.pdiparams"):
        assert (tmp_path / "s" / f).read_bytes() == (tmp_path / "e" / f).read_bytes(), f
    for f in ("model.json", "mtp/model.json"):
        assert _program(tmp_path / "s" / f) == _program(tmp_path / "e" / f), f
        assert '"struct_name"' not in (tmp_path / "s" / f).read_text()  # the quadratic tagging stayed off


def test_streamed_tp_rank_is_paddles_jit_save(mixed, tmp_path):
    from ds_export.export.tp import shard_weights
    from ds_export.export.weights import load_weights

    assert main(["export", str(mixed / "q"), "--out", str(tmp_path / "s"), "--tp", "2", "--max-seq-len", "64",
                 "-q"]) == 0
    w = load_weights(mixed / "q", "float32", include_mtp=False)
    for r in range(2):
        _eager_save(shard_weights(w, r, 2), tmp_path / f"e{r}", False)
        assert (tmp_path / "s" / f"rank_{r}" / "model.pdiparams").read_bytes() == \
            (tmp_path / f"e{r}" / "model.pdiparams").read_bytes()


def test_each_parameter_is_made_without_the_ones_before(mixed, tmp_path, monkeypatch):
    """Paddle's create_parameter copies the default startup program's whole parameter table into the main program
    (quadratic: R1's rank 0 spent ~4 of its ~5.5 minutes there). The export makes each in a startup program of its
    own: every parameter finds that program empty (the saved bytes are Paddle's, test above)."""
    import paddle.pir.core as pcore

    real, seen = pcore.create_parameter, []

    def watch(*args, **kwargs):
        seen.append(pcore.default_startup_program().parameters_num())
        return real(*args, **kwargs)

    monkeypatch.setattr(pcore, "create_parameter", watch)
    assert main(["export", str(mixed / "q"), "--out", str(tmp_path / "s"), "--max-seq-len", "64", "-q"]) == 0
    assert len(seen) > 50 and max(seen) == 0, seen[:10]
    assert pcore.create_parameter is watch  # put back after the save


@pytest.mark.parametrize("tp", [1, 2])
def test_parameter_files_are_hashed_as_written_not_read_again(mixed, tmp_path, monkeypatch, tp):
    """The manifest's sha256 of each parameter file (most of an export's bytes: R1's are hundreds of GB) comes from
    the bytes as they were written; the export read them all back to hash them. Each recorded hash is checked here
    against the file on disk, by hashlib."""
    import hashlib

    from ds_export.io import manifest as mmod

    read_back = []
    real = mmod.sha256_file
    monkeypatch.setattr(mmod, "sha256_file", lambda p, *a, **k: read_back.append(Path(p).name) or real(p, *a, **k))
    out = tmp_path / "s"
    assert main(["export", str(mixed / "q"), "--out", str(out), "--tp", str(tp), "--speculate", "--max-seq-len", "64",
                 "-q"]) == 0
    files = json.loads((out / "dsx-manifest.json").read_text())["files"]
    params = [rel for rel in files if rel.endswith(".pdiparams")]
    assert len(params) == 2 * tp, files
    assert read_back and "model.pdiparams" not in read_back, read_back  # (the configs and programs are read)
    for rel, ent in files.items():
        assert hashlib.sha256((out / rel).read_bytes()).hexdigest() == ent["sha256"], rel
        assert (out / rel).stat().st_size == ent["size"], rel


def test_pdiparams_round_trip_and_dtypes(tmp_path):
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((3, 5)).astype(np.float32), rng.integers(-8, 8, (4, 7)).astype(np.int8),
              rng.standard_normal(9).astype(ml_dtypes.bfloat16), rng.standard_normal((2, 130)).astype(
                  ml_dtypes.float8_e4m3fn)]
    f = tmp_path / "p.pdiparams"
    n = pdiparams.write_params(f, [(f"t{i}", (lambda a=a: a), a.shape, a.dtype) for i, a in enumerate(arrays)],
                               chunk=7)  # tiny chunks: the chunked write must not change the bytes
    assert n == f.stat().st_size
    for a, b in zip(arrays, pdiparams.read_params(f)):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    with pytest.raises(DsxError, match="declares float32 \\[3, 5\\]"):
        pdiparams.write_params(tmp_path / "bad", [("t", lambda: arrays[1], (3, 5), np.float32)])


def test_pdiparams_write_behind_makes_the_next_tensor_while_one_is_written(tmp_path):
    """write_params hashes and writes a tensor in its writer thread while the caller's thread makes the next one: the
    next thunk runs before the tensor before it is reported written; pairs over `behind` bytes take turns (the
    order of a synchronous writer; by default pairs up to the largest tensor, at least 64 MiB, overlap); the bytes and
    the hash are the same either way."""
    arrays = [np.full((256, 256), i, np.float32) for i in range(4)]  # 256 KiB each
    overlapped = ["make 0", "make 1", "written 0", "make 2", "written 1", "make 3", "written 2", "written 3"]
    in_turns = ["make 0", "written 0", "make 1", "written 1", "make 2", "written 2", "make 3", "written 3"]
    for behind, want in [(1 << 20, overlapped), (300 << 10, in_turns), (0, in_turns), (None, overlapped)]:
        events, digest = [], []

        def make(i):
            events.append(f"make {i}")
            return arrays[i]

        def written(n):
            events.append(f"written {sum(e.startswith('written') for e in events)}")
            assert n == arrays[0].nbytes
        f = tmp_path / f"p{behind}.pdiparams"
        pdiparams.write_params(f, [(f"t{i}", (lambda i=i: make(i)), (256, 256), np.float32) for i in range(4)],
                               written=written, hashed=digest.append, behind=behind)
        assert events == want, behind
        assert digest == [hashlib.sha256(f.read_bytes()).hexdigest()]
        assert [a.tobytes() for a in pdiparams.read_params(f)] == [a.tobytes() for a in arrays]


def test_pdiparams_write_behind_failures_surface(tmp_path):
    """A write that fails in the writer thread (a full disk: /dev/full) is raised by write_params, as is a thunk that
    fails while a write is in flight; no writer thread is left behind."""
    import threading

    arrays = [np.ones((512, 512), np.float32)] * 3
    if Path("/dev/full").exists():
        with pytest.raises(OSError) as err:
            pdiparams.write_params("/dev/full", [(f"t{i}", (lambda: arrays[0]), (512, 512), np.float32)
                                                 for i in range(3)])
        assert err.value.errno == 28  # ENOSPC

    def boom():
        raise DsxError("the second tensor failed")
    with pytest.raises(DsxError, match="second tensor failed"):
        pdiparams.write_params(tmp_path / "p", [("a", lambda: arrays[0], (512, 512), np.float32),
                                                ("b", boom, (512, 512), np.float32)])
    assert not [t for t in threading.enumerate() if t.name.startswith("dsx-pdiparams")]


def test_streamed_export_memory_is_bounded(tmp_path):
    """~875 MiB of float32 parameters: the streamed export holds one tensor at a time (the eager path,
    building every parameter first, peaked at 1934 MiB on the same model)."""
    from ds_export.procmem import run_measured

    write_tiny(tmp_path / "big", TinySpec(layers=2, experts=64, overrides=(
        ("hidden_size", 1024), ("moe_intermediate_size", 1024), ("intermediate_size", 2048), ("vocab_size", 8192))))
    dsx = str(Path(sys.executable).with_name("dsx"))
    _, _, base = run_measured([sys.executable, "-c", "import paddle; import ds_export.export.exporter"])
    res, secs, peak = run_measured([dsx, "export", str(tmp_path / "big"), "--out", str(tmp_path / "e"), "-q",
                                    "--max-seq-len", "64"])
    assert res.returncode == 0
    params = (tmp_path / "e" / "model.pdiparams").stat().st_size
    print(f"streamed export: {params / 2**20:.0f} MiB of parameters in {secs:.1f} s, peak {peak / 2**20:.0f} MiB "
          f"(Paddle + dsx imported: {base / 2**20:.0f} MiB)")
    assert params > 800 * 2**20
    assert peak - base < params / 4, f"peak {peak / 2**20:.0f} MiB over a {base / 2**20:.0f} MiB baseline"
