#!/bin/bash
# vit's GPU timeline (profile_vit.py, CUDA activity only): native, vmm at its default
# headroom and at 1/16, twice each in alternating order
set -u
mkdir -p $OUT/c
here=bench/results/h200-2026-11-28-tradeoff
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > $OUT/c/cfg.log 2>&1 &&
  cmake --build build-gpu -j16 --target vmm_torch_allocator > $OUT/c/build.log 2>&1 || { tail -30 $OUT/c/build.log; exit 1; }
export VMM_TORCH_LIBRARY=$PWD/build-gpu/python/libvmm_torch_allocator.so PROFILE_CUDA_ONLY=1
i=0
for run in "native" "vmm" "vmm 0.0625" "vmm 0.0625" "vmm" "native"; do
  i=$((i + 1)); name=$i-$(echo $run | tr ' ' '-')
  timeout 120 taskset -c 0-7 python3 $here/profile_vit.py $run $OUT/c/$name.json > $OUT/c/$name.log 2>&1 || tail -5 $OUT/c/$name.log
  tail -1 $OUT/c/$name.log
done
cd $OUT && tar czf c.tgz c && rm -rf c
