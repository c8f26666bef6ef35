#!/usr/bin/env bash
# Builds libspecla with CUDA for sm_90 on this machine (nvcc is here), as run_gpu.sh's step (a) does
# on the device, into .prebuilt/libspecla.so with the stamp of its sources (source_stamp.sh). A
# device call that carries it, carry=[".whl", ".prebuilt"], starts its GPU tests without waiting
# for a build (about 70 s of every call); run_gpu.sh still builds its own tree meanwhile for the
# steps that need one, and builds first, as before, where the stamp is not that of the sources it
# was given. The CUDA runtime is linked statically, so only the device's driver must accept it.
#
# A variant library for an A/B (ab_variants.sh's NAME=lib:PATH) comes from the same sources with
# other CMake options, into another folder, without touching .prebuilt/libspecla.so:
#   PREBUILD_DIR=/tmp/specla-prebuild-noevict PREBUILD_OUT=.prebuilt/noevict \
#     PREBUILD_CMAKE_ARGS="-DSPECLA_CUDA_WEIGHTS_EVICT_FIRST=OFF" bash tools/device/prebuild.sh
# (its stamp file names the options after the sources' stamp).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
BUILD=${PREBUILD_DIR:-/tmp/specla-prebuild-cuda}
OUT=${PREBUILD_OUT:-.prebuilt}
# shellcheck disable=SC2206  # a list of CMake arguments
extra=(${PREBUILD_CMAKE_ARGS:-})
# a variant must not replace the default library the device calls carry (its own PREBUILD_DIR, too,
# spares both builds recompiling every CUDA source each time they alternate)
if [ ${#extra[@]} -gt 0 ] && [ "$OUT" = .prebuilt ]; then
  echo "prebuild.sh: PREBUILD_CMAKE_ARGS needs its own PREBUILD_OUT (not .prebuilt)" >&2
  exit 2
fi
before=$(bash tools/device/source_stamp.sh)
# -U first: an option left in the cache by an earlier configure (or a default the sources changed
# since) must not outlive the arguments given now
cmake -U 'SPECLA_*' -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPECLA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  "${extra[@]}" > /dev/null
cmake --build "$BUILD" -j "$(nproc)"
after=$(bash tools/device/source_stamp.sh)
if [ "$before" != "$after" ]; then
  echo "prebuild.sh: the sources changed during the build; run it again" >&2
  exit 1
fi
mkdir -p "$OUT"
cp "$BUILD/native/libspecla.so" "$OUT/libspecla.so"
echo "$after${extra[*]:+ ${extra[*]}}" > "$OUT/stamp"
echo "built $OUT/libspecla.so ($after${extra[*]:+ ${extra[*]}})"
