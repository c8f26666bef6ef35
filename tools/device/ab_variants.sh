#!/usr/bin/env bash
# Device A/B of source changes in one call: builds one library per variant (patches applied to
# this tree in turn, incremental ninja builds in run_gpu.sh's build directory, patches reverted
# after each), checks each variant (pytest -m gpu against it; cuda_matmul_check when a patch
# touches the matmul, built in the background from a snapshot of the patched tree), then times every library with tools/bench_gpu.py in interleaved rounds
# (main, A, B, main, A, B, ...) so drift hits every variant alike. Rows carry commit COMMIT+NAME.
#
# A run_gpu.sh bench command (SPECLA_LIBRARY, MODEL and ROWS come from run_gpu.sh):
#   bash tools/device/ab_variants.sh COMMIT ROUNDS "BENCH_GPU_ARGS" NAME=PATCH[+PATCH...] ...
# (BENCH_GPU_ARGS "-": no bench_gpu run, only AB_EXTRA's command, for an A/B of another benchmark)
# e.g.
#   bash tools/device/ab_variants.sh d6a3efc 2 "--batches 1,23 --depths 0 --reps 5" \
#     mmq=ab/mmq.patch att=ab/att.patch both=ab/mmq.patch+ab/att.patch
# The patches are applied to this tree in place while the script runs: nothing else in the same call
# may build from the tree meanwhile (a checker built in the background beside this script compiled a
# patched source and was labelled main). Patches are `patch -p1` diffs against this tree, a branch's own changes from its merge base
# (git diff main...BRANCH -- native tools > ab/NAME.patch: with two dots, a diff from an older branch
# would also revert what main gained since); they travel as untracked files. NAME=env:VAR=VALUE[,VAR=VALUE...] is main's library run with those
# environment settings (e.g. regs=env:SPECLA_CUDA_TILE_BULK=0), no build; NAME=of:OTHER:VAR=VALUE[,...] is
# the library of OTHER, a variant named before it, run with those settings; NAME=lib:PATH a library
# built elsewhere (the same nvcc as the device's: built on the session's machine from main plus a
# patch and carried; PATH.gz is unpacked first), no build and no checker. AB_PYTEST=0 skips the variants' pytest -m gpu runs,
# AB_PYTEST="NAME ..." runs them for those variants only, AB_PYTEST_K=EXPR only the tests pytest's
# -k EXPR selects. A single-patch variant
# that touches the matmul also runs cuda_matmul_check (GPU bits against the CPU oracle), one that
# touches attention.cu, elementwise.cu, logits.cu or recurrent.cu cuda_ops_check (against the CPU ops and float64,
# and the bit-identity checks); AB_CHECKS=0 skips both (a variant that only moves loads or changes
# occupancy, whose operations are those of a checked build). Check results go to stdout (run_gpu.sh's
# bench.log). AB_EXTRA: a shell command run after bench_gpu for every variant and round, with that
# variant's SPECLA_LIBRARY (and settings) and AB_LABEL=COMMIT+NAME for its rows; the last
# AB_EXTRA_LINES (12) lines of its output go to bench.log (raise it for a profiler's report), e.g.
#   AB_EXTRA='python3 tools/bench_gpu_spec.py --model "$MODEL" --device cuda --depths 0 --commit "$AB_LABEL" --out "$ROWS"'.
# AB_ORDER=alternate runs the even rounds' variants last to first (main, A, B, then B, A, main): the
# first of a round ran 0.3-1.3 % slower on a 23-token batch in all four pairs at 8d898d3, which the
# default order (forward: main first every round) cannot tell from an order effect.
set -uo pipefail
commit=$1 rounds=$2 bench_args=$3
shift 3
case "${AB_ORDER:-forward}" in
  forward | alternate) ;;
  *) echo "ab_variants.sh: AB_ORDER must be forward or alternate (got '$AB_ORDER')" >&2; exit 2 ;;
esac
case "${AB_EXTRA_LINES:-12}" in
  *[!0-9]* | '') echo "ab_variants.sh: AB_EXTRA_LINES must be a number of lines (got '$AB_EXTRA_LINES')" >&2; exit 2 ;;
esac
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 1
build=$(dirname "$(dirname "$SPECLA_LIBRARY")")
libs=$HOME/ab-libs
rm -rf "$libs" && mkdir -p "$libs"
cp "$SPECLA_LIBRARY" "$libs/main.so"
names=(main)

