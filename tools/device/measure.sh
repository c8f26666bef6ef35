#!/usr/bin/env bash
# A run_gpu.sh bench command that measures one commit the way docs/perf.md's passes report it, in
# one device call beside llama.cpp's llama-bench (which run_gpu.sh builds in the background and runs
# last):
#
#   SKIP_PYTEST=1 BUDGET_S=560 LLAMA_RESERVE_S=35 BENCH_STEP_S=470 \
#     bash tools/device/run_gpu.sh "bash tools/device/measure.sh COMMIT"
#
# (348 s of wall time on an H200 at 8d1e586, before the two profiles at the end were added, about
# 30-40 s more). llama.cpp's build took 322 s on the H200 machine (8d1e586) and 233 s on an H100 one
# (d659771), so a call that is to time llama-bench needs a BUDGET_S near 520; with less, run_gpu.sh
# does not start the build (LLAMA_BUILD_MIN_S) and the wait below ends at once. A carried llama-bench
# (tools/device/prebuild_llama_bench.sh, .device/llama-bench.gz) needs no build: then the budget is
# what our own parts take. The GPU-timed parts
# run first, while llama.cpp builds:
# bench_gpu (decode, the N-token curve at depth 0 and 4096), bench_specla (the SpecLA ops, 1 and 48
# layers), cuda_matmul_check (every check, then the draft's and two small attention matrices),
# cuda_ops_check (attention, elementwise and logits ops against the CPU's, bit identities). The
# host-timed parts (bench_gpu_spec's accept, bench_gpu_e2e's tree / accept / host) wait for that build
# to end, at most 150 s, so that they run on an idle host; the e2e runs 256 tokens at 4, 6 and 8
# accepted a step, then 1024 at 6, recorded. The synthetic DFlash draft of the 27B shape
# is written on the device meanwhile (31 s) for the e2e run with the draft's cost. Rows go to $ROWS
# with commit COMMIT (the device's .git is the session's first commit, so it is passed in). The draft-cost
# run takes recorded steps on and off (the draft's proposals follow the target context's setting).
# Last, profile_gpu_step's per-kernel rows of a decode step and of the verify (kernels serialized).
# MEASURE_CHECKS=0 leaves out the two checkers (cuda_matmul_check, cuda_ops_check) and their builds:
# a call with a carried library (run_gpu.sh's PREBUILT_ONLY=1) has no build tree for them to link, and
# waiting for their builds held the timed parts back 130 s of d659771's 324 on an H100 (from the
# cuda_matmul_check stage to the llama.cpp wait).
set -u
commit=${1:?COMMIT}
: "${ROWS:?run from run_gpu.sh (ROWS, MODEL)}" "${MODEL:?run from run_gpu.sh (ROWS, MODEL)}"
cd "$(dirname "$0")/../.." || exit 1
t0=$(date +%s)
stage() { echo "=== [+$(( $(date +%s) - t0 ))s] $*"; }

# The builds and the draft writer below run at nice 19 beside the GPU-timed benches (run_gpu.sh's
# llama.cpp build already does): un-niced, they slowed bench_gpu's decode figure (docs/perf.md,
# twenty-first pass).
checks=${MEASURE_CHECKS:-1}
case "$checks" in 0 | 1) ;; *) echo "measure.sh: MEASURE_CHECKS must be 0 or 1 (got '$checks')" >&2; exit 2 ;; esac
if [ "$checks" = 1 ]; then
  ( nice -n 19 bash tools/device/build_cuda_checks.sh "$HOME/measure-check" 90 > "$HOME/measure-check.log" 2>&1
    echo $? > "$HOME/measure-check.rc" ) &
  check_pid=$!
  # the ops check (attention, elementwise, logits against the CPU ops) links the CUDA build's CPU archive
  ( nice -n 19 bash tools/device/cuda_ops_check/build.sh "$(dirname "$(dirname "$SPECLA_LIBRARY")")" "$HOME/measure-ops-check" \
      > "$HOME/measure-ops-check.log" 2>&1; echo $? > "$HOME/measure-ops-check.rc" ) &
  ops_check_pid=$!
fi
( nice -n 19 bash tools/device/write_draft.sh > "$HOME/measure-draft.path" 2> "$HOME/measure-draft.log"; echo $? > "$HOME/measure-draft.rc" ) &

