#!/usr/bin/env bash
# Device experiment, stage 1 of docs/persistent-step.md: builds tools/cuda_chain_check.cu with the
# matmul sources and runs it (its check, then its interleaved timings) on each chain given.
#
#   bash tools/device/chain_check.sh OUT_DIR COMMIT [ARGS_OF_ONE_RUN ...]
# e.g.
#   bash tools/device/chain_check.sh "$OUT" "$(git rev-parse --short HEAD)" \
#     "--links 16" "--links 32 --shapes 5120x1024,1024x5120"
# Each quoted argument is one run's arguments; none: the default chain (16 links of the 27B FFN's
# Q4_K shapes). Logs and rows: OUT_DIR/chain-check.log, OUT_DIR/chain-check.jsonl.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?OUT_DIR}; commit=${2:?COMMIT}
shift 2
[ $# -gt 0 ] || set -- "--links 16"
mkdir -p "$out"
bin=$HOME/chain-check/cuda_chain_check
mkdir -p "$(dirname "$bin")"
if ! nvcc -O3 -std=c++20 -arch=sm_90 -Xptxas -v -Xcompiler -ffp-contract=off \
    -I"$root/native/backends/cuda" -I"$root/native/common" -I"$root/native/include" \
    "$root/tools/cuda_chain_check.cu" "$root/native/backends/cuda/matmul.cu" -o "$bin" 2>"$out/chain-check-ptxas.txt"; then
  grep -v "^ptxas info" "$out/chain-check-ptxas.txt" | tail -20
  echo "chain_check.sh: nvcc failed"
  exit 1
fi
grep -A3 "Compiling entry.*mm_chain_kernel" "$out/chain-check-ptxas.txt" | grep -E "Compiling|Used|spill" | tee -a "$out/chain-check.log"
status=0
for args in "$@"; do
  echo "=== cuda_chain_check $args" | tee -a "$out/chain-check.log"
  # shellcheck disable=SC2086
  timeout 300 "$bin" $args --json "$out/chain-check.jsonl" --commit "$commit" 2>&1 | tee -a "$out/chain-check.log"
  rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || { echo "chain_check.sh: '$args' exited $rc" | tee -a "$out/chain-check.log"; status=1; }
done
exit $status
