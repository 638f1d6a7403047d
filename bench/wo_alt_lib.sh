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
  mkdir -p "$tmp/csrc"; cp -r csrc/CMakeLists.txt csrc/include csrc/cuda "$tmp/csrc/"
else
  # (every source of csrc/include and csrc/cuda at REV: the weight-only GEMM's set of files has grown over the
  # sessions, sm90_ptx.cuh, the warp-specialized path, its table and host side, the kernels' header; and
  # CMakeLists.txt, part of the source key that wo_src_hash.sh records)
  git archive "$rev" csrc/CMakeLists.txt csrc/include csrc/cuda | tar -x -C "$tmp"
fi
nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Xcompiler -fPIC -shared -cudart shared "$@" \
  -I"$tmp/csrc/include" -I"$tmp/csrc/cuda" "$tmp/csrc/cuda/gemm_weight_only.cu" -o "$out"
# OUT.so.src: what it was built from (the sources' hash and the flags), so that a build made elsewhere can be checked
# against a tree before it stands for it (bench/wo_retune.sh's BASE_SO)
{ "$(dirname "$0")/wo_src_hash.sh" "$tmp"; echo "flags: $*"; } > "$out.src"
rm -rf "$tmp"
