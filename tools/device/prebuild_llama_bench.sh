#!/usr/bin/env bash
# Builds llama.cpp's llama-bench with CUDA for sm_90 HERE (the 2-core machine, where nvcc 13 is) from
# the pack that pack_llama_cpp.sh wrote, into .device/llama-bench.gz with a stamp naming the pack.
# A device call that carries `.device` then times llama.cpp without building it: build_llama_bench.sh
# runs the carried binary when its stamp names the carried pack and it starts there, and builds from
# the pack as before otherwise. The device build took 322 s on the H200 machine and 233 s on an H100
# one, beside our benchmarks; so a call that measures both runtimes needs about that much less budget.
#
#     tools/device/prebuild_llama_bench.sh        # 22 min on 2 cores; then carry .device/llama-bench.{gz,stamp}
#
# The build is the device's (build_llama_bench.sh: Release, GGML_NATIVE=OFF, sm_90 real code) but
# static in llama.cpp's own libraries, so the binary needs only the CUDA runtime and cuBLAS of the
# device's toolkit (libcudart.so.13, libcublas.so.13, found there through the loader or the wrapper
# build_llama_bench.sh writes) and its driver. Its parts that this machine lacks:
# - cuBLAS headers and libraries: the registry's nvidia-cublas wheel for nvcc's major version,
#   unpacked under the build folder (only for linking; the binary loads the device's copy);
# - libcuda.so, the driver: a stub with the soname libcuda.so.1 that defines the driver entry points
#   ggml-cuda's objects name (read off them with nm), so that the link resolves; the device's driver
#   provides the real ones when the binary starts.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PACK=${1:-$ROOT/.device/llama.cpp.tar.gz}
WORK=${LLAMA_PREBUILD_DIR:-/tmp/specla-llama-prebuild}
OUT_BIN=$ROOT/.device/llama-bench.gz
OUT_STAMP=$ROOT/.device/llama-bench.stamp
NVCC=${NVCC:-$(command -v nvcc || true)}
CUDA_ARCH=${LLAMA_CUDA_ARCHITECTURES:-90-real}

