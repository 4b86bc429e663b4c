#!/bin/bash
# Live trade-off of vmm's learned headroom (idle memory kept mapped) against its page work:
# torch's native allocator, vmm at its default (1/256) and vmm with --vmm-headroom 1/64 and
# 1/16, three rounds in alternating order, quick gpt2 / llama / vit.
set -u
mkdir -p $OUT/t
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > $OUT/t/cfg.log 2>&1 &&
  cmake --build build-gpu -j16 --target vmm_torch_allocator > $OUT/t/build.log 2>&1 || { tail -30 $OUT/t/build.log; exit 1; }
export VMM_TORCH_LIBRARY=$PWD/build-gpu/python/libvmm_torch_allocator.so
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
nvidia-smi topo -m > $OUT/t/topo.txt 2>&1; lscpu > $OUT/t/lscpu.txt 2>&1
# Every process on the same eight cores of the GPU's NUMA node where nvidia-smi names one
# (the same code's steps moved by up to 25 % between processes in earlier runs).
cores=$(awk '/^GPU0/{for(i=2;i<=NF;i++) if($i ~ /^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$/){print $i; exit}}' $OUT/t/topo.txt)
first=$(echo "${cores:-0-7}" | sed 's/[-,].*//')
pin="taskset -c $first-$((first + 7))"
$pin true || pin=""
echo "pinned with: ${pin:-nothing} (GPU0 CPU affinity: ${cores:-unknown})"
one() {  # config round
  case $1 in
    native) args="--allocators native" ;;
    vmm) args="--allocators vmm" ;;
    h64) args="--allocators vmm --vmm-headroom 0.015625" ;;
    h16) args="--allocators vmm --vmm-headroom 0.0625" ;;
  esac
  timeout 150 $pin python3 bench/torch_allocators.py --quick $args --workloads gpt2,llama,vit --no-sleep-wake \
    --max-batch off --json $OUT/t/r$2-$1.json > $OUT/t/r$2-$1.log 2>&1
  echo "r$2 $1 rc $? $(date -u +%H:%M:%S)"
}
one native 1; one vmm 1; one h64 1; one h16 1
one h16 2; one h64 2; one vmm 2; one native 2
one native 3; one vmm 3; one h64 3; one h16 3
python3 bench/results/h200-2026-11-28-tradeoff/summary.py $OUT/t | tee $OUT/t/summary.txt
cd $OUT && tar czf t.tgz t && rm -rf t
