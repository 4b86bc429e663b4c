#!/bin/bash
# The full vit workload (40 steps, 32 timed) under native, expandable_segments and vmm, one
# round of three processes at a time, the order rotated every round (each allocator first,
# second and third in turn), until BUDGET seconds (default 520) would be passed. Every round
# writes a JSON of its own (rounds.tar.gz); summary.txt is summarize.py over them.
# cudaMallocAsync is left out: 49.4-53.4 ms against native's 44.9-47.8 in every round of
# 2026-11-28 (../h200-2026-11-28-vit-rounds), never the fastest.
# Usage (on the lent machine, from the repository root): bash THIS_DIR/rounds.sh [BUDGET]
set -u
here=$(dirname "$0")
source scripts/common.sh
start=$SECONDS
vmm_build_torch_allocator . build-gpu || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
budget=${1:-520}
orders=(native,expandable,vmm vmm,expandable,native expandable,vmm,native
  native,vmm,expandable vmm,native,expandable expandable,native,vmm)
work=$(mktemp -d)
round=0
# A round takes about 75 s; the last one must end inside the budget.
while ((SECONDS - start + 90 < budget)); do
  order=${orders[round % ${#orders[@]}]}
  round=$((round + 1))
  echo "round $round ($order) at $((SECONDS - start)) s"
  python3 bench/torch_allocators.py --rounds 1 --cpus 0-7 --allocators "$order" --workloads vit \
    --no-sleep-wake --max-batch off --json "$work/r$(printf %02d $round).json" >"$work/r$round.log" 2>&1 ||
    { echo "round $round failed"; tail -20 "$work/r$round.log"; }
done
tar czf "${OUT:-.}/rounds.tar.gz" -C "$work" .
python3 "$here/summarize.py" "$work"/r*.json | tee "${OUT:-.}/summary.txt"
echo "done at $((SECONDS - start)) s"
