"""The measured tables of the automatic choice (csrc/cuda/gemm_weight_only_tuned.inc and gemm_fp8_tuned.inc,
written by bench/tune_auto.py): well formed, only DeepSeek-V3 tensor-parallel shapes, and the emitter keeps
exactly the confirmed words. (Whether each entry is what the automatic choice takes, and is right, is
tests/gpu's: it needs an H200.)"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ds_export.models import deepseek_v3 as ds
from ds_export.tiny import REAL_CONFIG

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import tune_auto  # noqa: E402

WS, TILES = 1 << 28, 3 << 29
CUDA_DIR = Path(__file__).resolve().parents[1] / "csrc" / "cuda"
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
GXX = shutil.which("g++")


def shapes_at_tp():
    cfg = ds.DeepseekV3Config.from_dict(REAL_CONFIG)
    return {s for tp in (1, 2, 4, 8) for s in ds.gemm_shapes(cfg, tp)}


def shape_and_range_problems(where, known, n, k, lo, hi, what, top) -> list[str]:
    out = []
    if (n, k) not in known:
        out.append(f"{where}: not a DeepSeek-V3 shape at tp 1, 2, 4 or 8")
    if not 1 <= lo <= hi <= top:
        out.append(f"{where}: {what} out of 1..{top}")
    return out


def problems(rows) -> list[str]:
    """What is wrong with these table entries (empty: nothing)."""
    known, out = shapes_at_tp(), []
    seen: dict[tuple, list[tuple[int, int]]] = {}
    for bits, group, n, k, lo, hi, word in rows:
        where = f"entry {bits}, {group}, {n}x{k}, rows {lo}..{hi}"
        if (bits, group) not in tune_auto.WO_LAYOUTS:
            out.append(f"{where}: not a tuned layout")
        out += shape_and_range_problems(where, known, n, k, lo, hi, "rows", 64)  # (kWsWideRows)
        if 16 < hi <= 32 and word & TILES:  # (17..32 rows: one tile a warp; the bits would be ignored)
            out.append(f"{where}: word {word:#x} asks for several tiles a warp above 16 rows")
        # 33..64 rows (plan_launch): one launch of all the rows, eight token tiles through wgmma (bits 28..29), 4 or 8
        # warps (or the automatic count), x staged whole; a range from 32 down would mix two kinds of launch
        if hi > 32 and (lo <= 32 or (word & TILES) != 1 << 29 or word & 15 not in (0, 4, 8)):
            out.append(f"{where}: word {word:#x} is not one launch of eight token tiles through wgmma (33..64 rows)")
        # the warp-specialized path with its ring fields given (so the automatic rules are not asked
        # again), tiles a warp 1, 2 or 4 (bits 29..30 not 3), a split of at most 8, x's chunk automatic
        if not (word & WS and (word >> 16) & 15 and (word >> 20) & 15) or (word & TILES) == TILES:
            out.append(f"{where}: word {word:#x} is not a warp-specialized word with its ring")
        # (warps 0, 4, 8, or 3, 5, 6, 7 with several tiles a warp and a given split; a chunk either holds the whole
        # K slice of a given split (x staged whole, as with the automatic chunk) or is x through the ring: equal to
        # the steps a slot, int4 (any scales), two tiles a warp, 9..16 rows)
        warps, splits, chunk, box = word & 15, (word >> 4) & 15, (word >> 8) & 255, (word >> 20) & 15
        odd_ok = warps in (3, 5, 6, 7) and word & TILES and splits
        ring_ok = chunk == box and (word >> 29) & 3 == 1 and bits == 4 \
            and 9 <= lo and hi <= 16
        steps = -(-k // (128 if bits == 4 else 64))
        whole_ok = splits and chunk >= -(-steps // splits)
        if splits > 8 or not (warps in (0, 4, 8) or odd_ok) or (chunk and not (ring_ok or whole_ok)):
            out.append(f"{where}: word {word:#x} has a bad split, warp count or chunk")
        seen.setdefault((bits, group, n, k), []).append((lo, hi))
    return out + overlaps(seen, "row")


def overlaps(seen: dict[tuple, list[tuple[int, int]]], what: str) -> list[str]:
    """Keys whose ranges (first, last) overlap: one launch would have two entries."""
    out = []
    for key, spans in seen.items():
        spans.sort()
        if any(a[1] >= b[0] for a, b in zip(spans, spans[1:])):
            out.append(f"{key}: overlapping {what} ranges {spans}")
    return out


@pytest.mark.parametrize("card", ["h200", "h100"])
def test_table_entries_are_valid(card):
    rows = tune_auto.read_table(tune_auto.CARD_TABLES["wo", card])
    assert len(rows) >= 50, "the table lost its entries"
    assert problems(rows) == []


@pytest.mark.parametrize("fault,msg", [
    ((4, -1, 9216, 7000, 1, 1, 0x10220044), "not a DeepSeek-V3 shape"),
    ((8, 64, 9216, 7168, 1, 1, 0x10220044), "not a tuned layout"),
    ((4, -1, 9216, 7168, 1, 65, 0x30220044), "rows out of"),
    ((4, -1, 9216, 7168, 30, 40, 0x30220088), "not one launch of eight token tiles"),  # (across 32 / 33)
    ((4, -1, 9216, 7168, 33, 40, 0x10220088), "not one launch of eight token tiles"),  # (mma consumers)
    ((4, -1, 9216, 7168, 33, 40, 0x30220086), "not one launch of eight token tiles"),  # (6 warps)
    ((4, -1, 9216, 7168, 33, 40, 0x30220288), "bad split"),  # (x through the ring above 16 rows)
    ((4, -1, 9216, 7168, 17, 20, 0x30220088), "several tiles a warp above 16 rows"),
    ((4, -1, 9216, 7168, 1, 1, 0x00220044), "not a warp-specialized word"),
    ((4, -1, 9216, 7168, 1, 1, 0x70220044), "not a warp-specialized word"),
    ((4, -1, 9216, 7168, 1, 1, 0x10200044), "not a warp-specialized word"),  # no ring slots
    ((4, -1, 9216, 7168, 1, 1, 0x10220094), "bad split"),
    ((4, -1, 9216, 7168, 9, 9, 0x10220046), "bad split"),  # (6 warps, one tile a warp)
    ((4, -1, 9216, 7168, 9, 9, 0x30220006), "bad split"),  # (6 warps, no split)
    ((4, -1, 9216, 7168, 9, 9, 0x30220148), "bad split"),  # (a chunk of 1 with slots of 2 steps)
    ((4, -1, 9216, 7168, 8, 9, 0x30220248), "bad split"),  # (x through the ring at 8 rows)
    ((8, -1, 9216, 7168, 9, 9, 0x30220248), "bad split"),  # (int8)
    ((4, -1, 9216, 7168, 9, 9, 0x50220248), "bad split"),  # (four tiles a warp)
    ((4, -1, 8192, 512, 1, 1, 0x30220214), "bad split"),  # (a chunk of 2 short of one split's 4-step slice)
])
def test_planted_faults_are_caught(fault, msg):
    rows = tune_auto.read_table()
    assert any(msg in p for p in problems(rows + [fault]))


def test_a_chunk_that_holds_the_slice_is_x_whole():
    """A given chunk at least as long as the K slice stages x whole (the kernel's host side takes it so), at any
    rows: 8192x512 (4 steps) at 4 splits with a chunk of 2, the word the fortieth session's sweep confirmed there."""
    assert problems([(4, -1, 8192, 512, 1, 5, 0x30220244)]) == []
    assert problems([(4, -1, 8192, 512, 1, 5, 0x30220214)]) != []  # (1 split: a 4-step slice)


def test_an_entry_of_33_to_64_rows_is_one_launch_through_wgmma():
    """plan_launch consults the table at 33..64 rows too (forty-fifth session): such an entry is a word of eight
    token tiles through wgmma for all the rows (bits 28..29, 4 or 8 warps or automatic, x staged whole), with a
    range inside 33..64."""
    assert problems([(4, -1, 36864, 7168, 33, 40, 0x30130088), (8, 128, 7168, 2048, 41, 64, 0x30220000)]) == []
    assert problems([(4, -1, 36864, 7168, 33, 40, 0x30132088)]) == []  # (a chunk that holds the 7-step slice)


def test_the_rules_shapes_are_tabled_too():
    """Since the twentieth session the table takes every layout at the shapes the rules were tuned on too
    (their GPU tests run with the tables off): int4 per channel at 24576x1536 (the eighteenth session's
    confirmations, 5-9% faster than the rules at every row range) and the other layouts there."""
    rules_shapes = {(36864, 7168), (7168, 18432), (2048, 7168), (7168, 2048), (24576, 1536), (4096, 7168)}
    assert problems([(8, 128, 4096, 7168, 1, 1, 0x10220044), (4, -1, 4096, 7168, 1, 1, 0x10220044)]) == []
    rows = tune_auto.read_table()
    assert any((b, g) == (4, -1) and (n, k) == (24576, 1536) for b, g, n, k, *_ in rows)
    assert any((b, g) != (4, -1) and (n, k) in rules_shapes for b, g, n, k, *_ in rows)


def test_overlapping_ranges_are_caught():
    rows = [(4, -1, 9216, 7168, 1, 4, 0x10220044), (4, -1, 9216, 7168, 4, 8, 0x10220088)]
    assert any("overlapping" in p for p in problems(rows))


def _confirm(bits, group, n, k, rows, word, value, taken, us=(10.0, 9.0)):
    at = {str(r): {"us_auto": us[0], f"us_{word}": us[1]} for r in sorted(set(rows))}
    return {"kind": "confirm", "bits": bits, "group": group, "N": n, "K": k, "rows": list(rows), "word": word,
            "value": value, "taken": taken, "at": at}


def test_emit_keeps_confirmed_words_and_merges_ranges(tmp_path):
    log = tmp_path / "tune.jsonl"
    rows = [
        {"meta": True, "date": "2026-12-01"},
        _confirm(4, -1, 9216, 7168, (2, 4), "w8s8d2b2+10000000", 0x10220088, True),
        _confirm(4, -1, 9216, 7168, (5, 8), "w8s8d2b2+10000000", 0x10220088, True),  # same word: merged
        _confirm(4, -1, 9216, 7168, (9, 16), "w0s0d2b2+10000000", 0x10220000, True),
        _confirm(4, -1, 9216, 7168, (1, 1), "w4s4d2b2+10000000", 0x10220044, False, us=(10.0, 9.9)),  # not confirmed: left out
        _confirm(4, -1, 4096, 7168, (1, 1), "w8s4d2b2+30000000", 0x30220048, True),  # a rules' shape: in too
        _confirm(8, 128, 4096, 7168, (1, 1), "w8s4d2b2+30000000", 0x30220048, True),
        {"kind": "sweep", "N": 9216, "K": 7168, "M": 1},
    ]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = io.StringIO()
    tune_auto.emit_table([str(log)], out=out)
    table = tmp_path / "t.inc"
    table.write_text(out.getvalue())
    assert tune_auto.read_table(table) == [(4, -1, 4096, 7168, 1, 1, 0x30220048), (4, -1, 9216, 7168, 2, 8, 0x10220088),
                                           (4, -1, 9216, 7168, 9, 16, 0x10220000), (8, 128, 4096, 7168, 1, 1, 0x30220048)]
    assert "2026-12-01" in out.getvalue() and "M=2 10.0 -> 9.0" in out.getvalue()


def test_emit_a_later_file_replaces_what_earlier_ones_said_of_a_key(tmp_path):
    """A file that measured a key's rows (a sweep row is enough: no winner there) replaces the entries of
    those rows from the files before it; the other keys of the earlier files stay."""
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text("".join(json.dumps(r) + "\n" for r in [
        {"meta": True, "date": "2026-12-01"},
        _confirm(8, 128, 7168, 2048, (9, 12), "w8s8d2b2+10000000", 0x10220088, True),
        _confirm(8, 128, 7168, 2048, (13, 16), "w8s8d2b2+10000000", 0x10220088, True),
        _confirm(4, 128, 9216, 7168, (1, 1), "w8s4d2b2+30000000", 0x30220048, True)]))
    second.write_text("".join(json.dumps(r) + "\n" for r in [
        {"meta": True, "date": "2026-12-02"},
        {"kind": "sweep", "kernel": "wo", "key": [8, 128, 7168, 2048], "M": 16, "us_auto": 9.0},
        _confirm(8, 128, 7168, 2048, (9, 12), "w8s4d4b1+30000000", 0x30140048, True)]))
    out = io.StringIO()
    tune_auto.emit_table([str(first), str(second)], "wo", out=out)
    table = tmp_path / "t.inc"
    table.write_text(out.getvalue())
    # 14..16 go (the sweep at 16 found no winner); 13, which that sweep stands for without timing it, keeps the
    # word the first file timed at 13 itself
    assert tune_auto.read_table(table) == [(4, 128, 9216, 7168, 1, 1, 0x30220048), (8, 128, 7168, 2048, 9, 12, 0x30140048),
                                           (8, 128, 7168, 2048, 13, 13, 0x10220088)]
    assert "2026-12-01, 2026-12-02" in out.getvalue()


def _sweep(key, m, auto, **words):
    return {"kind": "sweep", "kernel": "wo", "key": list(key), "M": m, "us_auto": auto,
            **{f"us_{w}": t for w, t in words.items()}}


def test_emit_keeps_an_earlier_word_a_later_sweep_still_finds_faster(tmp_path):
    """A later run confirms only winners over its --gain: an earlier entry of a row it swept stays if that
    sweep timed the entry's word more than the run's --keep faster than the rules, and goes if not; its
    confirmed words replace earlier ones row by row; rows it did not sweep keep the earlier entries."""
    key, w1, w2 = (4, -1, 7168, 18432), "w8s8d2b2+50000000", "w8s4d2b1+30000000"
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text("".join(json.dumps(r) + "\n" for r in [
        {"meta": True, "date": "2026-12-01", "keep": 0.025},
        _confirm(*key, (5, 12), w1, 0x50220088, True),
        _confirm(*key, (16, 16), w1, 0x50220088, True)]))
    second.write_text("".join(json.dumps(r) + "\n" for r in [
        {"meta": True, "date": "2026-12-02", "keep": 0.025},
        *[_sweep(key, m, 31.0, **{w1: 30.0}) for m in (5, 6, 7, 8)],  # 3.2% faster: kept
        _sweep(key, 9, 31.0, **{w1: 30.5}),  # 1.6%: the rules' again
        *[_sweep(key, m, 31.0, **{w1: 30.0, w2: 29.0}) for m in (10, 11)],
        _confirm(*key, (10, 11), w2, 0x30120048, True, us=(31.0, 29.0)),  # a new winner replaces it
        _sweep(key, 12, 31.0)]))  # the word not timed: the sweep cannot support it
    out = io.StringIO()
    tune_auto.emit_table([str(first), str(second)], "wo", out=out)
    table = tmp_path / "t.inc"
    table.write_text(out.getvalue())
    # rows past the second file's largest M (12) were not swept by it: 16 stays
    assert tune_auto.read_table(table) == [key + (5, 8, 0x50220088), key + (10, 11, 0x30120048), key + (16, 16, 0x50220088)]
    assert "M=5 31.0 -> 30.0" in out.getvalue() and "M=10 31.0 -> 29.0" in out.getvalue()


def test_emit_a_new_word_replaces_an_earlier_one_only_where_the_sweep_timed_it_faster(tmp_path):
    """A later run's confirmed word (over a range, or at one end alone) replaces an earlier entry that stays only
    where its sweep timed the new word --keep faster than the entry's word too; where the sweep did not time the
    entry's word, the confirmation decides (fifty-eighth session: words within 1% of each other swapped on the H100)."""
    key, w1, w2 = (4, -1, 7168, 18432), "w8s8d2b2+50000000", "w8s4d2b1+30000000"
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text("".join(json.dumps(r) + "\n" for r in [
        {"meta": True, "date": "2026-12-01", "keep": 0.025},
        _confirm(*key, (1, 8), w1, 0x50220088, True)]))
    second.write_text("".join(json.dumps(r) + "\n" for r in [
        {"meta": True, "date": "2026-12-02", "keep": 0.025},
        _sweep(key, 2, 31.0, **{w1: 29.0, w2: 28.8}),  # 0.7% apart: the earlier word stays at 1..2
        _sweep(key, 4, 31.0, **{w1: 29.0, w2: 28.0}),  # 3.4% faster: the new word at 3..4
        _sweep(key, 6, 31.0, **{w1: 29.0}),  # the new word not timed: its confirmation decides at 5..6
        _sweep(key, 8, 31.0, **{w1: 29.0, w2: 28.9}),
        _confirm(*key, (1, 6), w2, 0x30120048, True, us=(31.0, 28.5)),
        {**_confirm(*key, (7, 8), w2, 0x30120048, False, us=(31.0, 28.5)),  # one end held: 8 alone, about as fast
         "at": {"7": {"us_auto": 31.0, f"us_{w2}": 30.9}, "8": {"us_auto": 31.0, f"us_{w2}": 28.5}}}]))
    out = io.StringIO()
    tune_auto.emit_table([str(first), str(second)], "wo", out=out)
    table = tmp_path / "t.inc"
    table.write_text(out.getvalue())
    assert tune_auto.read_table(table) == [key + (1, 2, 0x50220088), key + (3, 6, 0x30120048), key + (7, 8, 0x50220088)]


@pytest.mark.parametrize("kernel,card", sorted(tune_auto.CARD_TABLES))
def test_a_shipped_table_re_emits_itself_byte_for_byte(kernel, card):
    """A table stands for the tune logs it was emitted from (they are not kept): read back whole, words,
    ranges, times and dates, it is emitted again unchanged, naming its card."""
    out = io.StringIO()
    tune_auto.emit_table([str(tune_auto.CARD_TABLES[kernel, card])], kernel, out=out, card=card)
    assert out.getvalue() == tune_auto.CARD_TABLES[kernel, card].read_text()
    assert f"shapes, {tune_auto.CARDS[card]}, 2026-" in out.getvalue()


def test_the_cards_tables_differ_where_the_h100_was_swept():
    """The H100 SXM's weight-only table is the H200's but where sweeps on an H100 decided: int4 group 64 at rows
    1..8 (fifty-second session), int4 per channel, group 128 and group 64 and int8 per channel at rows 1..16
    (fifty-ninth), int8 group 128 at rows 1..16 and int4 at rows 17..32 (sixtieth), int4 at rows 33..64 and int8 at
    rows 17..64 (sixty-first; int8 group 128's sweep at 33..64 kept every word). Its words differ in every band
    swept (by many rows of each), nowhere else."""
    def words(card):
        return {e[:4] + (r,): e[6] for e in tune_auto.read_table(tune_auto.CARD_TABLES["wo", card])
                for r in range(e[4], e[5] + 1)}
    h200, h100 = words("h200"), words("h100")
    moved = {row for row in set(h200) | set(h100) if h200.get(row) != h100.get(row)}
    band = {1: (1, 16), 17: (17, 32), 33: (33, 64)}
    swept = {(4, 64): (1, 17, 33), (4, -1): (1, 17, 33), (4, 128): (1, 17, 33), (8, -1): (1, 17, 33),
             (8, 128): (1, 17)}
    in_band = [(layout, b) for layout, bands in swept.items() for b in bands]
    assert all(any(row[:2] == layout and band[b][0] <= row[4] <= band[b][1] for layout, b in in_band)
               for row in moved)
    for layout, b in in_band:
        assert sum(row[:2] == layout and band[b][0] <= row[4] <= band[b][1] for row in moved) > 20, (layout, b)


def fp8_words_by_row(card: str) -> dict[tuple[int, int, int], int]:
    """{(N, K, M): word} of every row the card's block FP8 table lists."""
    return {e[:2] + (r,): e[4] for e in tune_auto.read_table(tune_auto.CARD_TABLES["fp8", card])
            for r in range(e[2], e[3] + 1)}


def test_the_fp8_cards_tables_differ_where_the_h100_ran_other_words():
    """The H100 SXM's block FP8 table is the H200's with the rows of the fifty-eighth session's sweep on an H100 (every
    shape at M = 16, 32, 64, 128): their words differ at many rows, among them M = 128 at 7168x18432, where the
    H200's word (the cooperative CUTLASS kernel) was 12% slower than the rules on the H100."""
    h200, h100 = fp8_words_by_row("h200"), fp8_words_by_row("h100")
    moved = {row for row in set(h200) | set(h100) if h200.get(row) != h100.get(row)}
    assert len(moved) > 50 and (7168, 18432, 128) in moved


def test_emit_a_table_then_a_sweep_of_other_rows(tmp_path):
    """`--emit TABLE.inc new.jsonl`: the new file decides the rows it swept (17..32 here); the table's
    other rows stay, and an entry of a swept row stays only where that sweep still times its word faster, or where
    the table timed it at that row and the sweep did not."""
    key, w1, w2 = (4, -1, 7168, 18432), "w8s8d2b2+50000000", "w8s4d4b1+10000000"
    base = tmp_path / "base.inc"
    base.write_text("// automatic choice at DeepSeek-V3's tensor-parallel shapes, H200 (132 SMs), 2026-12-01.\n"
                    f"{{4, -1, 7168, 18432, 9, 16, 0x50220088}},  // {w1}: M=9 31.0 -> 30.0, M=16 33.5 -> 31\n"
                    f"{{4, -1, 7168, 18432, 17, 20, 0x10140048}},  // {w2}: M=17 40.0 -> 38.0\n")
    new = tmp_path / "b.jsonl"
    new.write_text("".join(json.dumps(r) + "\n" for r in [
        {"meta": True, "date": "2026-12-02", "keep": 0.025, "rows_from": 17},
        _sweep(key, 20, 41.0, **{w2: 41.5}),  # the old word no faster: gone from 17..20
        _sweep(key, 32, 50.0, **{w2: 45.0}),
        _confirm(*key, (21, 32), w2, 0x10140048, True, us=(50.0, 45.0))]))
    out = io.StringIO()
    tune_auto.emit_table([str(base), str(new)], "wo", out=out)
    table = tmp_path / "t.inc"
    table.write_text(out.getvalue())
    # 17 was timed by the table's sweep and not by this one: it stays; 18..19 were timed by neither, 20 by this one
    assert tune_auto.read_table(table) == [key + (9, 16, 0x50220088), key + (17, 17, 0x10140048),
                                           key + (21, 32, 0x10140048)]
    assert "M=9 31.0 -> 30.0, M=16 33.5 -> 31" in out.getvalue() and "2026-12-01, 2026-12-02" in out.getvalue()


_AB_KEY = (4, -1, 7168, 256)


def _table_and_sweep(tmp_path, table_rows: int, swept_rows: int) -> tuple[Path, Path]:
    """(an H100 table whose entry gives 7168x256 rows 1..table_rows word 0x50220088, a sweep that confirmed
    0x30120048 over rows 1..swept_rows, timing it faster than both the rules and the table's word)."""
    w1, w2 = "w8s8d2b2+50000000", "w8s4d2b1+30000000"
    base = tmp_path / "base.inc"
    base.write_text("// automatic choice at DeepSeek-V3's tensor-parallel shapes, H100 SXM (132 SMs), 2026-12-01.\n"
                    f"{{4, -1, 7168, 256, 1, {table_rows}, 0x50220088}},  // {w1}: M=1 5.0 -> 4.5, "
                    f"M={table_rows} 5.0 -> 4.6\n")
    new = tmp_path / "b.jsonl"
    new.write_text("".join(json.dumps(r) + "\n" for r in [
        {"meta": True, "date": "2026-12-06", "keep": 0.025, "rows_from": 1},
        *[_sweep(_AB_KEY, m, 5.0, **{w1: 4.8, w2: 4.3}) for m in range(1, swept_rows + 1)],
        _confirm(*_AB_KEY, (1, swept_rows), w2, 0x30120048, True, us=(5.0, 4.3))]))
    return base, new


def test_emit_keeps_the_first_tables_word_where_an_ab_timed_the_new_one_slower(tmp_path):
    """`--emit TABLE.inc new.jsonl --slower ab.log`: a row the A/B (bench/wo_ab.sh's lines) timed over 2% slower with
    the new word keeps TABLE's word there, or goes back to the rules where TABLE had none; rows within 2% or faster
    take the new word; the log's other lines are ignored."""
    key = _AB_KEY
    base, new = _table_and_sweep(tmp_path, table_rows=4, swept_rows=8)
    ab = tmp_path / "ab.log"
    ab.write_text("== A/B\n"
                  "4/-1 7168x256 M= 2 new    4.59 old    4.47 torch    4.33 x0.943 (old x0.968)  cfg (8, 1, 2, 2, 1)\n"
                  "4/-1 7168x256 M= 3 new    4.55 old    4.47 torch    4.33 x0.952 (old x0.968)  cfg (8, 1, 2, 2, 1)\n"
                  "4/-1 7168x256 M= 7 new    4.63 old    4.44 torch    4.33 x0.935 (old x0.975)  cfg (8, 1, 2, 2, 1)\n"
                  "4/128 7168x256 M= 8 new    9.00 old    4.00 torch    4.33\n"  # another layout: not this key
                  "A/B: 4 rows, old 17.38 -> new 22.77 us summed (+31.0%)\n")
    rows = {}
    for slower in ([], [str(ab)]):
        out = io.StringIO()
        tune_auto.emit_table([str(base), str(new)], "wo", out=out, slower=slower)
        table = tmp_path / "t.inc"
        table.write_text(out.getvalue())
        rows[bool(slower)] = tune_auto.read_table(table)
    assert rows[False] == [key + (1, 8, 0x30120048)]
    # 2 (2.7% slower) keeps the table's word, 3 (1.8%) does not; 7 had no entry: the rules
    assert rows[True] == [key + (1, 1, 0x30120048), key + (2, 2, 0x50220088), key + (3, 6, 0x30120048),
                          key + (8, 8, 0x30120048)]
    assert tune_auto.ab_slower_rows(str(ab)) == {(4, -1, 7168, 256, 2), (4, -1, 7168, 256, 7), (4, 128, 7168, 256, 8)}
    with pytest.raises(ValueError, match="old table must come first"):
        tune_auto.emit_table([str(new)], "wo", out=io.StringIO(), slower=[str(ab)])
    with pytest.raises(ValueError, match="--kernel wo only"):
        tune_auto.emit_table([str(base), str(new)], "fp8", out=io.StringIO(), slower=[str(ab)])
    res = subprocess.run([sys.executable, str(Path(tune_auto.__file__)), "--kernel", "wo", "--emit", str(new),
                          "--slower", str(ab)], capture_output=True, text=True)
    assert res.returncode == 1 and res.stdout == "" and "Traceback" not in res.stderr
    assert res.stderr.strip() == ("tune_auto --emit: --slower: the A/B's old table must come first among the "
                                  "--emit files")


def test_ab_summary_sums_the_rows_and_names_those_that_moved(tmp_path, capsys):
    """`--ab-summary ab.log` (bench/wo_retune.sh's last lines): the rows' sums and the rows over 2% either way."""
    ab = tmp_path / "ab.log"
    ab.write_text("4/-1 7168x256 M= 2 new    4.59 old    4.47 torch    4.33\n"
                  "4/-1 7168x256 M= 3 new    4.00 old    4.47 torch    4.33\n"
                  "4/128 512x7168 M=12 new    6.00 old    6.05 torch    7.00\n"
                  "not a row\n")
    assert tune_auto.print_ab_summary(str(ab)) == 0
    assert capsys.readouterr().out.splitlines() == [
        "A/B: 3 rows, old 14.99 -> new 14.59 us summed (-2.7%)",
        "  over 2% faster: 7168x256 M=3 4.47 -> 4.0",
        "  over 2% slower: 7168x256 M=2 4.47 -> 4.59"]


def _ab_line(layout, shape, m, new, old, err_new="-", err_old="-"):
    """A line as bench/wo_ab.sh prints it (its last fields the outputs' check)."""
    return (f"{layout} {shape} M={m:>2} new {new:>7} old {old:>7} torch    9.00 x1.0 (old x1.0)  "
            f"err new {err_new} old {err_old} cfg (8, 1, 2, 2, 1)\n")


def test_ab_summary_names_the_rows_whose_new_output_is_off(tmp_path, capsys):
    """A row's new output is off where its error (the largest difference from torch's, in torch's rms) is NaN, or
    over 0.1 and twice the old build's; rows without the check (older logs, "-") are not judged."""
    ab = tmp_path / "ab.log"
    ab.write_text(_ab_line("4/-1", "7168x256", 1, 4.0, 4.4, 0.03, 0.03)     # right
                  + _ab_line("4/-1", "7168x256", 2, 4.0, 4.4, 0.5, 0.03)    # a wrong tile: off
                  + _ab_line("4/-1", "7168x256", 3, 4.0, 4.4, "nan", 0.03)  # unwritten output: off
                  + _ab_line("4/-1", "7168x256", 4, 4.0, 4.4, 0.15, 0.1)    # within twice the old's
                  + _ab_line("4/-1", "7168x256", 5, 4.0, 4.4, 0.15, "-")    # over the floor, the old unchecked
                  + _ab_line("4/-1", "7168x256", 6, 4.0, 4.4, 0.15, "nan")  # the old one NaN: judged alone
                  + _ab_line("4/-1", "7168x256", 7, 4.0, 4.4)               # not checked
                  + "4/-1 7168x256 M= 8 new    4.00 old    4.40 torch    9.00\n")  # a log before the check
    assert tune_auto.ab_wrong_rows(str(ab)) == {(4, -1, 7168, 256, m) for m in (2, 3, 5, 6)}
    assert set(tune_auto.ab_errors(str(ab))) == {(4, -1, 7168, 256, m) for m in range(1, 7)}
    assert tune_auto.print_ab_summary(str(ab)) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "  outputs checked: 6 rows, largest error new nan / old nan (torch's rms); off: 7168x256 M=2 0.5, "
        "7168x256 M=3 nan, 7168x256 M=5 0.15, 7168x256 M=6 0.15")


