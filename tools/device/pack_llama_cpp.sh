#!/usr/bin/env bash
# Pack the llama.cpp that llama-cpp-python vendors into .device/llama.cpp.tar.gz, small enough to
# travel with the working tree to a GPU machine that has no network (a device call carries at most
# 64 MiB; the sdist is ~77 MB). Run here, where pip reaches the registry:
#
#     tools/device/pack_llama_cpp.sh            # then carry `.device` in the device call
#
# The sdist is the same llama.cpp our llama-cpp-python tests pin, so llama-bench on the device
# measures the code the parity tests compare against. Left out of the pack: models/ (vocab GGUFs,
# ~40 MB), docs/, tests/, benches/, media/, .git* — CMake configures without them (checked below
# with a CPU-only configure of the packed tree, unless SKIP_CONFIGURE_CHECK=1).
set -euo pipefail
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEST=${1:-$ROOT/.device/llama.cpp.tar.gz}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# The sdist only; pip still prepares its metadata in an isolated build environment, whose build
# dependencies (scikit-build-core, cmake) come as wheels: `--no-binary :all:` would build CMake
# from source there.
python3 -m pip download -q --no-deps --no-binary llama-cpp-python -d "$WORK/sdist" \
  "llama-cpp-python==$VERSION"
SDIST=$(ls "$WORK"/sdist/llama_cpp_python-"$VERSION".tar.gz)
tar -xzf "$SDIST" -C "$WORK" \
  --exclude="*/vendor/llama.cpp/models" --exclude="*/vendor/llama.cpp/docs" \
  --exclude="*/vendor/llama.cpp/tests" --exclude="*/vendor/llama.cpp/benches" \
  --exclude="*/vendor/llama.cpp/media" --exclude="*/vendor/llama.cpp/.git*" \
  "llama_cpp_python-$VERSION/vendor/llama.cpp"
SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"
test -f "$SRC/CMakeLists.txt" || { echo "pack_llama_cpp: no vendor/llama.cpp/CMakeLists.txt in $SDIST" >&2; exit 1; }
test -f "$SRC/tools/llama-bench/llama-bench.cpp" || { echo "pack_llama_cpp: no tools/llama-bench in $SDIST" >&2; exit 1; }
echo "llama-cpp-python==$VERSION" > "$SRC/PACKED_FROM"

if [ "${SKIP_CONFIGURE_CHECK:-0}" != 1 ]; then
  # LLAMA_BUILD_TESTS=OFF: tests/ is not packed. Configure only (seconds); nothing is built.
  cmake -S "$SRC" -B "$WORK/configure-check" -G Ninja -DGGML_CUDA=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=OFF \
    > "$WORK/configure.log" 2>&1 || { tail -30 "$WORK/configure.log" >&2; echo "pack_llama_cpp: the packed tree does not configure" >&2; exit 1; }
  grep -q '^build llama-bench\|bin/llama-bench' "$WORK/configure-check/build.ninja" \
    || { echo "pack_llama_cpp: the configured tree has no llama-bench target" >&2; exit 1; }
fi

mkdir -p "$(dirname "$DEST")"
tar -czf "$DEST.tmp" -C "$(dirname "$SRC")" llama.cpp
mv "$DEST.tmp" "$DEST"
echo "$DEST: llama.cpp from llama-cpp-python==$VERSION, $(du -h "$DEST" | cut -f1)"
