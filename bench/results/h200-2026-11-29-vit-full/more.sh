#!/bin/bash
# (1) torch.empty + del (empty_del.py) in processes of native, vmm and torch's pluggable
# interface over an allocator that does nothing, rotated, until 240 s: empty_del.jsonl and
# its summary. (2) Long vit (400 steps) of native beside vmm with more headroom (1/64, 1/32:
# vmm_torch.use(headroom=...)), rounds until BUDGET (default 560 s): headroom.tar.gz and
# headroom.txt. What the step would gain if vmm kept more idle memory.
# Usage (on the lent machine, from the repository root): bash THIS_DIR/more.sh [BUDGET]
set -u
here=$(dirname "$0")
source scripts/common.sh
start=$SECONDS
vmm_build_torch_allocator . build-gpu || exit 1
budget=${1:-560}
unset PYTORCH_CUDA_ALLOC_CONF PYTORCH_ALLOC_CONF
orders=("native vmm pluggable_floor" "pluggable_floor vmm native" "vmm native pluggable_floor")
round=0
while ((SECONDS - start < 240)); do
  for allocator in ${orders[round % 3]}; do
    timeout 60 taskset -c 0-7 python3 "$here/empty_del.py" "$allocator" 2>/tmp/e.err | tee -a "$OUT/empty_del.jsonl" ||
      { echo "empty_del.py $allocator failed"; tail -5 /tmp/e.err; }
  done
  round=$((round + 1))
done
python3 - "$OUT/empty_del.jsonl" <<'PY' | tee "$OUT/empty_del.txt"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
median = {}
for a in ("native", "vmm", "pluggable_floor"):
    for size in ("4096", "1048576"):
        xs = [r[size]["median_us"] for r in rows if r["allocator"] == a]
        if xs:
            median[a, size] = statistics.median(xs)
            print(f"{a:16} {size:>8} B: {len(xs)} processes, median {median[a, size]:.2f} us, each {sorted(round(x, 2) for x in xs)}")
for size in ("4096", "1048576"):
    if ("vmm", size) in median and ("native", size) in median:
        print(f"vmm / native {size} B: {median['vmm', size] / median['native', size]:.3f}x")
PY
echo "empty+del done at $((SECONDS - start)) s"
work=$(mktemp -d)
runs=("native" "vmm 0.015625" "vmm 0.03125")
round=0
last=0
while ((SECONDS - start + last + 10 < budget)); do
  began=$SECONDS
  set -- ${runs[round % 3]}
  name=$1${2:+-$2}
  echo "$name at $((began - start)) s"
  python3 bench/torch_allocators.py --rounds 1 --steps 400 --cpus 0-7 --allocators "$1" ${2:+--vmm-headroom $2} \
    --workloads vit --no-sleep-wake --max-batch off --json "$work/$(printf %02d $round)-$name.json" >"$work/$round.log" 2>&1 ||
    { echo "$name failed"; tail -20 "$work/$round.log"; }
  round=$((round + 1))
  last=$((SECONDS - began))
done
tar czf "$OUT/headroom.tar.gz" -C "$work" .
for f in "$work"/*.json; do
  python3 -c "
import json, sys
d = json.load(open(sys.argv[1])); (a, r), = d['results'].items(); v = r['workloads']['vit']
print(f\"{sys.argv[1].split('/')[-1]:28} step {v['step_ms_median']:.2f} ms, reserved/allocated {v['reserved_over_allocated']:.4f}, slow path {v.get('vmm_slow_path_ms_median') or 0:.2f} ms\")" "$f"
done | tee "$OUT/headroom.txt"
echo "done at $((SECONDS - start)) s"
