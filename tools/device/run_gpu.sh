#!/usr/bin/env bash
# THE script a device call runs on the lent H200 machine (no network, no registry). The call's
# command line stays short; this script does the work, under $HOME, in one pass of about 9 minutes:
#
#   (a) build libspecla with the CUDA backend for sm_90            -> build.log
#       (in the background, the GPU tests running on a carried .prebuilt/libspecla.so meanwhile,
#       where tools/device/prebuild.sh made it from these sources: carry=[".whl", ".prebuilt"])
#   (b) meanwhile, build llama.cpp's llama-bench with CUDA          -> llama-build.log
#   (c) meanwhile, write the 27B-shaped speed-only Q4_K_M GGUF      (kept in $HOME for later calls)
#   (d) python -m pytest -m gpu tests (its 25 slowest tests listed) -> pytest-gpu.log
#   (e) each benchmark command (BENCH_COMMANDS below, or arguments) -> bench.jsonl, bench.log
#   (f) llama-bench on the same file                                -> llama-bench.jsonl
# Every step is time-stamped in run.log (with nvidia-smi and the device properties first); a
# failing step is logged and the next one runs. At most the 7 files named above land in $OUT.
#
# The device call (carry the wheels and the llama.cpp pack; see tools/device/pack_llama_cpp.sh):
#   run(command="bash tools/device/run_gpu.sh", carry=[".whl", ".device"], timeout_s=600)
# Extra benchmark commands can ride as arguments:
#   bash tools/device/run_gpu.sh "python3 tools/bench_gpu.py --model \$MODEL --out \$ROWS"
#
# Issue 14's benchmarks (C = the commit the code is at: the device's .git is the session's first
# commit, so every script takes --commit). A call that only measures; each command appends to $ROWS:
#   SKIP_PYTEST=1 SKIP_LLAMA=1 bash tools/device/run_gpu.sh \
#     "python3 tools/bench_specla.py --device cuda --layers 1,48 --commit C --out \$ROWS" \
#     "python3 tools/bench_gpu_spec.py --model \$MODEL --device cuda --depths 0,4096 --commit C --out \$ROWS" \
#     "python3 tools/bench_gpu_e2e.py --model \$MODEL --device cuda --targets 4,6,8 -n 256 --commit C --out \$ROWS"
# (SpecLA ops on device-resident buffers; 23-node verify and accept in decode steps at depth 0 and
# 4096; tokens/s with the oracle drafter vs plain decoding, recorded steps on and off.)
#
# Knobs (environment): BUDGET_S (default 540: the whole script), SPEED_PRESET (27b), SPEED_SEED (0),
# SPEED_QUANT (q4_k_m, or q5_k_m or q8_0: the speed-only file's mix; llama-bench times the same file),
# LLAMA_BENCH_REPS (3), LLAMA_BENCH_ARGS (the -p/-n/-d grid), LLAMA_BUILD_MIN_S (340: a fresh llama.cpp
# build given less time than this is not started; it took 322 s on the H200 machine at 8d1e586; no
# build happens where .device holds a llama-bench that prebuild_llama_bench.sh made from the carried
# pack and it starts there, so that limit does not apply then), GGML_CUDA=OFF (a CPU-only
# llama-bench, to try the plumbing on a machine without a GPU), SKIP_LLAMA=1 (no llama.cpp steps),
# SKIP_PYTEST=1 (no GPU tests: a call that only measures), PYTEST_S (240: the GPU tests' limit; the
# suite ran past 180 s on an H100 beside the background build at f5c61a1), BENCH_STEP_S (300: the
# most one benchmark command may run; an A/B of several variants needs more), LLAMA_RESERVE_S (150:
# the seconds the benchmark commands leave for llama-bench's run, which takes about 20),
# PREBUILT_ONLY=1 (with a carried .prebuilt/libspecla.so of these sources: no background build, every
# step uses the carried library; 60-100 s less on a fresh machine, for calls whose commands need no
# build tree: ab_variants.sh with env: and lib: variants, measure.sh with MEASURE_CHECKS=0, not patch
# variants).

