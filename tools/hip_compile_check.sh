#!/usr/bin/env bash
# Compile-check the CUDA backend as HIP for RDNA 3 / 3.5 (gfx1100, gfx1151: Strix Halo) on a
# machine with no GPU and no ROCm runtime (CI). Debian packages only:
#   clang-19 / lld-19 / llvm-19 (clang-offload-bundler, llvm-as), libamdhip64-dev (ROCm 5.2 HIP
#   headers) and rocm-device-libs (amdgcn bitcode).
# Debian's own hipcc is clang-15, which cannot target gfx1151, hence clang++-19 -x hip. Debian's
# ROCm 5.2 bitcode has no oclc_isa_version_11xx.bc; each of those only defines the constant
# __oclc_ISA_version (e.g. 11501 for gfx1151), so they are generated here with llvm-as-19.
#
# Fails on any compile error and on the remark of amdgpu-remove-incompatible-functions: that pass
# silently drops a kernel that uses an instruction the target lacks (e.g. amd_mixed_dot on gfx11,
# whose int8 dot is __builtin_amdgcn_sudot4), leaving an empty kernel without an error.
#
# Then (HIP_CMAKE_BUILD=0 skips it) the library itself is built with -DSPECLA_HIP=ON through
# native/backends/hip/CMakeLists.txt (CMake's HIP language needs libclang-rt-19-dev) and loaded:
# with no GPU it must report 0 devices.
#
#     tools/hip_compile_check.sh            # as root (installs missing packages with apt-get)
#     HIP_ARCHS="gfx1151" HIP_CMAKE_BUILD=0 tools/hip_compile_check.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
HIP_ARCHS=${HIP_ARCHS:-"gfx1151 gfx1100"}
OUT_DIR=${HIP_CHECK_DIR:-$ROOT/build/hip-check}
export HIP_PLATFORM=amd  # with nvcc on PATH the HIP headers would pick the NVIDIA platform
start=$(date +%s)

packages=(clang-19 lld-19 llvm-19 clang-tools-19 libclang-rt-19-dev libamdhip64-dev rocm-device-libs)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "hip_compile_check: missing packages ${missing[*]} (run as root or install them)" >&2
    exit 1
  fi
  echo "hip_compile_check: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
fi
installed=$(date +%s)

