#!/usr/bin/env bash
# One line naming the sources libspecla is built from and how: the build run_gpu.sh makes (CUDA,
# sm_90, Release) and a hash of every file under native/ and of the top CMakeLists.txt. A carried
# prebuilt library (tools/device/prebuild.sh) is used on the device only where this line is the one
# it was built with.
set -euo pipefail
cd "$(dirname "$0")/../.."
hash=$(find native CMakeLists.txt -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
echo "cuda sm_90 Release $hash"
