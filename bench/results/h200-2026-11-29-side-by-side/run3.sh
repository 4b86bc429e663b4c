#!/bin/bash
# 2026-11-29 third call: the largest gpt2 batch at sequence 2048 that fits (two training
# steps) under each of torch's allocators and vmm, after a quick gpt2 run of each (which
# gives the first guess).
set -u
source scripts/common.sh
start=$SECONDS
vmm_build_torch_allocator . build-gpu || exit 1
echo "built at $((SECONDS - start)) s"
unset PYTORCH_CUDA_ALLOC_CONF PYTORCH_ALLOC_CONF
timeout $((570 - (SECONDS - start))) python3 bench/torch_allocators.py --quick --allocators native,expandable,cudaMallocAsync,vmm \
  --workloads gpt2 --max-batch on --side-by-side off --no-sleep-wake --cpus 0-7 --json "$OUT/batch.json" >"$OUT/batch.log" 2>&1 ||
  echo "batch search: exit $?"
echo "done at $((SECONDS - start)) s"; grep -E "^\[|PASS|FAIL|NOTE" "$OUT/batch.log" | tail -60; tail -12 "$OUT/batch.log"
