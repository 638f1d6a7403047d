#!/bin/sh
# Build the weight-only GEMM's diagnostic variants (bench/wo_alt_lib.sh, here: needs nvcc, no GPU) for one
# bench/wo_ab.sh call on the GPU machine, so that one call says where a kernel's time goes:
#   base      the tree as is (the reference the others are timed against)
#   noshift   the int4 unpack without its shifts (48 of the 9..16-row step loop's 252 instructions)
#   noadd     ... without its - 136 (64 of them)
#   nounpack  the raw weight words to the mma (no unpack at all)
#   nomma     the operands consumed by a few CUDA-core instructions instead of the mma
#   nomath    no arithmetic: the weight and x streams alone
# All but base compute wrong values: timing only. Usage (from the repository root):
#   bench/wo_diag_libs.sh DIR [names...]       (base and the names given; default: every variant above)
# then, on the GPU machine ($OUT set), the line it prints, e.g.
#   NEW=DIR/base.so OLD=DIR/base.so LIBS=DIR/noshift.so,... SHAPES=36864x7168 MS=1,9,16 bench/wo_ab.sh
# Twenty-ninth session (H200, 36864x7168 int4 per channel, us): base M = 9 / 16 47.01 / 49.52, noshift 43.76 / 45.09.
# Thirtieth session (same shape, another run): base M = 9 / 16 48.13 / 49.30, noadd 44.83 / 45.62.
set -e
dir=${1:?output directory}; shift
names="base ${*:-noshift noadd nounpack nomma nomath}"  # (base always: the printed line times the others against it)
flags_of() {
  case $1 in
    base) echo "" ;;
    noshift) echo -DDSX_WO_DIAG_NOSHIFT ;;
    noadd) echo -DDSX_WO_DIAG_NOADD ;;
    nounpack) echo -DDSX_WO_DIAG_NOUNPACK ;;
    nomma) echo -DDSX_WO_DIAG_NOMMA ;;
    nomath) echo -DDSX_WO_NOMATH ;;
    *) echo "unknown variant: $1 (noshift noadd nounpack nomma nomath)" >&2; return 2 ;;
  esac
}
for n in $names; do flags_of "$n" > /dev/null || exit 2; done  # (every name checked before the first build)
mkdir -p "$dir"
here=$(dirname "$0")
libs=""
for n in $names; do
  "$here/wo_alt_lib.sh" . "$dir/$n.so" $(flags_of "$n")
  [ "$n" = base ] || libs="${libs:+$libs,}$dir/$n.so"
done
echo "NEW=$dir/base.so OLD=$dir/base.so LIBS=$libs"
