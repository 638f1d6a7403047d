"""bench/ncu_regions.py: Nsight Compute's per-SASS warp samples summed by region, on a source page it is given
(the layout `ncu --page source --csv --print-source sass` writes: a kernel-name row, a header row, one row an
instruction)."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import ncu_regions  # noqa: E402

BASE = 0x7F0000001000
HDR = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
       "# Samples", "Instructions Executed", "stall_long_sb", "stall_math", "stall_wait",
       "stall_long_sb (Not Issued)", "stall_math (Not Issued)", "stall_wait (Not Issued)"]


def write_page(path: Path, insts: list[tuple[str, int, int, int, int, int]]) -> None:
    """insts: (source, samples, executed, long_sb, math, wait), 16 bytes apart from BASE."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "void k<(int)4>(P)", ""])
        w.writerow(HDR)
        for i, (src, n, ex, lsb, math, wait) in enumerate(insts):
            w.writerow([hex(BASE + 16 * i), f"      {src}", n, n, n, ex, lsb, math, wait, lsb, math, wait])


# Offsets: 0x00 setup, 0x10..0x30 a loop (its backward branch at 0x30 to 0x10), 0x40 the tail.
PAGE = [("LDC R1, c[0x0][0x28]", 2, 10, 0, 0, 2),
        ("LDS.128 R4, [R2]", 10, 100, 10, 0, 0),
        ("HMMA.16816.F32.BF16 R8, R4, R6, R8", 30, 100, 0, 24, 6),
        (f"@!P0 BRA {BASE + 0x10:#x}", 6, 100, 0, 0, 6),
        ("EXIT", 2, 10, 2, 0, 0)]


def test_regions_cut_at_the_loop_and_shares_add_up(tmp_path, capsys):
    p = tmp_path / "page.csv"
    write_page(p, PAGE)
    kernel, base, insts = ncu_regions.read(str(p))
    assert kernel == "void k<(int)4>(P)" and base == BASE
    assert [i.off for i in insts] == [0, 0x10, 0x20, 0x30, 0x40]
    assert ncu_regions.loop_regions(base, insts) == [(0, 0x10), (0x10, 0x40), (0x40, 0x50)]
    assert ncu_regions.main([str(p)]) == 0
    out = capsys.readouterr().out
    assert "50 samples over 5 instructions" in out
    assert "math 48.0" in out  # 24 of 50 samples, the leading reason
    loop = next(line for line in out.splitlines() if line.strip().startswith("10:40"))
    assert "92.0%" in loop and "     100" in loop  # (10 + 30 + 6) / 50; executed 100 times
    assert ncu_regions.main([str(p), "0:20", "20:50", "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert " 24.0%" in out and " 76.0%" in out
    assert out.strip().splitlines()[-1].startswith("    20  60.0%")  # the top instruction: the HMMA


def test_bad_pages_are_one_line_errors(tmp_path, capsys):
    p = tmp_path / "details.csv"
    p.write_text('"ID","Kernel Name","Metric Name"\n')
    assert ncu_regions.main([str(p)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no 'Address' header row" in err
    assert ncu_regions.main([str(tmp_path / "missing.csv")]) == 2
    write_page(p, [(src, 0, ex, 0, 0, 0) for src, _, ex, *_ in PAGE])
    assert ncu_regions.main([str(p)]) == 2
    assert "no warp samples" in capsys.readouterr().err
