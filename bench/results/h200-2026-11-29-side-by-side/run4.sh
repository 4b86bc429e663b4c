#!/bin/bash
# 2026-11-29 fourth call (after the GPU runner): native, vmm, the pluggable floor and
# vmm_pool side by side again, six repeats of 10 s, to see whether run2's ratios hold.
set -u
source scripts/common.sh
start=$SECONDS
vmm_build_torch_allocator . build-gpu || exit 1
unset PYTORCH_CUDA_ALLOC_CONF PYTORCH_ALLOC_CONF
timeout 300 python3 bench/torch_allocators.py --empty-del-only --allocators native,vmm,pluggable_floor \
  --side-by-side-seconds 10 --side-by-side-repeats 6 --json "$OUT/side4.json" >"$OUT/side4.log" 2>&1 ||
  { echo "side by side failed"; tail -30 "$OUT/side4.log"; }
echo "done at $((SECONDS - start)) s"; tail -16 "$OUT/side4.log"