# The benchmark hook. Each entry is one shell command run from the repository root with:
#   MODEL            the speed-only GGUF of step (c)
#   ROWS             $OUT/bench.jsonl: append one JSON object per line (say "synthetic_mode")
#   SPECLA_LIBRARY   the CUDA build of step (a); PYTHONPATH holds the carried wheels and the repo
# stdout and stderr go to bench.log. Write nothing else under $OUT (8 files come back at most).
BENCH_COMMANDS=(
)

set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 1
OUT=${OUT:-$ROOT/device-out}
mkdir -p "$OUT"
BUDGET_S=${BUDGET_S:-540}
# The build keeps 200 s for the steps after it (RESERVE_S below) and needs ~40 s itself: a smaller
# budget would skip every step and still cost the device call.
case "$BUDGET_S" in *[!0-9]*|'') echo "run_gpu.sh: BUDGET_S must be a number of seconds (got '$BUDGET_S')" >&2; exit 2;; esac
if [ "$BUDGET_S" -lt 300 ]; then
  echo "run_gpu.sh: BUDGET_S=$BUDGET_S is too small: the build alone keeps 200 s for the steps after it; use 300 or more (the device call's timeout bounds the real time)" >&2
  exit 2
fi
BENCH_STEP_S=${BENCH_STEP_S:-300}
case "$BENCH_STEP_S" in *[!0-9]*|'') echo "run_gpu.sh: BENCH_STEP_S must be a number of seconds (got '$BENCH_STEP_S')" >&2; exit 2;; esac
PYTEST_S=${PYTEST_S:-240}
case "$PYTEST_S" in *[!0-9]*|'') echo "run_gpu.sh: PYTEST_S must be a number of seconds (got '$PYTEST_S')" >&2; exit 2;; esac
SPEED_PRESET=${SPEED_PRESET:-27b}
SPEED_SEED=${SPEED_SEED:-0}
SPEED_QUANT=${SPEED_QUANT:-q4_k_m}
case "$SPEED_QUANT" in q4_k_m | q5_k_m | q8_0) ;; *) echo "run_gpu.sh: SPEED_QUANT must be q4_k_m, q5_k_m or q8_0 (got '$SPEED_QUANT')" >&2; exit 2 ;; esac
LLAMA_BENCH_REPS=${LLAMA_BENCH_REPS:-3}
LLAMA_BUILD_MIN_S=${LLAMA_BUILD_MIN_S:-340}
case "$LLAMA_BUILD_MIN_S" in *[!0-9]*|'') echo "run_gpu.sh: LLAMA_BUILD_MIN_S must be a number of seconds (got '$LLAMA_BUILD_MIN_S')" >&2; exit 2;; esac
LLAMA_BENCH_ARGS=${LLAMA_BENCH_ARGS:-"-fa 1 -ngl 99 -p 1,2,4,8,16,23,32,64 -n 128 -d 0,4096"}
BUILD=$HOME/specla-build-cuda
MODEL=$HOME/models/$SPEED_PRESET-$SPEED_QUANT-speed-only-seed$SPEED_SEED.gguf
RUN_LOG=$OUT/run.log
START=$(date +%s.%N)
for cmd in "$@"; do BENCH_COMMANDS+=("$cmd"); done

elapsed() { awk -v s="$START" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - s }'; }
left() { awk -v s="$START" -v n="$(date +%s.%N)" -v b="$BUDGET_S" 'BEGIN { printf "%d", b - (n - s) }'; }
log() { echo "[$(date -u +%H:%M:%S) +$(elapsed)s] $*" | tee -a "$RUN_LOG"; }
SUMMARY=()
# step NAME MAX_SECONDS LOGFILE CMD...: run CMD with a timeout of MAX_SECONDS, cut to what the
# budget leaves (minus RESERVE_S for the steps after it); log rc and time; never stop the script.
RESERVE_S=0
step() {
  local name=$1 max=$2 logfile=$3; shift 3
  local limit; limit=$(( $(left) - RESERVE_S ))
  [ "$limit" -gt "$max" ] && limit=$max
  if [ "$limit" -lt 5 ]; then
    log "SKIP $name: budget spent"; SUMMARY+=("$name: skipped (budget)"); return 1
  fi
  # say so when the budget, not the step's own limit, sets the timeout
  [ "$limit" -lt "$max" ] && log "$name: limit ${limit}s, not ${max}s: BUDGET_S leaves $(left)s and keeps ${RESERVE_S}s for the steps after it"
  log "START $name (limit ${limit}s)"
  local t0 rc; t0=$(date +%s.%N)
  timeout --kill-after=5 "$limit" "$@" >> "$logfile" 2>&1; rc=$?
  local dt; dt=$(awk -v s="$t0" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - s }')
  if [ "$rc" = 124 ]; then log "TIMEOUT $name after ${dt}s"; else log "END $name rc=$rc in ${dt}s"; fi
  SUMMARY+=("$name: rc=$rc ${dt}s")
  return "$rc"
}