def test_emit_keeps_the_first_tables_word_where_the_new_output_was_off(tmp_path):
    """`--emit TABLE new.jsonl --slower ab.log`: a row whose new word the A/B timed faster but whose output it found
    off keeps the table's word (the rules where the table has none), as a slower row does."""
    key = _AB_KEY
    base, new = _table_and_sweep(tmp_path, table_rows=2, swept_rows=4)
    ab = tmp_path / "ab.log"
    ab.write_text(_ab_line("4/-1", "7168x256", 1, 4.3, 4.5, 0.03, 0.03)
                  + _ab_line("4/-1", "7168x256", 2, 4.3, 4.6, 0.9, 0.03)   # faster, output off
                  + _ab_line("4/-1", "7168x256", 3, 4.3, 5.0, "nan", 0.03)
                  + _ab_line("4/-1", "7168x256", 4, 4.3, 5.0))
    out = io.StringIO()
    tune_auto.emit_table([str(base), str(new)], "wo", out=out, slower=[str(ab)])
    table = tmp_path / "t.inc"
    table.write_text(out.getvalue())
    assert tune_auto.read_table(table) == [key + (1, 1, 0x30120048), key + (2, 2, 0x50220088),
                                           key + (4, 4, 0x30120048)]


def test_wo_ab_prints_the_outputs_check_as_tune_auto_reads_it(tmp_path):
    """bench/wo_ab.sh's line printer (its Python, run on a row as bench/gpu_gemm_weight_only.py's ab_row writes it)
    and tune_auto's reader of those lines agree: the timings, and both builds' errors."""
    script = (Path(tune_auto.__file__).parent / "wo_ab.sh").read_text()
    printer = script.split("<<'PY'\n", 1)[1].split("\nPY\n", 1)[0]
    rows = tmp_path / "rows.log"
    row = {"N": 7168, "K": 256, "M": 9, "bits": 4, "group": 128, "us_auto": 4.1, "us_alt": 4.4, "us_torch": 9.0,
           "x_auto": 2.195, "x_alt": 2.045, "err_auto": 0.4, "err_alt": 0.031,
           "config": {"warps": 8, "splits": 1, "chunk": 2, "stages": 2, "box": 1}}
    rows.write_text("noise\n" + json.dumps(row) + "\n" + json.dumps({**row, "M": 10, "err_auto": "nan"}) + "\n")
    res = subprocess.run([sys.executable, "-c", printer, str(rows)], capture_output=True, text=True, check=True)
    ab = tmp_path / "ab.log"
    ab.write_text(res.stdout)
    assert tune_auto.ab_rows(str(ab)) == [((4, 128, 7168, 256, 9), 4.1, 4.4), ((4, 128, 7168, 256, 10), 4.1, 4.4)]
    assert tune_auto.ab_errors(str(ab)) == {(4, 128, 7168, 256, 9): (0.4, 0.031),
                                            (4, 128, 7168, 256, 10): (float("inf"), 0.031)}
    assert tune_auto.ab_wrong_rows(str(ab)) == {(4, 128, 7168, 256, 9), (4, 128, 7168, 256, 10)}


