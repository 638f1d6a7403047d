"""Planning at DeepSeek-R1's real scale (91,991 tensors, 163 shards) on a header-only sparse copy."""

from __future__ import annotations

import json
import time

import pytest

from ds_export.cli.app import main
from ds_export.io.checkpoint import Checkpoint
from ds_export.models import deepseek_v3 as ds
from ds_export.quant import plan as plan_mod
from r1_sparse import N_SHARDS, make_sparse_r1

GiB = 2**30


@pytest.fixture(scope="module")
def r1(tmp_path_factory):
    return make_sparse_r1(tmp_path_factory.mktemp("r1") / "DeepSeek-R1")


def test_inspect_real_scale(r1, capsys):
    assert main(["inspect", str(r1), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["tensors"] == 91_991 and s["shards"] == N_SHARDS and s["mtp_layers"] == [61]
    assert s["experts_present"] == 256


def _plan(r1, typ, mtp=None):
    ck = Checkpoint.open(r1)
    t0 = time.perf_counter()
    p = plan_mod.build(ck, plan_mod.load_recipe(typ, None, arch=None, group_size=None, mtp_type=mtp))
    return p, time.perf_counter() - t0


def test_plans_have_the_expected_sizes(r1):
    cfg = ds.DeepseekV3Config.from_dict(Checkpoint.open(r1).config)
    ts = ds.expected_tensors(cfg)
    fp8 = sum(t.nbytes for t in ts if t.dtype == "F8_E4M3")
    experts = sum(t.nbytes for t in ts if t.dtype == "F8_E4M3" and t.role.expert is not None)
    scales = sum(t.nbytes for t in ts if t.role.kind == "scale_inv")
    bf16 = sum(t.nbytes for t in ts if t.dtype == "BF16")
    router = sum(t.nbytes for t in ts if t.role.role == "router")

    p, dt = _plan(r1, "a8w8_fp8")
    assert dt < 60, f"planning took {dt:.0f} s"
    assert len(p.shards) == N_SHARDS
    # Every FP8 weight is copied; the only growth is the router going bf16 -> fp32 and eh_proj shrinking to FP8.
    eh = sum(t.nbytes for t in ts if t.role.role == "mtp_eh_proj")
    eh_fp8 = eh // 2 + 56 * 112 * 4
    assert p.bytes_out == p.bytes_in + router - eh + eh_fp8

    p4, _ = _plan(r1, "weight_only_int4")
    # int4 halves every FP8 byte, drops the fp32 block scales for bf16 per-channel scales.
    assert abs(p4.bytes_out - (p.bytes_in - fp8 // 2 - scales + router - eh // 4 * 3)) < 0.01 * p.bytes_in
    mix, _ = _plan(r1, "a8w8_fp8_wint4", "a8w8_fp8")
    assert mix.bytes_out < p.bytes_out - experts * 0.45
    assert p.bytes_in / GiB > 641 and bf16 > 0
