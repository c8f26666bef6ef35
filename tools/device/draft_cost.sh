#!/usr/bin/env bash
# A run_gpu.sh bench command: the speculative loop with the synthetic 27B-shape DFlash draft's cost
# (bench_gpu_e2e --draft-cost) at 6 accepted tokens per step, recorded steps on and off, and the
# ops check (cuda_ops_check: attention, elementwise and logits ops against the CPU's). The draft is
# written first when it is not there (write_draft.sh, about 30 s). Usage:
#   bash tools/device/run_gpu.sh "bash tools/device/draft_cost.sh COMMIT [REPS]"
set -u
commit=${1:?COMMIT}
reps=${2:-2}
: "${ROWS:?run from run_gpu.sh (ROWS, MODEL)}" "${MODEL:?run from run_gpu.sh (ROWS, MODEL)}"
cd "$(dirname "$0")/../.." || exit 1
( bash tools/device/cuda_ops_check/build.sh "$(dirname "$(dirname "$SPECLA_LIBRARY")")" "$HOME/ops-check" \
    > "$HOME/ops-check.log" 2>&1; echo $? > "$HOME/ops-check.rc" ) &
draft=$(bash tools/device/write_draft.sh) || { echo "draft_cost.sh: the draft was not written"; exit 1; }
wait
if [ "$(cat "$HOME/ops-check.rc")" = 0 ]; then
  timeout 120 "$HOME/ops-check" 2>&1 | grep -E "FAIL|FAILURES|topk first|window" | tail -12
else
  echo "cuda_ops_check did not build"; tail -20 "$HOME/ops-check.log"
fi
python3 tools/bench_gpu_e2e.py --model "$MODEL" --device cuda --draft-cost "$draft" --targets 6 --recorded on,off \
  --reps "$reps" --modes plain,ddtree+specla --commit "$commit" --out "$ROWS" 2>&1 | tail -10
