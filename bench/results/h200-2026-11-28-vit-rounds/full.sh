#!/bin/bash
# The full vit workload (40 steps, 32 timed, resolutions 160-384) under torch's three
# allocators and vmm, four rounds in alternating order on cores 0-7: full.json / full.log.
set -u
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > /tmp/cfg.log 2>&1 &&
  cmake --build build-gpu -j16 --target vmm_torch_allocator > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
export VMM_TORCH_LIBRARY=$PWD/build-gpu/python/libvmm_torch_allocator.so
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
start=$SECONDS
timeout 500 python3 bench/torch_allocators.py --rounds 4 --cpus 0-7 \
  --allocators native,expandable,cudaMallocAsync,vmm --workloads vit --no-sleep-wake --max-batch off \
  --json $OUT/full.json 2>&1 | tee /tmp/full.log | grep -v "^\[transformers\]" | tail -30
cp /tmp/full.log $OUT/full.log
echo "done at $((SECONDS-start)) s"
