#!/bin/bash
# One device call: live quick training (gpt2, llama, vit) on cores 0-7, two rounds in
# alternating order: native, expandable_segments, and one build of vmm run three ways
# through the environment: base, W (VMM_WINDOW: a request takes the page-aligned run of a
# large free block with the fewest pages to map) and WE (W and VMM_EXTRA: one large page
# more of room before pages are stitched, where it is at most 1/128 of the most in use).
set -u
start=$SECONDS
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > $OUT/cfg.log 2>&1 &&
  cmake --build build-gpu -j16 --target vmm_torch_allocator > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
export VMM_TORCH_LIBRARY=$PWD/build-gpu/python/libvmm_torch_allocator.so
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "built at $((SECONDS - start)) s"
one() {  # name round [env...]
  local name=$1 round=$2; shift 2
  local allocator=vmm
  case $name in native|expandable) allocator=$name ;; esac
  env "$@" timeout 100 python3 bench/torch_allocators.py --quick --cpus 0-7 --allocators $allocator \
    --workloads gpt2,llama,vit --no-sleep-wake --max-batch off --json $OUT/r$round-$name.json > $OUT/r$round-$name.log 2>&1
  python3 - "$OUT/r$round-$name.json" "$name" "$round" <<'PY'
import json, statistics as st, sys
d = next(iter(json.load(open(sys.argv[1]))["results"].values()))["workloads"]
for w, r in d.items():
    if "step_ms_median" not in r: print(sys.argv[3], sys.argv[2], w, r.get("error", "")[:200]); continue
    v = r.get("vmm", {}); slow = r.get("vmm_slow_path_ms", [])
    print(f"r{sys.argv[3]} {sys.argv[2]:10} {w:5} step {r['step_ms_median']:6.1f} issued {st.median(r['issued_ms']):6.1f} ratio {r['reserved_over_allocated']:.4f} slow/step {st.median(slow[2:]) if slow else 0:5.1f} waits {v.get('vmm.host_waits', '-')} wait_ms {v.get('vmm.host_wait_ns', 0)/1e6:.0f} stitched {v.get('vmm.pages_stitched', '-')} created {v.get('vmm.pages_created', '-')} released {v.get('vmm.pages_released', '-')}", flush=True)
PY
}
for round in 1 2; do
  if [ $round = 1 ]; then order="native base W WE expandable"; else order="WE W base expandable native"; fi
  for name in $order; do
    case $name in
      W) one W $round VMM_WINDOW=1 ;;
      WE) one WE $round VMM_WINDOW=1 VMM_EXTRA=1 ;;
      *) one $name $round ;;
    esac
  done
  echo "round $round done at $((SECONDS - start)) s"
done
