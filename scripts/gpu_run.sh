#!/usr/bin/env bash
# Runs on the lent GPU machine (its image has cmake, ninja, nvcc, gtest, benchmark, fmt):
# configure with Ninja, build, print vmm-info, run the tests (ctest, then pytest on
# tests/python where pytest is installed; and with --bench, the
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
# vmm_torch with PyTorch and CuPy (tests/python/test_vmm_torch.py; it skips with the reason
# where torch, CuPy or a GPU is missing), where pytest is installed.
pytest_rc=0
if python3 -c "import pytest" 2>/dev/null; then
  VMM_TORCH_LIBRARY="$PWD/$build/python/libvmm_torch_allocator.so" python3 -m pytest -q -rs tests/python \
    >"$out/pytest.log" 2>&1
  pytest_rc=$?
else
  echo "pytest is not installed: tests/python not run" >"$out/pytest.log"
fi
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
echo "=== pytest tests/python"
tail -3 "$out/pytest.log"
[ "$ctest_rc" -ne 0 ] && exit "$ctest_rc"
exit $pytest_rc
