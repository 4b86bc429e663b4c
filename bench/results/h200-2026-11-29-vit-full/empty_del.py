"""torch.empty + del of 4 KiB and 1 MiB under one allocator, its samples spread over ~2-3 s
of the process (the benchmark's own figure takes its 40 samples in ~0.3 s: one moment of the
lent host, whose speed moves by up to 2x from one moment to the next). Prints one JSON line:
the allocator, each size's median over 300 rounds of 1,000 pairs (sizes alternating round by
round), and the slowest and fastest tenth of the rounds.
    [VMM_TORCH_LIBRARY=...] python3 empty_del.py native|vmm|pluggable_floor"""
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import torch_allocators as bench  # noqa: E402


def main(allocator):
    if allocator not in ("native", "vmm", "pluggable_floor"):
        sys.exit(f"allocator {allocator!r}: expected native, vmm or pluggable_floor")
    if allocator == "native" and any(os.environ.get(n) for n in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")):
        sys.exit("native: unset PYTORCH_CUDA_ALLOC_CONF and PYTORCH_ALLOC_CONF")
    child = bench.Child(allocator)
    torch, device = child.torch, child.device
    sizes = (4096, 1 << 20)
    samples = {size: [] for size in sizes}
    for size in sizes:  # warm-up
        for _ in range(2000):
            t = torch.empty(size, dtype=torch.uint8, device=device)
            del t
    for i in range(600):
        size = sizes[i % 2]
        start = time.perf_counter_ns()
        for _ in range(1000):
            t = torch.empty(size, dtype=torch.uint8, device=device)
            del t
        samples[size].append((time.perf_counter_ns() - start) / 1000 / 1000)
    out = {"allocator": allocator}
    for size, times in samples.items():
        tenths = statistics.quantiles(times, n=10)
        out[str(size)] = {"median_us": statistics.median(times), "p10_us": tenths[0], "p90_us": tenths[-1]}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
