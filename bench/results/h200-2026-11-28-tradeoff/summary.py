#!/usr/bin/env python3
"""Summary of tradeoff.sh's JSON files: per workload and configuration, each round's step
median, its ratio to native's in the same round, reserved / allocated, vmm's slow path and
page counts; then the median over the rounds."""
import json
import os
import statistics as st
import sys

folder = sys.argv[1]
configs = ("native", "vmm", "h64", "h16")
rounds = (1, 2, 3)


def load(config, r):
    path = os.path.join(folder, f"r{r}-{config}.json")
    try:
        results = json.load(open(path))["results"]
    except (OSError, ValueError, KeyError):
        return None
    return next(iter(results.values()))["workloads"]


data = {(c, r): load(c, r) for c in configs for r in rounds}
for w in ("gpt2", "llama", "vit"):
    print(f"== {w}")
    for c in configs:
        steps, ratios, reserved, slows = [], [], [], []
        for r in rounds:
            run, base = data[(c, r)], data[("native", r)]
            if not run or "step_ms_median" not in run.get(w, {}):
                print(f"  r{r} {c:6} missing")
                continue
            x = run[w]
            steps.append(x["step_ms_median"])
            reserved.append(x["reserved_over_allocated"])
            ratio = x["step_ms_median"] / base[w]["step_ms_median"] if base and "step_ms_median" in base.get(w, {}) else float("nan")
            ratios.append(ratio)
            slow = x.get("vmm_slow_path_ms", [])[2:]
            slows.append(st.median(slow) if slow else 0.0)
            v = x.get("vmm", {})
            print(f"  r{r} {c:6} step {x['step_ms_median']:6.1f} ms  x{ratio:.3f}  issued {st.median(x['issued_ms']):6.1f}  "
                  f"reserved/allocated {x['reserved_over_allocated']:.4f}  slow {slows[-1]:5.1f} ms/step  "
                  f"stitched {v.get('vmm.pages_stitched', '-')} created {v.get('vmm.pages_created', '-')} "
                  f"released {v.get('vmm.pages_released', '-')} waits {v.get('vmm.host_waits', '-')}")
        if steps:
            print(f"  {c:6} median of rounds: step {st.median(steps):6.1f} ms, x{st.median(ratios):.3f} of native, "
                  f"largest reserved/allocated {max(reserved):.4f}, slow {st.median(slows):.1f} ms/step")
