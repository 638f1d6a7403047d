"""bench/wo_loop_layout.h: the step-loop probe's operand layouts, checked on the CPU.

The probe (bench/wo_loop_probe.cu, run on the GPU machine) feeds one weight image to the weight-only
kernel's mma.sync step and to a wgmma step whose x sits in the wgmma's canonical layout; its verdict is
only worth something if the two x images hold the same x behind every logical k. Here a host emulation
gathers each path's operands exactly as its lanes and descriptor would and must reproduce a float64
reference of sum_k w[ch][k] x[tok][k]; planted faults (descriptor offsets swapped, the mma image read
through the descriptor, nibble halves swapped) must be caught.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
CXX = shutil.which("g++") or shutil.which("c++")
pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler")

MAIN = r"""
#include <cstdlib>
#include "wo_loop_layout.h"
int main(int argc, char** argv) {
  const wo_loop::Shape sh{std::atoi(argv[1]), std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4])};
  std::printf("%d\n", wo_loop::selftest(sh, std::atoi(argv[5]) != 0, std::atoi(argv[6])));
  return 0;
}
"""


@pytest.fixture(scope="module")
def selftest(tmp_path_factory):
    d = tmp_path_factory.mktemp("wo_loop")
    (d / "main.cpp").write_text(MAIN)
    exe = d / "selftest"
    res = subprocess.run([CXX, "-std=c++17", "-O2", f"-I{BENCH}", str(d / "main.cpp"), "-o", str(exe)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]

    def run(warps: int, ct: int, mt: int, steps: int, wg: bool, fault: int) -> int:
        out = subprocess.run([str(exe), str(warps), str(ct), str(mt), str(steps), str(int(wg)), str(fault)],
                             capture_output=True, text=True, check=True)
        return int(out.stdout)

    return run


@pytest.mark.parametrize("mt", [1, 2])
@pytest.mark.parametrize("ct", [1, 2, 4])
@pytest.mark.parametrize("wg", [False, True], ids=["mma", "wgmma"])
def test_both_layouts_hold_the_same_x_behind_every_logical_k(selftest, wg, ct, mt):
    assert selftest(4, ct, mt, 2, wg, 0) == 0


@pytest.mark.parametrize("fault,wg", [(1, True), (2, True), (3, True), (3, False)],
                         ids=["descriptor-offsets-swapped", "mma-image-through-descriptor", "nibbles-swapped-wg",
                              "nibbles-swapped-mma"])
def test_planted_faults_are_caught(selftest, fault, wg):
    outputs = 4 * 2 * 2 * 32 * 4  # tiles x token tiles x lanes x accumulator elements
    assert selftest(4, 2, 2, 2, wg, fault) > outputs // 2
