#!/usr/bin/env bash
# A run_gpu.sh bench command: an A/B of the DFlash draft's proposal alone (tools/bench_draft_head.py:
# one recorded 16-row block after a 100-token prompt, top-4 over the reduced head and the whole one,
# median of REPEATS calls each) on the 27B-shape speed-only target and its synthetic F16 draft
# (write_draft.sh), through ab_variants.sh with no bench_gpu run: interleaved rounds, rows with commit
# COMMIT+NAME. Quieter than the draft_ms of a speculative loop (ab_draft_cost.sh: one run of 47 steps,
# ten per cent apart between rounds of one library), for a change that only moves the draft.
#   bash tools/device/run_gpu.sh "bash tools/device/ab_draft_propose.sh COMMIT ROUNDS NAME=SPEC ..."
# (SPEC as ab_variants.sh takes it, e.g. lib:PATH.so.gz built by prebuild.sh with other options;
# AB_PYTEST and AB_CHECKS pass through.)
set -u
commit=${1:?COMMIT} rounds=${2:?ROUNDS}
shift 2
: "${ROWS:?run from run_gpu.sh (ROWS, MODEL)}" "${MODEL:?run from run_gpu.sh (ROWS, MODEL)}"
cd "$(dirname "$0")/../.." || exit 1
DRAFT=$(bash tools/device/write_draft.sh) || { echo "ab_draft_propose.sh: the draft was not written"; exit 1; }
export DRAFT REPEATS=${REPEATS:-20}
export AB_EXTRA='python3 tools/bench_draft_head.py --target "$MODEL" --device cuda --draft "$DRAFT" --repeats "$REPEATS" --commit "$AB_LABEL" --out "$ROWS" | grep dflash-propose'
bash tools/device/ab_variants.sh "$commit" "$rounds" - "$@"
