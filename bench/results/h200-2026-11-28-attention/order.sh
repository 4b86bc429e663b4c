#!/bin/bash
# Does the order of the workloads in one process move vit's step? Eight processes on
# cores 0-7, vit alone or after gpt2 and llama, vmm and native, alternating; one line each
# (vit's step median, the host's share, vmm's slow path a step and pages, torch.empty + del
# at 4 KiB). Each process's JSON is order/oN.json. bash order.sh [SPEC...] runs those
# processes instead (SPEC: allocator:workloads, e.g. vmm:gpt2,llama,vit).
start=$SECONDS
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > /tmp/cfg.log 2>&1 &&
  cmake --build build-gpu -j16 --target vmm_torch_allocator > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
export VMM_TORCH_LIBRARY=$PWD/build-gpu/python/libvmm_torch_allocator.so
i=0
specs=("$@")
[ ${#specs[@]} -gt 0 ] || specs=(vmm:vit vmm:gpt2,llama,vit native:gpt2,llama,vit native:vit vmm:gpt2,llama,vit vmm:vit native:vit native:gpt2,llama,vit)
for spec in "${specs[@]}"; do
  i=$((i+1)); a=${spec%%:*}; w=${spec#*:}
  timeout 120 python3 bench/torch_allocators.py --quick --cpus 0-7 --allocators $a --workloads $w --no-sleep-wake --max-batch off --json /tmp/o$i.json > /tmp/o$i.log 2>&1
  python3 - /tmp/o$i.json "$spec" <<'PY'
import json, sys, statistics as st
d = json.load(open(sys.argv[1]))["results"]
r = next(iter(d.values()))
W = r["workloads"]["vit"]
v = W.get("vmm", {})
print(f"{sys.argv[2]:22} vit {W['step_ms_median']:6.1f} issued {st.median(W['issued_ms'][4:]):5.1f} slow {W.get('vmm_slow_path_ms_median', 0):5.2f} stitched {v.get('vmm.pages_stitched','-')} released {v.get('vmm.pages_released','-')} created {v.get('vmm.pages_created','-')} waits {v.get('vmm.host_waits','-')} empty4K {r['empty_del_us']['4096']:.2f}", flush=True)
PY
  cp /tmp/o$i.json $OUT/ 2>/dev/null
done
echo "done at $((SECONDS-start)) s"
