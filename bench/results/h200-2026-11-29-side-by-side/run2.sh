#!/bin/bash
# 2026-11-29 second call: the six allocators side by side again, each process timing a fixed
# piece of pure-Python work between its rounds (the host's speed as it sees it), six repeats
# so that every allocator runs once on each of the six CPUs.
set -u
source scripts/common.sh
start=$SECONDS
vmm_build_torch_allocator . build-gpu || exit 1
echo "built at $((SECONDS - start)) s"
unset PYTORCH_CUDA_ALLOC_CONF PYTORCH_ALLOC_CONF
timeout 300 python3 bench/torch_allocators.py --empty-del-only --allocators native,expandable,cudaMallocAsync,vmm,pluggable_floor \
  --side-by-side-seconds 8 --side-by-side-repeats 6 --json "$OUT/side2.json" >"$OUT/side2.log" 2>&1 ||
  { echo "side by side failed"; tail -30 "$OUT/side2.log"; }
echo "side by side done at $((SECONDS - start)) s"; tail -22 "$OUT/side2.log"
