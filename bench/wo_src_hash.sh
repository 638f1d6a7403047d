#!/bin/sh
# The source key of csrc under ROOT (ds_export.native.build_cuda.cuda_source_key: CMakeLists.txt, include/ and cuda/,
# the nvcc release, the CUTLASS version; the key that names the full library's build cache): what bench/wo_alt_lib.sh
# records beside a build (OUT.so.src) and bench/wo_retune.sh checks BASE_SO against.
#   bench/wo_src_hash.sh [ROOT]   (default .)
set -e
repo=$(cd "$(dirname "$0")/.." && pwd)
PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" python3 -c \
  'import sys; from pathlib import Path; from ds_export.native.build_cuda import cuda_source_key; print(cuda_source_key(Path(sys.argv[1]) / "csrc"))' \
  "${1:-.}"
