#!/bin/bash
# vit alone under torch's three allocators and vmm, five rounds in alternating order on cores
# 0-7 (vit.json / vit.log), then two vmm processes running gpt2, llama and vit in turn (the
# order experiment's lines; o1.json, o2.json): does vit's slow path after the other two
# still cost more than alone?
set -u
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > /tmp/cfg.log 2>&1 &&
  cmake --build build-gpu -j16 --target vmm_torch_allocator > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
export VMM_TORCH_LIBRARY=$PWD/build-gpu/python/libvmm_torch_allocator.so
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 330 python3 bench/torch_allocators.py --quick --rounds 5 --cpus 0-7 \
  --allocators native,expandable,cudaMallocAsync,vmm --workloads vit --no-sleep-wake --max-batch off \
  --json $OUT/vit.json 2>&1 | tee /tmp/vit.log | grep -v "^\[transformers\]" | tail -16
cp /tmp/vit.log $OUT/vit.log
bash bench/results/h200-2026-11-28-attention/order.sh vmm:gpt2,llama,vit vmm:gpt2,llama,vit
