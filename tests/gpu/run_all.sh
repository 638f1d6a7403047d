#!/usr/bin/env bash
# GPU machine: build the kernels once, run every GPU test, then every GPU benchmark (tables printed last).
#   tests/gpu/run_all.sh [OUTDIR] [--quick]     (default OUTDIR: $OUT, else out/gpu)
#   NO_BENCH=1 JOBS=15 tests/gpu/run_all.sh OUTDIR   every GPU test, no benchmarks (2179 in 172 s on an H100)
#   SHARD=I/N TESTS="tests/gpu/test_x.py ..." NO_BENCH=1 JOBS=14 tests/gpu/run_all.sh OUTDIR
#       the I-th of N fixed parts of those tests only (tests/gpu/shard.py: N calls run them all, each under the
#       device's 10 minutes), on JOBS pytest-xdist workers (its wheel in .whl/), no benchmarks
# A libdsx_cuda.so carried in .cutlass/dsx-cache is reused when its source hash matches
# (ds_export/native/build_cuda.py keys it); otherwise it is rebuilt here, with the CUTLASS headers from
# .cutlass/nvidia_cutlass-4.2.0.0-*.whl or the installed package. PyYAML for dsx quantize's tests may come
# as a wheel in .whl/ (see the device README).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUTDIR=${1:-${OUT:-out/gpu}}
QUICK=${2:-}
mkdir -p "$OUTDIR"
PY=${PY:-python3}
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if [ -d .cutlass/dsx-cache ]; then export DSX_CACHE_DIR=$PWD/.cutlass/dsx-cache; fi

{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu --format=csv
  nvcc --version | tail -2
  $PY -c 'import torch; print("torch", torch.__version__)' 2>&1
} > "$OUTDIR/env.txt" 2>&1
cat "$OUTDIR/env.txt"

t0=$(date +%s)
$PY -m ds_export.native.build > "$OUTDIR/build.log" 2>&1 || { echo "CPU build failed"; tail -30 "$OUTDIR/build.log"; exit 1; }
$PY -m ds_export.native.build_cuda >> "$OUTDIR/build.log" 2>&1 || { echo "CUDA build failed"; tail -40 "$OUTDIR/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"

args=(-q -p no:cacheprovider --noconftest)
[ -n "${SHARD:-}" ] && args+=(-p shard --shard "$SHARD") && export PYTHONPATH=$PWD/tests/gpu:$PYTHONPATH
# (each worker's host references and CPU kernels on a share of the cores, not an OpenMP / BLAS pool of every core:
# 14 workers on 16 cores had spent 103 CPU-minutes in 6.6 minutes on the two tuned-table files)
if [ -n "${JOBS:-}" ]; then
  args+=(-n "$JOBS")
  share=$(( $(nproc) / JOBS ))
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( share > 1 ? share : 1 ))}
fi
# shellcheck disable=SC2086  # (TESTS: a list of paths)
$PY -m pytest "${args[@]}" ${TESTS:-tests/gpu/} 2>&1 | tee "$OUTDIR/tests${SHARD:+-${SHARD/\//-of-}}.log" | tail -25
test_rc=${PIPESTATUS[0]}
if [ -n "${NO_BENCH:-}" ]; then echo "tests rc=$test_rc (no benchmarks)"; exit $(( test_rc != 0 )); fi

bench_rc=0
for b in bench/gpu_kernels.py bench/gpu_gemm_weight_only.py bench/gpu_mla_decode.py bench/gpu_quant.py; do
  name=$(basename "$b" .py)
  extra="$QUICK"
  [ "$name" = gpu_quant ] && extra=""  # no quick mode
  $PY "$b" --out "$OUTDIR" $extra 2>&1 | tee "$OUTDIR/$name.log" | grep -v '^{'
  [ "${PIPESTATUS[0]}" = 0 ] || bench_rc=1
done
# The weight-only step-loop probe (bench/wo_loop_probe.cu): mma.sync against wgmma with register A and against int8
# tensor cores, checked and timed.
if nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc/cuda bench/wo_loop_probe.cu -o /tmp/dsx_loop_probe \
    > "$OUTDIR/wo_loop_probe.log" 2>&1; then
  /tmp/dsx_loop_probe 2>&1 | tee -a "$OUTDIR/wo_loop_probe.log" | tail -60
  [ "${PIPESTATUS[0]}" = 0 ] || bench_rc=1
else
  echo "wo_loop_probe build failed"; tail -20 "$OUTDIR/wo_loop_probe.log"; bench_rc=1
fi
echo "tests rc=$test_rc bench rc=$bench_rc"
exit $(( test_rc != 0 || bench_rc != 0 ))
