#!/bin/bash
# scratch (not committed): native against vmm, alternating processes, with vmm's slow path per step
set -u
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > $OUT/cfg.log 2>&1 && cmake --build build-gpu -j16 --target vmm_torch_allocator > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
export VMM_TORCH_LIBRARY=$PWD/build-gpu/python/libvmm_torch_allocator.so
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 python3 -m pytest -q tests/python/test_vmm_torch.py -k statistics_move 2>&1 | tail -2
one() { timeout 150 python3 bench/torch_allocators.py --quick --allocators $1 --workloads ${WL:-gpt2,llama,vit} --no-sleep-wake --max-batch off --json $OUT/r$2-$1.json > $OUT/r$2-$1.log 2>&1; grep -E "^\[.*\] (gpt2|llama|vit):" $OUT/r$2-$1.log | sed "s/^/r$2 /"; }
one native 1; one vmm 1; one vmm 2; one native 2; one native 3; one vmm 3
python3 - <<'PY'
import json, os, statistics as st
out = os.environ["OUT"]
for w in os.environ.get("WL", "gpt2,llama,vit").split(","):
    for r in (1, 2, 3):
        try:
            n = json.load(open(f"{out}/r{r}-native.json"))["results"]["native"]["workloads"][w]
            v = json.load(open(f"{out}/r{r}-vmm.json"))["results"]["vmm"]["workloads"][w]
        except Exception as e:
            print(w, r, "missing", e); continue
        slow = v["vmm_slow_path_ms"][2:]
        print(f"{w} r{r}: native {n['step_ms_median']:.1f} vmm {v['step_ms_median']:.1f} ratio {v['step_ms_median']/n['step_ms_median']:.3f}; "
              f"vmm slow path median {st.median(slow):.1f} mean {st.fmean(slow):.1f} ms/step; step sums native {sum(n['step_ms'][2:]):.0f} vmm {sum(v['step_ms'][2:]):.0f} slow {sum(slow):.0f}; ratio {v['reserved_over_allocated']:.4f} waits {v['vmm']['vmm.host_waits']} wait_ms {v['vmm']['vmm.host_wait_ns']/1e6:.1f}")
PY
