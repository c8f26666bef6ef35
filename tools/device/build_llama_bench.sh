#!/usr/bin/env bash
# On the GPU machine: build llama.cpp's llama-bench with the CUDA backend for the H200 (sm_90) from
# the pack that tools/device/pack_llama_cpp.sh wrote (.device/llama.cpp.tar.gz, carried with the
# call). Extracts under $HOME and reuses an earlier build there (a warm machine keeps $HOME); or,
# where prebuild_llama_bench.sh built one from the same pack and it starts here, uses that binary.
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

# A llama-bench that prebuild_llama_bench.sh built from this pack on the 2-core machine (carried as
# .device/llama-bench.gz) is used as it is where it starts here: llama.cpp's build then costs the
# call nothing. Its CUDA runtime and cuBLAS come from this machine's toolkit, found below and named
# to the loader by a wrapper script, whose path is printed as the binary's. Anything amiss (another
# pack, a start that fails, a library not found among them, or no GPU seen) is said and the build
# from the pack follows. Without the pack (a call may carry the binary and its stamp alone: the
# pack adds 11 MB to the 64 MiB a call carries) there is nothing to compare and nothing to fall
# back to.
carried_llama_bench() {
  local dir=$HOME/llama-bench-carried stamp_sum lib found libdirs=
  stamp_sum=$(cut -d' ' -f2 "$ROOT/.device/llama-bench.stamp" 2>/dev/null || true)
  if [ -z "$stamp_sum" ]; then
    echo "build_llama_bench: the carried llama-bench has no stamp (.device/llama-bench.stamp); building" >&2; return 1
  fi
  if [ -f "$PACK" ] && [ "$(sha256sum < "$PACK" | cut -d' ' -f1)" != "$stamp_sum" ]; then
    echo "build_llama_bench: the carried llama-bench was built from another pack than $PACK; building" >&2; return 1
  fi
  rm -rf "$dir"; mkdir -p "$dir"
  gunzip -c "$CARRIED" > "$dir/llama-bench" && chmod +x "$dir/llama-bench"
  # the folders of the CUDA libraries it needs that the loader's cache lacks (the driver is the loader's)
  for lib in $(readelf -d "$dir/llama-bench" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(libcu[a-zA-Z]*\.so[.0-9]*\)\]/\1/p' || true); do
    [ "$lib" = libcuda.so.1 ] && continue
    ldconfig -p 2>/dev/null | awk '{print $1}' | grep -qx "$lib" && continue
    found=$(find /usr/local /opt /usr/lib -name "$lib" 2>/dev/null | head -1 || true)
    [ -n "$found" ] && libdirs="${libdirs:+$libdirs:}$(dirname "$found")"
  done
  printf '#!/bin/sh\nLD_LIBRARY_PATH="%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "%s" "$@"\n' \
    "$libdirs" "$dir/llama-bench" > "$dir/llama-bench.sh"
  chmod +x "$dir/llama-bench.sh"
  # it must start (the loader names a library it cannot find) and see the GPU (--list-devices: CUDA0)
  if ! "$dir/llama-bench.sh" --list-devices > "$dir/start.log" 2>&1 || ! grep -q "CUDA0" "$dir/start.log"; then
    echo "build_llama_bench: the carried llama-bench does not start here ($(tail -2 "$dir/start.log" | tr '\n' ' ')); building" >&2
    return 1
  fi
  echo "build_llama_bench: the carried llama-bench starts (libraries from: ${libdirs:-the loader cache})" >&2
  echo "$dir/llama-bench.sh"
}
CARRIED=$ROOT/.device/llama-bench.gz
if [ "$GGML_CUDA" = ON ] && [ -f "$CARRIED" ] && [ "${LLAMA_BENCH_CARRIED:-1}" = 1 ]; then
  carried_llama_bench && exit 0
fi
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
