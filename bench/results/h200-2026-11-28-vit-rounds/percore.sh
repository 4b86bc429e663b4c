#!/bin/bash
# percore.c on every CPU in turn, three passes: ms of one round, fastest and slowest of 5.
gcc -O2 -o /tmp/percore bench/results/h200-2026-11-28-vit-rounds/percore.c || exit 1
for pass in 1 2 3; do
  for cpu in $(seq 0 $(($(nproc) - 1))); do
    echo "pass $pass cpu $cpu $(taskset -c $cpu /tmp/percore)"
  done
done
# torch.empty + del of 4 KiB (native allocator) on a few CPUs, twice: us a pair, median of 15
# rounds of 1,000.
for pass in 1 2; do
  for cpu in 0 3 7 11 15; do
    echo "torch pass $pass cpu $cpu $(taskset -c $cpu python3 -c '
import time, statistics, torch
torch.empty(1, device="cuda")
rounds = []
for _ in range(15):
    t = time.perf_counter()
    for _ in range(1000):
        x = torch.empty(4096, dtype=torch.uint8, device="cuda"); del x
    rounds.append((time.perf_counter() - t) * 1e3)
print(round(statistics.median(rounds), 2))
')"
  done
done
