#!/usr/bin/env python3
"""Pools the vit rounds of bench/torch_allocators.py JSON files (one round or several each).

    python3 summarize.py FILE.json [FILE.json ...]

Every process is one sample: its step median, reserved / allocated, vmm's slow-path median and
torch.empty + del. A round is one file's processes (or one of a --rounds file's rounds). It
prints each round, then over all processes each allocator's median step (the benchmark's own
figure, the median of the processes' medians) and vmm's ratio to the fastest, and the median of
the rounds' own ratios (vmm against the fastest process of its round, which ran beside it).
"""
import json
import statistics
import sys


def processes(path):
    """(round key, allocator, sample) for every process in one JSON file."""
    data = json.load(open(path))
    for allocator, result in data["results"].items():
        if "error" in result:
            sys.exit(f"{path}: {allocator} failed: {result['error']}")
        vit = result["workloads"]["vit"]
        if "error" in vit:
            sys.exit(f"{path}: {allocator}'s vit failed: {vit['error']}")
        count = result.get("rounds", 1)
        steps = vit.get("step_ms_median_rounds", [vit["step_ms_median"]])
        slow = vit.get("vmm_slow_path_ms_median_rounds", [vit.get("vmm_slow_path_ms_median")] * count)
        ratio = vit.get("reserved_over_allocated_rounds", [vit["reserved_over_allocated"]] * count)
        empty = result.get("empty_del_us_rounds", [result["empty_del_us"]])
        if not len(steps) == len(slow) == len(ratio) == len(empty) == count:
            sys.exit(f"{path}: {allocator}'s rounds do not line up")
        for i in range(count):
            yield (path, i), allocator, {
                "step": steps[i], "slow": slow[i], "ratio": ratio[i],
                "4K": empty[i]["4096"], "1M": empty[i]["1048576"],
            }


def main(paths):
    if not paths:
        sys.exit(__doc__)
    rounds = {}
    for path in paths:
        for key, allocator, sample in processes(path):
            rounds.setdefault(key, {})[allocator] = sample
    allocators = sorted({a for r in rounds.values() for a in r})
    if "vmm" not in allocators or len(allocators) < 2:
        sys.exit("needs vmm and at least one of torch's allocators")
    print("round  " + "  ".join(f"{a:>15}" for a in allocators) + "  vmm / fastest other")
    round_ratios = []
    for n, (key, r) in enumerate(rounds.items(), 1):
        cells = "  ".join(f"{r[a]['step']:15.2f}" if a in r else f"{'-':>15}" for a in allocators)
        others = [s["step"] for a, s in r.items() if a != "vmm"]
        line = f"{n:5}  {cells}"
        if "vmm" in r and others:
            round_ratios.append(r["vmm"]["step"] / min(others))
            line += f"  {round_ratios[-1]:.3f}"
        print(line)
    print("\nover all processes (medians):")
    median = {}
    for a in allocators:
        samples = [r[a] for r in rounds.values() if a in r]
        median[a] = statistics.median(s["step"] for s in samples)
        slow = [s["slow"] for s in samples if s["slow"] is not None]
        print(f"  {a:>15}: {len(samples):2} processes, step {median[a]:.2f} ms "
              f"(min {min(s['step'] for s in samples):.2f}, max {max(s['step'] for s in samples):.2f}), "
              f"reserved/allocated max {max(s['ratio'] for s in samples):.4f}, "
              f"empty+del 4 KiB {statistics.median(s['4K'] for s in samples):.2f} us, "
              f"1 MiB {statistics.median(s['1M'] for s in samples):.2f} us"
              + (f", slow path {statistics.median(slow):.2f} ms a step" if slow else ""))
    fastest = min((a for a in allocators if a != "vmm"), key=median.get)
    print(f"\nvmm / fastest ({fastest}), medians over processes: {median['vmm'] / median[fastest]:.3f}x")
    print(f"median of the rounds' own ratios (vmm / fastest of its round, {len(round_ratios)} rounds): "
          f"{statistics.median(round_ratios):.3f}x")
    if "native" in allocators:
        for size in ("4K", "1M"):
            ours = statistics.median(r["vmm"][size] for r in rounds.values() if "vmm" in r)
            theirs = statistics.median(r["native"][size] for r in rounds.values() if "native" in r)
            print(f"torch.empty + del {size}: vmm / native {ours / theirs:.3f}x ({ours:.2f} / {theirs:.2f} us)")


if __name__ == "__main__":
    main(sys.argv[1:])
