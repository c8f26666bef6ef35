#!/usr/bin/env bash
# Device check of elementwise.cu / attention.cu / logits.cu against the CPU backend's ops, including
# the bit-identity claims the C-ABI tests cannot reach (split == unsplit attention, one query alone
# == the same query in a batch, a tree node == causal decoding of its path). Needs the CPU backend
# archive of a build (cmake --build BUILD --target specla_cpu). Usage, from the repository root:
#   bash tools/device/cuda_ops_check/build.sh BUILD_DIR OUT_BINARY && OUT_BINARY   # prints FAILURES n
# (OUT_BINARY --tensor-cores also runs the attention cases on the opt-in tensor-core path)
set -euo pipefail
cd "$(dirname "$0")/../../.."
BUILD=${1:-build/dev}
BIN=${2:-$BUILD/cuda_ops_check}
ARCH=${CUDA_ARCH:-sm_90}
F="-O2 -arch=$ARCH -I native/include -I native/common -I native/backends/cuda"
TMP=$(mktemp -d)
gcc -O2 -c -I native/include -I native/common native/common/error.c -o "$TMP/error.o"
for f in elementwise attention logits recurrent; do nvcc $F -c native/backends/cuda/$f.cu -o "$TMP/$f.o"; done
nvcc $F tools/device/cuda_ops_check/check.cu "$TMP/elementwise.o" "$TMP/attention.o" "$TMP/logits.o" "$TMP/recurrent.o" \
  "$BUILD/native/libspecla_cpu.a" "$TMP/error.o" -Xcompiler -fopenmp -lgomp -lm -o "$BIN"
echo "built $BIN"
