#!/bin/bash
# scratch A/B (not committed): HEAD's resource (old) against the fixed wait trigger with 1/128 (new)
set -u
mkdir -p $OUT/ab
build() {  # $1 source tree, $2 build dir, $3 targets
  cmake -S $1 -B $2 -G Ninja -DCMAKE_BUILD_TYPE=Release > $OUT/ab/cfg-$(basename $2).log 2>&1 && cmake --build $2 -j16 --target $3 > $OUT/ab/build-$(basename $1)-$(basename $2).log 2>&1 || { tail -30 $OUT/ab/build-$(basename $1)-$(basename $2).log; exit 1; }
}
rm -rf /tmp/old /tmp/f64 && mkdir /tmp/old /tmp/f64 && tar --exclude=./build --exclude=./build-gpu --exclude=./.git -cf - . | tar -C /tmp/old -xf - && cp ab_old_resource.cpp /tmp/old/vmm/src/resource/resource.cpp
tar --exclude=./build --exclude=./build-gpu --exclude=./.git -cf - . | tar -C /tmp/f64 -xf - && sed -i "s|  return high + high / 128;|  return high + high / 64;|" /tmp/f64/vmm/src/resource/resource.cpp && grep -c "high / 64;" /tmp/f64/vmm/src/resource/resource.cpp
build . build-gpu vmm_torch_allocator & build /tmp/old /tmp/old/build-gpu vmm_torch_allocator & build /tmp/f64 /tmp/f64/build-gpu vmm_torch_allocator & wait
nvidia-smi --query-gpu=name --format=csv,noheader
run() {  # $1 library dir, $2 name, $3 workloads
  echo "== $2 $(date +%T)"
  export VMM_TORCH_LIBRARY=$1/python/libvmm_torch_allocator.so
  timeout 200 python3 bench/torch_allocators.py --quick --allocators vmm --workloads $3 --no-sleep-wake --max-batch off --json $OUT/ab/$2.json > $OUT/ab/$2.log 2>&1
  python3 -c "
import json; d=json.load(open('$OUT/ab/$2.json'))['results']['vmm']['workloads']
for w,r in d.items(): v=r['vmm']; print(w, round(r['step_ms_median'],1), round(r['step_ms_mean'],1), round(r['reserved_over_allocated'],4), 'waits', v['vmm.host_waits'], 'stitched', v['vmm.pages_stitched'], 'created', v['vmm.pages_created'], 'released', v['vmm.pages_released'])" 2>&1 | tail -3
}
new=$PWD/build-gpu; old=/tmp/old/build-gpu; f64=/tmp/f64/build-gpu
run $old r1-old llama,vit; run $f64 r1-f64 llama,vit; run $new r1-f128 llama,vit
run $new r2-f128 llama,vit; run $f64 r2-f64 llama,vit; run $old r2-old llama,vit
run $f64 r3-f64 llama,vit; run $old r3-old llama,vit; run $new r3-f128 llama,vit
cd $OUT && tar czf ab.tgz ab && rm -rf ab
