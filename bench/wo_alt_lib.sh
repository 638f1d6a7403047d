#!/bin/sh
# Build the weight-only GEMM alone as a shared library (the C entry dsx_wo_gemm_bf16_nt_cuda),
# for `bench/gpu_gemm_weight_only.py --alt-lib / --diag-lib`: timed beside the current build.
# Usage (from the repository root; needs nvcc):
#   bench/wo_alt_lib.sh REV OUT.so [nvcc flags]   REV: a git revision, or . for the working tree
# e.g. bench/wo_alt_lib.sh HEAD old.so; bench/wo_alt_lib.sh . nomath.so -DDSX_WO_NOMATH
set -e
rev=${1:?revision or .}; out=${2:?output .so}; shift 2
tmp=$(mktemp -d)
if [ "$rev" = . ]; then
  mkdir -p "$tmp/csrc"; cp -r csrc/include csrc/cuda "$tmp/csrc/"
else
  # (sm90_ptx.cuh: the shared PTX helpers the kernel includes since 87365bb; gemm_weight_only_ws.cuh:
  # the warp-specialized path, tenth session; gemm_weight_only_tuned.inc: its measured table, seventeenth
  # session; tuned_tables.cuh: the DSX_TUNED_TABLES switch, eighteenth; each absent before)
  for f in csrc/cuda/gemm_weight_only.cu csrc/cuda/gemm_weight_only.cuh csrc/include/dsx.h \
           $(git ls-tree --name-only "$rev" csrc/include/dsx/ csrc/cuda/sm90_ptx.cuh csrc/cuda/gemm_weight_only_ws.cuh \
             csrc/cuda/gemm_weight_only_tuned.inc csrc/cuda/tuned_tables.cuh); do
    mkdir -p "$tmp/$(dirname "$f")"
    git show "$rev:$f" > "$tmp/$f"
  done
fi
nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Xcompiler -fPIC -shared -cudart shared "$@" \
  -I"$tmp/csrc/include" -I"$tmp/csrc/cuda" "$tmp/csrc/cuda/gemm_weight_only.cu" -o "$out"
rm -rf "$tmp"
