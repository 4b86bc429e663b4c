#!/bin/bash
# after.py in three processes on cores 0-7 (the library as committed).
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > /tmp/cfg.log 2>&1 &&
  cmake --build build-gpu -j16 --target vmm_torch_allocator > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
export VMM_TORCH_LIBRARY=$PWD/build-gpu/python/libvmm_torch_allocator.so
for i in 1 2 3; do
  echo "process $i"
  timeout 80 taskset -c 0-7 python3 bench/results/h200-2026-11-28-vit-rounds/after.py 2>&1 | grep -v "^\[transformers\]\|Warning\|warn"
done
