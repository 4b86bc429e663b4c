#!/usr/bin/env bash
# Every benchmark in one command, merged into one JSON file:
#   bash scripts/bench.sh [--quick] [--out DIR] [--build-dir DIR] [--budget SECONDS] [--no-build]
#                         [--only REGEX]
#
# Builds (benchmarks on, tests and samples off) in --build-dir ($VMM_BENCH_BUILD, default
# build-bench), then runs
#   - every build/bench/vmm_bench_* program (found by that pattern, so new ones are run
#     without being listed here) with --benchmark_out_format=json;
#   - vmm-replay --json on each trace of bench/data: on GPU 0 where there is one, else on the
#     OS provider simulated (--simulate: the resource's bookkeeping, no memory written);
#   - bench/torch_allocators.py, where a Python with torch and a CUDA device is found
#     ($VMM_BENCH_PYTHON, python3, /opt/torch/.venv/bin/python3), with the package vmm
#     installed by it with pip into BUILD_DIR/torch-venv (also with --no-build);
# and merges everything into DIR/bench.json (default DIR: bench-out): a "context" block
# (machine, driver, CUDA, date, git commit, GPU or not and why) and one section per program.
# Raw outputs and logs go to DIR/bench-logs.tar.gz. Then:
#   python3 scripts/bench_report.py DIR/bench.json --out docs   # docs/benchmarks.md + plots
#
# Without a GPU the programs run what they can: vmm_bench_grow, vmm_bench_resource and
# vmm_bench_resource_ipc have OS-provider rows, the others skip every row with the reason.
#
# --quick: --benchmark_min_time=0.05 (vmm_bench_append still on 1 Gi keys, the size its
#   targets are set at), torch_allocators.py
#   --quick, and a time budget of 480 s for the whole script (build included): a program
#   that would start past it is skipped, and each runs under a timeout of what is left
#   (torch_allocators.py, about 150 s after the package's install, is skipped when less
#   than 200 s are left).
#   Expected on an H100: build 1-2 min, the programs 2-3 min, torch_allocators.py 2.5 min.
#   Without a GPU (2 cores): about 100 s once built. bench.json's context has the times.
# --only REGEX: runs only the parts whose name matches (grep -E): a program's name
#   (vmm_bench_grow), vmm_replay for the traces, torch_allocators. For a full run split over
#   several shorter sessions: each writes its own DIR/bench-logs.tar.gz; unpack them into one
#   directory and merge it (python3 scripts/bench_report.py --merge WORK OUT.json). The last
#   part's context.txt is the one kept.
# --filter REGEX: Google Benchmark's --benchmark_filter for every program that runs (with
#   --only to pick one): splits one long program over several calls. The merged JSON marks
#   such a program "partial"; bench_report.py --fill-from completes it from the other parts'
#   JSON (whole tables, as for a program cut short by its time limit).
# Full run: Google Benchmark's default min time, 1 Gi keys, torch_allocators.py in full
#   (6-8 min on an H100 alone); no budget unless --budget is given. On an H200 (2026-12-02)
#   vmm_bench_grow took about 13 min (its five repetitions at the default min time: 464 s
#   for its first 14 rows, 325 s for the other 24), every other program and the replays
#   6-7 min, and torch_allocators.py had not finished after 480 s (the largest-batch search
#   runs one process per attempt and allocator): expect 30-35 min in all, so split it with
#   --only where calls are shorter (vmm_bench_grow with --filter '^grow/16GiB', then
#   --filter '^(grow/4GiB|grow_once|reach)'), torch_allocators in a part of its own.
# vmm_bench_grow, vmm_bench_driver and vmm_bench_growth_ahead (issue 16's rows) run 5
#   repetitions each, and the report takes their medians: single short runs of their rows
#   moved by 10-30 % on the lent H100s (2026-11-24). Not interleaved, so that each row follows
#   its own repetitions; and cold rows wait for the driver to finish with the memory the run
#   before released (bench/settle.hpp).
# VMM_BENCH_TORCH_ARGS: more arguments for torch_allocators.py, split at spaces (e.g.
#   "--max-batch off" for a full run without the largest-batch search, which fits in a
#   shorter session); its JSON says whether the search ran (max_batch_search).
# Nothing here enforces a target: the exit status is 0 when bench.json was written.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