: > "$RUN_LOG"
log "run_gpu.sh in $ROOT ($(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo 'no git')), budget ${BUDGET_S}s"
{
  echo "--- machine"; uname -a; nproc; free -g | head -2; df -h "$HOME" | tail -1
  echo "--- nvidia-smi"; nvidia-smi 2>&1
  nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv 2>&1
  echo "--- toolchain"; nvcc --version 2>&1 | tail -2; cmake --version | head -1; ninja --version; python3 --version
  echo "--- device properties (torch)"
  timeout 60 python3 -c "import torch; p = torch.cuda.get_device_properties(0); print(p); print('L2 bytes', getattr(p, 'L2_cache_size', '?'), 'SMs', p.multi_processor_count)" 2>&1
} >> "$RUN_LOG" 2>&1

# Python packages missing on the machine travel as wheels in .whl (gguf; see docs/perf.md).
if ls .whl/*.whl > /dev/null 2>&1; then
  if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >> "$RUN_LOG" 2>&1; then
    log "wheels installed: $(cd .whl && echo *.whl)"
  else
    log "FAILED to install the wheels in .whl"
  fi
else
  log "no .whl/*.whl carried: gguf may be missing"
fi
export PYTHONPATH=/tmp/site:$ROOT${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
# Every step after the build imports gguf (the model writer, the GPU tests, the benchmarks): without
# it a call would spend its build and then fail each step at the import, so stop before the build.
if ! python3 -c "import gguf, numpy" >> "$RUN_LOG" 2>&1; then
  log "STOP: python3 cannot import gguf (or numpy): carry the wheels, e.g. 'pip download gguf==0.19.0 --no-deps -d .whl' here and carry=[\".whl\"]"
  exit 2
fi

# (b) llama-bench in the background at the lowest priority (our benchmarks may run meanwhile; their
# host thread must not wait for a core); it may take until 150 s before the end (then llama-bench runs)
LLAMA_RC=$HOME/.llama-build.rc
rm -f "$LLAMA_RC"
llama_build_limit=$(( $(left) - 150 ))
if [ "${SKIP_LLAMA:-0}" = 1 ]; then
  log "SKIP llama-bench build: SKIP_LLAMA=1"
  echo "skipped 0" > "$LLAMA_RC"; LLAMA_PID=
elif [ "$llama_build_limit" -lt "$LLAMA_BUILD_MIN_S" ] && [ ! -f "$HOME/llama.cpp-build-cuda-${GGML_CUDA:-ON}/build.ninja" ] \
    && [ ! -f .device/llama-bench.gz ]; then
  # a fresh build that its limit would cut costs the call's cores and, in measure.sh, a wait for it
  # (a carried llama-bench, tools/device/prebuild_llama_bench.sh, needs no build: its step takes seconds)
  log "SKIP llama-bench build: ${llama_build_limit}s left for it, a fresh build takes about 233 s on the H100 machine and 322 s on the H200 one (LLAMA_BUILD_MIN_S=$LLAMA_BUILD_MIN_S; raise BUDGET_S)"
  echo "skipped 0" > "$LLAMA_RC"; LLAMA_PID=
elif [ "$llama_build_limit" -ge 30 ]; then
  log "START llama-bench build in the background (limit ${llama_build_limit}s)"
  ( t0=$(date +%s)
    timeout --kill-after=5 "$llama_build_limit" nice -n 19 bash tools/device/build_llama_bench.sh > "$OUT/llama-build.log" 2>&1
    rc=$?; echo "$rc $(( $(date +%s) - t0 ))" > "$LLAMA_RC" ) &
  LLAMA_PID=$!
else
  log "SKIP llama-bench build: budget spent"
  echo "skipped 0" > "$LLAMA_RC"; LLAMA_PID=
fi

# (c) the speed-only model in the background, unless an earlier call on this machine wrote it
MODEL_PID=
if [ -f "$MODEL" ]; then
  log "model $MODEL exists ($(du -h "$MODEL" | cut -f1)): reused"
else
  mkdir -p "$(dirname "$MODEL")"
  log "START writing $MODEL in the background"
  ( t0=$(date +%s)
    timeout --kill-after=5 300 python3 tools/speed_model.py --preset "$SPEED_PRESET" --seed "$SPEED_SEED" --quant "$SPEED_QUANT" --out "$MODEL" > "$HOME/.model.log" 2>&1
    echo "$? $(( $(date +%s) - t0 ))" > "$HOME/.model.rc" ) &
  MODEL_PID=$!
fi

# (a) our library, CUDA for sm_90, in the foreground; or, where the call carries .prebuilt/libspecla.so
# built from exactly these sources (tools/device/prebuild.sh, its stamp source_stamp.sh's line), that
# library for the GPU tests at once and this build in the background, waited for before the
# benchmark commands (which may use the build tree: cuda_ops_check, ab_variants.sh)
RESERVE_S=200
BUILD_CMD="cmake -S . -B '$BUILD' -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPECLA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 &&
  cmake --build '$BUILD' -j $(nproc)"
BUILD_PID=
PREBUILT=0
if [ -f .prebuilt/libspecla.so ] && [ -f .prebuilt/stamp ] &&
   [ "$(bash tools/device/source_stamp.sh)" = "$(cat .prebuilt/stamp)" ]; then
  PREBUILT=1
  export SPECLA_LIBRARY=$ROOT/.prebuilt/libspecla.so
fi
if [ "$PREBUILT" = 1 ] && [ "${PREBUILT_ONLY:-0}" = 1 ]; then
  log "using the carried .prebuilt/libspecla.so ($(cat .prebuilt/stamp)) for every step: PREBUILT_ONLY=1, no build"
elif [ "$PREBUILT" = 1 ]; then
  log "using the carried .prebuilt/libspecla.so ($(cat .prebuilt/stamp)); START build libspecla (CUDA sm_90) in the background"
  rm -f "$HOME/.build.rc"
  ( t0=$(date +%s)
    timeout --kill-after=5 300 nice -n 5 bash -c "$BUILD_CMD" > "$OUT/build.log" 2>&1
    echo "$? $(( $(date +%s) - t0 ))" > "$HOME/.build.rc" ) &
  BUILD_PID=$!
else
  [ -f .prebuilt/libspecla.so ] && log "the carried .prebuilt/libspecla.so was built from other sources: not used"
  step "build libspecla (CUDA sm_90)" 240 "$OUT/build.log" bash -c "$BUILD_CMD"
  export SPECLA_LIBRARY=$BUILD/native/libspecla.so
fi
if [ -f "$SPECLA_LIBRARY" ]; then
  python3 -c "from pyspecla import _native as n; print('libspecla sees', n.cuda_device_count(), 'CUDA device(s)')" >> "$RUN_LOG" 2>&1
  tail -1 "$RUN_LOG"
fi

# (d) the GPU tests, keeping 170 s for the benchmark commands and llama-bench after them, or 10 where
# there are none (a call that only runs the suite gives it the whole budget)
RESERVE_S=170
[ ${#BENCH_COMMANDS[@]} -eq 0 ] && [ "${SKIP_LLAMA:-0}" = 1 ] && RESERVE_S=10
if [ "${SKIP_PYTEST:-0}" = 1 ]; then
  log "SKIP pytest -m gpu: SKIP_PYTEST=1"; SUMMARY+=("pytest -m gpu: skipped (SKIP_PYTEST=1)")
else
step "pytest -m gpu" "$PYTEST_S" "$OUT/pytest-gpu.log" python3 -m pytest -m gpu tests -q -ra --durations=25 -p no:cacheprovider
fi

if [ -n "$MODEL_PID" ]; then
  log "waiting for the model writer"
  wait "$MODEL_PID"
  cat "$HOME/.model.log" >> "$RUN_LOG"
  read -r rc secs < "$HOME/.model.rc" || { rc=missing; secs=unknown; }
  log "END writing the model rc=$rc in ${secs}s: $(tail -1 "$HOME/.model.log")"
  SUMMARY+=("write $SPEED_PRESET $SPEED_QUANT speed-only model: rc=$rc ${secs}s")
fi

if [ -n "$BUILD_PID" ]; then
  log "waiting for the background build"
  wait "$BUILD_PID"
  read -r rc secs < "$HOME/.build.rc" || { rc=missing; secs=unknown; }
  log "END build libspecla (CUDA sm_90) rc=$rc in ${secs}s (background)"
  SUMMARY+=("build libspecla (CUDA sm_90, background): rc=$rc ${secs}s")
  # the benchmarks use the build tree's library, the same sources (ab_variants.sh builds in that tree)
  [ "$rc" = 0 ] && export SPECLA_LIBRARY=$BUILD/native/libspecla.so
fi

# (e) the benchmark hook
export MODEL ROWS=$OUT/bench.jsonl
# llama-bench's run keeps LLAMA_RESERVE_S (150) s after the benchmarks (none when it is skipped)
RESERVE_S=${LLAMA_RESERVE_S:-150}
[ "${SKIP_LLAMA:-0}" = 1 ] && RESERVE_S=10
if [ ${#BENCH_COMMANDS[@]} -eq 0 ]; then
  log "no benchmark commands (BENCH_COMMANDS in tools/device/run_gpu.sh, or arguments)"
fi
i=0
for cmd in "${BENCH_COMMANDS[@]}"; do
  i=$((i + 1))
  echo "=== bench $i: $cmd" >> "$OUT/bench.log"
  step "bench $i: $cmd" "$BENCH_STEP_S" "$OUT/bench.log" bash -c "$cmd"
done

# (f) llama-bench on the same file
log "waiting for the llama-bench build"
[ -n "$LLAMA_PID" ] && wait "$LLAMA_PID"
read -r rc secs < "$LLAMA_RC" || { rc=missing; secs=unknown; }
log "END llama-bench build rc=$rc in ${secs}s"
SUMMARY+=("build llama-bench: rc=$rc ${secs}s")
LLAMA_BENCH=$(tail -1 "$OUT/llama-build.log" 2>/dev/null)
RESERVE_S=10
if [ "$rc" = 0 ] && [ -x "$LLAMA_BENCH" ] && [ -f "$MODEL" ]; then
  # shellcheck disable=SC2086  # LLAMA_BENCH_ARGS is a list of flags
  step "llama-bench" 300 "$OUT/bench.log" bash -c \
    "'$LLAMA_BENCH' -m '$MODEL' $LLAMA_BENCH_ARGS -r $LLAMA_BENCH_REPS -o jsonl > '$HOME/llama-bench.raw.jsonl'"
  # the rows say which writer made the file
  python3 -c "
import json, sys
sys.path.insert(0, 'tools')
from speed_model import synthetic_mode
from gguf import GGUFReader
r = GGUFReader(sys.argv[1])
meta = {k: f.contents() for k, f in r.fields.items() if k in ('general.name', 'pyspecla.synthetic.mode')}
mode = synthetic_mode(meta)
with open(sys.argv[2]) as src, open(sys.argv[3], 'w') as dst:
    for line in src:
        if line.strip():
            row = json.loads(line)
            row.update(runtime='llama.cpp', synthetic_mode=mode, model_path=sys.argv[1])
            dst.write(json.dumps(row) + '\n')
" "$MODEL" "$HOME/llama-bench.raw.jsonl" "$OUT/llama-bench.jsonl" >> "$RUN_LOG" 2>&1 \
    || { log "could not annotate the llama-bench rows; raw rows kept"; cp "$HOME/llama-bench.raw.jsonl" "$OUT/llama-bench.jsonl"; }
else
  log "SKIP llama-bench (build rc=$rc, binary '${LLAMA_BENCH}', model $( [ -f "$MODEL" ] && echo present || echo missing))"
  SUMMARY+=("llama-bench: skipped")
fi

log "summary:"
for s in "${SUMMARY[@]}"; do log "  $s"; done
n_files=$(find "$OUT" -type f | wc -l)
log "done in $(elapsed)s; $n_files files in \$OUT: $(cd "$OUT" && echo *)"
[ "$n_files" -le 8 ] || log "WARNING: more than 8 files in \$OUT; some will not come back"