def test_emit_a_sweep_of_33_to_64_rows_over_the_shipped_table(tmp_path):
    """A 33..64-row sweep (--ms 40,48,56,64 --rows-from 33) emitted over the shipped table: the table's entries stay
    as they were, the confirmed words become entries of their ranges from row 33, and the result is a valid table."""
    key, w = (4, -1, 36864, 7168), tune_auto.word_name(0, 0, 3, 1, tune_auto.TWO)
    value = tune_auto.word_value(0, 0, 3, 1, tune_auto.TWO)
    new = tmp_path / "wide.jsonl"
    new.write_text("".join(json.dumps(r) + "\n" for r in [
        {"meta": True, "date": "2026-12-05", "keep": 0.025, "rows_from": 33},
        _sweep(key, 40, 120.0, **{w: 104.0}),
        _confirm(*key, (33, 40), w, value, True, us=(118.0, 103.1)),
        _sweep(key, 48, 123.0, **{w: 122.0}),  # no winner: the rules
        _sweep(key, 64, 131.0, **{w: 120.0}),
        _confirm(*key, (57, 64), w, value, False, us=(131.0, 129.5))]))  # held at neither end
    out = io.StringIO()
    tune_auto.emit_table([str(tune_auto.TABLES["wo"]), str(new)], "wo", out=out)
    table = tmp_path / "t.inc"
    table.write_text(out.getvalue())
    rows = tune_auto.read_table(table)
    assert rows == sorted(tune_auto.read_table() + [key + (33, 40, value)])
    assert problems(rows) == []


