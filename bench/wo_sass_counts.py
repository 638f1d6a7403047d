"""Instruction counts of the weight-only GEMM's step loops in a build's SASS (no GPU needed).

For each kernel instance whose mangled name matches REGEX: the span from its first to its last tensor-core
instruction (HMMA, or HGMMA in the wgmma consumers; the unrolled step loop lies inside it), their count, the
register moves (IMAD.MOV.U32 and MOV, which the compiler adds where an mma operand pair comes from two different
loads), the shared-memory loads by width, and the total; "in loops" counts the moves inside the step loops only
(between mma at most LOOP_GAP apart). A step loop that pays for moves or extra loads shows here before any GPU time
is spent (forty-third session: int4 group 64's loop had about 50 moves a step at two tiles a warp and two token
tiles, group 128's none; the forty-fourth took them out, 5-9% at 9..16 rows). CI keeps it so:
tests/test_gemm_weight_only_cuda_compile.py checks every kernel instance's loop moves with this module (at most one
per four mma) and that a planted split operand pair is caught.

    bench/wo_alt_lib.sh . /tmp/wo.so
    python3 bench/wo_sass_counts.py /tmp/wo.so 'wo_gemm_ws_kernelILi4ELi2ELi2ELi2E'

The disassembler comes from PyPI (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm, or --target DIR with
DSX_SASS_TOOLS=DIR), or from $CUOBJDUMP / $NVDISASM_PATH.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

OP = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)")


def find_tool(name: str) -> Path | None:
    """`name` from the environment, PATH, DSX_SASS_TOOLS or an installed nvidia-cuda-* wheel (nvidia/cu*/bin)."""
    env = os.environ.get("CUOBJDUMP" if name == "cuobjdump" else "NVDISASM_PATH", "")
    if env:
        p = Path(env)
        return p if p.is_file() else (p / name if (p / name).is_file() else None)
    if shutil.which(name):
        return Path(shutil.which(name))
    roots = [Path(os.environ["DSX_SASS_TOOLS"])] if os.environ.get("DSX_SASS_TOOLS") else []
    roots += [Path(p) for p in sys.path if p]
    for root in roots:
        for hit in sorted(root.glob(f"nvidia/cu*/bin/{name}")):
            return hit
    return None


def sass_functions(lib: Path) -> dict[str, list[str]]:
    """{mangled name: instruction lines} of every function in the build."""
    cuobjdump, nvdisasm = find_tool("cuobjdump"), find_tool("nvdisasm")
    if cuobjdump is None or nvdisasm is None:
        raise SystemExit("wo_sass_counts: cuobjdump / nvdisasm not found; pip install nvidia-cuda-cuobjdump "
                         "nvidia-cuda-nvdisasm (or set CUOBJDUMP and NVDISASM_PATH)")
    env = dict(os.environ, NVDISASM_PATH=str(nvdisasm.parent), PATH=f"{nvdisasm.parent}:{os.environ.get('PATH', '')}")
    out = subprocess.run([str(cuobjdump), "-sass", str(lib)], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise SystemExit(f"wo_sass_counts: cuobjdump failed on {lib}: {out.stderr.strip()[:300]}")
    funcs = {}
    for part in re.split(r"\n\s+Function : ", out.stdout)[1:]:
        name, body = part.split("\n", 1)
        funcs[name.strip()] = [m.group(1) for m in map(OP.search, body.split("\n")) if m]
    return funcs


MOVES = ("IMAD.MOV.U32", "MOV")
# Consecutive mma (HMMA, HGMMA) at most this many instructions apart belong to one step loop (its mma, unpacking and
# loads); the code between loops (a producer warp's part, barriers, epilogues) lies in wider gaps and keeps its
# moves out of `loop_moves` (the forty-fourth session: the fold instances' 42-45 moves all sit between their loops).
LOOP_GAP = 48
MMA = ("HMMA", "HGMMA")  # mma.sync and wgmma (the WG consumers at 17..64 rows)


def loop_counts(ops: list[str]) -> dict | None:
    """Counts over the first..last tensor-core instruction's span (HMMA or HGMMA: `mma`), or None where the function has
    none; `loop_moves` counts the moves between consecutive ones at most LOOP_GAP instructions apart only (the step
    loops)."""
    idx = [i for i, op in enumerate(ops) if op.startswith(MMA)]
    if not idx:
        return None
    span = collections.Counter(ops[idx[0]:idx[-1] + 1])
    loop_moves = sum(sum(op in MOVES for op in ops[a:b]) for a, b in zip(idx, idx[1:]) if b - a <= LOOP_GAP)
    return {"span": idx[-1] - idx[0] + 1, "mma": len(idx),
            "moves": sum(span[m] for m in MOVES), "loop_moves": loop_moves,
            "lds": {k[4:] or "32": v for k, v in sorted(span.items()) if k.startswith("LDS")}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("lib", type=Path, help="a build (bench/wo_alt_lib.sh) or any CUDA shared library")
    ap.add_argument("regex", nargs="?", default="wo_gemm", help="mangled-name filter (default wo_gemm)")
    args = ap.parse_args(argv)
    pat = re.compile(args.regex)
    shown = 0
    for name, ops in sass_functions(args.lib).items():
        if not pat.search(name):
            continue
        c = loop_counts(ops)
        if c is None:
            continue
        short = re.sub(r"^_ZN\d+_GLOBAL__N__\w+?_cu_[0-9a-f]+\d+", "", name)
        print(f"{short[:100]:100s} span {c['span']:4d} mma {c['mma']:3d} moves {c['moves']:3d} "
              f"(in loops {c['loop_moves']:3d}) lds {c['lds']}")
        shown += 1
    if not shown:
        print(f"wo_sass_counts: no function with HMMA or HGMMA matches {args.regex!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
