#!/bin/bash
# 2026-11-29 first call: torch.empty + del of six allocators side by side (the same seconds,
# a core each, CPUs rotated over four repeats), then a quick native / vmm run of the
# workloads (the benchmark's own empty_del_samples on a GPU).
set -u
source scripts/common.sh
start=$SECONDS
vmm_build_torch_allocator . build-gpu || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
lscpu -e=CPU,CORE,SOCKET,NODE >"$OUT/lscpu.txt" 2>&1
echo "built at $((SECONDS - start)) s"
unset PYTORCH_CUDA_ALLOC_CONF PYTORCH_ALLOC_CONF
timeout 240 python3 bench/torch_allocators.py --empty-del-only --allocators native,expandable,cudaMallocAsync,vmm,pluggable_floor \
  --side-by-side-seconds 10 --side-by-side-repeats 4 --json "$OUT/side.json" >"$OUT/side.log" 2>&1 ||
  { echo "side by side failed"; tail -30 "$OUT/side.log"; }
echo "side by side done at $((SECONDS - start)) s"; tail -15 "$OUT/side.log"
timeout $((540 - (SECONDS - start))) python3 bench/torch_allocators.py --quick --allocators native,vmm --workloads gpt2,vit \
  --cpus 0-7 --side-by-side-seconds 3 --json "$OUT/quick.json" >"$OUT/quick.log" 2>&1 ||
  { echo "quick failed"; tail -30 "$OUT/quick.log"; }
echo "quick done at $((SECONDS - start)) s"; tail -25 "$OUT/quick.log"