def test_changed_rows_are_where_the_words_differ(tmp_path, capsys):
    """`--changed OLD NEW`: the rows an A/B of two tables' builds must time, each row whose word differs (a word
    in one table against the rules in the other too); fp8 only at the ends of the sweep's row ranges."""
    w1, w2 = "w8s8d2b2+10000000", "w0s0d2b2+10000000"
    old, new = tmp_path / "old.inc", tmp_path / "new.inc"
    old.write_text(f"{{8, -1, 9216, 7168, 1, 8, 0x10220088}},  // {w1}: M=1 9.0 -> 8.0\n"
                   f"{{8, 128, 7168, 2048, 9, 10, 0x10220088}},  // {w1}: M=9 9.0 -> 8.0\n")
    new.write_text(f"{{8, -1, 9216, 7168, 1, 4, 0x10220088}},  // {w1}: M=1 9.0 -> 8.0\n"
                   f"{{8, -1, 9216, 7168, 5, 8, 0x10220000}},  // {w2}: M=5 9.0 -> 8.0\n"
                   f"{{8, 128, 7168, 2048, 10, 11, 0x10220088}},  // {w1}: M=10 9.0 -> 8.0\n")
    assert tune_auto.changed_rows(old, old) == []
    assert tune_auto.changed_rows(old, new) == [((8, -1, 9216, 7168), [5, 6, 7, 8]), ((8, 128, 7168, 2048), [9, 11])]
    tune_auto.print_changed(str(old), str(new), "wo")
    assert capsys.readouterr().out == "8,-1 9216x7168 5,6,7,8\n8,128 7168x2048 9,11\n# 2 6\n"
    f_old, f_new = tmp_path / "f_old.inc", tmp_path / "f_new.inc"
    f_old.write_text("{7168, 2048, 1, 64, 0x306},  // ks: M=1 9.0 -> 8.0\n")
    f_new.write_text("{7168, 2048, 1, 16, 0x306},  // ks: M=1 9.0 -> 8.0\n{7168, 2048, 17, 40, 0x106},  // small: M=17 9.0 -> 8.0\n")
    assert tune_auto.changed_rows(f_old, f_new, "fp8") == [((7168, 2048), [17, 32, 33, 64])]


