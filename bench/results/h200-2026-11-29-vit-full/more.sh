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
# The loop that ran here is ../h200-2026-11-29-shares/shares.sh (its lines now add vmm's page counts).
bash "$here/../h200-2026-11-29-shares/shares.sh" $((budget - (SECONDS - start))) headroom 400 vit \
  native "vmm 0.015625" "vmm 0.03125"
echo "done at $((SECONDS - start)) s"
