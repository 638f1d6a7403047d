#!/bin/sh
# The sha256 of the weight-only GEMM's sources under ROOT (csrc/include and csrc/cuda, files in byte order of their
# paths): what bench/wo_alt_lib.sh records beside a build (OUT.so.src) and bench/wo_retune.sh checks BASE_SO against.
#   bench/wo_src_hash.sh [ROOT]   (default .)
set -e
cd "${1:-.}"
find csrc/include csrc/cuda -type f | LC_ALL=C sort | xargs cat | sha256sum | cut -d' ' -f1
