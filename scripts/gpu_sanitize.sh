#!/usr/bin/env bash
# compute-sanitizer over the CUDA tests (tests/cuda) of a GPU build: memcheck (with leak
# checking) and racecheck of each program, on the lent GPU machine.
#   bash scripts/gpu_sanitize.sh [--build-dir DIR] [--timeout SECONDS]
#
# Left out: the tests whose kernels fault on purpose (a write through a read-only mapping, a
# trap, an illegal address): a faulting kernel is what they check, and under the sanitizer
# the fault is reported as an error and stops the program. Driver calls that return an error
# the code expects (the fabric-handle probe's cuMemCreate, refused without an IMEX channel)
# are not reported (--report-api-errors no): memcheck judges memory accesses and leaks.
# Logs go to $OUT/sanitizer/ (or ./sanitizer-out); each run's verdict is printed as it ends
# (and kept in summary.txt), and the exit status is 1 if any found an error or did not finish.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
build=build-gpu
limit=240
while (($#)); do
  case $1 in
    --build-dir) build=$2; shift ;;
    --timeout) limit=$2; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "gpu_sanitize.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
[ -x "$sanitizer" ] || { echo "gpu_sanitize.sh: compute-sanitizer not found" >&2; exit 2; }
logs=${OUT:-$PWD/sanitizer-out}/sanitizer
mkdir -p "$logs"
deliberate_faults='-*_fails:append_faults.*'
: >"$logs/summary.txt"
status=0
summary=()
for program in "$build"/tests/cuda/vmm_*tests; do
  [ -x "$program" ] || continue
  name=$(basename "$program")
  for tool in memcheck racecheck; do
    options=(--tool "$tool" --error-exitcode 9 --report-api-errors no)
    [ "$tool" = memcheck ] && options+=(--leak-check full)
    log="$logs/$tool-$name.log"
    timeout "$limit" "$sanitizer" "${options[@]}" "$program" --gtest_filter="$deliberate_faults" >"$log" 2>&1
    rc=$?
    verdict=clean
    if [ "$rc" = 124 ]; then verdict="did not finish in $limit s"; status=1
    elif [ "$rc" != 0 ]; then verdict="rc $rc: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|FAILED' "$log" | head -2 | tr '\n' ' ')"; status=1
    fi
    tests=$(grep -Eo '^\[  PASSED  \] [0-9]+' "$log" | grep -Eo '[0-9]+$')
    summary+=("$tool $name: $verdict (${tests:-0} tests passed)")
    echo "${summary[-1]}" | tee -a "$logs/summary.txt"
  done
done
if [ "${#summary[@]}" = 0 ]; then
  echo "gpu_sanitize.sh: no CUDA test program under $build/tests/cuda (build with a GPU toolkit first)" >&2
  exit 2
fi
exit "$status"
