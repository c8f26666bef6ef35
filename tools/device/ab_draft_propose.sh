#!/usr/bin/env bash
# A run_gpu.sh bench command: the DFlash draft's proposal alone (tools/bench_draft_head.py: one
# 16-row block after a 100-token prompt, top-4, the reduced head and the whole one, median of
# REPEATS calls each) under several libraries, in interleaved rounds (main, A, B, main, ...), on the
# 27B-shape speed-only target and its synthetic draft (write_draft.sh's shape: 5 layers, 32 heads,
# 8 KV heads, head_dim 128, F16). Quieter than the draft_ms of a speculative loop (one run of 47
# steps, ten per cent apart between rounds of one library), for a change that only moves the draft.
#   bash tools/device/run_gpu.sh "bash tools/device/ab_draft_propose.sh COMMIT ROUNDS NAME=PATH ..."
# PATH: a libspecla.so (or .so.gz, unpacked under $HOME) built from COMMIT's sources with other
# options (prebuild.sh's PREBUILD_CMAKE_ARGS); main is run_gpu.sh's SPECLA_LIBRARY. Rows carry
# commit COMMIT+NAME.
set -uo pipefail
commit=${1:?COMMIT} rounds=${2:?ROUNDS}
shift 2
: "${ROWS:?run from run_gpu.sh (ROWS, MODEL)}" "${MODEL:?run from run_gpu.sh (ROWS, MODEL)}" "${SPECLA_LIBRARY:?}"
cd "$(dirname "$0")/../.." || exit 1
REPEATS=${REPEATS:-20}
draft=$(bash tools/device/write_draft.sh) || { echo "ab_draft_propose.sh: the draft was not written"; exit 1; }
names=(main) libs=("$SPECLA_LIBRARY")
for spec in "$@"; do
  name=${spec%%=*} path=${spec#*=}
  case "$path" in
    *.gz) gunzip -c "$path" > "$HOME/ab-propose-$name.so" || exit 1; path=$HOME/ab-propose-$name.so ;;
  esac
  [ -f "$path" ] || { echo "ab_draft_propose.sh: $name: no library at $path"; exit 2; }
  names+=("$name") libs+=("$path")
done
for r in $(seq 1 "$rounds"); do
  for i in "${!names[@]}"; do
    echo "=== round $r: ${names[$i]}"
    SPECLA_LIBRARY=${libs[$i]} python3 tools/bench_draft_head.py --target "$MODEL" --device cuda \
      --draft "$draft" --draft-layers 5 --draft-heads 32 --draft-kv-heads 8 --draft-head-dim 128 --draft-quant f16 \
      --repeats "$REPEATS" --commit "$commit+${names[$i]}" --out "$ROWS" |
      python3 -c "import json,sys
for l in sys.stdin:
    r=json.loads(l)
    if r.get('mode')=='dflash-propose': print('propose ms: reduced head %.3f, whole head %.3f, decode step %.3f' % (r['reduced_head_ms'], r['whole_head_ms'], r['decode_step_ms']))"
  done
done
