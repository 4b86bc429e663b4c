#!/usr/bin/env python3
"""Where vit's step goes under one allocator: torch_allocators.py's quick vit workload, its
timed steps (after warm-up) under torch.profiler. Prints and writes (JSON) the steps' wall
time, the GPU's kernel time (summed, and the union of the intervals: busy), the number of
kernels, each kernel name's total, and any cuMem* driver calls the profiler saw.
    python3 profile_vit.py native|vmm [headroom] OUT.json
With PROFILE_CUDA_ONLY=1 in the environment, only the GPU's activity is recorded (the host
runs at nearly its own speed), and every kernel's name, start and end go into the JSON
("timeline"), to find where the GPU waits for the host."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import torch_allocators as ta  # noqa: E402

allocator = sys.argv[1]
headroom = float(sys.argv[2]) if len(sys.argv) > 3 else None
out_path = sys.argv[-1]
child = ta.Child(allocator, headroom)
torch = child.torch
report = {}


def profiled_train_steps(child, model, optimizer, batches, warmup):
    for make in batches[:warmup]:
        inputs = make()
        child.timed(lambda: ta._step(model, optimizer, inputs))
        del inputs
    times = []
    activities = [torch.profiler.ProfilerActivity.CUDA]
    if not os.environ.get("PROFILE_CUDA_ONLY"):
        activities.append(torch.profiler.ProfilerActivity.CPU)
    with torch.profiler.profile(activities=activities) as prof:
        for make in batches[warmup:]:
            inputs = make()
            seconds, _ = child.timed(lambda: ta._step(model, optimizer, inputs))
            times.append(seconds)
            del inputs
    kernels, by_name, driver = [], {}, {}
    for e in prof.events():
        start, end = e.time_range.start, e.time_range.end
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels.append((start, end))
            entry = by_name.setdefault(e.name, [0, 0.0])
            entry[0] += 1
            entry[1] += end - start
        elif e.name.startswith("cuMem") or e.name.startswith("cudaMem"):
            entry = driver.setdefault(e.name, [0, 0.0])
            entry[0] += 1
            entry[1] += end - start
    kernels.sort()
    names, timeline = {}, []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            timeline.append((names.setdefault(e.name, len(names)), e.time_range.start, e.time_range.end))
    timeline.sort(key=lambda k: k[1])
    busy, current = 0.0, None
    for start, end in kernels:
        if current is None or start > current[1]:
            if current is not None:
                busy += current[1] - current[0]
            current = [start, end]
        else:
            current[1] = max(current[1], end)
    if current is not None:
        busy += current[1] - current[0]
    report.update({
        "allocator": allocator,
        "headroom": headroom,
        "steps_ms": [1000 * t for t in times],
        "wall_ms": 1000 * sum(times),
        "kernel_ms_sum": sum(e - s for s, e in kernels) / 1000,
        "gpu_busy_ms": busy / 1000,
        "kernels": len(kernels),
        "by_name": by_name,
        "driver": driver,
        "names": names,
        "timeline": timeline,
    })
    return {"step_ms_median": 1000 * sorted(times)[len(times) // 2], "step_ms": [1000 * t for t in times]}


ta.train_steps = profiled_train_steps
child.clean()
result = ta.workload_vit(child, ta.settings(True)["vit"])
report.update(child.peaks())
json.dump(report, open(out_path, "w"))
print(f"{allocator} headroom {headroom}: wall {report['wall_ms']:.1f} ms over {len(report['steps_ms'])} steps, "
      f"kernels {report['kernels']} summing {report['kernel_ms_sum']:.1f} ms, GPU busy {report['gpu_busy_ms']:.1f} ms, "
      f"reserved/allocated {report['reserved_over_allocated']:.4f}; driver calls seen: "
      + ", ".join(f"{k} {v[0]} ({v[1] / 1000:.1f} ms)" for k, v in sorted(report["driver"].items())))
