#!/bin/bash
# Every trace of bench/data replayed on the OS host (two passes, 30 GiB simulated), the
# device 0, 150 and 1,000 events behind, at each headroom given: one line a replay.
# Usage (from the repository root, vmm-replay built in build/): bash THIS_DIR/replays.sh SHARE...
ulimit -n 20000
for share in "$@"; do
  for trace in bench/data/*.trace.gz; do
    for lag in 0 150 1000; do
      out=$(./build/vmm/vmm-replay "$trace" --location os_host --simulate 30GiB --lag $lag --repeat 2 --headroom "$share" 2>&1)
      printf "%-10s %-17s lag %4s  %s  %s\n" "$share" "$(basename "$trace" .trace.gz)" $lag \
        "$(grep -o 'reserved/live  [0-9.]*' <<<"$out" | awk '{print $2}')" "$(grep '^pages:' <<<"$out" | cut -d';' -f1,3)"
    done
  done
done