def test_read_table_refuses_a_malformed_line(tmp_path):
    bad = tmp_path / "t.inc"
    bad.write_text("{4, -1, 9216, 7168, 2, 8},  // the word missing\n")
    with pytest.raises(ValueError, match="not a table entry"):
        tune_auto.read_table(bad)


def test_word_names_pack_as_the_bench_does():
    assert tune_auto.word_value(8, 4, 2, 2, tune_auto.TWO) == 0x30220048
    assert tune_auto.word_name(8, 4, 2, 2, tune_auto.TWO) == "w8s4d2b2+30000000"
    # (a chunk: x through the ring where it equals the steps a slot)
    assert tune_auto.word_value(8, 4, 2, 2, tune_auto.TWO, 2) == 0x30220248
    assert tune_auto.word_name(8, 4, 2, 2, tune_auto.TWO, 2) == "w8s4d2b2c2+30000000"
    names = {tune_auto.word_name(*c) for c in tune_auto.CANDIDATES}
    assert len(names) == len(tune_auto.CANDIDATES), "candidate names are unique"
    assert tune_auto.ranges([1, 4, 8, 16]) == {1: (1, 1), 4: (2, 4), 8: (5, 8), 16: (9, 16)}


def test_each_row_band_has_its_own_candidates():
    """A wo sweep lies inside one row band (1..16, 17..32, 33..64: one kind of launch each) and times that band's
    words; every 33..64 word, as a table entry there, is one the table may hold (plan_launch takes it)."""
    assert tune_auto.band_candidates([9, 12, 16], 9) is tune_auto.CANDIDATES
    assert tune_auto.band_candidates([17, 24, 32], 17) is tune_auto.CANDIDATES_WIDE
    assert tune_auto.band_candidates([40, 48, 56, 64], 33) is tune_auto.CANDIDATES_WG
    for ms, first in (([16, 17], 1), ([24, 40], 17), ([40, 48], 17), ([8, 16], 9), ([64, 65], 33)):
        with pytest.raises(SystemExit, match="row bands"):
            tune_auto.band_candidates(ms, first)
    names = {tune_auto.word_name(*c) for c in tune_auto.CANDIDATES_WG}
    assert len(names) == len(tune_auto.CANDIDATES_WG)
    assert problems([(4, 128, 18432, 7168, 33 + 4 * i, 36 + 4 * i, tune_auto.word_value(*c))
                     for i, c in enumerate(tune_auto.CANDIDATES_WG[:8])]) == []
    assert problems([(8, -1, 18432, 7168, 33 + 4 * i, 36 + 4 * i, tune_auto.word_value(*c))
                     for i, c in enumerate(tune_auto.CANDIDATES_WG[8:])]) == []
    assert tune_auto.ranges([40, 48, 56, 64], 33) == {40: (33, 40), 48: (41, 48), 56: (49, 56), 64: (57, 64)}


