#!/usr/bin/env bash
# Builds libspecla with CUDA for sm_90 on this machine (nvcc is here), as run_gpu.sh's step (a) does
# on the device, into .prebuilt/libspecla.so with the stamp of its sources (source_stamp.sh). A
# device call that carries it, carry=[".whl", ".prebuilt"], starts its GPU tests without waiting
# for a build (about 70 s of every call); run_gpu.sh still builds its own tree meanwhile for the
# steps that need one, and builds first, as before, where the stamp is not that of the sources it
# was given. The CUDA runtime is linked statically, so only the device's driver must accept it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
BUILD=${PREBUILD_DIR:-/tmp/specla-prebuild-cuda}
before=$(bash tools/device/source_stamp.sh)
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPECLA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > /dev/null
cmake --build "$BUILD" -j "$(nproc)"
after=$(bash tools/device/source_stamp.sh)
if [ "$before" != "$after" ]; then
  echo "prebuild.sh: the sources changed during the build; run it again" >&2
  exit 1
fi
mkdir -p .prebuilt
cp "$BUILD/native/libspecla.so" .prebuilt/libspecla.so
echo "$after" > .prebuilt/stamp
echo "built .prebuilt/libspecla.so ($after)"
