#!/usr/bin/env bash
# Device diagnosis of the quantized matmuls in one run_gpu.sh bench command: where a launch's time
# goes, split three ways, per benchmarked matrix of the 27B shape. Its length alone was never timed:
# at fcad2f0 it ran after an A/B inside one 330 s step, and part 4 was cut off (give it a step of its
# own, BENCH_STEP_S=500 or more).
#
#   1. the normal checker's benchmark at n = 1 and 23, with each matrix's read probe (a launch that
#      only reads the same bytes: the floor of a launch that size)                  kernel "dp4a"...
#   2. the -DMM_LOAD_ONLY checker at n = 1: the one-token kernel's loads, prefetch and unit mapping
#      without its arithmetic                                                        load_only 1
#   3. the -DMM_TRACE checker: per-unit start, wait and end times of every launch (matmul_trace_report)
#   4. Nsight Compute on the first two launches of each matmul kernel in a real 23-token forward
#      (tools/device/ncu_step.py): stall reasons, occupancy, DRAM and L2 throughput, L2 hit rate
#
# (1) and (2) append JSON rows to ROWS (commit COMMIT); the rest goes to stdout (run_gpu.sh's
# bench.log). From the repository root, on the device:
#   SKIP_LLAMA=1 SKIP_PYTEST=1 bash tools/device/run_gpu.sh "bash tools/device/diagnose_matmul.sh COMMIT"
set -uo pipefail
commit=${1:?COMMIT}
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 1
: "${ROWS:?run from run_gpu.sh (ROWS, MODEL)}" "${MODEL:?run from run_gpu.sh (ROWS, MODEL)}"

bash tools/device/build_checker_variants.sh "$HOME/diag" normal= load-only=-DMM_LOAD_ONLY trace=-DMM_TRACE || exit 1

echo "=== 1. benchmark with read probes (n = 1, 23)"
timeout 150 "$HOME/diag-normal/cuda_matmul_check" --no-check --batches 1,23 --json "$ROWS" --commit "$commit"
echo "=== 2. load-only one-token kernel"
timeout 100 "$HOME/diag-load-only/cuda_matmul_check" --no-check --batches 1 --json "$ROWS" \
  --commit "$commit+load-only"
echo "=== 3. launch timelines"
timeout 100 "$HOME/diag-trace/cuda_matmul_check" --no-check --batches 1,23 --trace "$HOME/diag-trace.jsonl" > /dev/null 2>&1
python3 tools/device/matmul_trace_report.py "$HOME/diag-trace.jsonl" --copy-gbps 4250 2>&1 | head -60
echo "=== 4. Nsight Compute"
metrics='regex:smsp__average_warps_issue_stalled_(long_scoreboard|barrier|wait|short_scoreboard|math_pipe_throttle|not_selected|selected|membar|imc_miss|no_instruction|sleeping|lg_throttle|mio_throttle)_per_issue_active\.ratio'
for kernel in '^mm_kernel' '^mm_tile_bulk'; do
  timeout 120 ncu --clock-control none -k "regex:$kernel" -c 2 --section SpeedOfLight --section Occupancy \
    --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --metrics "$metrics" \
    python3 tools/device/ncu_step.py --model "$MODEL" --batch 23 2>&1 |
    grep -E "^  [a-z].*\(|stalled|Duration|Throughput|Hit Rate|Issued Warp|Eligible Warps|Active Warps Per|Block Limit|Warp Cycles Per Issued|Mem Busy|Max Bandwidth"
done
