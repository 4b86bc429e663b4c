#!/bin/bash
# torch's three allocators and vmm (the code as committed), quick gpt2 / llama / vit with
# scaled_dot_product_attention off cuDNN (bench/torch_allocators.py's default since this
# folder), three rounds in alternating order, every process on cores 0-7.
# bash four.sh [NAME]: NAME.json and NAME.log under $OUT (default four).
set -u
name=${1:-four}
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > /tmp/cfg.log 2>&1 &&
  cmake --build build-gpu -j16 --target vmm_torch_allocator > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
export VMM_TORCH_LIBRARY=$PWD/build-gpu/python/libvmm_torch_allocator.so
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 560 python3 bench/torch_allocators.py --quick --rounds 3 --cpus 0-7 \
  --allocators native,expandable,cudaMallocAsync,vmm --workloads gpt2,llama,vit --no-sleep-wake --max-batch off \
  --json $OUT/$name.json 2>&1 | tee /tmp/four.log | grep -v "^\[transformers\]" | tail -45
cp /tmp/four.log $OUT/$name.log
