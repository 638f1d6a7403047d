"""The CPU benchmark scripts under bench/ still run, at their smallest sizes (the figures in docs/benchmarks.md come
from them; one of them broke when `pdiparams.write_params` gained a keyword and nothing ran it). Each script is run
as a user runs it, and its own correctness column is read: the same bits, the same bytes as Paddle, no weight that
failed. The timings themselves are not judged here (see docs/benchmarks.md)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_bench(script: str, *args: str, timeout: int = 300) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, str(REPO / "bench" / script), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)
    assert proc.returncode == 0, f"bench/{script} {' '.join(args)}: rc {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_cpu_kernels_bench_checks_both_paths_bits():
    out = run_bench("cpu_kernels.py", "--shapes", "2x256x256,3x128x384", "--repeat", "1", "--threads", "1")
    rows = [line for line in out.splitlines() if re.match(r"\s+\d+x\d+x\d+\s", line)]
    assert len(rows) == 2 and all(line.split()[-1] == "same" for line in rows), out


def test_fp8_nan_scan_bench_times_scan_copy_and_reference():
    out = run_bench("fp8_nan_scan.py", "--mib", "4", "--rounds", "1")
    for name in ("scan (C++)", "copy (anchor)", "scan (numpy ref)"):
        assert re.search(re.escape(name) + r"\s+[\d.]+ ms\s+[\d.]+ GB/s", out), (name, out)


def test_quant_fp8_bench_runs_native_and_numpy():
    out = run_bench("quant_fp8.py", "--repeat", "1", "--shapes", "256x256")
    assert re.search(r"quantize f32 native\s+[\d.]+ ms", out) and re.search(r"np\.copy f32 bytes\s+[\d.]+ ms", out), out


@pytest.mark.paddle
def test_quant_weight_only_bench_matches_paddle_bytes():
    pytest.importorskip("paddle")
    out = run_bench("quant_weight_only.py", "--repeat", "1", "--shapes", "256x256", "--threads", "1")
    rows = [line for line in out.splitlines() if line.strip().startswith("256x256")]
    assert len(rows) == 4 and all(line.split()[-1] == "identical" for line in rows), out


def test_verify_weights_bench_on_the_tiny_model(tmp_path):
    out = run_bench("verify_weights.py", "--tiny", "--workdir", str(tmp_path))
    rows = [line.split() for line in out.splitlines() if re.match(r"\s+\d+\s+(no|yes)\s", line)]
    assert rows, out
    for row in rows:
        assert int(row[-2]) > 0 and row[-1] == "0", out  # tensors checked, none failed


@pytest.mark.paddle
def test_export_program_bench_builds_one_r1_layer(tmp_path):
    pytest.importorskip("paddle")
    out = run_bench("export_program.py", "--layers", "1", "--no-anchor", "--workdir", str(tmp_path))
    m = re.search(r"dsx export\s+([\d.]+) s\s+program\s+([\d.]+) MiB\s+parameters\s+([\d.]+) GiB", out)
    assert m, out
    # rank 0 of tp 8: the embedding's and the head's slices (2 x 16160 x 7168 bf16, 0.43 GiB) and dense layer 0
    assert float(m.group(2)) > 0 and 0.45 < float(m.group(3)) < 1.0, out


BENCH_PY = sorted((REPO / "bench").glob("*.py"))
@pytest.mark.paddle
def test_export_vs_cp_bench_on_the_tiny_model(tmp_path):
    pytest.importorskip("paddle")
    out = run_bench("export_vs_cp.py", "--small", "--layers", "2", "--experts", "4", "--sources",
                    "orig,a8w8_fp8_wint4", "--workdir", str(tmp_path), "--speculate")
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("orig ", "a8w8_fp8_wint4 "))}
    assert set(rows) == {"orig", "a8w8_fp8_wint4"}, out
    for row in rows.values():
        # (columns: GB in, dsx s, cp s, ratio, GB/s in, GB out; GB/s in, 3 decimals, rounds to 0.000 on this tiny
        # model when the export is slow, so it is not asked to be positive)
        gb_in, dsx_s, cp_s, ratio, gbps_in, gb_out = map(float, row[1:7])
        assert gb_in > 0 and dsx_s > 0 and cp_s > 0 and ratio > 0 and gbps_in >= 0 and gb_out > 0, out


SCRIPTS = [p.name for p in BENCH_PY if '__name__ == "__main__"' in p.read_text()]
MODULES = [p.stem for p in BENCH_PY if p.name not in SCRIPTS]  # gpu_timing, the pytest plugin


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_bench_script_imports_and_answers_help(script):
    """The GPU benches cannot run here, but each must still import against today's ds_export and say how it is
    run (a renamed function or module fails here, not on the GPU machine's clock)."""
    out = run_bench(script, "--help", timeout=120)
    assert "usage" in out.lower() or "python" in out, out


@pytest.mark.parametrize("module", MODULES)
def test_every_bench_module_imports(module):
    env = dict(os.environ, PYTHONPATH=f"{REPO}:{REPO / 'bench'}")
    proc = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr


SHELL = sorted(str(p.relative_to(REPO)) for p in [*(REPO / "bench").glob("*.sh"), REPO / "tests/gpu/run_all.sh"])


@pytest.mark.parametrize("script", SHELL)
def test_every_bench_shell_script_parses(script):
    proc = subprocess.run(["bash", "-n", str(REPO / script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