quick=0
out=bench-out
build=${VMM_BENCH_BUILD:-build-bench}
budget=""
do_build=1
only=""
filter=""
while (($#)); do
  case $1 in
    --quick) quick=1 ;;
    --out) out=$2; shift ;;
    --build-dir) build=$2; shift ;;
    --budget) budget=$2; shift ;;
    --no-build) do_build=0 ;;
    --only) only=$2; shift ;;
    --filter) filter=$2; shift ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 0 ;;
    *) echo "bench.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$budget" ] || { [ "$quick" = 1 ] && budget=480 || budget=0; }

start=$(date +%s)
# Whether the part named $1 is to run (--only).
wanted() { [ -z "$only" ] || grep -Eq -- "$only" <<<"$1"; }
elapsed() { echo $(( $(date +%s) - start )); }
# Seconds left of the budget (a large number without one).
left() { if [ "$budget" -gt 0 ]; then echo $(( budget - $(elapsed) )); else echo 100000; fi; }

mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/programs" "$work/replay" "$work/torch"
# Several GPUs: NCCL's NVLink multicast stays off on the lent machines.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

# ---- the machine ----------------------------------------------------------------------------
gpu=0
no_gpu_reason=""
if ! command -v nvidia-smi >/dev/null 2>&1; then
  no_gpu_reason="nvidia-smi not found"
elif ! nvidia-smi -L >"$work/nvidia-smi-L.txt" 2>&1 || ! grep -q '^GPU ' "$work/nvidia-smi-L.txt"; then
  no_gpu_reason="nvidia-smi lists no GPU: $(head -c 200 "$work/nvidia-smi-L.txt" | tr '\n' ' ')"
else
  gpu=1
fi
{
  echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host=$(hostname 2>/dev/null)"
  echo "git_commit=$(git rev-parse HEAD 2>/dev/null)"
  echo "git_branch=$(git rev-parse --abbrev-ref HEAD 2>/dev/null)"
  echo "git_dirty=$([ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] && echo 1 || echo 0)"
  echo "cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
  echo "cpus=$(nproc)"
  echo "memory_bytes=$(awk '/^MemTotal:/ {print $2 * 1024}' /proc/meminfo)"
  echo "kernel=$(uname -r)"
  echo "gpu=$gpu"
  echo "no_gpu_reason=$no_gpu_reason"
  echo "quick=$quick"
  echo "build_dir=$build"
  if [ "$gpu" = 1 ]; then
    # One line a GPU: "name, memory, driver" -> gpu_name=, gpu_memory=, driver= lines.
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null |
      sed 's/^ *\([^,]*\), *\([^,]*\), *\(.*\)$/gpu_name=\1\ngpu_memory=\2\ndriver=\3/' 
    echo "cuda_driver_api=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -1)"
  fi
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  [ -x "$nvcc" ] && echo "nvcc=$("$nvcc" --version | sed -n 's/.*release \([0-9.]*\), V\([0-9.]*\).*/\2/p')"
} >"$work/context.txt"
[ "$gpu" = 1 ] && nvidia-smi >"$work/nvidia-smi.txt" 2>&1
if [ "$gpu" = 1 ]; then echo "bench.sh: $(grep -c '^GPU ' "$work/nvidia-smi-L.txt") GPU(s)"; else echo "bench.sh: no GPU ($no_gpu_reason): OS-provider rows only"; fi

