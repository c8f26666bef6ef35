#!/usr/bin/env bash
# Device diagnosis of the staged tensor-core matmul (matmul_tile.cuh's bulk kernel, 2..64 tokens):
# what limits a block step, by difference. Three checkers of the same tree, timed side by side in
# alternating rounds on the 27B matrices at n = 1, 8, 16, 23 (n = 1 is the dp4a kernel):
#
#   normal     the real kernel                                                  commit+normal
#   act-once   no per-block activation staging (every block reads the first    commit+act-once
#              block's staged codes: -DMM_TILE_DIAG_ACT_ONCE; n = 1 unchanged)
#   load-only  the weight stages, activation staging and fragment reads, no    commit+load-only
#              arithmetic (-DMM_LOAD_ONLY; also strips the dp4a kernel's arithmetic at n = 1)
#
# then the -DMM_TRACE checker's launch timelines at n = 23 (matmul_trace_report.py; the raw
# timelines to $OUT/tile-trace.jsonl.gz when OUT is set) and Nsight Compute on the first bulk-kernel
# launches of a real 23-token forward (stall reasons, occupancy, memory). The two diagnostic
# variants compute wrong results: they only time, and their rows say which they are ("diagnostic").
#
# From the repository root, on the device (rows to $ROWS, the rest to bench.log):
#   SKIP_LLAMA=1 bash tools/device/run_gpu.sh "bash tools/device/diagnose_tile.sh COMMIT"
set -uo pipefail
commit=${1:?COMMIT}
rounds=${DIAG_ROUNDS:-2}
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 1
: "${ROWS:?run from run_gpu.sh (ROWS, MODEL)}" "${MODEL:?run from run_gpu.sh (ROWS, MODEL)}"

bash tools/device/build_checker_variants.sh "$HOME/tile" normal= act-once=-DMM_TILE_DIAG_ACT_ONCE load-only=-DMM_LOAD_ONLY trace=-DMM_TRACE || exit 1
grep -h "mm_tile_bulk_kernel" "$HOME/tile-normal/ptxas-summary.txt" 2>/dev/null | head -8

matrices="ffn_up attn_q ffn_down attn_gate attn_qkv attn_k"
for round in $(seq 1 "$rounds"); do
  for name in normal act-once load-only; do
    echo "=== round $round: $name"
    for m in $matrices; do
      timeout 60 "$HOME/tile-$name/cuda_matmul_check" --no-check --matrix "$m" --batches 1,8,16,23 \
        --json "$ROWS" --commit "$commit+$name" 2>&1 | grep -E "^  $m "
    done
  done
done

echo "=== launch timelines at n = 23"
timeout 90 "$HOME/tile-trace/cuda_matmul_check" --no-check --batches 23 --trace "$HOME/tile-trace.jsonl" > /dev/null 2>&1
python3 tools/device/matmul_trace_report.py "$HOME/tile-trace.jsonl" --copy-gbps 4250 2>&1 | head -80
[ -n "${OUT:-}" ] && gzip -c "$HOME/tile-trace.jsonl" > "$OUT/tile-trace.jsonl.gz"

echo "=== Nsight Compute: the first bulk-kernel launches of a 23-token forward"
metrics='regex:smsp__average_warps_issue_stalled_(long_scoreboard|barrier|wait|short_scoreboard|math_pipe_throttle|not_selected|selected|membar|imc_miss|no_instruction|sleeping|lg_throttle|mio_throttle|branch_resolving|dispatch_stall)_per_issue_active\.ratio'
timeout 150 ncu --clock-control none -k "regex:^mm_tile_bulk" -c 4 --section SpeedOfLight --section Occupancy \
  --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section InstructionStats \
  --metrics "$metrics" python3 tools/device/ncu_step.py --model "$MODEL" --batch 23 2>&1 |
  grep -E "^  [a-z].*\(|stalled|Duration|Throughput|Hit Rate|Issued Warp|Eligible Warps|Active Warps Per|Block Limit|Warp Cycles Per Issued|Mem Busy|Max Bandwidth|Executed Instructions|Registers|Dynamic Shared"
