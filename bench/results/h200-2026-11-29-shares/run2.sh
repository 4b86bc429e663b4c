#!/bin/bash
# 2026-11-29 second call: the full gpt2, llama and vit workloads (their own steps) of native
# beside vmm at headroom 1/128 and 1/256, in turn, until the call's time is nearly spent.
set -u
here=$(dirname "$0")
source scripts/common.sh
start=$SECONDS
vmm_build_torch_allocator . build-gpu || exit 1
unset PYTORCH_CUDA_ALLOC_CONF PYTORCH_ALLOC_CONF
bash "$here/shares.sh" $((570 - (SECONDS - start))) full - gpt2,llama,vit native "vmm 0.0078125" "vmm 0.00390625"
