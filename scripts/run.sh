#!/usr/bin/env bash
# The README's main command: builds what is missing, prints the capability table, runs the
# grow-and-share demo, then the growth benchmark against the baselines a user would pick
# instead, with its report. On the GPU when there is one, otherwise on the OS provider.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
vmm_prepare build -DVMM_BUILD_BENCHMARKS=ON >/dev/null
build/vmm/vmm-info
echo
build/samples/grow_and_share
echo
build/bench/vmm_bench_grow --benchmark_min_time=0.05 --benchmark_out=build/grow.json \
  --benchmark_out_format=json >build/grow.log 2>&1 || { cat build/grow.log; exit 1; }
python3 scripts/bench_report.py build/grow.json