# Debian's amdgcn bitcode folder (rocm-device-libs), completed with the ISA-version files it lacks.
SYS_BITCODE=$(dirname "$(dpkg -L rocm-device-libs | grep '/ocml\.bc$' | head -1)")
test -f "$SYS_BITCODE/ocml.bc" || { echo "hip_compile_check: no ocml.bc from rocm-device-libs" >&2; exit 1; }
mkdir -p "$OUT_DIR/bitcode"
ln -sf "$SYS_BITCODE"/*.bc "$OUT_DIR/bitcode/"
for arch in $HIP_ARCHS; do
  gfx=${arch#gfx}  # 1151 -> ISA version 11.5.1 -> 11501; 1100 -> 11000
  case ${#gfx} in
    4) version=$(( ${gfx:0:2} * 1000 + 16#${gfx:2:1} * 100 + 16#${gfx:3:1} )) ;;
    3) version=$(( ${gfx:0:1} * 1000 + 16#${gfx:1:1} * 100 + 16#${gfx:2:1} )) ;;
    *) echo "hip_compile_check: cannot read the ISA version of $arch" >&2; exit 1 ;;
  esac
  bc="$OUT_DIR/bitcode/oclc_isa_version_$gfx.bc"
  if [ ! -f "$SYS_BITCODE/oclc_isa_version_$gfx.bc" ]; then
    # the same module as one Debian ships (its data layout and attributes), another constant
    templates=("$SYS_BITCODE"/oclc_isa_version_*.bc)
    template=${templates[0]}
    llvm-dis-19 -o - "$template" \
      | sed -E "s/(@__oclc_ISA_version = .* i32 )[0-9]+/\1$version/" \
      | llvm-as-19 -o "$bc"
    llvm-dis-19 -o - "$bc" | grep -q "i32 $version" \
      || { echo "hip_compile_check: could not write $bc" >&2; exit 1; }
  fi
done

arch_flags=()
for arch in $HIP_ARCHS; do arch_flags+=(--offload-arch="$arch"); done
hip_flags=(-x hip -std=c++17 -O3 "${arch_flags[@]}" --hip-device-lib-path="$OUT_DIR/bitcode" -fPIC
           -DSPECLA_USE_HIP=1 -I"$ROOT/native/include" -I"$ROOT/native/common" -I"$ROOT/native/backends/cuda"
           -Rpass=amdgpu-remove-incompatible-functions)
# HIP_CHECK_SOURCES: other files to check (the script's own test feeds it a kernel that must fail)
sources=${HIP_CHECK_SOURCES:-$(ls "$ROOT"/native/backends/cuda/*.cu)}
status=0
for src in $sources; do
  name=$(basename "${src%.cu}")
  log="$OUT_DIR/$name.log"
  # host + device object (what the HIP build links), then the device code alone as an offload
  # bundle: a host object holds no bundle while the file defines no kernel, the bundle always does
  if ! { clang++-19 "${hip_flags[@]}" -c "$src" -o "$OUT_DIR/$name.o" &&
         clang++-19 "${hip_flags[@]}" --offload-device-only -c "$src" -o "$OUT_DIR/$name.hipfb"; } > "$log" 2>&1; then
    cat "$log" >&2
    echo "hip_compile_check: $src does not compile as HIP" >&2
    status=1
    continue
  fi
  cat "$log"
  if grep -q "remark:.*amdgpu-remove-incompatible-functions" "$log"; then
    echo "hip_compile_check: $src: a function was dropped for an instruction the target lacks (remark above)" >&2
    status=1
    continue
  fi
  bundle=$(clang-offload-bundler-19 --list --type=o --input="$OUT_DIR/$name.hipfb")
  echo "$name: $(echo "$bundle" | tr '\n' ' ')"
  for arch in $HIP_ARCHS; do
    echo "$bundle" | grep -q -- "--$arch\$" || { echo "hip_compile_check: $src has no $arch code object" >&2; status=1; }
  done
done
compiled=$(date +%s)

if [ "${HIP_CMAKE_BUILD:-1}" = 1 ] && [ "$status" = 0 ]; then
  hip_arch_list=$(echo "$HIP_ARCHS" | tr ' ' ';')
  if cmake -S "$ROOT" -B "$OUT_DIR/cmake" -G Ninja -DSPECLA_CUDA=OFF -DSPECLA_HIP=ON \
       -DCMAKE_HIP_COMPILER=clang++-19 -DCMAKE_HIP_ARCHITECTURES="$hip_arch_list" \
       -DCMAKE_HIP_FLAGS="--hip-device-lib-path=$OUT_DIR/bitcode" > "$OUT_DIR/cmake.log" 2>&1 &&
     cmake --build "$OUT_DIR/cmake" >> "$OUT_DIR/cmake.log" 2>&1; then
    devices=$(SPECLA_LIBRARY="$OUT_DIR/cmake/native/libspecla.so" PYTHONPATH="$ROOT" python3 -c \
      "from pyspecla import _native; print(_native.cuda_device_count())" 2>&1)
    if [ "$devices" = 0 ]; then
      echo "libspecla.so built with -DSPECLA_HIP=ON ($hip_arch_list): loads, sees 0 devices"
    else
      echo "hip_compile_check: the HIP libspecla.so does not load cleanly: $devices" >&2
      status=1
    fi
  else
    tail -30 "$OUT_DIR/cmake.log" >&2
    echo "hip_compile_check: the -DSPECLA_HIP=ON build failed (log: $OUT_DIR/cmake.log)" >&2
    status=1
  fi
fi
end=$(date +%s)
echo "hip_compile_check: install $((installed - start)) s, compile $((compiled - installed)) s, library build $((end - compiled)) s, status $status"
exit $status
