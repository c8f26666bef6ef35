#!/usr/bin/env bash
# Device experiment: chosen matrices of the isolated matmul benchmark (tools/cuda_matmul_check.cu)
# timed under several settings of one build, in interleaved rounds, after the checker's own checks
# (--no-bench) on the default settings. For a kernel change behind an environment switch (e.g.
# SPECLA_CUDA_FTC_CHUNK_MAJOR, SPECLA_CUDA_TILE_BULK): the same build, so the variants differ only
# in the switch. Tables to stdout (one line per matrix, variant and round: us per call and GB/s at
# each n), rows to OUT when given.
#
#   bash tools/device/bench_matrices.sh "draft_q draft_up" 1,16,23 ROUNDS NAME=VAR=VALUE[,VAR=VALUE] ... [-- OUT.jsonl COMMIT]
# e.g.
#   bash tools/device/bench_matrices.sh "draft_up draft_kv" 1,16 2 \
#     chunks=SPECLA_CUDA_FTC_CHUNK_MAJOR=1 rows=SPECLA_CUDA_FTC_CHUNK_MAJOR=0
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
matrices=${1:?MATRICES}; batches=${2:?BATCHES}; rounds=${3:?ROUNDS}
shift 3
names=() envs=() out= commit=
while [ $# -gt 0 ]; do
  case "$1" in
    --) out=${2:?OUT.jsonl}; commit=${3:?COMMIT}; shift 3 ;;
    *=*=*) names+=("${1%%=*}"); envs+=("${1#*=}"); shift ;;
    *) echo "bench_matrices.sh: '$1' is not NAME=VAR=VALUE" >&2; exit 2 ;;
  esac
done
[ ${#names[@]} -gt 0 ] || { echo "bench_matrices.sh: no variant (NAME=VAR=VALUE)" >&2; exit 2; }
build=$HOME/bench-matrices
bash "$root/tools/device/build_cuda_checks.sh" "$build" 90 > "$build.log" 2>&1 || { echo "bench_matrices.sh: the checker did not build"; tail -20 "$build.log"; exit 1; }
bin=$build/cuda_matmul_check
echo "=== cuda_matmul_check --no-bench (default settings)"
timeout 200 "$bin" --no-bench 2>&1 | grep -E "FAIL|PASSED|failure" | tail -8
for r in $(seq 1 "$rounds"); do
  for m in $matrices; do
    for i in "${!names[@]}"; do
      printf "round %s %-10s " "$r" "${names[$i]}"
      json=()
      [ -n "$out" ] && json=(--json "$out" --commit "$commit+${names[$i]}")
      env $(tr ',' ' ' <<< "${envs[$i]}") timeout 60 "$bin" --no-check --matrix "$m" --batches "$batches" "${json[@]}" 2>&1 |
        grep -E "^  $m " || echo "$m: no timing"
    done
  done
done
