#!/bin/bash
# 2026-11-29 first call: vit's allocation trace as the live workload makes it (100 steps,
# native, for vmm-replay), then 400-step vit of native beside vmm at headroom 1/128 and 3/256.
set -u
here=$(dirname "$0")
source scripts/common.sh
start=$SECONDS
vmm_build_torch_allocator . build-gpu || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
unset PYTORCH_CUDA_ALLOC_CONF PYTORCH_ALLOC_CONF
timeout 200 python3 bench/torch_allocators.py --rounds 1 --steps 100 --cpus 0-7 --allocators native --workloads vit \
  --no-sleep-wake --max-batch off --record "$OUT" --json "$OUT/record.json" >"$OUT/record.log" 2>&1 ||
  { echo "record failed"; tail -20 "$OUT/record.log"; }
echo "recorded at $((SECONDS - start)) s"; ls -la "$OUT"
bash "$here/shares.sh" $((560 - (SECONDS - start))) shares 400 vit native "vmm 0.0078125" "vmm 0.01171875"
