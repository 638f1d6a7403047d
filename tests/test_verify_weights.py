"""dsx verify's weight numerics in row parts on worker threads: the same figures as whole tensors in float64, every
part counted, bounded memory, errors that stop the run."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
import subprocess
import sys
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from ds_export.cli.app import main
from ds_export.errors import DsxError
from ds_export.formats import fp8_block, weight_only
from ds_export.io.checkpoint import Checkpoint
from ds_export.models import deepseek_v3 as ds
from ds_export.verify import weights as W
from ds_export.verify.integrity import check_files

TYPES = {
    "mix": ["--type", "a8w8_fp8_wint4", "--mtp-type", "a8w8_fp8"],  # int4 per channel experts, fp8 elsewhere
    "int8g128": ["--type", "weight_only_int8", "--group-size", "128"],
    "int4g64": ["--type", "weight_only_int4", "--group-size", "64"],
    "bf16": ["--type", "bf16"],
}


@pytest.fixture(scope="module")
def outs(tiny_fp8, tmp_path_factory):
    root = tmp_path_factory.mktemp("vw")
    for name, args in TYPES.items():
        assert main(["quantize", str(tiny_fp8), "--out", str(root / name), "-q", *args]) == 0
    return root


@pytest.fixture
def small_parts(monkeypatch):
    """Parts of 128 rows on the tiny model (most tensors in 2..4 parts, 192- and 320-row ones ragged)."""
    monkeypatch.setattr(W, "PART_ELEMENTS", 1 << 12)


def whole_f64(target: Checkpoint, reference: Checkpoint, name: str) -> tuple[float, float, float, float, float]:
    """(rel, sqnr, max abs, cosine, saturated share) of one weight from whole tensors in float64, straight from the
    format references (no parts, no threads)."""
    r = reference.info(name)
    if r.dtype == "F8_E4M3":
        ref = fp8_block.dequant_ref(reference.get(name), reference.get(name + ds.SCALE_SUFFIX)).astype(np.float64)
    else:
        ref = reference.get(name).astype(np.float64)
    t = target.info(name)
    if t.dtype == "F8_E4M3":
        q = target.get(name)
        got = fp8_block.dequant_ref(q, target.get(name + ds.SCALE_SUFFIX)).astype(np.float64)
        sat = float(np.mean((q.view(np.uint8) & 0x7F) == 0x7E))
    elif t.dtype == "I8":
        n, k = ref.shape
        s = target.info(name + ds.WO_SCALE_SUFFIX)
        bits = 8 if t.shape[0] == n else 4
        group = -1 if len(s.shape) == 1 else (64 if s.shape[0] == -(-k // 64) else 128)
        qw, sc = target.get(name), target.get(name + ds.WO_SCALE_SUFFIX)
        got = weight_only.dequantize_ref(qw, sc, bits, group, 90, k).astype(np.float64)
        ints = weight_only.unpack_ref(qw, bits, 90, k)
        sat = float(np.mean(np.abs(ints) >= (127 if bits == 8 else 7)))
    else:
        got, sat = target.get(name).astype(np.float64), 0.0
    err = got - ref
    e2, r2, g2 = float((err * err).sum()), float((ref * ref).sum()), float((got * got).sum())
    rel = math.sqrt(e2 / r2)
    sqnr = math.inf if e2 == 0 else 10 * math.log10(r2 / e2)
    return rel, sqnr, float(np.abs(err).max()), float((ref * got).sum()) / math.sqrt(r2 * g2), sat


def run(target, reference, **kw):
    with Checkpoint.open(target) as ck, Checkpoint.open(reference) as ref:
        cfg = ds.DeepseekV3Config.from_dict(ck.config)
        return W.check_weights(ck, ref, cfg, **kw)


@pytest.mark.parametrize("typ", list(TYPES))
def test_parts_on_threads_give_the_whole_tensor_figures(outs, tiny_fp8, small_parts, typ):
    stats = run(outs / typ, tiny_fp8, workers=3)
    assert stats and all(s.ok for s in stats)
    ragged = 0
    with Checkpoint.open(outs / typ) as ck, Checkpoint.open(tiny_fp8) as ref:
        for s in stats:
            rel, sqnr, mx, cos, sat = whole_f64(ck, ref, s.name)
            assert s.max_abs == mx, s.name  # a max does not depend on the order: equal
            assert s.saturated == pytest.approx(sat, rel=1e-12, abs=0), s.name
            assert s.rel_fro == pytest.approx(rel, rel=1e-9, abs=1e-300), s.name
            assert s.cosine == pytest.approx(cos, rel=1e-12), s.name
            assert s.sqnr_db == sqnr or s.sqnr_db == pytest.approx(sqnr, rel=1e-9), s.name
            shape = ref.info(s.name).shape
            ragged += len(shape) == 2 and shape[0] > 128 and shape[0] % 128 != 0
        assert ragged, "no tensor with a ragged last part: the test lost its point"
    fmts = {s.format for s in stats}
    assert fmts >= {"mix": {"a8w8_fp8", "weight_only_int4", "bf16"}, "int8g128": {"weight_only_int8/g"},
                    "int4g64": {"weight_only_int4/g"}, "bf16": {"bf16"}}[typ]


def test_worker_count_does_not_change_the_report(outs, tiny_fp8, small_parts):
    one = run(outs / "mix", tiny_fp8, workers=1)
    many = run(outs / "mix", tiny_fp8, workers=4)
    assert [s.name for s in one] == [s.name for s in many]  # the target's order, whatever finished first
    for a, b in zip(one, many):
        assert (a.max_abs, a.saturated, a.ok, a.format) == (b.max_abs, b.saturated, b.ok, b.format)
        assert a.rel_fro == pytest.approx(b.rel_fro, rel=1e-12, abs=1e-300)


def _flip_last_byte(root, name: str) -> None:
    """Corrupt the last stored byte of `name` in its shard (the last rows: the last part)."""
    with Checkpoint.open(root) as ck:
        shard = ck.shard_of(name)
        path, end = shard.path, shard.info(name).end
    with open(path, "r+b") as f:
        f.seek(end - 1)
        b = f.read(1)[0]
        f.seek(end - 1)
        f.write(bytes([b ^ 0x77]))


@pytest.mark.parametrize("name", ["model.layers.1.mlp.experts.2.up_proj.weight",  # int4, 192 rows: parts 128 + 64
                                  "model.layers.0.self_attn.q_b_proj.weight"])  # fp8, 512 rows: 4 parts
def test_a_fault_in_the_last_part_is_counted(outs, tiny_fp8, tmp_path, small_parts, name):
    bad = tmp_path / "mix"
    shutil.copytree(outs / "mix", bad)
    _flip_last_byte(bad, name)
    before = {s.name: s for s in run(outs / "mix", tiny_fp8, workers=2)}[name]
    after = {s.name: s for s in run(bad, tiny_fp8, workers=2)}[name]
    with Checkpoint.open(bad) as ck, Checkpoint.open(tiny_fp8) as ref:
        rel, sqnr, mx, cos, sat = whole_f64(ck, ref, name)
    assert after.max_abs == mx > before.max_abs
    assert after.sqnr_db == pytest.approx(sqnr, rel=1e-9) and after.sqnr_db < before.sqnr_db


def test_a_nan_code_fails_its_tensor(outs, tiny_fp8, tmp_path, small_parts):
    name = "model.layers.0.self_attn.q_b_proj.weight"  # fp8 copy of the source: must be exact
    bad = tmp_path / "mix"
    shutil.copytree(outs / "mix", bad)
    with Checkpoint.open(bad) as ck:
        path, begin = ck.shard_of(name).path, ck.info(name).begin
    with open(path, "r+b") as f:
        f.seek(begin + 256 * 192 + 5)  # row 256 (the third part), column 5
        f.write(b"\x7f")  # e4m3 NaN
    stat = {s.name: s for s in run(bad, tiny_fp8, workers=2)}[name]
    assert not stat.ok and math.isnan(stat.max_abs) and math.isnan(stat.sqnr_db)


def test_memory_is_bounded_by_the_parts(outs, tiny_fp8, monkeypatch):
    """A tensor is never held whole in float64: the traced peak of a run in small parts is a fraction of one in whole
    tensors (the old way: reference, stored and error of the largest weight in float64 at once)."""
    monkeypatch.setattr(W, "_copy_rows", lambda *a: None)  # decode the bf16 copies (embed, lm_head) too
    biggest = 512 * 256 * 8  # the tiny model's largest weights (embed, lm_head) in float64

    def peak(part_elements):
        monkeypatch.setattr(W, "PART_ELEMENTS", part_elements)
        tracemalloc.start()
        try:
            run(outs / "bf16", tiny_fp8, workers=2)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    small, whole = peak(1 << 10), peak(1 << 30)
    assert whole > 2 * biggest  # the measure sees float64 tensors when they are whole
    assert small < whole / 2, (small, whole)


def test_an_error_in_a_part_stops_the_run(outs, tiny_fp8, small_parts, monkeypatch):
    calls = []
    real = weight_only.decoder

    def decoder(*a, **k):
        decode = real(*a, **k)

        def failing(*b, **c):
            calls.append(1)
            if len(calls) == 3:
                raise DsxError("planted: qweight bytes unreadable")
            return decode(*b, **c)
        return failing

    monkeypatch.setattr(weight_only, "decoder", decoder)
    with pytest.raises(DsxError, match="planted"):
        run(outs / "mix", tiny_fp8, workers=2)
    n_parts = sum(len(W._parts(192, 256, 128)) for _ in range(3 * 8 * 2))  # int4 experts of the tiny model
    assert len(calls) < n_parts // 2  # queued parts were dropped, not run to the end


def test_a_stored_shape_that_cannot_hold_the_weight_fails_that_tensor(outs, tiny_fp8, monkeypatch):
    name = "model.layers.1.mlp.experts.0.gate_proj.weight"
    real = Checkpoint.info

    def info(self, n):
        i = real(self, n)
        if n == name + ds.WO_SCALE_SUFFIX and self.root == outs / "mix":
            return dataclasses.replace(i, shape=(i.shape[0] // 2,))
        return i

    monkeypatch.setattr(Checkpoint, "info", info)
    stat = {s.name: s for s in run(outs / "mix", tiny_fp8)}[name]
    assert not stat.ok and stat.format == "weight_only_int4" and math.isinf(stat.max_abs)


def test_verify_cli_workers(outs, tiny_fp8, capsys):
    assert main(["verify", str(outs / "mix"), "--reference", str(tiny_fp8), "--samples", "0", "-j", "2", "-q"]) == 0
    assert main(["verify", str(outs / "mix"), "--reference", str(tiny_fp8), "-j", "0"]) != 0
    assert "--workers must be at least 1" in capsys.readouterr().err


def test_parts_cover_rows_once():
    for rows, cols, align in [(512, 256, 128), (192, 256, 128), (7168, 2048, 128), (129280, 7168, 1), (5, 1, 1),
                              (0, 7, 128)]:
        parts = W._parts(rows, cols, align)
        assert parts[0][0] == 0 and parts[-1][1] == rows
        assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
        assert all(r0 % align == 0 for r0, _ in parts)
        assert all((r1 - r0) * cols <= max(W.PART_ELEMENTS, align * cols) for r0, r1 in parts)


def test_files_are_hashed_on_threads_and_reported_in_order(outs, tmp_path):
    bad = tmp_path / "mix"
    shutil.copytree(outs / "mix", bad)
    shards = sorted(p.name for p in bad.glob("*.safetensors"))
    assert len(shards) >= 3
    for name in (shards[-1], shards[0]):
        with open(bad / name, "r+b") as f:
            f.seek(-1, 2)
            b = f.read(1)[0]
            f.seek(-1, 2)
            f.write(bytes([b ^ 1]))
    for workers in (1, 3):
        findings, _ = check_files(bad, workers=workers)
        assert [(f.where, "sha256" in f.problem) for f in findings] == [(shards[0], True), (shards[-1], True)]
    assert check_files(outs / "mix", workers=3)[0] == []


def test_bench_runs(tmp_path):
    r = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "bench" / "verify_weights.py"), "--tiny",
                        "--layers", "2", "--experts", "4", "--workers", "1,2", "--reproduce", "0,1", "--workdir",
                        str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [ln.split() for ln in r.stdout.splitlines() if ln.strip() and ln.split()[0] in ("1", "2")]
    assert [row[:2] for row in rows] == [["1", "no"], ["1", "yes"], ["2", "no"], ["2", "yes"]], r.stdout
    assert all(row[-1] == "0" for row in rows)  # no tensor failed


def test_kernel_checks_in_parts_equal_whole_weights(outs, tiny_fp8, monkeypatch):
    """The kernel checks' float64 references (x @ W.T, stored and reference weights) built from row parts on threads
    give the figures of whole weights."""
    from ds_export.verify.kernels import check_kernels

    def kernels(part_elements, workers):
        monkeypatch.setattr(W, "PART_ELEMENTS", part_elements)
        with Checkpoint.open(outs / "mix") as ck, Checkpoint.open(tiny_fp8) as ref:
            return check_kernels(ck, ref, ds.DeepseekV3Config.from_dict(ck.config), samples=4, workers=workers)

    whole, parts = kernels(1 << 30, 1), kernels(1 << 10, 3)
    gemms = [k for k in whole if "gemm" in k.kernel and "grouped" not in k.kernel]
    assert {k.kernel.split(" (")[0] for k in gemms} >= {"block fp8 gemm", "weight_only_int4 gemm"}
    assert [k.tensor for k in whole] == [k.tensor for k in parts]
    for a, b in zip(whole, parts):
        assert a.ok and b.ok
        assert b.kernel_err == pytest.approx(a.kernel_err, rel=1e-9, abs=1e-15), a.tensor
        assert b.quant_sqnr_db == pytest.approx(a.quant_sqnr_db, rel=1e-9), a.tensor


def _decoded_names(monkeypatch) -> set:
    """Names whose parts go through the float64 decode (_part_sums) in the runs that follow."""
    real_rows, real_sums, seen = W._reference_rows, W._part_sums, set()

    def reference_rows(ck, name):
        shape, align, rows = real_rows(ck, name)
        return shape, align, lambda r0, r1, out=None, *, _n=name: rows(r0, r1, out)

    def part_sums(ref_rows, got_rows, r0, r1, cols):
        seen.add(ref_rows.__kwdefaults__["_n"])
        return real_sums(ref_rows, got_rows, r0, r1, cols)

    monkeypatch.setattr(W, "_reference_rows", reference_rows)
    monkeypatch.setattr(W, "_part_sums", part_sums)
    return seen


@pytest.mark.parametrize("typ", ["mix", "bf16"])
def test_copies_are_compared_by_bytes(outs, tiny_fp8, small_parts, monkeypatch, typ):
    """FP8 weights kept with the source's blocks, and bf16 weights from bf16, are exact by their bytes: none of their
    parts is decoded, and their figures are the decode's (which every other tensor still goes through)."""
    decoded = _decoded_names(monkeypatch)
    fast = run(outs / typ, tiny_fp8, workers=2)
    with Checkpoint.open(outs / typ) as ck, Checkpoint.open(tiny_fp8) as ref:
        copies = {s.name for s in fast if ck.info(s.name).dtype == ref.info(s.name).dtype}
    assert copies and decoded == {s.name for s in fast} - copies
    assert all(math.isinf(s.sqnr_db) and s.ok for s in fast if s.name in copies)
    assert any(s.saturated > 0 for s in fast if s.name in copies) or typ == "bf16"  # (fp8 copies hold 448 codes)
    monkeypatch.setattr(W, "_copy_rows", lambda *a: None)
    slow = run(outs / typ, tiny_fp8, workers=2)
    for a, b in zip(fast, slow):
        assert (a.name, a.format, a.ok, a.max_abs, a.saturated, a.rel_fro, a.sqnr_db, a.gate) == \
               (b.name, b.format, b.ok, b.max_abs, b.saturated, b.rel_fro, b.sqnr_db, b.gate)
        assert a.cosine == pytest.approx(b.cosine, rel=1e-12)


