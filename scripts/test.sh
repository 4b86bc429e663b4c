#!/usr/bin/env bash
# The README's test command: installs missing Debian packages, builds, runs every test.
# GPU tests skip with the reason where there is no GPU; the OS-provider suites always run.
#   bash scripts/test.sh              # the normal build, in build/
#   bash scripts/test.sh --sanitize   # AddressSanitizer + UndefinedBehaviorSanitizer, in build-asan/
#   bash scripts/test.sh --tsan       # ThreadSanitizer, in build-tsan/
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

build=build
# The sanitizer builds compile at -Og (-O2 took three times as long to compile under ASan on
# CI's two cores) and leave out the CUDA C++ code (its tests need a GPU, and the lent GPU
# runs the normal build: scripts/gpu_run.sh).
sanitized=(-DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-Og -g" -DVMM_CUDA_CODE=OFF)
options=()
case "${1:-}" in
  --sanitize) build=build-asan; options=(-DVMM_SANITIZE=ON "${sanitized[@]}") ;;
  --tsan) build=build-tsan; options=(-DVMM_TSAN=ON "${sanitized[@]}") ;;
  "") ;;
  *) echo "usage: $0 [--sanitize|--tsan]" >&2; exit 2 ;;
esac
vmm_prepare "$build" "${options[@]}"
ctest --test-dir "$build" --output-on-failure -j "$(nproc)"
