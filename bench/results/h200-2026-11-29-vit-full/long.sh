#!/bin/bash
# Long vit runs: STEPS steps (default 400, 8 of them warm-up) under native,
# expandable_segments and vmm, one round of three processes at a time in rotated order,
# until BUDGET seconds (default 540) would be passed; each process times ~16 s of steps
# instead of the full run's ~1.4 s. Every round's JSON in long.tar.gz, summary in long.txt.
# Usage (on the lent machine, from the repository root): bash THIS_DIR/long.sh [STEPS [BUDGET]]
set -u
here=$(dirname "$0")
source scripts/common.sh
start=$SECONDS
vmm_build_torch_allocator . build-gpu || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
steps=${1:-400}
budget=${2:-540}
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
tar czf "${OUT:-.}/long.tar.gz" -C "$work" .
python3 "$here/summarize.py" "$work"/r*.json | tee "${OUT:-.}/long.txt"
echo "done at $((SECONDS - start)) s"