def fp8_problems(rows) -> list[str]:
    """What is wrong with these block FP8 table entries (empty: nothing)."""
    known, words, out = shapes_at_tp(), set(tune_auto.fp8_words().values()), []
    seen: dict[tuple, list[tuple[int, int]]] = {}
    for n, k, lo, hi, word in rows:
        where = f"fp8 entry {n}x{k}, M {lo}..{hi}"
        out += shape_and_range_problems(where, known, n, k, lo, hi, "M", 128)
        if word not in words:  # (a variant the bench times: no PDL bit)
            out.append(f"{where}: word {word:#x} is not one of bench/gpu_kernels.py's non-PDL variants")
        seen.setdefault((n, k), []).append((lo, hi))
    return out + overlaps(seen, "M")


@pytest.mark.parametrize("card", ["h200", "h100"])
def test_fp8_table_entries_are_valid(card):
    rows = tune_auto.read_table(tune_auto.CARD_TABLES["fp8", card])
    assert len(rows) >= 10, "the table lost its entries"
    assert fp8_problems(rows) == []


@pytest.mark.parametrize("fault,msg", [
    ((7168, 2050, 1, 16, 6), "not a DeepSeek-V3 shape"),
    ((9216, 7168, 1, 129, 6), "M out of"),
    ((9216, 7168, 1, 16, 6 | 1 << 28), "non-PDL variants"),  # PDL is the caller's, never the table's
    ((9216, 7168, 1, 16, 7 | 15 << 12), "non-PDL variants"),  # a large-M kernel variant the bench does not time
])
def test_fp8_planted_faults_are_caught(fault, msg):
    rows = tune_auto.read_table(tune_auto.TABLES["fp8"])
    assert any(msg in p for p in fp8_problems(rows + [fault]))
    assert any("overlapping" in p for p in fp8_problems([(9216, 7168, 1, 16, 6), (9216, 7168, 16, 32, 3)]))


def test_emit_fp8_rows(tmp_path):
    log = tmp_path / "tune.jsonl"
    rows = [{"meta": True, "kernel": "fp8", "date": "2026-12-01"},
            {"kind": "confirm", "kernel": "fp8", "key": [9216, 7168], "rows": [1, 16], "word": "small", "value": 262,
             "taken": True, "at": {"1": {"us_auto": 9.0, "us_small": 8.0}, "16": {"us_auto": 27.5, "us_small": 20.4}}},
            {"kind": "confirm", "kernel": "wo", "key": [4, -1, 9216, 7168], "rows": [1, 1], "word": "w", "value": 1,
             "taken": True, "at": {}}]  # another kernel's row: not in this table
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = io.StringIO()
    tune_auto.emit_table([str(log)], "fp8", out=out)
    table = tmp_path / "t.inc"
    table.write_text(out.getvalue())
    assert tune_auto.read_table(table) == [(9216, 7168, 1, 16, 262)]
    assert "M=16 27.5 -> 20.4" in out.getvalue()


def test_emit_takes_the_one_end_a_failed_range_held(tmp_path):
    """A winner that did not hold at both ends of its range is an entry of the end where it did (by more than
    the run's --keep), and nothing where it did not."""
    log = tmp_path / "tune.jsonl"
    rows = [{"meta": True, "kernel": "wo", "date": "2026-12-01", "keep": 0.025},
            _confirm(8, 128, 7168, 9216, (7, 8), "w8s8d2b2+30000000", 0x30220088, False, us=(34.06, 23.91)),
            _confirm(8, 128, 7168, 14336, (5, 6), "w8s8d2b2+30000000", 0x30220088, False, us=(33.12, 32.8))]
    rows[1]["at"]["7"] = {"us_auto": 23.67, "us_w8s8d2b2+30000000": 23.58}  # held at 8 only
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = io.StringIO()
    tune_auto.emit_table([str(log)], "wo", out=out)
    table = tmp_path / "t.inc"
    table.write_text(out.getvalue())
    assert tune_auto.read_table(table) == [(8, 128, 7168, 9216, 8, 8, 0x30220088)]
    assert "M=8 34.06 -> 23.91" in out.getvalue() and "M=7" not in out.getvalue()


class _FakeSwitch:
    """dsx_tuned_tables_cuda's contract without a GPU: the state before the call, -1 for a bad argument."""

    def __init__(self, state=1):
        self.state, self.calls = state, []

    def __call__(self, on):
        self.calls.append(on)
        if on not in (-1, 0, 1):
            return -1
        before = self.state
        if on >= 0:
            self.state = on
        return before


def test_tuned_tables_switch_and_rules_only(monkeypatch):
    """native.cuda.tuned_tables reads the state (1 is on, not an error code), switches it, and rules_only()
    turns the tables off for a block and puts the state back afterwards, also when the block raises."""
    from ds_export.errors import DsxError
    from ds_export.native import cuda

    fake = _FakeSwitch()
    monkeypatch.setattr(cuda, "_fn", lambda name, *types: fake)
    assert cuda.tuned_tables() is True and fake.calls == [-1]
    with cuda.rules_only():
        assert cuda.tuned_tables() is False
    assert cuda.tuned_tables() is True
    with pytest.raises(RuntimeError):
        with cuda.rules_only():
            raise RuntimeError("a failing test inside")
    assert fake.state == 1
    fake.state = 0  # (DSX_TUNED_TABLES=0: off from the start; rules_only leaves it off)
    with cuda.rules_only():
        pass
    assert fake.state == 0 and cuda.tuned_tables(True) is False and fake.state == 1
    monkeypatch.setattr(cuda, "_fn", lambda name, *types: (lambda on: -1))
    with pytest.raises(DsxError, match="tuned tables"):
        cuda.tuned_tables()


def test_tuned_card_front_end(monkeypatch):
    """native.cuda.tuned_card: "" asks (-1), a card forces it (its code), None gives the choice back to the device (0);
    the setting before comes back by name; a card that is none of the tables' is refused before the library is
    asked; as_card puts the setting back after a block, also when it raises."""
    from ds_export.errors import DsxError
    from ds_export.native import cuda

    state, calls = [0], []

    def switch(card):
        calls.append(card)
        if card < -1 or card > 2:
            return -1
        before = state[0]
        if card >= 0:
            state[0] = card
        return before

    monkeypatch.setattr(cuda, "_fn", lambda name, *types: switch)
    assert cuda.tuned_card() is None and calls == [-1]
    assert cuda.tuned_card("h100") is None and state == [2]
    with pytest.raises(RuntimeError):
        with cuda.as_card("h200"):
            assert cuda.tuned_card() == "h200"
            raise RuntimeError("a failing test inside")
    assert cuda.tuned_card(None) == "h100" and state == [0]
    with pytest.raises(DsxError, match="'a100' is none of h200, h100"):
        cuda.tuned_card("a100")
    assert calls == [-1, 2, 1, -1, 2, 0]


