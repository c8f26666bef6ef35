#!/usr/bin/env bash
# Device experiment: the isolated matmul benchmark (tools/cuda_matmul_check.cu, no checks) built
# with several MM_TARGET_UNITS (the plan's work-unit target: it sets the chunk count per matrix,
# hence the summation order, and the tail of the last wave of warps). Rows to OUT (JSON lines,
# each carrying target_units), tables to stdout.
#
#   bash tools/device/matmul_plan_sweep.sh OUT.jsonl COMMIT "1024 2048 4096 8192" [BATCHES] [MATRICES]
#
# MATRICES (space-separated benchmark shape names, e.g. "draft_kv draft_q draft_up draft_down" with
# BATCHES 1,16,23 for the DFlash draft's F16 matrices) times only those shapes, one checker run each;
# without it every shape is timed. PLAN_DEFINE names the target to vary (default MM_TARGET_UNITS,
# every type's; MM_TARGET_UNITS_FLOAT varies F16/BF16's alone, matmul_blocks.h):
#   PLAN_DEFINE=MM_TARGET_UNITS_FLOAT bash tools/device/matmul_plan_sweep.sh OUT C "512 768 1024" 16 "draft_q draft_up"
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?OUT.jsonl}; commit=${2:?COMMIT}; units=${3:-"1024 2048 4096 8192"}; batches=${4:-1,23}; matrices=${5:-}
define=${PLAN_DEFINE:-MM_TARGET_UNITS}
case "$define" in
  MM_TARGET_UNITS | MM_TARGET_UNITS_FLOAT) ;;
  *) echo "matmul_plan_sweep.sh: PLAN_DEFINE must be MM_TARGET_UNITS or MM_TARGET_UNITS_FLOAT (got '$define')" >&2; exit 2 ;;
esac
# the CPU library once; each variant builds only the checker
for u in $units; do
  build=$HOME/cuda-check-$define-$u
  EXTRA_NVCC_FLAGS="-D$define=$u" bash "$root/tools/device/build_cuda_checks.sh" "$build" 90 > "$build.log" 2>&1 &
done
wait
for u in $units; do
  build=$HOME/cuda-check-$define-$u
  if [ -x "$build/cuda_matmul_check" ]; then
    echo "=== $define=$u"
    if [ -z "$matrices" ]; then
      "$build/cuda_matmul_check" --no-check --batches "$batches" --json "$out" --commit "$commit"
    else
      for m in $matrices; do
        "$build/cuda_matmul_check" --no-check --matrix "$m" --batches "$batches" --json "$out" --commit "$commit"
      done
    fi
  else
    echo "=== $define=$u: build failed"; tail -5 "$build.log"
  fi
done
