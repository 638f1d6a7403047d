"""CUDA block FP8 GEMM: the measured tables of the automatic choice (csrc/cuda/gemm_fp8_tuned.inc, the H200's, and
gemm_fp8_tuned_h100.inc, the H100 SXM's; bench/tune_auto.py --kernel fp8), on any 132-SM card made each table's card
(cuda.as_card).

Every entry must be what algo 0 runs at both ends of its M range (dsx_gemm_fp8_nt_resolve_cuda, and the
same output bits as the entry's word: a word that could not take the launch would silently run the rules'
choice instead), keep the caller's PDL bit only where its kernel takes it, and auto's output at the table's
shapes must be right against float64 (assert_gemm_close of test_kernels_cuda.py, NaN-poisoned outputs).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ds_export.native import cuda

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from test_gemm_weight_only_ws_cuda import skip_unless_h200  # noqa: E402 (the tables are the H200's)
from test_kernels_cuda import assert_gemm_close, make_gemm, ref_gemm  # noqa: E402
import tune_auto  # noqa: E402

pytestmark = pytest.mark.skipif(not cuda.available(), reason="no CUDA device")

TABLE = tune_auto.read_table(tune_auto.TABLES["fp8"])
# the H100 SXM's table where it is not the H200's (its other entries are the same words, checked with the H200's)
H100 = sorted(set(tune_auto.read_table(tune_auto.CARD_TABLES["fp8", "h100"])) - set(TABLE))
PDL, SMALL = 1 << 28, 6


@pytest.mark.parametrize("card,entry", [("h200", e) for e in TABLE] + [("h100", e) for e in H100],
                         ids=lambda v: v if isinstance(v, str) else f"{v[0]}x{v[1]}-m{v[2]}..{v[3]}")
def test_table_entry_is_what_auto_runs(card, entry):
    n, k, lo, hi, w = entry
    skip_unless_h200()
    # (one set of operands and its float64 reference for the entry: the first lo rows of them at lo; every shape, the
    # largest too, seconds of host numpy)
    x, sx, b, sb = make_gemm(np.random.default_rng([hi, n, k]), hi, n, k)
    ref = ref_gemm(x, sx, b, sb), ref_gemm(x, sx, b, sb, absolute=True)
    with cuda.as_card(card):
        for m in sorted({lo, hi}):
            assert cuda.gemm_fp8_resolve(m, n, k) == w, f"m {m}"
            assert cuda.gemm_fp8_resolve(m, n, k, PDL) == (w | PDL if (w & 15) == SMALL else w), f"m {m} with PDL"
            assert cuda.gemm_fp8_resolve(m, n, k, w) == w  # (an explicit word is left as it is)
            a, sa = np.ascontiguousarray(x[:m]), np.ascontiguousarray(sx[:m])
            auto = cuda.gemm_fp8_nt(a, sa, b, sb)
            same = cuda.gemm_fp8_nt(a, sa, b, sb, algo=w)
            assert np.array_equal(auto.view(np.uint16), same.view(np.uint16)), f"m {m}"
            assert_gemm_close(auto, a, sa, b, sb, f"auto {(m, n, k)} = {w:#x} ({card})", pre=(ref[0][:m], ref[1][:m]))


def test_a_launch_follows_the_card():
    """Where the two tables' words differ, algo 0 resolves to the word of the card the process is made (and to the
    rules' choice, 0, where that card's table lists nothing)."""
    skip_unless_h200()
    words = {card: {(m, n, k): w for n, k, lo, hi, w in tune_auto.read_table(tune_auto.CARD_TABLES["fp8", card])
                    for m in range(lo, hi + 1)} for card in ("h200", "h100")}
    moved = sorted(e for e in set(words["h200"]) | set(words["h100"]) if words["h200"].get(e) != words["h100"].get(e))
    assert len(moved) > 50
    for card in ("h200", "h100", "h200"):
        with cuda.as_card(card):
            assert [cuda.gemm_fp8_resolve(*e) for e in moved] == [words[card].get(e, 0) for e in moved], card


def test_tables_off_leaves_auto_to_the_rules():
    """DSX_TUNED_TABLES=0 (bench/tune_auto.py's measuring runs): algo 0 resolves to itself at every entry."""
    skip_unless_h200()
    ends = [(m, n, k) for n, k, lo, hi, _ in TABLE + H100 for m in sorted({lo, hi})]
    code = ("import sys; from ds_export.native import cuda; "
            f"print([cuda.gemm_fp8_resolve(*e) for e in {ends!r}])")
    env = {**os.environ, "DSX_TUNED_TABLES": "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == str([0] * len(ends)), out.stdout[-2000:]
    table = [cuda.gemm_fp8_resolve(*e) for e in ends]
    assert table != [0] * len(ends)  # (this process: the table)
    with cuda.rules_only():  # (the switch at run time: dsx_tuned_tables_cuda)
        assert [cuda.gemm_fp8_resolve(*e) for e in ends] == [0] * len(ends)
        assert not cuda.tuned_tables()
    assert cuda.tuned_tables() and [cuda.gemm_fp8_resolve(*e) for e in ends] == table