CARD_PROGRAM = r"""
#include "tuned_card.cuh"
#include <cstdio>
int main(int argc, char** argv) {
  using namespace dsx_cuda;
  // (SMs, GB/s): H200, H100 SXM, H100 NVL 3.9 TB/s, GH200 HBM3 4.0 and HBM3e 4.9 TB/s, unknown bandwidth, other SMs
  const int q[][2] = {{132, 4915}, {132, 3352}, {132, 3938}, {132, 4000}, {132, 4900}, {132, 0}, {114, 2039},
                      {78, 4000}};
  for (const auto& x : q) std::printf("%d ", card_of(x[0], x[1]));
  std::printf("\nforced %d\n", tuned_card_switch(-1));
  const int was = tuned_card_switch(kCardH100);
  const int forced = tuned_card(132);
  const int back = tuned_card_switch(kCardByDevice);
  const int judged = tuned_card(132);
  std::printf("switch %d %d %d %d %d\n", was, forced, back, judged, tuned_card_switch(7));
  return 0;
}
"""


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_a_device_is_the_card_of_its_sm_count_and_nearest_bandwidth(tmp_path):
    """tuned_card.cuh: a 132-SM device is the H200 or the H100 SXM by the ratio of its memory bandwidth to theirs
    (an H100 NVL or a 4.0 TB/s GH200 the H100's, a 4.9 TB/s GH200 the H200's; unknown bandwidth the H200's), a card
    of another SM count none; DSX_TUNED_CARD forces one (h200 / h100; anything else judges by the device) and the
    switch sets it at any time, 7 refused. (Host code, run with no device visible, so that the judging falls back
    to the SM count on a GPU machine too: there an H100 judged itself the H100, fifty-ninth session.)"""
    (tmp_path / "c.cu").write_text(CARD_PROGRAM)
    res = subprocess.run([NVCC, "-std=c++17", "-O1", f"-I{CUDA_DIR}", str(tmp_path / "c.cu"), "-o",
                          str(tmp_path / "c")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]

    def run(card=None):
        env = {k: v for k, v in os.environ.items() if k != "DSX_TUNED_CARD"} | {"CUDA_VISIBLE_DEVICES": ""}
        return subprocess.run([str(tmp_path / "c")], capture_output=True, text=True, check=True,
                              env={**env, **({"DSX_TUNED_CARD": card} if card is not None else {})}).stdout
    assert run().splitlines() == ["1 2 2 2 1 1 3 3 ", "forced 0", "switch 0 2 2 1 -1"]
    assert run("h100").splitlines()[1:] == ["forced 2", "switch 2 2 2 1 -1"]
    assert run("h200").splitlines()[1] == "forced 1"
    assert run("H100").splitlines()[1] == "forced 0"  # (the words are lower case: any other judges by the device)


class _FakeWoBench:
    """bench/gpu_gemm_weight_only.py's part that tune_auto's wo sweep uses (Problem, ab_row, torch), without a GPU:
    a timing model in which one word is 20% faster than the rules but refused below 36 rows (as a word that does not
    fit there would be), one is 10% faster everywhere, and the rest are 1% slower."""

    torch = None
    FAST, PICKY = "w8s4d2b1+30000000", "w4s2d2b2+30000000"

    class Problem:
        def __init__(self, n, k, bits, group, rng):
            self.n, self.k, self.bits, self.group = n, k, bits, group

        def free_torch(self):
            pass

    def ab_row(self, pb, m, rng, words, rounds, anchor=True):
        auto = 100.0 + m
        row = {"us_auto": auto}
        for name, _ in words:
            if name == self.PICKY and m < 36:
                continue  # (refused: not timed, as ab_row reports and skips it)
            row[f"us_{name}"] = (0.9 if name == self.FAST else 0.8 if name == self.PICKY else 1.01) * auto
        if anchor:
            row["us_torch"] = 130.0
        return row


def test_a_33_to_64_row_sweep_runs_end_to_end_without_a_gpu(tmp_path, monkeypatch, capsys):
    """tune_auto's wo sweep over the 33..64 band with the bench faked: each M times auto and every CANDIDATES_WG word,
    the winner is confirmed at both ends of its range (a word refused at one end is not confirmed there, and does not
    stop the run), and the log emitted over the shipped table adds one valid entry of 33..64 rows."""
    fake = _FakeWoBench()
    monkeypatch.setitem(sys.modules, "gpu_gemm_weight_only", fake)
    monkeypatch.setitem(sys.modules, "torch", None)  # (the SM count is only recorded)
    monkeypatch.setenv("DSX_TUNED_TABLES", "1")
    args = tune_auto.argparse.Namespace(kernel="wo", out=str(tmp_path), tp="1", shapes="36864x7168", layouts="4,-1",
                                        ms="40,48,56,64", rows_from=33, rounds=1, confirm_rounds=1, gain=0.04,
                                        keep=0.025)
    assert tune_auto.measure(args) == 0
    assert os.environ["DSX_TUNED_TABLES"] == "0"  # (the rules alone in a measuring run)
    capsys.readouterr()
    rows = [json.loads(line) for line in (tmp_path / "tune.jsonl").read_text().splitlines()]
    sweeps = [r for r in rows if r.get("kind") == "sweep"]
    assert [r["M"] for r in sweeps] == [40, 48, 56, 64]
    assert all(len([k for k in r if k.startswith("us_w")]) == len(tune_auto.CANDIDATES_WG) for r in sweeps)
    confirms = [(r["rows"], r["word"], r["taken"]) for r in rows if r.get("kind") == "confirm"]
    assert confirms == [([33, 40], fake.PICKY, False)] + [([lo, lo + 7], fake.PICKY, True) for lo in (41, 49, 57)]
    out = io.StringIO()
    tune_auto.emit_table([str(tune_auto.TABLES["wo"]), str(tmp_path / "tune.jsonl")], "wo", out=out)
    table = tmp_path / "t.inc"
    table.write_text(out.getvalue())
    # the word held at 40 alone of its first range (refused at 33): an entry from 40, merged with 41..64
    picky = tune_auto.word_value(4, 2, 2, 2, tune_auto.TWO)
    assert tune_auto.read_table(table) == sorted(tune_auto.read_table() + [(4, -1, 36864, 7168, 40, 64, picky)])
    assert problems(tune_auto.read_table(table)) == []


# ------------------------------------------------- the order the units' binary search needs



@pytest.mark.parametrize("kernel,card", sorted(tune_auto.CARD_TABLES))
def test_shipped_tables_are_in_search_order(kernel, card):
    """tuned_tables.cuh's tuned_find bisects a table by (key, first row): each shipped table is sorted so, and the
    emitter writes it so (the units also static_assert it)."""
    rows = tune_auto.read_table(tune_auto.CARD_TABLES[kernel, card])
    assert rows == sorted(rows)
    assert all(a[-2] < b[-3] for a, b in zip(rows, rows[1:]) if a[:-3] == b[:-3])  # (ranges of a key apart)


SEARCH_PROGRAM = r"""
#include "gemm_fp8_tuned_table.cuh"
#include <cstdio>
using E = dsx_cuda::Fp8Tuned;  // (an entry type of the library: key (N, K), rows m_lo..m_hi, word algo)
constexpr E kTable[] = {TABLE {0, 0, 0, 0, 0}};
constexpr size_t kLen = sizeof(kTable) / sizeof(kTable[0]) - 1;
static_assert(dsx_cuda::tuned_sorted(kTable, kLen), "sorted");
constexpr E kBad[][2] = {BAD};
int main() {
  const int64_t q[][3] = {QUERIES};
  for (const auto& x : q) {
    const E* e = dsx_cuda::tuned_find(kTable, kLen, std::make_tuple(x[0], x[1]), x[2]);
    std::printf("%d\n", e ? e->algo : 0);
  }
  for (const auto& b : kBad) std::printf("bad %d\n", dsx_cuda::tuned_sorted(b, 2) ? 1 : 0);
  std::printf("empty %d\n", dsx_cuda::tuned_find(kTable, 0, std::make_tuple(int64_t(1), int64_t(1)), 1) ? 1 : 0);
  return 0;
}
"""


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_binary_search_finds_what_a_scan_finds(tmp_path):
    """tuned_find (host C++, compiled with nvcc) against a linear scan in Python on random sorted tables: every row
    around every entry's ends and shapes missing from the table; tuned_sorted refuses out-of-order pairs, overlapping
    or empty ranges and rows below 1 (the planted faults a hand edit of a table would bring)."""
    rng = random.Random(46)
    entries, queries = [], []
    for n in rng.sample(range(1, 40), 12):
        for k in rng.sample(range(1, 6), 3):
            row = rng.randint(1, 3)
            for _ in range(rng.randint(1, 5)):
                lo = row + rng.randint(0, 2)
                hi = lo + rng.randint(0, 6)
                entries.append((n, k, lo, hi, len(entries) + 1))
                row = hi + 1
    entries.sort()
    for n, k, lo, hi, _ in entries:
        queries += [(n, k, r) for r in range(lo - 2, hi + 3)] + [(n + 40, k, lo), (n, k + 6, hi)]
    queries += [(0, 0, 1), (99, 99, 99)]
    bad = [((3, 1, 1, 2), (2, 1, 1, 2)),  # keys out of order
           ((3, 1, 5, 9), (3, 1, 1, 2)),  # rows out of order
           ((3, 1, 1, 4), (3, 1, 4, 6)),  # overlapping
           ((3, 1, 5, 4), (4, 1, 1, 2)),  # empty range
           ((3, 1, 0, 4), (4, 1, 1, 2))]  # row 0
    src = (SEARCH_PROGRAM.replace("TABLE", "".join(f"{{{n}, {k}, {lo}, {hi}, {w}}}, " for n, k, lo, hi, w in entries))
           .replace("QUERIES", ", ".join(f"{{{n}, {k}, {r}}}" for n, k, r in queries))
           .replace("BAD", ", ".join("{" + ", ".join("{" + ", ".join(map(str, e)) + ", 1}" for e in pair) + "}"
                                     for pair in bad)))
    (tmp_path / "s.cu").write_text(src)
    res = subprocess.run([NVCC, "-std=c++17", "-O1", f"-I{CUDA_DIR}", str(tmp_path / "s.cu"), "-o",
                          str(tmp_path / "s")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    out = subprocess.run([str(tmp_path / "s")], capture_output=True, text=True, check=True).stdout.split("\n")
    want = [next((w for n2, k2, lo, hi, w in entries if (n2, k2) == (n, k) and lo <= r <= hi), 0)
            for n, k, r in queries]
    assert [int(v) for v in out[:len(queries)]] == want
    assert sum(w != 0 for w in want) > len(entries) * 2  # (the queries hit every entry, many times)
    assert out[len(queries):len(queries) + len(bad)] == ["bad 0"] * len(bad)
    assert out[len(queries) + len(bad)] == "empty 0"


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("unit,table", [("gemm_weight_only.cu", "gemm_weight_only_tuned.inc"),
                                        ("gemm_weight_only.cu", "gemm_weight_only_tuned_h100.inc"),
                                        ("gemm_fp8_api.cu", "gemm_fp8_tuned.inc"),
                                        ("gemm_fp8_api.cu", "gemm_fp8_tuned_h100.inc")])
def test_a_unit_refuses_a_table_out_of_order(tmp_path, unit, table):
    """A table hand-edited out of order would make the binary search miss entries silently: the unit's static_assert
    stops the build in nvcc's front end (-cuda: about a second), with that error alone (the unit as shipped builds:
    tests/test_cuda_compile.py, tests/test_gemm_weight_only_cuda_compile.py)."""
    cuda = tmp_path / "cuda"
    shutil.copytree(CUDA_DIR, cuda)
    inc = CUDA_DIR.parents[0] / "include"

    def front_end():
        return subprocess.run([NVCC, "-std=c++17", "--expt-relaxed-constexpr", "-gencode=arch=compute_90a,code=sm_90a",
                               f"-I{inc}", f"-I{cuda}", "-cuda", str(cuda / unit), "-o", str(tmp_path / "u.ii")],
                              capture_output=True, text=True)

    lines = (cuda / table).read_text().splitlines(keepends=True)
    at = [i for i, line in enumerate(lines) if line.startswith("{")]
    lines[at[1]], lines[at[2]] = lines[at[2]], lines[at[1]]
    (cuda / table).write_text("".join(lines))
    res = front_end()
    log = res.stdout + res.stderr
    assert res.returncode != 0 and f"{table} must be sorted" in log and "1 error detected" in log, log[-3000:]


FP8_CARD_PROGRAM = r"""
#include "gemm_fp8_tuned_table.cuh"
#include <cstdio>
int main() {
  using namespace dsx_cuda;
  const int64_t q[][3] = {QUERIES};
  for (const int card : {kCardH200, kCardH100, kCardNone, kCardByDevice}) {
    std::printf("card %d:", card);
    for (const auto& x : q) {
      const Fp8Tuned* t = fp8_tuned_find(card, x[0], x[1], x[2]);
      std::printf(" %d", t ? t->algo : 0);
    }
    std::printf("\n");
  }
  return 0;
}
"""


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_an_fp8_launch_looks_in_its_cards_table(tmp_path):
    """gemm_fp8_tuned_table.cuh's fp8_tuned_find (what gemm_fp8_api.cu's automatic choice asks with the card the launch
    runs on, tuned_card.cuh): every row either card's table lists (and the row past it) gives the H200's table's
    word for the H200, the H100 SXM's for the H100, nothing for a card of another SM count (kCardNone) nor for the
    undecided code 0. tests/gpu checks the library's choice with the card forced, with data."""
    tables = {"h200": fp8_words_by_row("h200"), "h100": fp8_words_by_row("h100")}
    queries = sorted({(n, k, r + d) for t in tables.values() for n, k, r in t for d in (0, 1)} | {(7168, 2050, 16)})
    (tmp_path / "f.cu").write_text(FP8_CARD_PROGRAM.replace("QUERIES", ", ".join(
        "{" + ", ".join(map(str, x)) + "}" for x in queries)))
    res = subprocess.run([NVCC, "-std=c++17", "-O1", f"-I{CUDA_DIR}", str(tmp_path / "f.cu"), "-o",
                          str(tmp_path / "f")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    out = subprocess.run([str(tmp_path / "f")], capture_output=True, text=True, check=True).stdout.splitlines()
    got = {line.split(":")[0]: [int(v) for v in line.split(":")[1].split()] for line in out}
    assert got["card 1"] == [tables["h200"].get(x, 0) for x in queries]
    assert got["card 2"] == [tables["h100"].get(x, 0) for x in queries]
    assert got["card 3"] == got["card 0"] == [0] * len(queries)
    assert sum(a != b for a, b in zip(got["card 1"], got["card 2"])) >= 20  # (the card decides at those rows)
