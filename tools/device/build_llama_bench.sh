#!/usr/bin/env bash
# On the GPU machine: build llama.cpp's llama-bench with the CUDA backend for the H200 (sm_90) from
# the pack that tools/device/pack_llama_cpp.sh wrote (.device/llama.cpp.tar.gz, carried with the
# call). Extracts under $HOME and reuses an earlier build there (a warm machine keeps $HOME).
# Prints the path of the llama-bench binary on its last line.
#
#     tools/device/build_llama_bench.sh [PACK]        # PACK defaults to .device/llama.cpp.tar.gz
#     GGML_CUDA=OFF HOME=/tmp/x nice tools/device/build_llama_bench.sh   # CPU-only, anywhere
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PACK=${1:-$ROOT/.device/llama.cpp.tar.gz}
SRC=$HOME/llama.cpp
# GGML_CUDA=OFF builds a CPU-only llama-bench (to check the pack on a machine without a GPU)
GGML_CUDA=${GGML_CUDA:-ON}
BUILD=$HOME/llama.cpp-build-cuda-$GGML_CUDA
BIN=$BUILD/bin/llama-bench
CUDA_ARCH=${LLAMA_CUDA_ARCHITECTURES:-90-real}

test -f "$PACK" || { echo "build_llama_bench: no $PACK (run tools/device/pack_llama_cpp.sh here and carry .device)" >&2; exit 1; }
if [ ! -f "$SRC/CMakeLists.txt" ] || ! cmp -s "$PACK" "$SRC/.pack.tar.gz"; then
  rm -rf "$SRC"
  tar -xzf "$PACK" -C "$HOME"
  cp "$PACK" "$SRC/.pack.tar.gz"  # the pack this tree came from, to tell a new pack from the old
  rm -rf "$BUILD"
fi
if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA="$GGML_CUDA" \
    -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF
fi
ninja -C "$BUILD" -j "$(nproc)" llama-bench
test -x "$BIN" || { echo "build_llama_bench: ninja finished but $BIN is missing" >&2; exit 1; }
echo "$BIN"
