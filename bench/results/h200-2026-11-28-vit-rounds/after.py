"""Is vit's slow path larger after other work in the same vmm process because of the work
itself, or because vit runs a second time? One process: quick vit, quick vit again, then
18 GiB of tensors of 2-320 MiB allocated and freed (no kernels of note), then quick vit.
One line a phase: step median, vmm's slow path a step (median), pages, host waits.
    VMM_TORCH_LIBRARY=... python3 after.py"""
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import torch_allocators as bench  # noqa: E402


def report(child, label, result):
    result.update(child.peaks())
    v = result["vmm"]
    print(f"{label:18} vit {result['step_ms_median']:6.1f} ms, slow path {result['vmm_slow_path_ms_median']:5.2f} ms a step "
          f"(steps {[round(x, 2) for x in result['vmm_slow_path_ms']]}), created {v['vmm.pages_created']}, "
          f"stitched {v['vmm.pages_stitched']}, released {v['vmm.pages_released']}, waits {v['vmm.host_waits']}, "
          f"reserved/allocated {result['reserved_over_allocated']:.4f}", flush=True)


def filler(child, total=18 << 30):
    torch = child.torch
    sizes = random.Random(5).choices([2 << 20, 20 << 20, 64 << 20, 77 << 20, 320 << 20], k=4000)
    held, used = [], 0
    for size in sizes:
        if used + size > total:
            break
        held.append(torch.empty(size, dtype=torch.uint8, device=child.device))
        used += size
        if len(held) % 7 == 0:  # free some along the way, so that frees and allocations mix
            used -= held.pop(len(held) // 2).numel()
    del held


def main():
    child = bench.Child("vmm")
    s = bench.settings(True)["vit"]
    for label in ("vit first", "vit second"):
        child.clean()
        report(child, label, bench.workload_vit(child, s))
    child.clean()
    filler(child)
    child.clean()
    report(child, "vit after 18 GiB", bench.workload_vit(child, s))


if __name__ == "__main__":
    main()
