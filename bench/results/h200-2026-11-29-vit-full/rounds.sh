#!/bin/bash
# vit under native, expandable_segments and vmm: STEPS steps a process (40: the full
# workload; 400: ~17 s of timed steps, so one process is not one moment of the host), one
# round of three processes at a time, the order rotated every round (each allocator first,
# second and third in turn), until BUDGET seconds would be passed. Every round's JSON and log
# in NAME.tar.gz; NAME.txt is summarize.py over them.
# cudaMallocAsync is left out: 49.4-53.4 ms against native's 44.9-47.8 in every round of
# 2026-11-28 (../h200-2026-11-28-vit-rounds), never the fastest.
# Usage (on the lent machine, from the repository root):
#   bash THIS_DIR/rounds.sh [STEPS [BUDGET [NAME]]]     (default 40 520 rounds)
set -u
here=$(dirname "$0")
source scripts/common.sh
start=$SECONDS
vmm_build_torch_allocator . build-gpu || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
steps=${1:-40}
budget=${2:-520}
name=${3:-rounds}
orders=(native,expandable,vmm vmm,expandable,native expandable,vmm,native
  native,vmm,expandable vmm,native,expandable expandable,native,vmm)
work=$(mktemp -d)
round=0
last=0
# A round's length is known after the first; the last one must end inside the budget.
while ((round == 0 || SECONDS - start + last + 15 < budget)); do
  order=${orders[round % ${#orders[@]}]}
  round=$((round + 1))
  began=$SECONDS
  echo "round $round ($order) at $((began - start)) s"
  python3 bench/torch_allocators.py --rounds 1 --steps "$steps" --cpus 0-7 --allocators "$order" \
    --workloads vit --no-sleep-wake --max-batch off --json "$work/r$(printf %02d $round).json" \
    >"$work/r$round.log" 2>&1 || { echo "round $round failed"; tail -20 "$work/r$round.log"; }
  last=$((SECONDS - began))
done
tar czf "${OUT:-.}/$name.tar.gz" -C "$work" .
python3 "$here/summarize.py" "$work"/r*.json | tee "${OUT:-.}/$name.txt"
echo "done at $((SECONDS - start)) s"