# ---- build ----------------------------------------------------------------------------------
# shellcheck source=scripts/common.sh
source scripts/common.sh
if [ "$do_build" = 1 ]; then
  # Install only where a tool is missing: the lent GPU image has every tool (cmake and ninja
  # from pip, which dpkg does not know) and no network.
  if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null || ! command -v c++ >/dev/null ||
     { [ ! -f /usr/local/cuda/include/cuda.h ] && [ ! -f /usr/include/cuda.h ]; }; then
    vmm_install_missing || echo "bench.sh: could not install every package; building with what is there" >&2
  fi
  echo "bench.sh: building in $build"
  if ! vmm_configure_and_build "$build" -DCMAKE_BUILD_TYPE="${VMM_BENCH_BUILD_TYPE:-Release}" \
      -DVMM_BUILD_BENCHMARKS=ON -DVMM_BUILD_TESTS=OFF -DVMM_BUILD_SAMPLES=OFF >"$work/build.log" 2>&1; then
    grep -E -A5 'error|FAILED' "$work/build.log" | head -60
    tail -20 "$work/build.log"
    exit 1
  fi
  echo "bench.sh: built in $(elapsed) s"
fi
echo "build_seconds=$(elapsed)" >>"$work/context.txt"

"$build/vmm/vmm-info" >"$work/vmm-info.txt" 2>&1

# Runs one command under a timeout of what is left of the budget (capped at $1 seconds),
# recording its exit status and time in $2.status; output goes to $2.log.
run_timed() {
  local cap=$1 base=$2
  shift 2
  local remaining
  remaining=$(left)
  if [ "$remaining" -lt 20 ]; then
    printf 'skipped\t0\tthe time budget of %s s was spent\n' "$budget" >"$base.status"
    echo "  skipped: the time budget of $budget s was spent"
    return 0
  fi
  [ "$remaining" -lt "$cap" ] && cap=$remaining
  local t0 rc
  t0=$(date +%s.%N)
  timeout --signal=TERM --kill-after=10 "$cap" "$@" >"$base.log" 2>&1
  rc=$?
  local seconds
  seconds=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    printf 'timed_out\t%s\tkilled after %s s (rc %s)\n' "$seconds" "$cap" "$rc" >"$base.status"
  else
    printf 'exited\t%s\t%s\n' "$seconds" "$rc" >"$base.status"
  fi
  printf '%s\n' "$*" >"$base.command"
  echo "  $(cut -f1 "$base.status") after $(printf '%.0f' "$seconds") s$( [ "$rc" = 0 ] || echo " (rc $rc)")"
}

# ---- the benchmark programs -----------------------------------------------------------------
if [ "$quick" = 1 ]; then program_cap=150; else program_cap=1800; fi
for program in "$build"/bench/vmm_bench_*; do
  [ -x "$program" ] && [ -f "$program" ] || continue
  name=$(basename "$program")
  wanted "$name" || continue
  args=(--benchmark_out="$work/programs/$name.json" --benchmark_out_format=json)
  if [ "$quick" = 1 ]; then
    args+=(--benchmark_min_time=0.05)
  fi
  [ -n "$filter" ] && args+=(--benchmark_filter="$filter")
  case "$name" in
    vmm_bench_grow | vmm_bench_driver | vmm_bench_growth_ahead) args+=(--benchmark_repetitions=5) ;;
    # A 7B model's 291 tensors, 12.6 GiB in BF16, for up to 8 processes (up to 9 copies on
    # the GPU at once: the set and a copy per process); --quick divides every dimension by 4.
    vmm_bench_tensor_set) [ "$quick" = 1 ] && args+=(--scale=4) ;;
  esac
  echo "bench.sh: $name (${args[*]:2})"
  run_timed "$program_cap" "$work/programs/$name" "$program" "${args[@]}"
done

