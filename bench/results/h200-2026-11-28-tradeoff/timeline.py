#!/usr/bin/env python3
"""Idle gaps of the GPU in profile_vit.py's CUDA-only timelines (PROFILE_CUDA_ONLY=1): per
timed step, the span of its kernels and their busy time; then, over the steps that reuse a
resolution seen before (2-5 and 7), the idle time before each kernel summed by stretches of
100 kernels of the step (the forward pass comes first).
    python3 timeline.py FOLDER_OF_JSONS"""
import glob
import json
import os
import sys

for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    d = json.load(open(path))
    timeline = d["timeline"]
    per_step = len(timeline) // len(d["steps_ms"])  # every step: 2 input kernels, then its own
    spans, busy, gaps = [], [], [0.0] * per_step
    for k in range(len(d["steps_ms"])):
        kernels = timeline[k * per_step + 2:(k + 1) * per_step]
        spans.append((kernels[-1][2] - kernels[0][1]) / 1000)
        busy.append(sum(e - s for _, s, e in kernels) / 1000)
        if k in (2, 3, 4, 5, 7):
            for i in range(1, len(kernels)):
                gaps[i] += max(0, kernels[i][1] - kernels[i - 1][2])
    name = os.path.basename(path)[:-5]
    print(f"{name:14} span ms {' '.join(f'{x:6.1f}' for x in spans)}")
    print(f"{'':14} busy ms {' '.join(f'{x:6.1f}' for x in busy)}")
    print(f"{'':14} idle ms by 100 kernels: {' '.join(f'{sum(gaps[j:j + 100]) / 1000:5.1f}' for j in range(0, per_step, 100))}")