test -f "$PACK" || { echo "prebuild_llama_bench: no $PACK (run tools/device/pack_llama_cpp.sh first)" >&2; exit 1; }
test -n "$NVCC" || { echo "prebuild_llama_bench: no nvcc on PATH (set NVCC)" >&2; exit 1; }
# the toolkit's root: CUDA_ROOT, else /usr/local/cuda (this machine's nvcc on PATH is a wrapper script
# that execs the toolkit's), else the folder above nvcc's
CUDA_ROOT=${CUDA_ROOT:-$(readlink -f /usr/local/cuda 2>/dev/null || (cd "$(dirname "$(readlink -f "$NVCC")")/.." && pwd))}
test -x "$CUDA_ROOT/bin/nvcc" || { echo "prebuild_llama_bench: no $CUDA_ROOT/bin/nvcc (set CUDA_ROOT)" >&2; exit 1; }
cuda_major=$("$CUDA_ROOT/bin/nvcc" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
test -n "$cuda_major" || { echo "prebuild_llama_bench: could not read nvcc's version" >&2; exit 1; }
pack_sum=$(sha256sum < "$PACK" | cut -d' ' -f1)
mkdir -p "$WORK"
SRC=$WORK/llama.cpp
BUILD=$WORK/build

if [ ! -f "$SRC/CMakeLists.txt" ] || [ "$(cat "$WORK/pack.sha256" 2>/dev/null)" != "$pack_sum" ]; then
  rm -rf "$SRC" "$BUILD"
  tar -xzf "$PACK" -C "$WORK"
  echo "$pack_sum" > "$WORK/pack.sha256"
fi

# cuBLAS: the toolkit's own where it has one, else the registry wheel's
cublas_args=()
if [ ! -f "$CUDA_ROOT/include/cublas_v2.h" ]; then
  CUBLAS=$WORK/cublas
  if [ ! -f "$CUBLAS/nvidia/cu$cuda_major/include/cublas_v2.h" ]; then
    rm -rf "$CUBLAS"; mkdir -p "$CUBLAS"
    python3 -m pip download -q --no-deps --only-binary=:all: -d "$CUBLAS" "nvidia-cublas>=$cuda_major,<$((cuda_major + 1))"
    (cd "$CUBLAS" && python3 -m zipfile -e nvidia_cublas-*.whl . && rm -f nvidia_cublas-*.whl)
  fi
  lib=$CUBLAS/nvidia/cu$cuda_major/lib
  ln -sf "libcublas.so.$cuda_major" "$lib/libcublas.so"
  ln -sf "libcublasLt.so.$cuda_major" "$lib/libcublasLt.so"
  cublas_args=(-DCUDA_cublas_LIBRARY="$lib/libcublas.so" -DCUDA_cublasLt_LIBRARY="$lib/libcublasLt.so"
    -DCMAKE_CUDA_FLAGS="-I$CUBLAS/nvidia/cu$cuda_major/include" -DCMAKE_CXX_FLAGS="-I$CUBLAS/nvidia/cu$cuda_major/include"
    -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$lib")
fi

# the driver stub: an empty library first (CMake's CUDA::cuda_driver needs a file), its symbols
# once ggml-cuda's objects exist
STUB=$WORK/cuda-stub
mkdir -p "$STUB"
if [ ! -f "$STUB/libcuda.so" ]; then
  echo "void specla_llama_prebuild_stub(void) {}" > "$STUB/stub.c"
  cc -shared -fPIC -o "$STUB/libcuda.so" "$STUB/stub.c" -Wl,-soname,libcuda.so.1
fi

if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DBUILD_SHARED_LIBS=OFF -DCMAKE_CUDA_COMPILER="$CUDA_ROOT/bin/nvcc" -DCUDAToolkit_ROOT="$CUDA_ROOT" \
    -DCUDA_cuda_driver_LIBRARY="$STUB/libcuda.so" "${cublas_args[@]}" > "$WORK/configure.log"
fi
ninja -C "$BUILD" -j "$(nproc)" ggml-cuda

# every driver entry point the objects name (cuda.h maps the API names to versioned ones such as
# cuMemGetInfo_v2; the real libcuda.so.1 exports those)
archive=$(find "$BUILD" -name 'libggml-cuda.a' | head -1)
nm -u "$archive" | awk '{print $2}' | grep -E '^cu[A-Z]' | sort -u > "$STUB/symbols.txt"
{ echo "/* generated by prebuild_llama_bench.sh: link-time stand-ins, never run */"
  sed 's/.*/void &(void) {}/' "$STUB/symbols.txt"; } > "$STUB/stub.c"
cc -shared -fPIC -o "$STUB/libcuda.so" "$STUB/stub.c" -Wl,-soname,libcuda.so.1
echo "driver stub: $(wc -l < "$STUB/symbols.txt") entry points"

ninja -C "$BUILD" -j "$(nproc)" llama-bench
BIN=$BUILD/bin/llama-bench
test -x "$BIN" || { echo "prebuild_llama_bench: ninja finished but $BIN is missing" >&2; exit 1; }
# what the binary needs from the device: the CUDA runtime, cuBLAS, the driver, the C/C++ runtime
readelf -d "$BIN" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' '; echo
strip -o "$WORK/llama-bench" "$BIN"
mkdir -p "$(dirname "$OUT_BIN")"
gzip -9 -c "$WORK/llama-bench" > "$OUT_BIN"
echo "pack $pack_sum cuda $cuda_major arch $CUDA_ARCH" > "$OUT_STAMP"
echo "built $OUT_BIN ($(du -h "$OUT_BIN" | cut -f1)), stamp: $(cat "$OUT_STAMP")"