def _patch_byte(path: Path, offset: int, value: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(bytes([value]))


def test_a_copy_with_a_changed_scale_is_decoded_and_fails(outs, tiny_fp8, tmp_path, small_parts):
    name = "model.layers.0.self_attn.q_b_proj.weight"  # fp8 copy; its scale rows 2..3 (the third and fourth parts)
    bad = tmp_path / "mix"
    shutil.copytree(outs / "mix", bad)
    with Checkpoint.open(bad) as ck:
        sh = ck.shard_of(name + ds.SCALE_SUFFIX)
        path, begin, ncols = sh.path, sh.info(name + ds.SCALE_SUFFIX).begin, ck.info(name + ds.SCALE_SUFFIX).shape[1]
    _patch_byte(path, begin + (3 * ncols) * 4 + 3, 0x40)  # row 3, column 0's high byte: another power of two
    stat = {s.name: s for s in run(bad, tiny_fp8, workers=2)}[name]
    with Checkpoint.open(bad) as ck, Checkpoint.open(tiny_fp8) as ref:
        rel, sqnr, mx, cos, sat = whole_f64(ck, ref, name)
    assert not stat.ok and stat.max_abs == mx > 0
    assert stat.sqnr_db == pytest.approx(sqnr, rel=1e-9) and stat.rel_fro == pytest.approx(rel, rel=1e-9)


@pytest.mark.parametrize("name, kind", [("model.layers.0.self_attn.q_b_proj.weight", "fp8"),
                                        ("model.layers.0.self_attn.q_b_proj.weight", "scale"),
                                        ("model.embed_tokens.weight", "bf16")])
def test_a_non_finite_value_in_both_copies_is_not_exact(outs, tiny_fp8, tmp_path, small_parts, name, kind):
    """Equal bytes are not enough: a NaN / Inf planted in the reference and its copy alike must still fail (the
    decode's figures are NaN / Inf), not pass as an exact copy."""
    ref_dir, bad = tmp_path / "ref", tmp_path / "mix"
    shutil.copytree(tiny_fp8, ref_dir)
    shutil.copytree(outs / "mix", bad)
    for root in (ref_dir, bad):
        with Checkpoint.open(root) as ck:
            t = name + (ds.SCALE_SUFFIX if kind == "scale" else "")
            sh = ck.shard_of(t)
            path, begin = sh.path, sh.info(t).begin
        if kind == "fp8":
            _patch_byte(path, begin + 300 * ck.info(name).shape[1] + 7, 0xFF)  # e4m3 -NaN in row 300
        elif kind == "scale":
            _patch_byte(path, begin + 3, 0x7F)  # block (0, 0): 0x7F.. with its other bytes = a NaN or Inf float32
            _patch_byte(path, begin + 2, 0xC0)
        else:
            _patch_byte(path, begin + 2 * 70 + 1, 0x7F)  # element 70: bf16 0x7F.. with exponent bits all ones
            _patch_byte(path, begin + 2 * 70, 0x80)
    for root, want_copy in ((tiny_fp8, True), (ref_dir, False)):
        with Checkpoint.open(bad if root is ref_dir else outs / "mix") as ck, Checkpoint.open(root) as ref:
            copy = W._copy_rows(ref, ck, name)
            rows = ck.info(name).shape[0]
            assert (all(copy(r0, r1) is not None for r0, r1 in W._parts(rows, ck.info(name).shape[1], 128))
                    == want_copy)
    stat = {s.name: s for s in run(bad, ref_dir, workers=2)}[name]
    assert not stat.ok and not math.isfinite(stat.max_abs if kind != "bf16" else stat.sqnr_db)


def _strict(text: str):
    def refuse(c):
        raise ValueError(f"not strict JSON: {c}")
    return json.loads(text, parse_constant=refuse)


def _rehash(root, name: str) -> None:
    """Record the changed shard's hash (a converter's bug, not disk corruption: the numerics must catch it)."""
    from ds_export.io.manifest import Manifest

    with Checkpoint.open(root) as ck:
        rel = ck.weight_map[name]
    Manifest.load(root).record_file(rel)


def test_a_report_with_nan_figures_is_strict_json_and_names_the_problem(outs, tiny_fp8, tmp_path, capsys):
    """NaN / Inf figures are written as null (JSON has no NaN), the tensor says why it failed, and the one-line error
    names it instead of quoting a NaN SQNR."""
    name = "model.layers.0.self_attn.q_b_proj.weight"
    bad = tmp_path / "mix"
    shutil.copytree(outs / "mix", bad)
    with Checkpoint.open(bad) as ck:
        path, begin = ck.shard_of(name).path, ck.info(name).begin
    _patch_byte(path, begin + 5, 0x7F)  # e4m3 NaN
    _rehash(bad, name)
    report, html = tmp_path / "r.json", tmp_path / "r.html"
    assert main(["verify", str(bad), "--reference", str(tiny_fp8), "--samples", "0", "--report", str(report),
                 "--html", str(html), "--json"]) == 1
    page = html.read_text()
    assert "Weights that failed" in page and f"<td>{name}</td>" in page
    assert "the stored weight holds NaN or Inf values" in page
    out, err = capsys.readouterr()
    for rep in (_strict(report.read_text()), _strict(out)):
        w = {x["name"]: x for x in rep["weights"]}[name]
        assert not w["ok"] and w["problem"] == "the stored weight holds NaN or Inf values"
        assert w["sqnr_db"] is None and w["max_abs"] is None and w["gate"] is None  # NaN, NaN, inf (a copy)
        g = rep["by_format"][f"a8w8_fp8 {w['role']}"]
        assert g["failed"] == 1 and g["exact"] == g["tensors"] - 1 and g["min_sqnr_db"] is None
    assert f"first: {name}: the stored weight holds NaN or Inf values" in err and "SQNR" not in err


def test_a_copy_that_is_not_bit_identical_says_so(outs, tiny_fp8, tmp_path, capsys):
    name = "model.layers.0.self_attn.q_b_proj.weight"
    bad = tmp_path / "mix"
    shutil.copytree(outs / "mix", bad)
    _flip_last_byte(bad, name)
    _rehash(bad, name)
    assert main(["verify", str(bad), "--reference", str(tiny_fp8), "--samples", "0"]) == 1
    err = capsys.readouterr().err
    assert f"{name}: stored in the source's format (a8w8_fp8) but not bit-identical to it (SQNR " in err
    assert "inf dB" not in err


def test_json_safe_writes_strict_json(tmp_path):
    from ds_export.io.writer import atomic_write_json, dumps_json

    obj = {"a": [1.5, math.nan, (math.inf, -math.inf)], "b": {"c": np.float32("nan"), "d": np.float64(2.0)},
           "e": np.int64(3), "f": None, "g": "NaN"}
    want = {"a": [1.5, None, [None, None]], "b": {"c": None, "d": 2.0}, "e": 3, "f": None, "g": "NaN"}
    assert _strict(dumps_json(obj)) == want
    atomic_write_json(tmp_path / "x.json", obj)
    assert _strict((tmp_path / "x.json").read_text()) == want


def test_a_copy_of_a_zero_reference_that_is_not_zero_fails(outs, tiny_fp8, tmp_path):
    """SQNR -inf (no signal, some error) is not the +inf of an exact copy."""
    name = "model.layers.0.self_attn.q_b_proj.weight"
    ref_dir = tmp_path / "ref"
    shutil.copytree(tiny_fp8, ref_dir)
    with Checkpoint.open(ref_dir) as ck:
        sh = ck.shard_of(name)
        path, begin, end = sh.path, sh.info(name).begin, sh.info(name).end
    with open(path, "r+b") as f:
        f.seek(begin)
        f.write(bytes(end - begin))  # e4m3 +0 everywhere
    stat = {s.name: s for s in run(outs / "mix", ref_dir, workers=2)}[name]
    assert stat.sqnr_db == -math.inf and stat.gate == math.inf and not stat.ok


def test_kernel_checks_decode_a_copy_once_with_the_same_figures(outs, tiny_fp8, tmp_path, monkeypatch):
    """The kernel checks' references decode an FP8 copy once for both products; the figures are those of decoding
    both sides, also where a part of the copy differs (planted weights: that part is decoded on each side)."""
    from ds_export.verify.kernels import check_kernels

    name = "model.layers.0.self_attn.q_b_proj.weight"
    bad = tmp_path / "mix"
    shutil.copytree(outs / "mix", bad)
    with Checkpoint.open(bad) as ck:
        path, end = ck.shard_of(name).path, ck.info(name).end
    for i in range(1, 17):  # the last row's last 16 weights at code 448 (a change the kernel error must see)
        _patch_byte(path, end - i, 0x7E)
    calls = []
    real = fp8_block.dequant_ref

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    def kernels(root, copies: bool):
        monkeypatch.setattr(fp8_block, "dequant_ref", counting)
        if not copies:
            monkeypatch.setattr(W, "_copy_rows", lambda *a: None)
        calls.clear()
        with Checkpoint.open(root) as ck, Checkpoint.open(tiny_fp8) as ref:
            out = check_kernels(ck, ref, ds.DeepseekV3Config.from_dict(ck.config), samples=4, workers=2)
        monkeypatch.undo()
        return out, len(calls)

    for root in (outs / "mix", bad):
        (fast, n_fast), (slow, n_slow) = kernels(root, True), kernels(root, False)
        assert n_fast < n_slow
        assert [(k.tensor, k.kernel_err, k.quant_sqnr_db, k.ok) for k in fast] == \
               [(k.tensor, k.kernel_err, k.quant_sqnr_db, k.ok) for k in slow]
    planted = {k.tensor: k for k in fast}[name]
    clean = {k.tensor: k for k in kernels(outs / "mix", True)[0]}[name]
    assert planted.quant_sqnr_db < clean.quant_sqnr_db - 3  # the planted weights are seen


def test_scratch_buffers_are_per_thread_and_bounded():
    """Parts decode into buffers each thread keeps (a new array of a part's size costs its page zeroing each time):
    the same buffer for a key while it is large enough, a larger one when not, another thread's own, and none above
    SCRATCH_ELEMENTS (such parts get arrays of their own)."""
    a = W._scratch("ref", 1000, np.float64)
    assert W._scratch("ref", 900, np.float64) is a and W._scratch("got", 900, np.float64) is not a
    b = W._scratch("ref", 2000, np.float64)
    assert b.size >= 2000 and W._scratch("ref", 10, np.float64) is b
    assert W._scratch("ref", W.SCRATCH_ELEMENTS + 1, np.float64) is None
    with ThreadPoolExecutor(1) as pool:
        other = pool.submit(W._scratch, "ref", 10, np.float64).result()
    assert other is not b and not np.shares_memory(other, b)


def test_disk_bench_runs(tmp_path):
    """bench/verify_disk.py on a pair made here (tiny dims): every row printed, the ratios computed; with root it
    counts the bytes each run reads from the disk (cgroup v1 blkio), without it says so and runs unconfined."""
    bench = Path(__file__).parents[1] / "bench"
    r = subprocess.run([sys.executable, str(bench / "verify_weights.py"), "--tiny", "--layers", "2", "--experts", "4",
                        "--workers", "1", "--workdir", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run([sys.executable, str(bench / "verify_disk.py"), "--workdir", str(tmp_path), "--pair",
                        "tiny-l2-e4,tiny-l2-e4-fp8_wint4", "--rounds", "1", "--workers", "1"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {m[1]: [float(x) for x in m[2].split()]  # best s, GB from disk, each run's s
            for m in re.finditer(r"^ *(cat once|verify|cat target twice) +([-0-9. na]+)$", r.stdout, re.M)}
    assert set(rows) == {"cat once", "verify", "cat target twice"}, r.stdout
    assert all(v[0] > 0 for v in rows.values()) and "verify / cat once" in r.stdout