gunzip_to() { gunzip -c "$1" > "$2"; }
revert() { local i; for ((i = ${#list[@]} - 1; i >= 0; i--)); do patch -R -p1 -s < "${list[i]}"; done; }

# a CPU-only build of SRC in DIR, as the checkers link it: libspecla.so (build_cuda_checks.sh's
# CPU_LIB_BUILD) and the static specla_cpu (cuda_ops_check/build.sh); output to LOG
build_cpu_oracle() {
  local src=$1 dir=$2 log=$3
  { cmake -S "$src" -B "$dir" -G Ninja -DSPECLA_CUDA=OFF -DCMAKE_BUILD_TYPE=Release &&
    cmake --build "$dir" -j "$(nproc)" && cmake --build "$dir" --target specla_cpu; } > "$log" 2>&1
}

# the checkers' CPU oracle library, built once when a variant is a patch (a patch that touches more
# than the CUDA sources gets its own, below)
cpu_lib=$HOME/ab-cpu-lib
if [[ " $* " != *.patch* ]]; then cpu_lib=
elif ! build_cpu_oracle "$root" "$cpu_lib" "$HOME/ab-cpu-lib.log"; then
  echo "the checkers' CPU library did not build: every checker builds its own"; cpu_lib=
fi

checks=() # KIND:NAME:PID of the background checker builds
patched=0 # whether a patch variant was built in the build tree
declare -A variant_env # NAME -> "VAR=VALUE ..." for the env: variants (main's library, another setting)
# variant NAME: library LIB run with SETTINGS (VAR=VALUE[,VAR=VALUE...]), LABEL's library
env_variant() {
  local name=$1 lib=$2 settings=$3 label=$4
  if [[ ! "$settings" =~ ^[A-Z_][A-Z0-9_]*=[^,[:space:]]*(,[A-Z_][A-Z0-9_]*=[^,[:space:]]*)*$ ]]; then
    echo "variant $name: '$settings' is not VAR=VALUE[,VAR=VALUE...]"; return
  fi
  variant_env[$name]=${settings//,/ }
  cp "$lib" "$libs/$name.so"
  names+=("$name")
  echo "variant $name: $label's library with ${variant_env[$name]}"
}
for spec in "$@"; do
  name=${spec%%=*}
  if [[ "${spec#*=}" == env:* ]]; then env_variant "$name" "$SPECLA_LIBRARY" "${spec#*=env:}" main; continue; fi
  if [[ "${spec#*=}" == of:* ]]; then # an earlier variant's library with settings: NAME=of:OTHER:VAR=VALUE[,...]
    rest=${spec#*=of:} other=${rest%%:*}
    if [ -f "$libs/$other.so" ]; then env_variant "$name" "$libs/$other.so" "${rest#*:}" "$other"
    else echo "variant $name: of:$other names no variant built before it"; fi
    continue
  fi
  if [[ "${spec#*=}" == lib:* ]]; then # a library built elsewhere (e.g. on the session's machine), carried in
    path=${spec#*=lib:}
    unpack=cp
    [[ "$path" == *.gz ]] && unpack=gunzip_to
    if [ -f "$path" ]; then $unpack "$path" "$libs/$name.so" && names+=("$name") && echo "variant $name: the library $path"
    else echo "variant $name: no library at $path"; fi
    continue
  fi
  IFS=+ read -ra list <<< "${spec#*=}"
  applied=()
  for p in "${list[@]}"; do
    if patch -p1 -s --dry-run < "$p" > /dev/null && patch -p1 -s < "$p"; then applied+=("$p")
    else echo "variant $name: $p does not apply"; fi
  done
  if [ ${#applied[@]} -ne ${#list[@]} ]; then list=("${applied[@]}"); revert; continue; fi
  t0=$(date +%s)
  patched=1
  if cmake --build "$build" -j "$(nproc)" > "$HOME/ab-build-$name.log" 2>&1; then
    cp "$SPECLA_LIBRARY" "$libs/$name.so"
    names+=("$name")
    echo "variant $name: built in $(( $(date +%s) - t0 ))s"
    # the checkers build from a snapshot of the patched sources, in the background: each is one
    # single-threaded nvcc of matmul.cu, so they overlap the next variant's library build
    if [ "${AB_CHECKS:-1}" != 0 ] && [ ${#list[@]} -eq 1 ]; then
      snap=$HOME/ab-src-$name
      rm -rf "$snap" && mkdir -p "$snap/tools" && cp -r native CMakeLists.txt "$snap/" && cp -r tools/device tools/cuda_matmul_check.cu "$snap/tools/"
      # a patch that changes more than the CUDA sources (the op table, the CPU backend) needs its own
      # CPU oracle: main's would not match the patched ops table
      variant_cpu=$cpu_lib
      if [ -n "$cpu_lib" ] && grep -E "^\+\+\+ b/native/" "${list[0]}" | grep -qv "^+++ b/native/backends/cuda/"; then
        variant_cpu=$snap/cpu-build
        build_cpu_oracle "$snap" "$variant_cpu" "$HOME/ab-cpu-lib-$name.log" ||
          { echo "variant $name: its CPU oracle did not build"; variant_cpu=; }
      fi
      if grep -qE "^\+\+\+ b/(native/backends/cuda/matmul|tools/cuda_matmul_check)" "${list[0]}"; then
        CPU_LIB_BUILD=$variant_cpu bash "$snap/tools/device/build_cuda_checks.sh" "$HOME/ab-check-$name" 90 > "$HOME/ab-check-$name.log" 2>&1 &
        checks+=("matmul:$name:$!")
      fi
      if [ -n "$variant_cpu" ] && grep -qE "^\+\+\+ b/native/backends/cuda/(attention|elementwise|logits|recurrent)\.cu" "${list[0]}"; then
        bash "$snap/tools/device/cuda_ops_check/build.sh" "$variant_cpu" "$HOME/ab-ops-check-$name" > "$HOME/ab-ops-check-$name.log" 2>&1 &
        checks+=("ops:$name:$!")
      fi
    fi
  else
    echo "variant $name: build FAILED"; tail -30 "$HOME/ab-build-$name.log"
  fi
  revert
done
# main's library again in the build tree, which the patched builds left behind; only env: and lib:
# variants (a PREBUILT_ONLY=1 call, no build tree) leave nothing to rebuild
if [ "$patched" = 1 ]; then
  cmake --build "$build" -j "$(nproc)" > "$HOME/ab-build-main.log" 2>&1 || echo "rebuilding main FAILED"
fi

for entry in "${checks[@]}"; do
  IFS=: read -r kind name pid <<< "$entry"
  if [ "$kind" = matmul ]; then
    if wait "$pid"; then
      echo "variant $name: cuda_matmul_check (checks only):"
      timeout 150 "$HOME/ab-check-$name/cuda_matmul_check" --no-bench 2>&1 | tail -4
    else
      echo "variant $name: cuda_matmul_check did not build"; tail -20 "$HOME/ab-check-$name.log"
    fi
  elif wait "$pid"; then
    echo "variant $name: cuda_ops_check:"
    timeout 100 "$HOME/ab-ops-check-$name" 2>&1 | grep -E "FAIL|FAILURES|mismatch" | tail -12
  else
    echo "variant $name: cuda_ops_check did not build"; tail -20 "$HOME/ab-ops-check-$name.log"
  fi
done

for name in "${names[@]:1}"; do
  [ "${AB_PYTEST:-1}" = 0 ] && break
  [ "${AB_PYTEST:-1}" = 1 ] || [[ " $AB_PYTEST " == *" $name "* ]] || continue
  echo "variant $name: pytest -m gpu"
  # shellcheck disable=SC2086  # the variant's settings are a list of VAR=VALUE words
  env ${variant_env[$name]:-} SPECLA_LIBRARY="$libs/$name.so" timeout 240 python3 -m pytest -m gpu tests -q -x -p no:cacheprovider \
    ${AB_PYTEST_K:+-k "$AB_PYTEST_K"} 2>&1 | tail -3
done

for ((r = 1; r <= rounds; r++)); do
  order=("${names[@]}")
  if [ "${AB_ORDER:-forward}" = alternate ] && ((r % 2 == 0)); then # even rounds run the variants last to first
    order=()
    for ((i = ${#names[@]} - 1; i >= 0; i--)); do order+=("${names[i]}"); done
  fi
  for name in "${order[@]}"; do
    echo "=== round $r: $name"
    # shellcheck disable=SC2086  # bench_args is a list of flags
    [ "$bench_args" = - ] || env ${variant_env[$name]:-} SPECLA_LIBRARY="$libs/$name.so" python3 tools/bench_gpu.py \
      --model "$MODEL" --out "$ROWS" --commit "$commit+$name" $bench_args 2>&1 | tail -20
    if [ -n "${AB_EXTRA:-}" ]; then # one more command per variant and round, e.g. bench_gpu_spec
      echo "=== round $r: $name: AB_EXTRA"
      # shellcheck disable=SC2086
      env ${variant_env[$name]:-} SPECLA_LIBRARY="$libs/$name.so" AB_LABEL="$commit+$name" bash -c "$AB_EXTRA" 2>&1 |
        tail -n "${AB_EXTRA_LINES:-12}"
    fi
  done
done
