"""tests/gpu/shard.py: the N parts of a GPU suite are disjoint and together every test (checked on CPU by
collecting the GPU files, which collect here and skip at run time)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = ["tests/gpu/test_gemm_weight_only_cuda.py", "tests/gpu/test_mla_decode_cuda.py"]


def _collect(*extra: str) -> tuple[int, list[str]]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tests" / "gpu"), str(ROOT)]))
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        "--noconftest", "-p", "shard", *extra, *FILES], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    return r.returncode, [ln for ln in r.stdout.splitlines() if "::" in ln]


def test_the_parts_are_disjoint_and_cover_every_test():
    rc, whole = _collect()
    assert rc == 0 and len(whole) > 100
    parts = []
    for i in range(3):
        rc, part = _collect("--shard", f"{i}/3")
        assert rc == 0 and part, i
        parts.append(part)
    assert sorted(sum(parts, [])) == sorted(whole)  # (every test once)
    assert all(len(p) < len(whole) * 0.5 for p in parts)  # (a split, not everything in one part)
    assert _collect("--shard", "1/3")[1] == parts[1]  # (fixed from run to run)


def test_a_bad_part_is_a_usage_error():
    for spec in ("3/3", "x", "1/0"):
        rc, _ = _collect("--shard", spec)
        assert rc == 4, spec  # (pytest's usage error)
