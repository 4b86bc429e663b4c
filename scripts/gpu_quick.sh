#!/usr/bin/env bash
# A focused GPU run for development: build (Release, benchmarks), vmm-info, every test,
# then the programs named as arguments (each a shell command run from the repository root).
# Logs go under $OUT; a summary is printed last.
#   bash scripts/gpu_quick.sh ['build-gpu/bench/vmm_bench_driver ...' ...]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
build="build-gpu"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The ctest python.pip_install_and_pytest installs the package with the python3 of torch.
export VMM_PYTHON=${VMM_PYTHON:-python3}
start=$(date +%s)
if ! { cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DVMM_BUILD_BENCHMARKS=ON >"$out/configure.log" 2>&1 &&
       cmake --build "$build" -j "$(nproc)" >"$out/build.log" 2>&1; }; then
  tail -30 "$out/configure.log"; grep -E -A5 'error|FAILED' "$out/build.log" | head -60; exit 1
fi
echo "build: $(( $(date +%s) - start )) s"
"$build/vmm/vmm-info" | tee "$out/vmm-info.txt"
# CTEST_REGEX limits the tests (ctest -R); CTEST_REGEX=none runs none.
if [ "${CTEST_REGEX:-}" != none ]; then
  ctest --test-dir "$build" -j 6 --timeout 300 --output-on-failure ${CTEST_REGEX:+-R "$CTEST_REGEX"} >"$out/ctest.log" 2>&1
fi
echo "tests: $(( $(date +%s) - start )) s"
for command in "$@"; do
  echo "=== $command"
  bash -c "$command" 2>&1 | tee -a "$out/programs.log" | tail -60
done
echo "=== ctest"
[ -f "$out/ctest.log" ] && grep -E 'tests passed|tests failed|\(Failed\)|\(Timeout\)|Not Run|Exception' "$out/ctest.log" | head -60
echo "total: $(( $(date +%s) - start )) s"
