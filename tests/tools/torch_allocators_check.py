#!/usr/bin/env python3
"""bench/torch_allocators.py's own checks, run by ctest without torch or a GPU.

    torch_allocators_check.py BENCHMARK

Every bad argument ends with exit status 2 and a message naming it before any process is
started or torch imported; --steps sets the steps of the three training workloads only,
and leaves the settings of later calls as they were.
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
]


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
    for failure in failures:
        print("FAILED:", failure)
    print(f"{len(BAD_ARGUMENTS)} bad arguments and the settings of --steps checked")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
