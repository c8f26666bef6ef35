#!/usr/bin/env bash
# A run_gpu.sh bench command: an A/B of whole speculative steps with the draft's cost. Writes the
# synthetic 27B-shape DFlash draft (write_draft.sh), then runs ab_variants.sh over the variants with
# decode only for bench_gpu and, per variant and round, bench_gpu_e2e --draft-cost at 6 accepted
# tokens per step (recorded steps; its rows carry the draft, tree, verify and accept ms per step).
#   bash tools/device/run_gpu.sh "bash tools/device/ab_draft_cost.sh COMMIT ROUNDS NAME=SPEC ..."
# (SPEC as ab_variants.sh takes it: a patch, env:VAR=VALUE or lib:PATH; AB_PYTEST and AB_CHECKS pass through.)
set -u
commit=${1:?COMMIT} rounds=${2:?ROUNDS}
shift 2
: "${ROWS:?run from run_gpu.sh (ROWS, MODEL)}" "${MODEL:?run from run_gpu.sh (ROWS, MODEL)}"
cd "$(dirname "$0")/../.." || exit 1
DRAFT=$(bash tools/device/write_draft.sh) || { echo "ab_draft_cost.sh: the draft was not written"; exit 1; }
export DRAFT
export AB_EXTRA='python3 tools/bench_gpu_e2e.py --model "$MODEL" --device cuda --draft-cost "$DRAFT" --targets 6 --recorded on --reps 1 --modes ddtree+specla --commit "$AB_LABEL" --out "$ROWS"'
bash tools/device/ab_variants.sh "$commit" "$rounds" "--batches 1 --depths 0 --reps 3" "$@"
