#!/usr/bin/env bash
# Runs on the lent GPU machine (its image has cmake, ninja, nvcc, gtest, benchmark, fmt):
# configure with Ninja, build, print vmm-info, run the tests (and with --bench, the
# benchmarks). Full logs go to $OUT/gpu-logs.tar.gz; a summary is printed last.
#   bash scripts/gpu_run.sh [--bench [--quick]]
set -uo pipefail
cd "$(dirname "$0")/.."
# $OUT takes back a few files only: logs are written to a folder, packed at the end.
final=${OUT:-$PWD/gpu-out}
mkdir -p "$final"
out=$(mktemp -d)
trap 'tar czf "$final/gpu-logs.tar.gz" -C "$out" . ; rm -rf "$out"' EXIT
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
# Every test once through ctest (one process a test: a GPU fault in one cannot poison
# another), then the summary of each GoogleTest program run whole.
ctest --test-dir "$build" -j 4 --output-on-failure >"$out/ctest.log" 2>&1
ctest_rc=$?
for program in "$build"/tests/vmm_*tests "$build"/tests/cuda/vmm_*tests; do
  [ -x "$program" ] && "$program" >"$out/gtest-$(basename "$program").log" 2>&1
done
if [ "$bench" = ON ]; then
  # Every benchmark through the one command: $final/bench.json (made into docs/benchmarks.md
  # with its plots by scripts/bench_report.py), raw outputs in $final/bench-logs.tar.gz.
  bash scripts/bench.sh --no-build --build-dir "$build" --out "$final" ${2:+$2} >"$out/bench.log" 2>&1
  tail -25 "$out/bench.log"
  python3 scripts/bench_report.py "$final/bench.json" --no-plots >"$out/bench-report.md" 2>&1
fi
for log in "$out"/gtest-*.log; do
  echo "=== $(basename "$log" .log)"
  grep -E '^\[  (PASSED|SKIPPED|FAILED) +\]|tests ran' "$log"
done
echo "=== ctest"
grep -E 'tests passed|tests failed|\*\*\*Failed|Not Run' "$out/ctest.log"
exit $ctest_rc
