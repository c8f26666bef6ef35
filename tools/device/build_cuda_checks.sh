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
# The ptxas register / spill report of the kernels goes to BUILD_DIR/ptxas.txt.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build/cuda-check}
sm=${2:-90}
case "$sm" in *[!0-9]*|'') echo "build_cuda_checks.sh: SM must be a number such as 90 (got '$sm')" >&2; exit 2;; esac
mkdir -p "$build"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$root" -B "$build/lib" "${generator[@]}" -DSPECLA_CUDA=OFF -DCMAKE_BUILD_TYPE=Release >"$build/cmake.log"
cmake --build "$build/lib" -j "$(nproc)" >>"$build/cmake.log"
lib="$build/lib/native"
nvcc -O3 -std=c++17 -arch="sm_$sm" -Xptxas -v -Xcompiler -fopenmp,-ffp-contract=off \
    -I"$root/native/backends/cuda" -I"$root/native/common" -I"$root/native/include" \
    "$root/tools/cuda_matmul_check.cu" "$root/native/backends/cuda/matmul.cu" \
    -L"$lib" -lspecla -Xlinker -rpath="$lib" -o "$build/cuda_matmul_check" 2>"$build/ptxas.txt"
grep -E "spill|registers" "$build/ptxas.txt" | paste - - | awk '{print $5, $9, $14, $15, $16}' | sort | uniq -c | sort -rn | head -5 || true
echo "built $build/cuda_matmul_check"
