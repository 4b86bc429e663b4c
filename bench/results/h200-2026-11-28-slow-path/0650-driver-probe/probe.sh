#!/bin/bash
# scratch (not committed): driver time by entry point, in and out of the slow path, live
set -u
rm -rf /tmp/probe && mkdir /tmp/probe && tar --exclude=./build --exclude=./build-gpu --exclude=./.git --exclude=./scratch -cf - . | tar -C /tmp/probe -xf - && python3 scratch/probe_patch.py /tmp/probe
cmake -S /tmp/probe -B /tmp/probe/b -G Ninja -DCMAKE_BUILD_TYPE=Release > $OUT/cfg.log 2>&1 && cmake --build /tmp/probe/b -j16 --target vmm_torch_allocator > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
export VMM_TORCH_LIBRARY=/tmp/probe/b/python/libvmm_torch_allocator.so
for w in ${WL:-gpt2 llama vit}; do
  timeout 150 python3 bench/torch_allocators.py --quick --allocators vmm --workloads $w --no-sleep-wake --max-batch off --json $OUT/p-$w.json > $OUT/p-$w.log 2>&1
  echo "== $w"; grep -E "^\[vmm\] $w:" $OUT/p-$w.log; grep "\[probe\]" $OUT/p-$w.log | sort -k5 -n -r | head -14
  python3 -c "
import json; v=json.load(open('$OUT/p-$w.json'))['results']['vmm']['workloads']['$w']; s=v['vmm']
print('slow path ms', s['vmm.slow_path_ns']/1e6, 'wait ms', s['vmm.host_wait_ns']/1e6, 'stitched', s['vmm.pages_stitched'], 'created', s['vmm.pages_created'], 'released', s['vmm.pages_released'], 'waits', s['vmm.host_waits'])
print('slow per step', v['vmm_slow_path_ms'])"
done