# ---- traces through vmm-replay --------------------------------------------------------------
# The peak of live bytes a trace asks for (each request as given).
trace_peak_live() {
  zcat -f "$1" | awk '$1 == "a" { size[$2] = $3; live += $3; if (live > peak) peak = live }
                      $1 == "f" { live -= size[$2]; delete size[$2] } END { printf "%.0f\n", peak }'
}
for trace in bench/data/*.trace.gz; do
  [ -f "$trace" ] && wanted vmm_replay || continue
  name=$(basename "$trace" .trace.gz)
  base="$work/replay/$name"
  location_args=(--location gpu0)
  if [ "$gpu" = 0 ]; then
    # No GPU: the OS provider, simulated (pages at first touch, nothing written), with a
    # budget of twice the trace's peak live bytes in whole GiB.
    peak=$(trace_peak_live "$trace")
    location_args=(--location os_host --simulate "$(( (2 * peak >> 30) + 1 ))GiB")
  fi
  echo "bench.sh: vmm-replay $name (${location_args[*]})"
  run_timed 300 "$base" "$build/vmm/vmm-replay" "$trace" "${location_args[@]}" --json "$base.json"
done

# ---- PyTorch's allocators against vmm -------------------------------------------------------
torch_python=""
torch_why="no Python with torch and a CUDA device found (tried \$VMM_BENCH_PYTHON, python3, /opt/torch/.venv/bin/python3)"
if ! wanted torch_allocators; then
  :
elif [ "$gpu" = 1 ]; then
  for candidate in "${VMM_BENCH_PYTHON:-}" python3 /opt/torch/.venv/bin/python3; do
    [ -n "$candidate" ] && command -v "$candidate" >/dev/null 2>&1 || continue
    if "$candidate" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
      torch_python=$candidate
      break
    fi
  done
else
  torch_why="no GPU ($no_gpu_reason)"
fi
# Its JSON is written at the end only: a run cut short by the budget leaves nothing.
if [ -n "$torch_python" ] && [ "$quick" = 1 ] && [ "$(left)" -lt 200 ]; then
  torch_python=""
  torch_why="--quick takes about 150 s and only $(left) s of the budget were left"
fi
# vmm's allocator is the package vmm, installed with pip by that Python into a fresh virtual
# environment that sees its packages (torch): the benchmark and its processes run there.
if [ -n "$torch_python" ]; then
  echo "bench.sh: installing the package vmm with $torch_python"
  if vmm_install_python_package "$torch_python" "$build/torch-venv" >"$work/torch/pip-install.log" 2>&1; then
    torch_python=$build/torch-venv/bin/python
  else
    torch_why="the package vmm could not be installed with $torch_python: $(tail -1 "$work/torch/pip-install.log")"
    torch_python=""
  fi
fi
if [ -n "$torch_python" ]; then
  torch_args=(bench/torch_allocators.py --json "$work/torch/torch_allocators.json")
  if [ "$quick" = 1 ]; then torch_args+=(--quick --timeout 240); fi
  read -r -a extra <<<"${VMM_BENCH_TORCH_ARGS:-}"
  torch_args+=("${extra[@]}")
  echo "bench.sh: torch_allocators.py with $torch_python (${torch_args[*]:3})"
  run_timed 3600 "$work/torch/torch_allocators" "$torch_python" "${torch_args[@]}"
elif wanted torch_allocators; then  # a part left out by --only leaves no record to merge
  printf 'skipped\t0\t%s\n' "$torch_why" >"$work/torch/torch_allocators.status"
  echo "bench.sh: torch_allocators.py skipped: $torch_why"
fi

# ---- one JSON -------------------------------------------------------------------------------
echo "total_seconds=$(elapsed)" >>"$work/context.txt"
tar czf "$out/bench-logs.tar.gz" -C "$work" . 2>/dev/null
if ! python3 scripts/bench_report.py --merge "$work" "$out/bench.json"; then
  echo "bench.sh: merging failed; the raw outputs are in $out/bench-logs.tar.gz" >&2
  exit 1
fi
echo "bench.sh: $out/bench.json in $(elapsed) s (raw outputs and logs: $out/bench-logs.tar.gz)"
# The report (scripts/bench_report.py) draws its plots with matplotlib, a Debian package that
# only this script asks for; where it cannot be had the report has its tables alone. Last and
# time-boxed: the lent GPU machines have no network.
if ! python3 -c 'import matplotlib' 2>/dev/null && ! /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  if [ "$(left)" -gt 90 ]; then
    timeout 60 bash -c 'source scripts/common.sh && vmm_apt_install_missing python3-matplotlib' >/dev/null 2>&1 ||
      echo "bench.sh: python3-matplotlib could not be installed here: the report will have tables but no plots"
  fi
fi
echo "bench.sh: report: python3 scripts/bench_report.py $out/bench.json --out docs"
