#!/bin/bash
# 2026-11-29 fifth call, after the review's mend (one child_command for every child): native
# and vmm (and vmm_pool) side by side, two repeats of 5 s, to see the children start and pin.
set -u
source scripts/common.sh
vmm_build_torch_allocator . build-gpu || exit 1
unset PYTORCH_CUDA_ALLOC_CONF PYTORCH_ALLOC_CONF
timeout 200 python3 bench/torch_allocators.py --empty-del-only --allocators native,vmm \
  --side-by-side-seconds 5 --side-by-side-repeats 2 --json "$OUT/side5.json" >"$OUT/side5.log" 2>&1 ||
  { echo "side by side failed"; tail -30 "$OUT/side5.log"; }
tail -12 "$OUT/side5.log"
