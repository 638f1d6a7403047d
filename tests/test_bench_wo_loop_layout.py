"""bench/wo_loop_layout.h: the step-loop probe's operand layouts, checked on the CPU.

The probe (bench/wo_loop_probe.cu, run on the GPU machine) feeds one weight image to the weight-only
kernel's mma.sync step and to a wgmma step whose x sits in the wgmma's canonical layout; its verdict is
only worth something if the two x images hold the same x behind every logical k. Here a host emulation
gathers each path's operands exactly as its lanes and descriptor would and must reproduce a float64
reference of sum_k w[ch][k] x[tok][k]; planted faults (descriptor offsets swapped, the mma image read
through the descriptor, nibble halves swapped) must be caught. The int8 paths (x in two int8 pieces, the nibbles as
unsigned bytes, mma.sync m16n8k32 fragments as PTX defines them) are emulated the same way against the reference of
what their x image stands for, with their own planted faults.
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
  const int path = std::atoi(argv[5]), fault = std::atoi(argv[6]);  // path 0 mma, 1 wgmma, 4 / 5 the int8 paths
  std::printf("%d\n", path >= 4 ? wo_loop::selftest_i8(sh, path == 5, fault) : wo_loop::selftest(sh, path != 0, fault));
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

    def run(warps: int, ct: int, mt: int, steps: int, wg: bool | int, fault: int) -> int:
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


@pytest.mark.parametrize("mt", [1, 2])
@pytest.mark.parametrize("ct", [1, 2])
@pytest.mark.parametrize("path", [4, 5], ids=["imma-tok", "imma-step"])
def test_int8_paths_sum_what_their_x_image_stands_for(selftest, path, ct, mt):
    assert selftest(2, ct, mt, 3, path, 0) == 0


@pytest.mark.parametrize("fault", [1, 2, 3], ids=["token-swap-left-out", "nibble-chains-swapped", "pieces-swapped"])
@pytest.mark.parametrize("path", [4, 5], ids=["imma-tok", "imma-step"])
def test_int8_planted_faults_are_caught(selftest, path, fault):
    outputs = 2 * 2 * 2 * 32 * 4
    assert selftest(2, 2, 2, 2, path, fault) >= outputs // 2


def test_int8_image_rounds_x_to_a_few_parts_in_a_hundred_thousand(tmp_path):
    """x in two int8 pieces, S (h + l / 254), is within S / 508 of the bf16 x, S = a scope's |x| max / 127 (per
    token, or per token and step): checked on the image's own xt, element by element."""
    src = tmp_path / "q.cpp"
    src.write_text(r"""
#include "wo_loop_layout.h"
int main() {
  const wo_loop::Shape sh{2, 1, 2, 3};
  const wo_loop::Data d = wo_loop::make_data(sh, 5);
  int bad = 0;
  for (int per_step = 0; per_step < 2; ++per_step) {
    const wo_loop::XI8 q = wo_loop::make_xi8(sh, d, per_step);
    for (int tok = 0; tok < sh.tokens(); ++tok)
      for (int k = 0; k < sh.k(); ++k) {
        const double S = 4064.0 * q.sc[per_step ? (k / wo_loop::kStepK) * sh.tokens() + tok : tok];
        const double x = wo_loop::bf16_to_f32(d.x[tok * sh.k() + k]);
        if (!(std::fabs(q.xt[tok * sh.k() + k] - x) <= S / 508 * (1 + 1e-9)) || S <= 0) ++bad;
      }
  }
  std::printf("%d\n", bad);
}
""")
    exe = tmp_path / "q"
    res = subprocess.run([CXX, "-std=c++17", "-O2", f"-I{BENCH}", str(src), "-o", str(exe)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    assert subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.strip() == "0"
