"""torch.empty + del of 4 KiB and 1 MiB under one allocator, its samples spread over ~2-3 s
of the process (the benchmark's own figure takes its 40 samples in ~0.3 s: one moment of the
lent host, whose speed moves by up to 2x from one moment to the next). Prints one JSON line:
the allocator, each size's median over 300 rounds of 1,000 pairs (sizes alternating round by
round: torch_allocators.empty_del_samples, the loop this script had as it ran), and the
slowest and fastest tenth of the rounds.
    [VMM_TORCH_LIBRARY=...] python3 empty_del.py native|vmm|pluggable_floor"""
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import torch_allocators as bench  # noqa: E402


def main(allocator):
    if allocator not in ("native", "vmm", "pluggable_floor"):
        sys.exit(f"allocator {allocator!r}: expected native, vmm or pluggable_floor")
    if allocator == "native" and any(os.environ.get(n) for n in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")):
        sys.exit("native: unset PYTORCH_CUDA_ALLOC_CONF and PYTORCH_ALLOC_CONF")
    samples = bench.empty_del_samples(bench.Child(allocator), rounds=300, per_round=1000)
    out = {"allocator": allocator}
    for size, times in samples.items():
        tenths = statistics.quantiles(times, n=10)
        out[str(size)] = {"median_us": statistics.median(times), "p10_us": tenths[0], "p90_us": tenths[-1]}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
