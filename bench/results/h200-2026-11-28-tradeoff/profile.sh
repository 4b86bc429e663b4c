#!/bin/bash
# vit under torch.profiler: native, vmm at its default headroom, 1/64 and 1/16 (profile_vit.py)
set -u
mkdir -p $OUT/p
here=bench/results/h200-2026-11-28-tradeoff
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > $OUT/p/cfg.log 2>&1 &&
  cmake --build build-gpu -j16 --target vmm_torch_allocator > $OUT/p/build.log 2>&1 || { tail -30 $OUT/p/build.log; exit 1; }
export VMM_TORCH_LIBRARY=$PWD/build-gpu/python/libvmm_torch_allocator.so
i=0
for run in "native" "vmm" "vmm 0.015625" "vmm 0.0625" "native" "vmm"; do
  i=$((i + 1)); name=$i-$(echo $run | tr ' ' '-')
  timeout 120 taskset -c 0-7 python3 $here/profile_vit.py $run $OUT/p/$name.json > $OUT/p/$name.log 2>&1 || tail -5 $OUT/p/$name.log
  tail -1 $OUT/p/$name.log
done
cd $OUT && tar czf p.tgz p && rm -rf p
