#!/bin/bash
# WORKLOADS (torch_allocators.py's, comma-separated) of each RUN in turn, one process each,
# until BUDGET seconds would be passed; a RUN is "native" or "vmm SHARE"
# (vmm_torch.use(headroom=SHARE)); STEPS is --steps (- for the workloads' own).
# Every process's JSON and log in NAME.tar.gz; NAME.txt has one line per process and
# workload (step, reserved / allocated, vmm's slow path and page counts).
# Usage (on the lent machine, from the repository root):
#   bash THIS_DIR/shares.sh BUDGET NAME STEPS WORKLOADS RUN...
#   e.g. bash THIS_DIR/shares.sh 300 shares 400 vit native "vmm 0.0078125"
set -u
source scripts/common.sh
start=$SECONDS
budget=$1 name=$2 steps=$3 workloads=$4
shift 4
runs=("$@")
[[ -n ${VMM_TORCH_LIBRARY:-} ]] || vmm_build_torch_allocator . build-gpu || exit 1
work=$(mktemp -d)
round=0
last=0
while ((round == 0 || SECONDS - start + last + 10 < budget)); do
  began=$SECONDS
  set -- ${runs[round % ${#runs[@]}]}
  label=$(printf %02d $round)-$1${2:+-$2}
  echo "$label at $((began - start)) s"
  python3 bench/torch_allocators.py --rounds 1 $([[ $steps == - ]] || echo --steps "$steps") --cpus 0-7 \
    --allocators "$1" ${2:+--vmm-headroom $2} --workloads "$workloads" --no-sleep-wake --max-batch off --json "$work/$label.json" >"$work/$label.log" 2>&1 ||
    { echo "$label failed"; tail -20 "$work/$label.log"; }
  round=$((round + 1))
  last=$((SECONDS - began))
done
tar czf "${OUT:-.}/$name.tar.gz" -C "$work" .
for f in "$work"/*.json; do
  python3 - "$f" <<'PY'
import json, os, sys
d = json.load(open(sys.argv[1]))
(allocator, r), = d["results"].items()
for workload, v in r["workloads"].items():
    if "step_ms_median" not in v:
        print(f"{os.path.basename(sys.argv[1]):26} {workload:5} {v.get('error', 'no step time')[:200]}")
        continue
    s = v.get("vmm") or {}
    pages = f", pages created {s['vmm.pages_created']}, released {s['vmm.pages_released']}, waits {s['vmm.host_waits']}" if s else ""
    print(f"{os.path.basename(sys.argv[1]):26} {workload:5} step {v['step_ms_median']:.2f} ms, reserved/allocated "
          f"{v['reserved_over_allocated']:.4f}, slow path {v.get('vmm_slow_path_ms_median') or 0:.2f} ms{pages}")
PY
done | tee "${OUT:-.}/$name.txt"
echo "$name done at $((SECONDS - start)) s"
