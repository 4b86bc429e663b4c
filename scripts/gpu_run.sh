#!/usr/bin/env bash
# Runs on the lent GPU machine (its image has cmake, ninja, nvcc, gtest, benchmark, fmt):
# configure with Ninja, build, print vmm-info, run the tests (and with --bench, the
# benchmarks). Full logs go to $OUT; a summary is printed last.
#   bash scripts/gpu_run.sh [--bench [benchmark filter]]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
build=build-gpu
bench=OFF
[ "${1:-}" = "--bench" ] && bench=ON

nvidia-smi >"$out/nvidia-smi.txt" 2>&1
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DVMM_BUILD_BENCHMARKS=$bench \
  >"$out/configure.log" 2>&1 || { tail -40 "$out/configure.log"; exit 1; }
if ! cmake --build "$build" -j "$(nproc)" >"$out/build.log" 2>&1; then
  grep -E -A5 'error|FAILED' "$out/build.log" | head -80
  exit 1
fi
"$build/vmm/vmm-info" | tee "$out/vmm-info.txt"
"$build/tests/vmm_tests" >"$out/gtest.log" 2>&1
ctest --test-dir "$build" -j 4 --output-on-failure >"$out/ctest.log" 2>&1
ctest_rc=$?
if [ "$bench" = ON ]; then
  for program in "$build"/bench/vmm_bench_*; do
    "$program" --benchmark_filter="${2:-.}" --benchmark_counters_tabular=true \
      --benchmark_out="$out/$(basename "$program").json" --benchmark_out_format=json \
      2>&1 | tee -a "$out/bench.log"
  done
fi
echo "=== gtest summary"
grep -E '^\[  (PASSED|SKIPPED|FAILED) +\]|tests ran' "$out/gtest.log"
echo "=== ctest"
grep -E 'tests passed|tests failed|\*\*\*Failed|Not Run' "$out/ctest.log"
exit $ctest_rc
