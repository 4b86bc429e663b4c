#!/bin/bash
# 2026-11-29 third call: the GPU runner at the working tree (headroom default 1/128), then,
# while the call has time, full vit and llama under vmm at its default (no --vmm-headroom).
set -u
start=$SECONDS
bash scripts/gpu_run.sh 2>&1 | tail -25
echo "runner done at $((SECONDS - start)) s"
((SECONDS - start < 470)) || exit 0
source scripts/common.sh
vmm_build_torch_allocator . build-gpu || exit 1
timeout $((540 - (SECONDS - start))) python3 bench/torch_allocators.py --rounds 1 --cpus 0-7 --allocators vmm \
  --workloads vit,llama --no-sleep-wake --max-batch off --json "$OUT/default.json" 2>&1 | tail -8
echo "done at $((SECONDS - start)) s"
