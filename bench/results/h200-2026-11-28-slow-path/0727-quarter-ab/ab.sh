#!/bin/bash
# scratch A/B: the resource of ba47d5d (old) against 7fb6967 (new), torch's native allocator beside them
set -u
mkdir -p $OUT/ab
build() {  # $1 source tree, $2 build dir
  cmake -S $1 -B $2 -G Ninja -DCMAKE_BUILD_TYPE=Release > $OUT/ab/cfg-$(basename $2).log 2>&1 && cmake --build $2 -j16 --target vmm_torch_allocator > $OUT/ab/build-$(basename $2).log 2>&1 || { tail -30 $OUT/ab/build-$(basename $2).log; exit 1; }
}
rm -rf /tmp/old && mkdir /tmp/old && tar --exclude=./build --exclude=./build-gpu --exclude=./.git -cf - . | tar -C /tmp/old -xf - && cp scratch/old_resource.cpp /tmp/old/vmm/src/resource/resource.cpp
build . $PWD/build-gpu & build /tmp/old /tmp/old/build-gpu & wait
nvidia-smi --query-gpu=name --format=csv,noheader
one() {  # allocator library name round
  export VMM_TORCH_LIBRARY=$2/python/libvmm_torch_allocator.so
  timeout 150 python3 bench/torch_allocators.py --quick --allocators $1 --workloads gpt2,llama,vit --no-sleep-wake --max-batch off --json $OUT/ab/r$4-$3.json > $OUT/ab/r$4-$3.log 2>&1
  python3 - "$OUT/ab/r$4-$3.json" "$3" "$4" "$1" <<'PY'
import json, sys, statistics as st
d = json.load(open(sys.argv[1]))["results"][sys.argv[4]]["workloads"]
for w, r in d.items():
    if "step_ms_median" not in r: print(sys.argv[3], sys.argv[2], w, r.get("error", "")[:200]); continue
    v = r.get("vmm", {})
    slow = r.get("vmm_slow_path_ms", [])
    print(f"r{sys.argv[3]} {sys.argv[2]:6} {w:5} step {r['step_ms_median']:7.1f} sum {sum(r['step_ms'][2:]):7.0f} ratio {r['reserved_over_allocated']:.4f} slow/step {st.median(slow[2:]) if slow else 0:5.1f} waits {v.get('vmm.host_waits', '-')} wait_ms {v.get('vmm.host_wait_ns', 0)/1e6:.1f} stitched {v.get('vmm.pages_stitched', '-')} created {v.get('vmm.pages_created', '-')} released {v.get('vmm.pages_released', '-')}")
PY
}
new=$PWD/build-gpu; old=/tmp/old/build-gpu
one native $new native 1; one vmm $old old 1; one vmm $new new 1
one vmm $new new 2; one vmm $old old 2; one native $new native 2
one vmm $old old 3; one native $new native 3; one vmm $new new 3
cd $OUT && tar czf ab.tgz ab && rm -rf ab
