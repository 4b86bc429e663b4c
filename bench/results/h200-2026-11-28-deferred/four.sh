#!/bin/bash
# torch's three allocators and vmm, quick gpt2 / llama / vit, three rounds in alternating
# order, every process on cores 0-7.
set -u
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > $OUT/cfg.log 2>&1 &&
  cmake --build build-gpu -j16 --target vmm_torch_allocator > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
export VMM_TORCH_LIBRARY=$PWD/build-gpu/python/libvmm_torch_allocator.so
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 560 python3 bench/torch_allocators.py --quick --rounds 3 --cpus 0-7 \
  --allocators native,expandable,cudaMallocAsync,vmm --workloads gpt2,llama,vit --no-sleep-wake --max-batch off \
  --json $OUT/four.json 2>&1 | tee $OUT/four.log | grep -v "^\[transformers\]" | tail -45
