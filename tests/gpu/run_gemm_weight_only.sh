#!/usr/bin/env bash
# GPU machine: build the kernels, run the weight-only GEMM tests, then its benchmark (table last).
#   tests/gpu/run_gemm_weight_only.sh [OUTDIR] [--quick]   (default OUTDIR: $OUT, else out/gpu)
# Same build seam as tests/gpu/run_all.sh: a libdsx_cuda.so carried in .cutlass/dsx-cache is
# used when its source hash matches; otherwise it is built there (CUTLASS headers from
# .cutlass/nvidia_cutlass-4.2.0.0-*.whl or the installed package).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUTDIR=${1:-${OUT:-out/gpu}}
QUICK=${2:-}
mkdir -p "$OUTDIR"
PY=${PY:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if [ -d .cutlass/dsx-cache ]; then export DSX_CACHE_DIR=$PWD/.cutlass/dsx-cache; fi

{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu --format=csv
  nvcc --version | tail -2
  $PY -c 'import torch; print("torch", torch.__version__)' 2>&1
} > "$OUTDIR/env_wo.txt" 2>&1
cat "$OUTDIR/env_wo.txt"

t0=$(date +%s)
$PY -m ds_export.native.build > "$OUTDIR/build_wo.log" 2>&1 || { echo "CPU build failed"; tail -30 "$OUTDIR/build_wo.log"; exit 1; }
$PY -m ds_export.native.build_cuda >> "$OUTDIR/build_wo.log" 2>&1 || { echo "CUDA build failed"; tail -40 "$OUTDIR/build_wo.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s ($(tail -1 "$OUTDIR/build_wo.log"))"

$PY -m pytest -q -p no:cacheprovider --noconftest tests/gpu/test_gemm_weight_only_cuda.py \
  tests/test_gemm_weight_only_cpu.py 2>&1 | tee "$OUTDIR/tests_wo.log" | tail -25
test_rc=${PIPESTATUS[0]}

$PY bench/gpu_gemm_weight_only.py --out "$OUTDIR" $QUICK 2>&1 | tee "$OUTDIR/bench_wo.log" | grep -v '^{'
bench_rc=${PIPESTATUS[0]}
echo "tests rc=$test_rc bench rc=$bench_rc"
exit $(( test_rc != 0 || bench_rc != 0 ))
