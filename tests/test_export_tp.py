"""dsx export --tp N: rank shares of every weight format, and N rank programs that reproduce tp = 1.

The rank programs run for real: N processes under `paddle.distributed.launch` (gloo on CPU), each
loading OUT/rank_{r}/ with Paddle Inference, whose all_reduce_ / all_gather ops join them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from ds_export.cli.app import main
from ds_export.errors import DsxError
from ds_export.formats import fp8_block
from ds_export.formats import weight_only as wo
from ds_export.tiny import TinySpec, write_tiny

pytest.importorskip("paddle")
PROMPTS = [[0, 5, 9, 17, 33, 2], [0, 44, 3, 2, 250, 7]]
IDS = ";".join(",".join(map(str, p)) for p in PROMPTS)
# The tiny model with MLP widths that two ranks can split on 128 (FP8 blocks) and 64 (weight-only tiles).
ALIGNED = (("intermediate_size", 256), ("moe_intermediate_size", 256))
# ... and every expert always routed (top_k = experts): a continuous model, so the bf16 rounding of
# rank partial sums cannot flip a routing decision and the quantized comparison is about rounding only.
ALL_EXPERTS = ALIGNED + (("n_routed_experts", 4), ("n_group", 1), ("topk_group", 1), ("num_experts_per_tok", 4))


def rel(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def launch(n: int, args: list[str], log_dir: Path) -> None:
    """`dsx ARGS` as n ranks of one paddle.distributed job on this machine (the product's launcher)."""
    from ds_export.export.runtime import launch_ranks

    launch_ranks(n, args, log_dir, timeout=600)


# ------------------------------------------------------------ rank shares ----

@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("group", [-1, 64, 128])
def test_weight_only_share_is_exact_and_column_share_is_paddles_bytes(bits, group):
    from test_weight_only import assert_bitwise_equal, paddle_quantize

    rng = np.random.default_rng(bits * 1000 + group)
    w = (rng.standard_normal((256, 512)) * np.exp(rng.uniform(-2, 2, (256, 1)))).astype(ml_dtypes.bfloat16)
    q, s = wo.quantize_ref(w, bits, group, 90)
    full = wo.dequantize_ref(q, s, bits, group, 90, 512)
    for rows, cols in (((0, 128), None), ((128, 256), None), (None, (0, 256)), (None, (256, 512)),
                       ((64, 192), (128, 384))):
        q2, s2 = wo.slice_ref(q, s, bits, group, 90, 512, rows, cols)
        r, c = slice(*(rows or (0, 256))), slice(*(cols or (0, 512)))
        np.testing.assert_array_equal(wo.dequantize_ref(q2, s2, bits, group, 90, c.stop - c.start), full[r, c])
        if cols is None:  # an output-channel share has the same scales: it IS Paddle's quantization of the rows
            pq, ps = paddle_quantize(np.ascontiguousarray(w[r]), bits, group, 90)
            assert_bitwise_equal(q2, pq, f"int{bits} g{group} rows {rows}")
            assert_bitwise_equal(s2, ps, f"int{bits} g{group} rows {rows} scale")


@pytest.mark.parametrize("bits", [8, 4])
def test_packed_share_equals_the_reference_share(bits):
    """slice_packed (whole tiles of the bytes) == slice_ref (unpack, slice, repack), every arch >= 75."""
    rng = np.random.default_rng(bits)
    w = rng.standard_normal((384, 640)).astype(np.float32)
    for arch in (75, 80, 90, 100):
        q, s = wo.quantize_ref(w, bits, 64, arch)
        for rows, cols in (((0, 128), None), ((256, 384), None), (None, (64, 320)), ((64, 192), (128, 640))):
            plan = wo.slice_plan(384, 640, bits, 64, arch, rows, cols)
            ref, _ = wo.slice_ref(q, s, bits, 64, arch, 640, rows, cols)
            got = wo.slice_packed(q, bits, arch, 640, plan)
            assert got.dtype == np.int8 and got.tobytes() == ref.tobytes(), (arch, rows, cols)


def test_weight_only_share_refuses_broken_tiles_and_groups():
    w = np.random.default_rng(0).standard_normal((256, 512)).astype(np.float32)
    q, s = wo.quantize_ref(w, 4, 128, 90)
    with pytest.raises(DsxError, match="multiples of 64"):
        wo.slice_ref(q, s, 4, 128, 90, 512, rows=(0, 96))
    with pytest.raises(DsxError, match="splits a scale group of 128"):
        wo.slice_ref(q, s, 4, 128, 90, 512, cols=(64, 512))


def test_fp8_share_is_whole_blocks_or_refused():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((320, 384)).astype(np.float32)
    q, sinv = fp8_block.quantize_native(w)
    full = fp8_block.dequant_ref(q, sinv)
    for rows, cols in (((0, 128), None), ((256, 320), None), (None, (128, 384)), ((128, 320), (256, 384))):
        q2, s2 = fp8_block.slice_blocks(q, sinv, rows, cols)
        r, c = slice(*(rows or (0, 320))), slice(*(cols or (0, 384)))
        assert q2.view(np.uint8).tobytes() == np.ascontiguousarray(q[r, c]).view(np.uint8).tobytes()
        np.testing.assert_array_equal(fp8_block.dequant_ref(q2, s2), full[r, c])
    with pytest.raises(DsxError, match="row split at 160 cuts a 128x128"):
        fp8_block.slice_blocks(q, sinv, rows=(0, 160))


def _rank_processes() -> list[int]:
    """This process's spawned children (the rank processes of an export run in a thread here)."""
    import os

    from ds_export.procmem import _children

    out = []
    for pid in _children(os.getpid()):
        try:
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(pid)
        except OSError:
            pass
    return out


def _none_left_in(group: int) -> None:
    """No process of process group `group` is left (the resource tracker leaves once its pipe closes)."""
    import subprocess
    import time

    deadline = time.monotonic() + 10
    while subprocess.run(["pgrep", "-g", str(group)], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, f"processes left behind in group {group}"
        time.sleep(0.05)


# --------------------------------------------------------------- exports ----

@pytest.fixture(scope="module")
def aligned(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp")
    write_tiny(root / "src", TinySpec(overrides=ALIGNED))
    for tp in (1, 2):  # tp 2: both ranks at once, each in its own process
        assert main(["export", str(root / "src"), "--out", str(root / f"tp{tp}"), "--tp", str(tp), "--speculate",
                     "--max-seq-len", "64", "-q", "--workers", str(tp)]) == 0
    return root


def test_rank_processes_write_the_bytes_of_one_process(aligned, tmp_path):
    """--workers 2 (a spawned process per rank) and --workers 1 (one rank after another) give the same files."""
    one = tmp_path / "serial"
    assert main(["export", str(aligned / "src"), "--out", str(one), "--tp", "2", "--speculate", "--max-seq-len", "64",
                 "-q", "--workers", "1"]) == 0
    par = aligned / "tp2"
    files = sorted(str(p.relative_to(one)) for p in one.rglob("*") if p.is_file())
    assert files == sorted(str(p.relative_to(par)) for p in par.rglob("*") if p.is_file())
    assert "rank_1/model.pdiparams" in files and "mtp/rank_1/model.json" in files
    for f in files:
        assert (one / f).read_bytes() == (par / f).read_bytes(), f


class _Recorder:
    """A ds_export.progress.Reporter that keeps each phase's total, unit and count."""

    def __init__(self):
        self.phases = {}

    def phase(self, what, total, unit="bytes"):
        rec = self.phases[what] = {"total": total, "unit": unit, "done": 0}

        def advance(n):
            rec["done"] += n
        return advance


@pytest.mark.parametrize("tp", [1, 2])
def test_export_reports_its_programs_parameters_and_hashes(aligned, tmp_path, tp):
    """What dsx export tells its progress bar: each program saved (every rank's and its draft's; at tp 2 counted here
    as the rank processes send them), every parameter byte written (the .pdiparams files' tensors, read back), and
    every byte hashed into the manifest after the writing (the parameter files are hashed as they are written)."""
    from ds_export.export.exporter import export
    from ds_export.export.pdiparams import read_params

    rec, out = _Recorder(), tmp_path / "e"
    export(aligned / "src", out, tp=tp, speculate=True, max_seq_len=64, workers=tp, progress=rec)
    (programs,) = [v for k, v in rec.phases.items() if k.startswith("programs")]
    assert programs == {"total": 2 * tp, "unit": "programs", "done": 2 * tp}
    params = sum(a.nbytes for p in out.rglob("*.pdiparams") for a in read_params(p))
    assert rec.phases["parameters written"] == {"total": None, "unit": "bytes", "done": params} and params > 0
    files = [p for p in out.rglob("*") if p.is_file() and p.name not in ("dsx-manifest.json", "model.pdiparams")]
    hashed = rec.phases[f"sha256 ({len(files)} files)"]
    assert hashed["total"] == hashed["done"] == sum(p.stat().st_size for p in files)


def test_default_workers_is_bounded_by_ranks_cores_and_memory():
    from ds_export.export.exporter import RANK_MEMORY_BASE, RANK_MEMORY_PER_LAYER, default_workers

    r1 = RANK_MEMORY_BASE + 62 * RANK_MEMORY_PER_LAYER  # one R1 rank with its draft: ~6.6 GiB
    assert default_workers(8, 62, cores=128, available=100 * r1) == 8  # one process per rank
    assert default_workers(8, 62, cores=4, available=100 * r1) == 4
    assert default_workers(8, 62, cores=128, available=3 * r1 + r1 // 2) == 3
    assert default_workers(8, 62, cores=128, available=r1 // 2) == 1  # never fewer than one
    assert default_workers(1, 62, cores=128, available=100 * r1) == 1
    assert default_workers(2, 4, cores=2, available=None) == 2  # memory unknown: cores and ranks decide


def test_a_failing_rank_process_is_one_clear_error(aligned, tmp_path):
    """A rank process that fails hands its DsxError (message and hint) to the caller; nothing is published."""
    from ds_export.errors import CheckpointError
    from ds_export.export.exporter import _write_ranks_in_processes

    out = tmp_path / "part"
    out.mkdir()
    with pytest.raises(CheckpointError, match="not a directory") as e:
        _write_ranks_in_processes(tmp_path / "no-such-source", out, 2, 2, "float32", 64, False)
    assert e.value.hint and "checkpoint directory" in e.value.hint
    assert not any(out.rglob("*.pdiparams"))


def test_a_killed_rank_process_stops_the_export_with_one_clear_error(aligned, tmp_path, capfd):
    """Planted fault: one rank's process is killed (as the OOM killer would) while the other writes: the
    caller gets a one-line DsxError naming the rank, the other rank's process is stopped without a word, and no
    process is left behind. (Stopped by SIGTERM with Paddle's C++ handler in place, each rank printed a 12-line
    "FatalError: `Termination signal` is detected" block on the user's stdout; now the ranks are killed, and
    quiet_paddle puts the default SIGTERM action back after the import.)"""
    import os
    import signal
    import threading
    import time

    from ds_export.export.exporter import _write_ranks_in_processes

    def writing():  # (a rank writes its files once Paddle, and with it Paddle's signal handlers, is imported)
        return any(p.is_file() for p in out.rglob("*"))

    err = []
    out = tmp_path / "part"
    out.mkdir()

    def run():
        try:
            _write_ranks_in_processes(aligned / "src", out, 2, 2, "float32", 64, True)
        except DsxError as e:
            err.append(e)

    capfd.readouterr()
    t = threading.Thread(target=run)
    t.start()
    deadline = time.time() + 60
    while not (len(ranks := _rank_processes()) == 2 and writing()) and time.time() < deadline:
        time.sleep(0.01)
    assert len(ranks) == 2 and writing(), "the rank processes did not start or write"
    os.kill(ranks[1], signal.SIGKILL)
    t.join(120)
    assert not t.is_alive()
    assert len(err) == 1 and "died" in str(err[0]) and "rank" in str(err[0]) and "--workers" in err[0].hint
    captured = capfd.readouterr()
    assert "FatalError" not in captured.out + captured.err and "Termination signal" not in captured.out, captured
    assert not _rank_processes()


def test_tp_layout_and_config(aligned):
    e = aligned / "tp2"
    for f in ("config.json", "mtp/config.json", "dsx-manifest.json", "tokenizer.json"):
        assert (e / f).is_file(), f
    for r in range(2):
        for f in (f"rank_{r}/model.json", f"rank_{r}/model.pdiparams", f"mtp/rank_{r}/model.json"):
            assert (e / f).is_file(), f
        prog = (e / f"rank_{r}" / "model.json").read_text()
        assert '"1.all_reduce_"' in prog and '"1.all_gather"' in prog  # Paddle's collectives, ring 0
    assert not (e / "model.json").exists()
    assert json.loads((e / "config.json").read_text())["tensor_parallel_degree"] == 2
    # Column/row/vocab splits halve the split weights; the replicated ones (q_a, kv_a, norms, router) stay.
    one = (aligned / "tp1" / "model.pdiparams").stat().st_size
    ranks = [(e / f"rank_{r}" / "model.pdiparams").stat().st_size for r in range(2)]
    assert ranks[0] == ranks[1] and one / 2 < ranks[0] < 0.75 * one


def test_two_rank_programs_reproduce_tp1(aligned, tmp_path):
    """float32 export of the FP8 tiny model: 2 ranks under paddle.distributed == 1 rank, with speculation."""
    ref_npz, tp_npz = tmp_path / "tp1.npz", tmp_path / "tp2.npz"
    args = ["--input-ids", IDS, "--max-new-tokens", "6", "--speculate", "2", "-q"]
    assert main(["generate", str(aligned / "tp1"), *args, "--dump-logits", str(ref_npz), "--report",
                 str(tmp_path / "tp1.json")]) == 0
    launch(2, ["generate", str(aligned / "tp2"), *args, "--dump-logits", str(tp_npz), "--report",
               str(tmp_path / "tp2.json")], tmp_path / "log")
    a, b = np.load(ref_npz), np.load(tp_npz)
    assert rel(b["base_logits"], a["base_logits"]) < 1e-5
    assert rel(b["mtp_logits"], a["mtp_logits"]) < 1e-5
    tok1 = json.loads((tmp_path / "tp1.json").read_text())["tokens"]
    tok2 = json.loads((tmp_path / "tp2.json").read_text())["tokens"]  # rank 0 reports
    assert tok1 == tok2


def test_tp_export_outside_a_launch_is_a_clear_error(aligned, capsys):
    assert main(["generate", str(aligned / "tp2"), "--input-ids", "0,1", "--max-new-tokens", "1"]) == 2
    err = capsys.readouterr().err
    assert "tensor-parallel export over 2 ranks" in err and "paddle.distributed.launch --nproc_per_node 2" in err


def test_tp_that_does_not_divide_is_refused(aligned, tmp_path, capsys):
    assert main(["export", str(aligned / "src"), "--out", str(tmp_path / "x"), "--tp", "3"]) == 2
    assert "num_attention_heads 4 is not divisible by 3" in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not (tmp_path / "x.partial").exists()


def test_fp8_share_that_cuts_a_block_is_refused(tiny_fp8, tmp_path, capsys):
    """The standard tiny model's MLP width 320 splits into 160: inside a 128x128 FP8 block."""
    q = tmp_path / "q"
    assert main(["quantize", str(tiny_fp8), "--out", str(q), "--type", "a8w8_fp8", "-q"]) == 0
    assert main(["export", str(q), "--out", str(tmp_path / "x"), "--tp", "2"]) == 2
    err = capsys.readouterr().err
    assert re.search(r"--tp 2: layer 0 dense_(gate|up|down): .* split at 160 cuts a 128x128 FP8 scale block", err)
    assert not (tmp_path / "x").exists()


# ----------------------------------------------------------- quantized ----

@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """a8w8_fp8_wint4 base + a8w8_fp8 draft on the all-experts model, exported at tp 1 and tp 2."""
    root = tmp_path_factory.mktemp("tpq")
    write_tiny(root / "src", TinySpec(overrides=ALL_EXPERTS))
    assert main(["quantize", str(root / "src"), "--out", str(root / "q"), "--type", "a8w8_fp8_wint4",
                 "--mtp-type", "a8w8_fp8", "-q"]) == 0
    for tp in (1, 2):
        assert main(["export", str(root / "q"), "--out", str(root / f"tp{tp}"), "--tp", str(tp), "--speculate",
                     "--max-seq-len", "64", "-q"]) == 0
    return root


@pytest.mark.parametrize("fixture,src", [("aligned", "src"), ("mixed", "q")])
def test_the_exports_space_check_is_a_lower_bound(request, fixture, src, tmp_path):
    """The space an export is refused without (ModelWeights.nbytes: every array once) is at most what the export
    writes: its .pdiparams alone, at tp 1 and tp 2, with the draft, for a float source and a quantized one (a bound
    above that would refuse exports that fit)."""
    from ds_export.export.weights import load_weights
    from ds_export.io.checkpoint import Checkpoint

    root = request.getfixturevalue(fixture)
    with Checkpoint.open(root / src) as ck:
        need = load_weights(ck, "float32", include_mtp=True, lazy=True).nbytes()
    assert need > 0
    for tp in (1, 2):
        written = sum(p.stat().st_size for p in (root / f"tp{tp}").rglob("*.pdiparams"))
        assert need <= written, (tp, need, written)
        assert need >= 0.6 * written, (tp, need, written)  # (and not a bound too loose to catch anything)


def test_quantized_linears_split_to_the_same_product(mixed):
    """Each quantized Linear of a layer: its 2 rank shares (concatenated, or summed for row splits)
    give the tp = 1 op's output up to the bf16 rounding of the partial outputs."""
    import paddle

    from ds_export.export.modeling import make_linear
    from ds_export.export.tp import shard_weights
    from ds_export.export.weights import load_weights
    from ds_export.models import deepseek_v3 as ds

    w = load_weights(mixed / "q", "float32", include_mtp=False)
    parts = [shard_weights(w, r, 2) for r in range(2)]
    rng = np.random.default_rng(3)
    lw = w.layers[1]
    cases = [(k, lw.tensors[k], [p.layers[1].tensors[k] for p in parts], ds.ROLES[k][0])
             for k in ("q_b", "o_proj", "shared_gate", "shared_down")]
    cases += [(f"expert {k}", lw.experts[2][k], [p.layers[1].experts[2][k] for p in parts],
               ds.ROLES["expert_" + k][0]) for k in ("up", "down")]
    fmts = set()
    for what, full, shares, split in cases:
        fmts.add(full.fmt)
        x = rng.standard_normal((5, full.in_features)).astype(np.float32)
        y = make_linear(full, "float32")(paddle.to_tensor(x)).numpy()
        if split == "col":
            y2 = np.concatenate([make_linear(s, "float32")(paddle.to_tensor(x)).numpy() for s in shares], 1)
            np.testing.assert_array_equal(y2, y, err_msg=what)  # same rows, same sums: identical
        else:
            xs = np.split(x, 2, axis=1)
            y2 = sum(make_linear(s, "float32")(paddle.to_tensor(np.ascontiguousarray(p))).numpy()
                     for s, p in zip(shares, xs))
            assert rel(y2, y) < 2 ** -7, what  # two bf16-rounded partials vs one rounded sum
    assert fmts == {"fp8", "weight_only"}


def test_quantized_two_rank_programs_match_tp1(mixed, tmp_path):
    ref_npz, tp_npz = tmp_path / "tp1.npz", tmp_path / "tp2.npz"
    args = ["--input-ids", IDS, "--max-new-tokens", "2"]
    assert main(["generate", str(mixed / "tp1"), *args, "--dump-logits", str(ref_npz), "-q"]) == 0
    launch(2, ["generate", str(mixed / "tp2"), *args, "--dump-logits", str(tp_npz), "-q"], tmp_path / "log")
    a, b = np.load(ref_npz), np.load(tp_npz)
    for key in ("base_logits", "mtp_logits"):
        top1 = float((a[key].argmax(-1) == b[key].argmax(-1)).mean())
        # The only difference is where the bf16 rounding of row-parallel partials happens.
        assert rel(b[key], a[key]) < 0.25 and top1 >= 0.75, (key, rel(b[key], a[key]), top1)


def test_ctrl_c_stops_the_rank_processes_with_one_line_and_leaves_nothing(aligned, tmp_path):
    """Ctrl-C to the process group (as a terminal sends it) at several points of a --tp 2 export, from the rank
    processes' start to their writing: exit 130 and one line, no traceback from a rank process (they start with SIGINT
    blocked and ignore it; before, one killed while its interpreter started printed "Fatal Python error" and a
    traceback), no OUT and no OUT.partial left (an export starts over, so its partial output is only disk taken), and
    no process left behind."""
    import os
    import signal
    import subprocess
    import sys
    import time

    for i, delay in enumerate((0.0, 0.02, 0.05, 0.3, 1.0)):
        out = tmp_path / f"o{i}"
        proc = subprocess.Popen([sys.executable, "-m", "ds_export.cli.app", "export", str(aligned / "src"), "--out",
                                 str(out), "--tp", "2", "--speculate", "--max-seq-len", "64", "-q", "--workers", "2"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: (signal.signal(signal.SIGINT, signal.SIG_DFL), os.setpgrp()))
        try:
            deadline = time.monotonic() + 60
            while not (tmp_path / f"o{i}.partial").exists():  # (made just before the rank processes start)
                assert time.monotonic() < deadline and proc.poll() is None, "the export never started"
                time.sleep(0.005)
            time.sleep(delay)
            os.killpg(proc.pid, signal.SIGINT)
            said, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
        assert proc.returncode == 130 and len(err.strip().splitlines()) == 1, (delay, err)
        assert not said.strip(), (delay, said)  # (no Paddle "FatalError" block from a rank stopped)
        assert "interrupted" in err and "was not written" in err and "Traceback" not in err, err
        assert not out.exists() and not (tmp_path / f"o{i}.partial").exists(), delay
        _none_left_in(proc.pid)


@pytest.mark.parametrize("tp,group", [(1, False), (2, False), (2, True)])
def test_sigterm_stops_an_export_as_ctrl_c_does(aligned, tmp_path, tp, group):
    """SIGTERM (a scheduler, `timeout` or `kill` stopping the job; Slurm sends it to every process of the job) to an
    export started as a script's background job (SIGINT ignored): before, the process died where it stood, with
    Paddle's 12-line C++ "FatalError: `Termination signal`" block on stdout, and left OUT.partial behind. Now: exit
    143, one line, nothing on stdout, no OUT and no OUT.partial, no process left behind; at several points from the
    start of the work (Paddle's import among them) to the writing (once the first parameter file is in the staging
    directory: a fixed 2 s there was 0.2 s before a tiny export's last parameter, and CI's export once finished
    first)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    def start():
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # (as a non-interactive shell starts a `&` job)
        os.setpgrp()

    for i, delay in enumerate((0.0, 0.3, 1.0, "writing")):
        out = tmp_path / f"o{i}"
        proc = subprocess.Popen([sys.executable, "-m", "ds_export.cli.app", "export", str(aligned / "src"), "--out",
                                 str(out), "--tp", str(tp), "--speculate", "--max-seq-len", "64", "-q", "--workers",
                                 str(tp)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=start)
        try:
            deadline = time.monotonic() + 60
            staging = tmp_path / f"o{i}.partial"
            while not (staging.exists() if delay != "writing" else any(staging.rglob("*.pdiparams"))):
                assert time.monotonic() < deadline and proc.poll() is None, "the export never started"
                time.sleep(0.005)
            time.sleep(delay if delay != "writing" else 0)
            (os.killpg if group else os.kill)(proc.pid, signal.SIGTERM)
            said, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
        assert proc.returncode == 143 and len(err.strip().splitlines()) == 1, (delay, proc.returncode, err)
        assert "interrupted" in err and "was not written" in err and not said.strip(), (delay, said, err)
        assert not out.exists() and not (tmp_path / f"o{i}.partial").exists(), delay
        _none_left_in(proc.pid)


def test_a_ctrl_c_while_a_rank_process_starts_stops_that_one_too(aligned, tmp_path, monkeypatch):
    """Ctrl-C held while a rank process starts (SIGINT blocked around the spawn) is raised when the spawn returns:
    that process must already be among those the export stops. It was not, and ran on by itself: it wrote into the
    removed OUT.partial, held the terminal's stderr open (the CLI's caller waited for it) and printed a
    BrokenPipeError traceback when it could not report to the parent that was gone."""
    import multiprocessing.context as mpc
    import signal

    from ds_export.export.exporter import _write_ranks_in_processes

    started = []
    real = mpc.SpawnProcess.start

    def start(self):
        real(self)
        started.append(self)
        signal.raise_signal(signal.SIGINT)  # (held by sigint_blocked until the spawn's block ends)

    monkeypatch.setattr(mpc.SpawnProcess, "start", start)
    try:
        with pytest.raises(KeyboardInterrupt):
            _write_ranks_in_processes(aligned / "src", tmp_path / "o.partial", 2, 2, "float32", 64, True)
        assert len(started) == 1 and started[0].exitcode is not None, "the started rank process was left running"
    finally:
        for p in started:
            p.kill()
            p.join()
