"""CUDA weight-only GEMM: the measured tables of the automatic choice (csrc/cuda/gemm_weight_only_tuned.inc for
the H200, gemm_weight_only_tuned_h100.inc for the H100 SXM; bench/tune_auto.py), on either card.

Every entry must be what auto takes at both ends of its row range (the same launch configuration and
path as the entry's word; a word that did not fit would silently fall back to the rules), and auto's
output at the table's shapes must be right against float64 (check_bound of test_gemm_weight_only_cuda.py,
the output buffer NaN-poisoned) and reproducible.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ds_export.errors import DsxError
from ds_export.native import cuda
from ds_export.native import gemm_weight_only as G

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from test_gemm_weight_only_cuda import check_bound, make, reference, run_raw  # noqa: E402
from test_gemm_weight_only_ws_cuda import same, skip_unless_h200  # noqa: E402
import tune_auto  # noqa: E402

pytestmark = pytest.mark.skipif(not cuda.available(), reason="no CUDA device")

TABLE = tune_auto.read_table()
# the H100 SXM's table where it is not the H200's (its other entries are the same words, checked above)
H100 = sorted(set(tune_auto.read_table(tune_auto.CARD_TABLES["wo", "h100"])) - set(TABLE))


def _entry_id(e):
    return f"{e[0]}/{e[1]}-{e[2]}x{e[3]}-m{e[4]}..{e[5]}"


@pytest.mark.parametrize("card,entry", [("h200", e) for e in TABLE] + [("h100", e) for e in H100],
                         ids=lambda v: v if isinstance(v, str) else _entry_id(v))
def test_table_entry_is_the_automatic_choice(card, entry):
    """On any 132-SM card, made the table's card (cuda.as_card: the tables of the card a launch runs on)."""
    bits, group, n, k, lo, hi, w = entry
    skip_unless_h200()
    with cuda.as_card(card):
        for m in sorted({lo, hi}):  # (and the rows its first launch takes: all of them, also at 33..64 rows)
            want = tuple(f(m, n, k, bits, group, w) for f in (G.cuda_config, G.cuda_path, G.cuda_launch))
            assert tuple(f(m, n, k, bits, group) for f in (G.cuda_config, G.cuda_path, G.cuda_launch)) == want, \
                f"m {m}"
            assert want[2]["rows"] == m, f"m {m}"


def test_the_card_is_judged_by_the_device_and_can_be_forced():
    """The device counts as the card its name says (torch's name; an H100 SXM, an H200; another 132-SM card as one
    of the two), and cuda.tuned_card forces another for the process until it is given back; a card that is none of
    them is refused."""
    skip_unless_h200()
    torch = pytest.importorskip("torch")
    name = torch.cuda.get_device_name(0)
    named = "h200" if "H200" in name else "h100" if "H100" in name and "HBM3" in name else None
    with cuda.as_card(None):  # (judged by the device; skip_unless_h200 made it the H200's)
        want = named or cuda.device_card()
        assert want in cuda.CARDS, f"{name}: judged {want}"
        assert cuda.tuned_card() is None and cuda.device_card() == want
        other = "h100" if want == "h200" else "h200"
        with cuda.as_card(other):
            assert cuda.tuned_card() == other and cuda.device_card() == other
        assert cuda.tuned_card() is None and cuda.device_card() == want
    with pytest.raises(DsxError, match="none of h200, h100"):
        cuda.tuned_card("a100")
    # a group-64 launch whose word differs between the tables follows the card
    bits, group, n, k, lo, hi, w = H100[0]
    with cuda.as_card("h100"):
        h100 = G.cuda_config(lo, n, k, bits, group)
    with cuda.as_card("h200"):
        h200 = G.cuda_config(lo, n, k, bits, group)
    assert h100 == G.cuda_config(lo, n, k, bits, group, w) and h100 != h200


# (every shape of both tables, the largest too: their float64 reference takes seconds of host numpy a shape, once
# for the entry's most rows; an entry's words at the large shapes are launches no smaller shape makes)
SHAPES = sorted({e[:4] for e in TABLE})


H100_SHAPES = sorted({e[:4] for e in H100})


@pytest.mark.parametrize("card,key", [("h200", s) for s in SHAPES] + [("h100", s) for s in H100_SHAPES],
                         ids=lambda v: v if isinstance(v, str) else "{}/{}-{}x{}".format(*v))
def test_table_shapes_right_against_float64(card, key):
    bits, group, n, k = key
    skip_unless_h200()
    entries = [e for e in (TABLE if card == "h200" else H100) if e[:4] == key]
    x, q, s, wd = make(max(e[5] for e in entries), n, k, bits, group, seed=41)
    ref, mag = reference(x, wd)  # (row by row: the first m rows' are the reference of x[:m])
    del wd
    with cuda.as_card(card):
        for _, _, _, _, lo, hi, w in entries:
            for m in sorted({lo, hi}):
                xm = np.ascontiguousarray(x[:m])
                a = run_raw(xm, q, s, bits, group, 0)
                check_bound(a, xm, None, f"auto {bits}/{group} {n}x{k} m {m} (word {w:#x}, {card})",
                            pre=(ref[:m], mag[:m]))
                assert same(a, run_raw(xm, q, s, bits, group, w)), "bits differ from the entry's word"
                assert same(a, run_raw(xm, q, s, bits, group, 0)), "not reproducible"


@pytest.mark.parametrize("card", ["h200", "h100"])
def test_tables_off_leaves_auto_to_the_rules(card):
    """DSX_TUNED_TABLES=0 (bench/tune_auto.py's measuring runs): the rules alone. Every entry of either card's table
    was confirmed faster than the rules' choice at both ends of its range (on that card), so with the tables off auto
    must resolve to another configuration or path than the entry's word at every end."""
    skip_unless_h200()
    table = tune_auto.read_table(tune_auto.CARD_TABLES["wo", card])
    ends = [(m, n, k, bits, group) for bits, group, n, k, lo, hi, _ in table for m in sorted({lo, hi})]
    code = ("import json; from ds_export.native import gemm_weight_only as G; "
            f"print(json.dumps([[G.cuda_config(*e), G.cuda_path(*e)] for e in {ends!r}]))")
    env = {**os.environ, "DSX_TUNED_TABLES": "0"}
    off = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                                    check=True).stdout)
    words = [w for *_, lo, hi, w in table for _ in sorted({lo, hi})]
    same = [(e, f"{w:#x}") for e, w, o in zip(ends, words, off)
            if o == [G.cuda_config(*e, w), G.cuda_path(*e, w)]]
    assert same == [], f"{len(same)} of {len(ends)} ends: the rules' own choice"
    with cuda.as_card(card):  # (this process: the card's table, on either card)
        assert all([G.cuda_config(*e), G.cuda_path(*e)] == [G.cuda_config(*e, w), G.cuda_path(*e, w)]
                   for e, w in zip(ends, words))
    with cuda.rules_only():  # (the switch at run time, dsx_tuned_tables_cuda: the same as the environment's)
        assert [[G.cuda_config(*e), G.cuda_path(*e)] for e in ends] == off
