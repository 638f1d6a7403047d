#!/usr/bin/env bash
# GPU machine: build the kernels, run the GPU tests, then the benchmark (table printed last).
#   tests/gpu/run_all.sh [OUTDIR]      (default: $OUT, else out/gpu)
# A prebuilt libdsx_cuda.so carried in .cutlass/dsx-cache is used when its source hash
# matches (ds_export/native/build_cuda.py keys it); otherwise it is rebuilt there, with the
# CUTLASS headers from .cutlass/nvidia_cutlass-4.2.0.0-*.whl or the installed package.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUTDIR=${1:-${OUT:-out/gpu}}
mkdir -p "$OUTDIR"
PY=${PY:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if [ -d .cutlass/dsx-cache ]; then export DSX_CACHE_DIR=$PWD/.cutlass/dsx-cache; fi

{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu --format=csv
  nvcc --version | tail -2
  $PY -c 'import torch; print("torch", torch.__version__)' 2>&1
} > "$OUTDIR/env.txt" 2>&1
cat "$OUTDIR/env.txt"

t0=$(date +%s)
$PY -m ds_export.native.build > "$OUTDIR/build.log" 2>&1 || { echo "CPU build failed"; tail -30 "$OUTDIR/build.log"; }
$PY -m ds_export.native.build_cuda >> "$OUTDIR/build.log" 2>&1 || { echo "CUDA build failed"; tail -40 "$OUTDIR/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s ($(tail -1 "$OUTDIR/build.log"))"

$PY -m pytest -q -p no:cacheprovider --noconftest tests/gpu/test_kernels_cuda.py tests/test_kernels_cpu.py \
  2>&1 | tee "$OUTDIR/tests.log" | tail -25
test_rc=${PIPESTATUS[0]}

$PY bench/gpu_kernels.py --out "$OUTDIR" 2>&1 | tee "$OUTDIR/bench.log" | grep -v '^{'
bench_rc=${PIPESTATUS[0]}
echo "tests rc=$test_rc bench rc=$bench_rc"
exit $(( test_rc != 0 || bench_rc != 0 ))
