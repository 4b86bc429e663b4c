#!/usr/bin/env bash
# Runs on the lent GPU machine (its image has cmake, ninja, nvcc, gtest, benchmark, fmt, and a
# python3 with torch, CuPy, pip, setuptools, wheel and pytest): configure with Ninja, build,
# print vmm-info, run the tests (ctest; then the package vmm installed with pip by
# $VMM_PYTHON, default python3, and pytest of tests/python against it; the README's PyTorch
# quick start on it; and with --bench, the benchmarks). Full logs go to $OUT/gpu-logs.tar.gz;
# a summary is printed last.
#   bash scripts/gpu_run.sh [--bench [--quick]]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# NVLink multicast stays off on the lent machines (NCCL, PyTorch, NVSHMEM).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# $OUT takes back a few files only: logs are written to a folder, packed at the end.
final=${OUT:-$PWD/gpu-out}
mkdir -p "$final"
out=$(mktemp -d)
trap 'tar czf "$final/gpu-logs.tar.gz" -C "$out" . ; rm -rf "$out"' EXIT
build="build-gpu"
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
# another), then the summary of each GoogleTest program run whole. The ctest of the Python
# package (label python) is left out here and its script run below, with the python3 that
# holds torch rather than the ctest's /usr/bin/python3, and its own log.
ctest --test-dir "$build" -j 4 -LE python --output-on-failure >"$out/ctest.log" 2>&1
ctest_rc=$?
# The package vmm, installed with pip from this tree into a fresh virtual environment that
# sees every package of the interpreter (torch, CuPy), and pytest -rs of tests/python against
# it: tests/python/pip_install_check.sh, the ctest's script. test_vmm_torch.py's GPU tests
# skip with the reason where torch, CuPy or a GPU is missing; 77 means skipped (no pytest).
python=${VMM_PYTHON:-python3}
venv=$build/python-package/venv
VMM_PYTHON=$python bash tests/python/pip_install_check.sh . "$build/python-package" "$build/vmm/vmm-replay" \
  >"$out/pytest.log" 2>&1
pytest_rc=$?
[ "$pytest_rc" -eq 77 ] && pytest_rc=0
# The README's PyTorch quick start on the installed package (77: skipped, it says why).
sample_rc=0
if [ -x "$venv/bin/python" ]; then
  "$venv/bin/python" samples/torch_quick_start.py >"$out/torch_quick_start.log" 2>&1
  sample_rc=$?
else
  echo "torch_quick_start: not run: no environment was made in $venv (see pytest.log)" >"$out/torch_quick_start.log"
fi
[ "$sample_rc" -eq 77 ] && sample_rc=0
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
echo "=== pip install of the package vmm with $python, pytest tests/python against it"
grep -E '^vmm .* installed in |^pip install of .* failed|has no pip|has no pytest|could not make|does not import' \
  "$out/pytest.log" | head -5
tail -3 "$out/pytest.log"
echo "=== samples/torch_quick_start.py"
tail -1 "$out/torch_quick_start.log"
[ "$ctest_rc" -ne 0 ] && exit "$ctest_rc"
[ "$pytest_rc" -ne 0 ] && exit "$pytest_rc"
exit "$sample_rc"
