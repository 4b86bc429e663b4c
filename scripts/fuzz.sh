#!/usr/bin/env bash
# Fuzzing (tests/fuzz/): builds the libFuzzer targets with clang, ASan and UBSan in build-fuzz/,
# replays each target's regression inputs (tests/fuzz/regressions/<target>/), then fuzzes it
# from a scratch copy of its committed corpus (tests/fuzz/corpus/<target>/) for a bounded time.
#   bash scripts/fuzz.sh 45                       # CI: 45 s per target (default 60), the corpus untouched
#   bash scripts/fuzz.sh 300                      # longer, the corpus still untouched
#   bash scripts/fuzz.sh --long 3600 [target...]  # then minimize each corpus and keep it
# Options before the seconds: --jobs N fuzzes each target in N processes at once (libFuzzer's
# fork mode, all sharing one corpus; the executions are their sum), and --no-build uses the
# targets already in build-fuzz/tests/fuzz/ (built on another machine of the same
# architecture: a machine without clang can fuzz).
# The long mode fuzzes each target (all, or those named) for the seconds given, then merges
# what it found into a minimal corpus (libFuzzer -merge=1 into a fresh directory that starts
# with the named seeds, so that only inputs adding coverage join them) and writes it back to
# tests/fuzz/corpus/<target>/, for a commit. Prints the executions per target (and, in the long
# mode, the corpus sizes). Exits non-zero if any target failed a regression input or found a
# crash, a leak, a timeout or an out-of-memory (a target with a finding keeps its corpus); the
# inputs it found are kept in build-fuzz/findings/<target>/, the logs in build-fuzz/fuzz-logs/.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh

usage() {
  echo "usage: $0 [--jobs N] [--no-build] [seconds per target (default 60)]" >&2
  echo "       $0 [--jobs N] [--no-build] --long <seconds per target> [target...]" >&2
  exit 2
}
long=0
jobs=1
build=1
while (($#)); do
  case $1 in
    --jobs) [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || usage; jobs=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    --long) long=1; shift; (($#)) || usage ;;
    *) break ;;
  esac
done
seconds=${1:-60}
[[ $seconds =~ ^[1-9][0-9]*$ ]] || usage
(($#)) && shift

if ((build)); then
  vmm_install_fuzz_tools
  vmm_prepare build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DVMM_FUZZ=ON -DVMM_BUILD_TESTS=OFF \
    -DVMM_BUILD_SAMPLES=OFF -DVMM_BUILD_BENCHMARKS=OFF -DVMM_CUDA_CODE=OFF >build-fuzz.build.log 2>&1 ||
    { cat build-fuzz.build.log; exit 1; }
fi

# The longest input worth trying per target: beyond it an input only repeats what shorter
# ones do (the targets read at most 16-64 messages or operations).
declare -A max_len=([manifest]=8192 [fd_channel]=8192 [handoff]=4096 [import]=8192 [stateful]=512 [store_message]=4096
                   [trace]=4096 [byte_size]=64 [conf]=512 [handle_header]=2048 [safetensors]=4096
                   [tensor_table]=4096)
targets=(manifest fd_channel handoff import stateful store_message trace byte_size conf handle_header safetensors
         tensor_table)
if ((long && $#)); then
  for target in "$@"; do
    [[ -v max_len[$target] ]] || { echo "$0: no fuzz target '$target' (${targets[*]})" >&2; exit 2; }
  done
  targets=("$@")
elif (($#)); then
  usage
fi

logs=build-fuzz/fuzz-logs
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
rm -rf "$logs"
mkdir -p "$logs"
export UBSAN_OPTIONS=print_stacktrace=1

# What a failed run says: the finding, the sanitizer's summary, the first frames in vmm, and
# where libFuzzer wrote the input.
summarize() {
  grep -E 'vmm fuzz finding|^==[0-9]+==ERROR|^SUMMARY|^ +#[0-9]+ .* in vmm::|Test unit written|ALARM|out-of-memory' "$1" |
    grep -v ' in vmm::fuzz::' | head -n 14 | sed 's/^/    /'
}

# The long mode's corpus: the named seeds (make_seeds.cpp; libFuzzer names what it finds by
# the SHA-1 of its bytes) and, merged after them, whatever of the committed and the new inputs
# adds coverage, written back to tests/fuzz/corpus/<target>/.
keep_minimized_corpus() {
  local target=$1 binary=$2
  shift 2
  local committed=tests/fuzz/corpus/$target fresh=$scratch/$target/minimized
  local before after
  before=$(find "$committed" -type f | wc -l)
  mkdir -p "$fresh"
  find "$committed" -maxdepth 1 -regextype posix-extended -type f ! -regex '.*/[0-9a-f]{40}' \
    -exec cp {} "$fresh/" \;
  if ! "$binary" "$@" -merge=1 "$fresh" "$scratch/$target/corpus" >"$logs/$target.merge.log" 2>&1; then
    echo "$target: the merge failed (log: $logs/$target.merge.log)"
    failures+=("$target: merge")
    return
  fi
  rm -rf "$committed"
  cp -r "$fresh" "$committed"
  after=$(find "$committed" -type f | wc -l)
  report[-1]+=$(printf ', corpus %d -> %d inputs (%s)' "$before" "$after" "$(du -sh "$committed" | cut -f1)")
}

failures=()
report=()
for target in "${targets[@]}"; do
  binary=build-fuzz/tests/fuzz/vmm_fuzz_$target
  findings=build-fuzz/findings/$target
  mkdir -p "$findings" "$scratch/$target"
  options=(-rss_limit_mb=2048 -timeout=10 "-max_len=${max_len[$target]}" -print_final_stats=1
           "-artifact_prefix=$findings/")

  shopt -s nullglob
  regressions=(tests/fuzz/regressions/"$target"/*)
  shopt -u nullglob
  for input in "${regressions[@]}"; do
    log="$logs/$target.regression.$(basename "$input").log"
    if ! "$binary" "${options[@]}" "$input" >"$log" 2>&1; then
      echo "$target: regression input $input fails:"
      summarize "$log"
      failures+=("$target: $input")
    fi
  done

  cp -r "tests/fuzz/corpus/$target" "$scratch/$target/corpus"
  log="$logs/$target.log"
  echo "fuzzing $target for ${seconds}s"
  status=0
  if ((jobs > 1)); then
    # Fork mode: the parent's status lines ("#RUNS: cov: ...") count every child's executions.
    "$binary" "${options[@]}" -fork="$jobs" -max_total_time="$seconds" "$scratch/$target/corpus" >"$log" 2>&1 ||
      status=$?
    runs=$(sed -n 's/^#\([0-9][0-9]*\): cov:.*/\1/p' "$log" | tail -n 1)
  else
    "$binary" "${options[@]}" -max_total_time="$seconds" "$scratch/$target/corpus" >"$log" 2>&1 || status=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  fi
  report+=("$(printf '%-11s %12s executions' "$target" "${runs:-?}")")
  if ((status != 0)) || [ -z "$runs" ]; then
    echo "$target: the fuzzer stopped with status $status (log: $log):"
    summarize "$log"
    failures+=("$target: fuzzing (status $status)")
  elif ((long)); then
    keep_minimized_corpus "$target" "$binary" "${options[@]}"
  fi
done

echo
echo "executions per target (${seconds}s each):"
printf '  %s\n' "${report[@]}"
if ((${#failures[@]})); then
  echo "findings:"
  printf '  %s\n' "${failures[@]}"
  exit 1
fi
echo "no findings"
