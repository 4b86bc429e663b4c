#!/bin/bash
# scratch (not committed): the resource as it is against large requests placed in mapped runs of 2 MiB-page arenas (XKIND=6) with points made room for (XPOINT=1); one build, switched by environment
set -u
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > $OUT/cfg.log 2>&1 && cmake --build build-gpu -j16 --target vmm_torch_allocator > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
export VMM_TORCH_LIBRARY=$PWD/build-gpu/python/libvmm_torch_allocator.so
nvidia-smi --query-gpu=name --format=csv,noheader
one() {  # allocator name round
  if [ $2 = new ]; then export XKIND=6 XPOINT=1; else unset XKIND XPOINT; fi
  timeout 150 python3 bench/torch_allocators.py --quick --allocators $1 --workloads gpt2,llama,vit --no-sleep-wake --max-batch off --json $OUT/r$3-$2.json > $OUT/r$3-$2.log 2>&1
  unset XKIND XPOINT
  python3 - "$OUT/r$3-$2.json" "$2" "$3" "$1" <<'PY'
import json, sys, statistics as st
d = json.load(open(sys.argv[1]))["results"][sys.argv[4]]["workloads"]
for w, r in d.items():
    if "step_ms_median" not in r: print(sys.argv[3], sys.argv[2], w, r.get("error", "")[:200]); continue
    v = r.get("vmm", {})
    slow = r.get("vmm_slow_path_ms", [])
    print(f"r{sys.argv[3]} {sys.argv[2]:6} {w:5} step {r['step_ms_median']:7.1f} sum {sum(r['step_ms'][2:]):7.0f} ratio {r['reserved_over_allocated']:.4f} slow/step {st.median(slow[2:]) if slow else 0:5.1f} waits {v.get('vmm.host_waits', '-')} stitched {v.get('vmm.pages_stitched', '-')} created {v.get('vmm.pages_created', '-')} released {v.get('vmm.pages_released', '-')}")
PY
}
one native native 1; one vmm old 1; one vmm new 1; one vmm new 2; one vmm old 2; one native native 2; one vmm old 3; one vmm new 3
cd $OUT && tar czf runs.tgz r*.json && rm -f r*.json
