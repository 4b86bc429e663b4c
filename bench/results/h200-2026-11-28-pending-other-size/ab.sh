#!/bin/bash
# scratch A/B (not committed): the resource before (ab_old_resource.cpp) and after, on quick training
set -u
mkdir -p $OUT/ab
build() {  # $1 source tree, $2 build dir
  cmake -S $1 -B $2 -G Ninja -DCMAKE_BUILD_TYPE=Release > $OUT/ab/cfg-$(basename $2).log 2>&1 && cmake --build $2 -j16 --target vmm_torch_allocator > $OUT/ab/build-$(basename $2).log 2>&1 || { tail -30 $OUT/ab/build-$(basename $2).log; exit 1; }
}
rm -rf /tmp/old && mkdir /tmp/old && tar --exclude=./build --exclude=./build-gpu --exclude=./.git -cf - . | tar -C /tmp/old -xf - && cp ab_old_resource.cpp /tmp/old/vmm/src/resource/resource.cpp
build . build-gpu & build /tmp/old /tmp/old/build-gpu & wait
nvidia-smi --query-gpu=name --format=csv,noheader
run() {  # $1 library dir or native, $2 name
  echo "== $2 $(date +%T)"
  if [ "$1" = native ]; then a=native; else a=vmm; export VMM_TORCH_LIBRARY=$1/python/libvmm_torch_allocator.so; fi
  timeout 200 python3 bench/torch_allocators.py --quick --allocators $a --workloads gpt2,llama,vit --no-sleep-wake --max-batch off --json $OUT/ab/$2.json > $OUT/ab/$2.log 2>&1; grep -E "^\[(vmm|native)\]" $OUT/ab/$2.log
}
new=$PWD/build-gpu; old=/tmp/old/build-gpu
run $old r1-old; run $new r1-new; run native r1-native
run native r2-native; run $new r2-new; run $old r2-old
run $old r3-old; run $new r3-new; run native r3-native
cd $OUT && tar czf ab.tgz ab && rm -rf ab
