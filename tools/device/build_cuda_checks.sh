#!/usr/bin/env bash
# Builds the CPU library (the oracle, libspecla) and tools/cuda_matmul_check, which links the CUDA
# matmul sources (native/backends/cuda/matmul.cu) and calls the oracle through libspecla's C ABI.
#
#   tools/device/build_cuda_checks.sh [BUILD_DIR] [SM]      defaults: build/cuda-check 90
#
# Then, on a machine with a GPU:
#   BUILD_DIR/cuda_matmul_check --json OUT.jsonl --commit "$(git rev-parse --short HEAD)"
# and anywhere (no GPU: the host model of the kernels against the CPU oracle):
#   BUILD_DIR/cuda_matmul_check --host-model --quick --self-test
# The ptxas report of the kernels goes to BUILD_DIR/ptxas.txt, one line per kernel to
# BUILD_DIR/ptxas-summary.txt.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build/cuda-check}
sm=${2:-90}
case "$sm" in *[!0-9]*|'') echo "build_cuda_checks.sh: SM must be a number such as 90 (got '$sm')" >&2; exit 2;; esac
mkdir -p "$build"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
# CPU_LIB_BUILD: an existing CPU-only build directory of this tree to link against (the A/B script
# builds one checker per variant; the oracle library does not change between them)
if [ -n "${CPU_LIB_BUILD:-}" ]; then
    lib="$CPU_LIB_BUILD/native"
    [ -f "$lib/libspecla.so" ] || { echo "build_cuda_checks.sh: CPU_LIB_BUILD=$CPU_LIB_BUILD has no native/libspecla.so" >&2; exit 2; }
else
    cmake -S "$root" -B "$build/lib" "${generator[@]}" -DSPECLA_CUDA=OFF -DCMAKE_BUILD_TYPE=Release >"$build/cmake.log"
    cmake --build "$build/lib" -j "$(nproc)" >>"$build/cmake.log"
    lib="$build/lib/native"
fi
# EXTRA_NVCC_FLAGS: e.g. -DMM_TARGET_UNITS=4096 to try another matmul plan (it changes the order)
# shellcheck disable=SC2086
if ! nvcc -O3 -std=c++20 -arch="sm_$sm" ${EXTRA_NVCC_FLAGS:-} -Xptxas -v -Xcompiler -fopenmp,-ffp-contract=off \
    -I"$root/native/backends/cuda" -I"$root/native/common" -I"$root/native/include" \
    "$root/tools/cuda_matmul_check.cu" "$root/native/backends/cuda/matmul.cu" \
    -L"$lib" -lspecla -Xlinker -rpath="$lib" -o "$build/cuda_matmul_check" 2>"$build/ptxas.txt"; then
    grep -v "^ptxas info" "$build/ptxas.txt" >&2
    echo "build_cuda_checks.sh: nvcc failed (full output in $build/ptxas.txt)" >&2
    exit 1
fi
# one line per kernel: name<type id, tokens per pass>, stack frame, spill stores, registers
grep -E "Compiling entry|stack frame|registers" "$build/ptxas.txt" | paste - - - |
    sed -E 's/.*function .([A-Za-z0-9_]+). for .(sm_[0-9a]+).*[^0-9]([0-9]+) bytes stack frame, ([0-9]+) bytes spill stores.*Used ([0-9]+) registers.*/\2 \1 stack \3 spill \4 registers \5/' \
    >"$build/ptxas-summary.txt"
awk '$4 != 0 || $6 != 0 {bad++} END {printf "kernels: %d, with a stack frame or spills: %d (see %s)\n", NR, bad + 0, FILENAME}' \
    "$build/ptxas-summary.txt"
echo "built $build/cuda_matmul_check"
