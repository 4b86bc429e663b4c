#!/usr/bin/env python3
"""bench/torch_allocators.py's own checks, run by ctest without torch or a GPU.

    torch_allocators_check.py BENCHMARK

Every bad argument ends with exit status 2 and a message naming it before any process is
started or torch imported; --steps sets the steps of the three training workloads only,
and leaves the settings of later calls as they were; the side-by-side torch.empty + del
summary compares allocators over each process's reference work (made-up rounds).
"""

import copy
import importlib.util
import subprocess
import sys

BAD_ARGUMENTS = [
    (["--steps", "5"], "--steps 5: expected more than the 10 warm-up steps"),
    (["--quick", "--steps", "5"], "--steps 5: expected more than the 5 warm-up steps"),
    (["--steps", "100001"], "at most 100000"),
    (["--steps", "many"], "invalid int value: 'many'"),
    (["--rounds", "0"], "--rounds 0: expected 1 to 100"),
    (["--allocators", "native,foo"], "unknown allocator foo"),
    (["--workloads", "vit,bar"], "unknown workload bar"),
    (["--vmm-headroom", "2"], "--vmm-headroom 2.0: expected a share from 0 to 1"),
    (["--cpus", "x"], "--cpus 'x'"),
    (["--cpus", "3-1"], "runs backwards"),
    (["--cpus", "99999"], "are not available to this process"),
    (["--record", "/tmp/x", "--allocators", "vmm"], "--record records under the native allocator"),
    (["--side-by-side", "native,baz"], "--side-by-side: unknown allocator baz"),
    (["--side-by-side-seconds", "0.1"], "--side-by-side-seconds 0.1: expected 0.5 to 600"),
    (["--side-by-side-repeats", "0"], "--side-by-side-repeats 0: expected 1 to 100"),
    (["--empty-del-only", "--side-by-side", "off"], "--empty-del-only compares allocators side by side"),
    (["--empty-del-only", "--side-by-side", "vmm"], "--empty-del-only compares allocators side by side"),
]


def check_side_by_side(bench):
    """summarize_side_by_side on made-up rounds: the host runs native's process at full speed
    and vmm's at half (every piece of work takes twice as long there, the reference work too),
    and at the same speed vmm's pair takes 0.9x native's. Its plain median is then above
    native's; over the reference work it must come out 0.9x."""
    failures = []
    bin_ns = bench.SIDE_BY_SIDE_BIN_NS
    rounds = {"native": [], "vmm": []}
    for allocator, slowness, pair in (("native", 1.0, 2.0), ("vmm", 2.0, 1.8)):
        at = 0
        for b in range(8):
            for i in range(12):
                for kind in (4096, bench.REFERENCE, 1 << 20, bench.REFERENCE):
                    rounds[allocator].append((at, kind, slowness * (0.5 if kind == bench.REFERENCE else pair)))
                    at += bin_ns // 48
    repeats = [{"cpus": {"native": 0, "vmm": 1}, "start_ns": 0, "end_ns": 8 * bin_ns, "rounds": rounds,
                "process": {"native": {"thread_ran_share": 1.0, "involuntary_switches": 0}, "vmm": {"thread_ran_share": 0.5, "involuntary_switches": 9}}}]

    class Arguments:
        side_by_side_seconds = 2.0

    result = bench.summarize_side_by_side(["native", "vmm"], repeats, Arguments)
    for size in map(str, bench.EMPTY_DEL_SIZES):
        ratio = result["ratio_to_native"]["vmm"][size]
        if abs(ratio - 0.9) > 1e-9:
            failures.append(f"side by side, {size} B: vmm {ratio}x native over the reference, expected 0.9")
        if not result["median_us"]["vmm"][size] > result["median_us"]["native"][size]:
            failures.append(f"side by side, {size} B: the made-up rounds should put vmm's plain median above native's: {result['median_us']}")
        if result["ratio_to_native"]["native"][size] != 1.0:
            failures.append(f"side by side, {size} B: native against itself {result['ratio_to_native']['native'][size]}")
        if len(result["each_repeat"][0]["bins"]["vmm"][size]) != 8:
            failures.append(f"side by side, {size} B: {len(result['each_repeat'][0]['bins']['vmm'][size])} bins kept, expected 8")
    if result["each_repeat"][0].get("thread_ran_share") != {"native": 1.0, "vmm": 0.5}:
        failures.append(f"side by side: the processes' figures were not kept: {result['each_repeat'][0]}")
    cpus = [0, 1, 2, 3]
    if sorted(bench.one_cpu_per_core(cpus)) != cpus:
        failures.append(f"one_cpu_per_core({cpus}) = {bench.one_cpu_per_core(cpus)}: not the same CPUs")
    return failures


def check_largest_batch(bench):
    """largest_batch against a made-up GPU where batches up to `limit` fit: it must find a
    batch within 2 % below the limit (none above it), from starts below and above the limit."""
    import types

    failures = []
    real_spawn = bench.spawn
    try:
        for limit, start, step in ((137, 90, 1.5), (137, 150, 1.1), (137, 400, 1.5), (1, 5, 1.5), (0, 5, 1.5), (60, 60, 1.1)):
            def spawn(allocator, extra, timeout, arguments, limit=limit):
                return types.SimpleNamespace(returncode=0 if int(extra[extra.index("--batch") + 1]) <= limit else bench.OOM_EXIT, stderr="")

            bench.spawn = spawn
            result = bench.largest_batch("made-up", types.SimpleNamespace(sequence=2048), start, step)
            if not (limit - max(1, int(limit * 0.02)) <= result["batch"] <= limit):
                failures.append(f"largest_batch with limit {limit}, start {start}, step {step}: {result}")
    finally:
        bench.spawn = real_spawn
    return failures


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    benchmark = sys.argv[1]
    failures = []
    for arguments, words in BAD_ARGUMENTS:
        result = subprocess.run([sys.executable, benchmark, *arguments], capture_output=True, text=True, timeout=60)
        if result.returncode != 2 or words not in result.stderr:
            failures.append(f"{arguments}: exit {result.returncode}, stderr {result.stderr[-400:]!r}")
    spec = importlib.util.spec_from_file_location("torch_allocators", benchmark)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)  # defines only: torch is imported by the measuring processes
    for quick in (False, True):
        plain = copy.deepcopy(bench.settings(quick))
        longer = bench.settings(quick, 400)
        for name in ("gpt2", "llama", "vit"):
            if longer[name]["steps"] != 400 or longer[name]["warmup"] != plain[name]["warmup"]:
                failures.append(f"settings({quick}, 400)[{name!r}] = {longer[name]}, plain {plain[name]}")
        if {k: v for k, v in longer.items() if k not in ("gpt2", "llama", "vit")} != {
                k: v for k, v in plain.items() if k not in ("gpt2", "llama", "vit")}:
            failures.append(f"--steps changed a workload that has no steps (quick={quick})")
        if bench.settings(quick) != plain:
            failures.append(f"settings({quick}) changed after a call with steps")
    failures += check_side_by_side(bench)
    failures += check_largest_batch(bench)
    for failure in failures:
        print("FAILED:", failure)
    print(f"{len(BAD_ARGUMENTS)} bad arguments, the settings of --steps and the side-by-side summary and the largest-batch search checked")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