stage "bench_gpu"
python3 tools/bench_gpu.py --model "$MODEL" --out "$ROWS" --commit "$commit" 2>&1 | tail -30
stage "bench_specla"
python3 tools/bench_specla.py --device cuda --layers 1,48 --commit "$commit" --out "$ROWS" 2>&1 | tail -16
stage "cuda_matmul_check"
if [ "$checks" = 0 ]; then
  echo "skipped: MEASURE_CHECKS=0"
elif wait "$check_pid"; [ "$(cat "$HOME/measure-check.rc")" = 0 ]; then
  timeout 150 "$HOME/measure-check/cuda_matmul_check" --no-bench 2>&1 | tail -4
  for m in draft_kv draft_q draft_up draft_down attn_k attn_v; do
    timeout 60 "$HOME/measure-check/cuda_matmul_check" --no-check --matrix "$m" --batches 1,16,23 --json "$ROWS" \
      --commit "$commit" 2>&1 | grep -E "^  (draft|attn)"
  done
else
  echo "cuda_matmul_check did not build"; tail -20 "$HOME/measure-check.log"
fi
stage "cuda_ops_check"
if [ "$checks" = 0 ]; then
  echo "skipped: MEASURE_CHECKS=0"
elif wait "$ops_check_pid"; [ "$(cat "$HOME/measure-ops-check.rc")" = 0 ]; then
  timeout 120 "$HOME/measure-ops-check" 2>&1 | grep -E "FAIL|FAILURES|window" | tail -12
else
  echo "cuda_ops_check did not build"; tail -20 "$HOME/measure-ops-check.log"
fi
stage "waiting for llama.cpp's build (at most 150 s)"
for _ in $(seq 150); do [ -f "$HOME/.llama-build.rc" ] && break; sleep 1; done
uptime
stage "bench_gpu_spec"
python3 tools/bench_gpu_spec.py --model "$MODEL" --device cuda --depths 0,4096 --commit "$commit" --out "$ROWS" 2>&1 | tail -20
stage "bench_gpu_e2e, oracle drafter"
python3 tools/bench_gpu_e2e.py --model "$MODEL" --device cuda --targets 4,6,8 -n 256 --modes plain,ddtree+specla \
  --reps 2 --commit "$commit" --out "$ROWS" 2>&1 | tail -12
# 256 tokens give a seeded sample of 47 steps (5.43 accepted at the target of 6); 1024 tokens give 164
# steps and 6.27, the figure issue 14's goal of 4x at 6 is read at (docs/perf.md, thirty-fourth pass)
stage "bench_gpu_e2e, oracle drafter, 1024 tokens at the target of 6"
python3 tools/bench_gpu_e2e.py --model "$MODEL" --device cuda --targets 6 -n 1024 --modes plain,ddtree+specla \
  --recorded on --reps 2 --commit "$commit" --out "$ROWS" 2>&1 | tail -4
stage "bench_gpu_e2e with the draft's cost"
wait
if [ "$(cat "$HOME/measure-draft.rc" 2>/dev/null)" = 0 ]; then
  draft=$(cat "$HOME/measure-draft.path")
  python3 tools/bench_gpu_e2e.py --model "$MODEL" --device cuda --draft-cost "$draft" --targets 6 --recorded on,off \
    --reps 1 --modes plain,ddtree+specla --commit "$commit" --out "$ROWS" 2>&1 | tail -10
  # the draft's proposal alone (one recorded 16-row block, top-4 over the reduced head and the whole
  # one, median of 20): the part of the draft's cost that does not depend on the loop's acceptance
  stage "the draft's proposal alone"
  python3 tools/bench_draft_head.py --target "$MODEL" --device cuda --draft "$draft" --repeats 20 --commit "$commit" \
    --out "$ROWS" 2>&1 |
    grep dflash-propose | cut -c1-400
else
  echo "the draft was not written"; tail -20 "$HOME/measure-draft.log"
fi
# Where the time goes, kernel by kernel: a decode step at depth 76 and the 23-node SpecLA verify at
# depth 16, serialized (SPECLA_CUDA_PDL=0: with launch overlap a kernel's span includes its wait).
# The rows go to $ROWS; the log keeps each profile's step row and its 12 largest kernels.
for what in "--depth 76" "--tree --depth 16"; do
  stage "profile_gpu_step $what, serialized"
  # shellcheck disable=SC2086  # $what is two or three words of options
  SPECLA_CUDA_PDL=0 python3 tools/profile_gpu_step.py --model "$MODEL" $what --tokens 8 --commit "$commit" \
    --out "$ROWS" > "$HOME/measure-profile.out" 2>&1
  head -13 "$HOME/measure-profile.out" | cut -c1-240
done
stage "end"
