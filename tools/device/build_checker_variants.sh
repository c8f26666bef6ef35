#!/usr/bin/env bash
# Builds several cuda_matmul_check variants of this tree at once, for the device's diagnosis scripts
# (diagnose_matmul.sh, diagnose_tile.sh): the CPU oracle library once, then one checker per
# NAME=NVCC_FLAGS in parallel (each is one single-threaded nvcc of matmul.cu) into PREFIX-NAME/.
#
#   bash tools/device/build_checker_variants.sh PREFIX normal= load-only=-DMM_LOAD_ONLY trace=-DMM_TRACE
#
# Exit status 1 when the CPU library did not build; a checker that did not build is reported (with
# its log's tail) and leaves no PREFIX-NAME/cuda_matmul_check.
set -uo pipefail
prefix=${1:?PREFIX}
shift
root=$(cd "$(dirname "$0")/../.." && pwd)
cpu_lib=$HOME/diag-cpu-lib
if ! { cmake -S "$root" -B "$cpu_lib" -G Ninja -DSPECLA_CUDA=OFF -DCMAKE_BUILD_TYPE=Release &&
       cmake --build "$cpu_lib" -j "$(nproc)"; } > "$HOME/diag-cpu-lib.log" 2>&1; then
  echo "build_checker_variants: the CPU oracle library did not build"; tail -20 "$HOME/diag-cpu-lib.log"; exit 1
fi
for spec in "$@"; do
  name=${spec%%=*}
  EXTRA_NVCC_FLAGS=${spec#*=} CPU_LIB_BUILD=$cpu_lib \
    bash "$root/tools/device/build_cuda_checks.sh" "$prefix-$name" 90 > "$prefix-$name.log" 2>&1 &
done
wait
for spec in "$@"; do
  name=${spec%%=*}
  [ -x "$prefix-$name/cuda_matmul_check" ] || { echo "build_checker_variants: the $name checker did not build"; tail -20 "$prefix-$name.log"; }
done
exit 0
