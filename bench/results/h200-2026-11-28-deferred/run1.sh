#!/bin/bash
# One device call: (1) deferred_pages.cu, alone on the machine; (2) the GPU runner at the
# working tree while the previous commit's vmm/ (old) builds; (3) live quick training, native,
# new and old alternating on cores 0-7 (gpt2, llama, vit), with vmm's host waits.
# run2.sh runs it with other settings: PROBE_ENV, PROBE_LOG, PROBE_LIMIT (the probe's
# environment, log and time limit), OLD_REV (old's vmm/) and CLOSING_NATIVE (a last native).
set -u
probe_env=${PROBE_ENV:-} probe_log=${PROBE_LOG:-deferred_pages.txt} probe_limit=${PROBE_LIMIT:-120}
start=$SECONDS
here=bench/results/h200-2026-11-28-deferred
nvcc -O2 -std=c++17 $here/deferred_pages.cu -lcuda -o /tmp/deferred_pages &&
  env $probe_env timeout $probe_limit taskset -c 0-7 /tmp/deferred_pages 2>&1 | tee $OUT/$probe_log
echo "probe done at $((SECONDS - start)) s"
rm -rf /tmp/old && mkdir /tmp/old && tar --exclude=./build --exclude=./build-gpu --exclude=./.git -cf - . | tar -C /tmp/old -xf -
rm -rf /tmp/old/vmm && git archive ${OLD_REV:-HEAD~1} vmm | tar -x -C /tmp/old
(cmake -S /tmp/old -B /tmp/old/build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > /tmp/old-cfg.log 2>&1 &&
  nice cmake --build /tmp/old/build-gpu -j4 --target vmm_torch_allocator > /tmp/old-build.log 2>&1; echo "old build rc $?") &
bash scripts/gpu_run.sh 2>&1 | tail -40
wait
echo "runner and builds done at $((SECONDS - start)) s"
one() {  # name library round
  export VMM_TORCH_LIBRARY=$2/python/libvmm_torch_allocator.so
  local allocator=vmm; [ $1 = native ] && allocator=native
  timeout 100 python3 bench/torch_allocators.py --quick --cpus 0-7 --allocators $allocator --workloads gpt2,llama,vit \
    --no-sleep-wake --max-batch off --json $OUT/ab-r$3-$1.json > /tmp/ab-r$3-$1.log 2>&1
  python3 - "$OUT/ab-r$3-$1.json" "$1" "$3" <<'PY'
import json, statistics as st, sys
d = next(iter(json.load(open(sys.argv[1]))["results"].values()))["workloads"]
for w, r in d.items():
    if "step_ms_median" not in r: print(sys.argv[3], sys.argv[2], w, r.get("error", "")[:200]); continue
    v = r.get("vmm", {}); slow = r.get("vmm_slow_path_ms", [])
    print(f"r{sys.argv[3]} {sys.argv[2]:6} {w:5} step {r['step_ms_median']:6.1f} issued {st.median(r['issued_ms']):6.1f} ratio {r['reserved_over_allocated']:.4f} slow/step {st.median(slow[2:]) if slow else 0:5.1f} waits {v.get('vmm.host_waits', '-')} wait_ms {v.get('vmm.host_wait_ns', 0)/1e6:.0f} stitched {v.get('vmm.pages_stitched', '-')} created {v.get('vmm.pages_created', '-')} released {v.get('vmm.pages_released', '-')}", flush=True)
PY
}
new=$PWD/build-gpu; old=/tmp/old/build-gpu
one native $new 1; one new $new 1; one old $old 1; one new $new 2; one old $old 2
[ "${CLOSING_NATIVE:-1}" = 1 ] && one native $new 2
echo "done at $((SECONDS - start)) s"
