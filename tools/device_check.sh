#!/usr/bin/env bash
# On a GPU machine without registry access: build libspecla with the CUDA backend, report what
# the library sees, and run the whole test suite against that build. Needs the wheels the tests
# import (gguf, llama-cpp-python, diskcache) in .whl/ (see docs/perf.md for how they are fetched).
# Writes logs under $OUT (or ./device-out).
set -uo pipefail
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
BUILD=$HOME/specla-build
{ cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPECLA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 &&
  cmake --build "$BUILD"; } > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
export SPECLA_LIBRARY=$BUILD/native/libspecla.so
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "from pyspecla import _native as n; print('cuda devices seen by libspecla:', n.cuda_device_count(), '| cpu kernels:', {1: 'scalar', 2: 'avx2'}[n.cpu_best_kernels()])" | tee -a "$OUT/gpu.txt"
python3 -m pytest tests -q -ra -p no:cacheprovider 2>&1 | tee "$OUT/tests.log" | tail -15
