#!/usr/bin/env python3
"""Markdown tables from vmm_bench_grow's Google Benchmark JSON output.

    build/bench/vmm_bench_grow --benchmark_out=grow.json --benchmark_out_format=json
    python3 scripts/bench_report.py grow.json [more.json ...]

Per file (one machine, one run): a table per grow scenario (time, ratio to the floor,
speed-up against each baseline, bytes/s, peak extra memory), the per-grow cost against
the raw calls, and on a GPU the largest vector reachable by growing, with the issue's
targets beside the numbers. The targets are printed, never enforced: the exit status is 0
whenever the files could be read. Python 3 standard library only.
"""

import argparse
import json
import statistics
import sys

GIB = float(1 << 30)
MIB = float(1 << 20)
TO_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}

# The targets on an H100/H200 (the GPU set only).
TARGET_CASE = "16GiB_by_256MiB"
TARGET_FLOOR_RATIO = 1.25
TARGET_SPEEDUP = {"realloc_copy_2x": 2.0, "thrust_resize": 4.0}
TARGET_REACH_SHARE = 0.99
TARGET_GROW_ONCE_RATIO = 1.05


class Run:
    """One benchmark: its name split into family / case / contender, time in seconds."""

    def __init__(self, entry):
        name = entry.get("run_name") or entry["name"]
        if name.endswith("/manual_time"):
            name = name[: -len("/manual_time")]
        parts = name.split("/")
        self.family = parts[0]
        self.case = parts[1] if len(parts) > 1 else ""
        self.contender = "/".join(parts[2:]) if len(parts) > 2 else name
        self.role = entry.get("label", "")
        self.error = None
        if entry.get("error_occurred") or entry.get("skipped"):
            self.error = entry.get("error_message") or entry.get("skip_message") or "skipped"
        scale = TO_SECONDS.get(entry.get("time_unit", "ns"), 1e-9)
        self.seconds = float(entry.get("real_time", 0.0)) * scale
        self.counters = {k: v for k, v in entry.items() if isinstance(v, (int, float))}

    def counter(self, key, default=None):
        return self.counters.get(key, default)


def load_runs(benchmarks):
    """Runs in the order of first appearance; the median aggregate wins where there are
    repetitions, else the median of the iteration entries."""
    order, iterations, medians = [], {}, {}
    for entry in benchmarks:
        run = Run(entry)
        key = (run.family, run.case, run.contender)
        if key not in order:
            order.append(key)
        if entry.get("run_type") == "aggregate":
            if entry.get("aggregate_name") == "median":
                medians[key] = run
        else:
            iterations.setdefault(key, []).append(run)
    runs = []
    for key in order:
        if key in medians:
            runs.append(medians[key])
            continue
        reps = iterations.get(key, [])
        if not reps:
            continue
        ok = [r for r in reps if r.error is None]
        if not ok:
            runs.append(reps[0])
            continue
        middle = statistics.median_low([r.seconds for r in ok])
        runs.append(next(r for r in ok if r.seconds == middle))
    return runs


def fmt_time(seconds):
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms" if seconds < 0.1 else f"{seconds * 1e3:.0f} ms"
    return f"{seconds * 1e6:.2f} µs"


def fmt_bytes(n):
    if n is None:
        return "–"
    if n >= GIB:
        return f"{n / GIB:.2f} GiB"
    return f"{n / MIB:.0f} MiB"


def marked(run):
    """The contender's name, with "(floor)" where the name does not say it."""
    return run.contender + (" (floor)" if run.role == "floor" and run.contender != "floor" else "")


def fmt_ratio(x):
    return "–" if x is None else f"{x:.2f}×"


def verdict(ok):
    return "met" if ok else "NOT met"


def size_of_case(case):
    """'16GiB_by_256MiB' -> (16 GiB, 256 MiB) in bytes, or (None, None)."""
    def parse(text):
        for unit, scale in (("GiB", GIB), ("MiB", MIB)):
            if text.endswith(unit):
                try:
                    return float(text[: -len(unit)]) * scale
                except ValueError:
                    return None
        return None

    if "_by_" not in case:
        return None, None
    final, append = case.split("_by_", 1)
    return parse(final), parse(append)


def describe_case(case):
    final, append = size_of_case(case)
    if final is None or append is None:
        return case
    return f"0 → {fmt_bytes(final)} in {fmt_bytes(append)} appends"


def grow_tables(runs, is_gpu, out):
    cases = []
    for run in runs:
        if run.family == "grow" and run.case not in cases:
            cases.append(run.case)
    for case in cases:
        rows = [r for r in runs if r.family == "grow" and r.case == case]
        floor = next((r for r in rows if r.role == "floor" and r.error is None), None)
        baselines = [r for r in rows if r.role == "baseline" and r.error is None]
        out.append(f"### Grow {describe_case(case)}, each slice written once")
        out.append("")
        header = ["contender", "time", "time / floor"]
        header += [f"× faster than {b.contender}" for b in baselines]
        header += ["GB/s", "peak extra memory", "peak / size", "chunks (vmm) / allocations"]
        out.append("| " + " | ".join(header) + " |")
        out.append("|" + "---|" * len(header))
        for r in rows:
            if r.error is not None:
                cells = [r.contender, f"skipped: {r.error}"] + [""] * (len(header) - 2)
                out.append("| " + " | ".join(cells) + " |")
                continue
            cells = [marked(r), fmt_time(r.seconds)]
            cells.append(fmt_ratio(r.seconds / floor.seconds) if floor and floor.seconds else "–")
            for b in baselines:
                cells.append(fmt_ratio(b.seconds / r.seconds) if r.seconds else "–")
            rate = r.counter("bytes_per_second")
            cells.append(f"{rate / 1e9:.1f}" if rate else "–")
            cells.append(fmt_bytes(r.counter("peak_extra_bytes")))
            cells.append(fmt_ratio(r.counter("peak_extra_x")))
            handles = r.counter("chunks", r.counter("allocations"))
            cells.append("–" if handles is None else f"{handles:.0f}")
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
        if is_gpu and case == TARGET_CASE:
            grow_targets(rows, floor, baselines, case, out)


def grow_targets(rows, floor, baselines, case, out):
    final, _ = size_of_case(case)
    lines = []
    for r in rows:
        if r.role != "vmm" or r.error is not None:
            continue
        parts = []
        if floor and floor.seconds:
            ratio = r.seconds / floor.seconds
            ok = verdict(ratio <= TARGET_FLOOR_RATIO)
            parts.append(f"{ratio:.2f}× the floor (≤ {TARGET_FLOOR_RATIO}×: {ok})")
        for b in baselines:
            want = TARGET_SPEEDUP.get(b.contender)
            if want is not None and r.seconds:
                speedup = b.seconds / r.seconds
                ok = verdict(speedup >= want)
                parts.append(f"{speedup:.2f}× faster than {b.contender} (≥ {want}×: {ok})")
        peak = r.counter("peak_extra_bytes")
        if peak is not None and final:
            parts.append(f"peak {fmt_bytes(peak)} = size + {fmt_bytes(max(peak - final, 0))} "
                         f"(target: at most size + one chunk)")
        lines.append(f"- {r.contender}: " + "; ".join(parts))
    if lines:
        out.append(f"Targets of the issue ({describe_case(case)}):")
        out.append("")
        out.extend(lines)
        out.append("")


def grow_once_table(runs, is_gpu, out, floor_note):
    rows = [r for r in runs if r.family == "grow_once"]
    if not rows:
        return
    out.append("### One grow of one chunk, warm pool, against the raw calls it needs")
    out.append("")
    if floor_note:
        out.append(f"Floor: {floor_note}.")
        out.append("")
    out.append("| chunk | contender | grow | × raw | undo (unmap, untimed) "
               "| chunks created while timed |")
    out.append("|---|---|---|---|---|---|")
    cases = []
    for r in rows:
        if r.case not in cases:
            cases.append(r.case)
    target_lines = []
    for case in cases:
        group = [r for r in rows if r.case == case]
        raw = next((r for r in group if r.role == "floor" and r.error is None), None)
        for r in group:
            if r.error is not None:
                out.append(f"| {case} | {r.contender} | skipped: {r.error} | | | |")
                continue
            ratio = r.seconds / raw.seconds if raw and raw.seconds else None
            undo = r.counter("undo_us")
            created = r.counter("chunks_created")
            name = marked(r)
            out.append(f"| {case} | {name} | {fmt_time(r.seconds)} | {fmt_ratio(ratio)} | "
                       f"{'–' if undo is None else f'{undo:.2f} µs'} | "
                       f"{'–' if created is None else f'{created:.0f}'} |")
            if is_gpu and r.contender == "vmm_growable_warm" and ratio is not None:
                target_lines.append(
                    f"- {case}: growable_buffer grow = {ratio:.3f}× {raw.contender} "
                    f"(within 5 %: {verdict(ratio <= TARGET_GROW_ONCE_RATIO)})")
        # Like for like: the same calls into a reservation of the same size (1 GiB).
        raw_1g = next((r for r in group if r.contender == "raw_driver_1GiB" and r.error is None), None)
        vmm_1g = next((r for r in group if r.contender == "vmm_growable_warm_1GiB" and r.error is None), None)
        if is_gpu and raw_1g and vmm_1g and raw_1g.seconds:
            ratio = vmm_1g.seconds / raw_1g.seconds
            target_lines.append(
                f"- {case}, both in a 1 GiB reservation: growable_buffer grow = {ratio:.3f}× "
                f"raw_driver_1GiB (within 5 %: {verdict(ratio <= TARGET_GROW_ONCE_RATIO)})")
    out.append("")
    if target_lines:
        out.append("Target of the issue (a grow with a warm pool within 5 % of the raw "
                   "driver calls):")
        out.append("")
        out.extend(target_lines)
        out.append("")


def reach_lines(runs, out):
    rows = [r for r in runs if r.family == "reach"]
    if not rows:
        return
    cases = []
    for r in rows:
        if r.case not in cases:
            cases.append(r.case)
    for case in cases:
        out.append(f"### Largest vector reachable by growing ({case.replace('_', ' ')})")
        out.append("")
        for r in (x for x in rows if x.case == case):
            if r.error is not None:
                out.append(f"- {r.contender}: skipped: {r.error}")
                continue
            share = r.counter("reached_share")
            percent = "–" if share is None else f"{share * 100:.2f} %"
            line = (f"- {r.contender}: {fmt_bytes(r.counter('reached_bytes'))} of "
                    f"{fmt_bytes(r.counter('free_at_start_bytes'))} free ({percent}) "
                    f"in {fmt_time(r.seconds)}")
            if r.role == "vmm" or r.contender == "vmm":
                if share is not None:
                    ok = verdict(share >= TARGET_REACH_SHARE)
                    line += f" (≥ {TARGET_REACH_SHARE * 100:.0f} %: {ok})"
            out.append(line)
        out.append("")


def report(path):
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    context = data.get("context", {})
    runs = load_runs(data.get("benchmarks", []))
    is_gpu = context.get("vmm_bench_set") == "gpu"
    out = [f"## vmm_bench_grow on {context.get('vmm_memory', '?')} "
           f"({context.get('host_name', '?')}, {context.get('date', '?')})", ""]
    if context.get("vmm_no_gpu_reason"):
        out.append(f"No GPU set: {context['vmm_no_gpu_reason']}; OS-provider set "
                   "(vmm on location::os_host() against host baselines).")
        out.append("")
    if context.get("vmm_peak_memory_source"):
        out.append(f"Peak extra memory: {context['vmm_peak_memory_source']}.")
        out.append("")
    if context.get("library_build_type") == "debug":
        out.append("(\"library_build_type: debug\" is Google Benchmark's own library, not vmm.)")
        out.append("")
    grow_tables(runs, is_gpu, out)
    grow_once_table(runs, is_gpu, out, context.get("vmm_grow_once_floor"))
    if is_gpu:
        reach_lines(runs, out)
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="JSON files from --benchmark_out")
    args = parser.parse_args()
    reports = []
    for path in args.files:
        try:
            reports.append(report(path))
        except (OSError, ValueError, KeyError) as e:
            print(f"bench_report: {path}: {e}", file=sys.stderr)
            return 1
    print("\n\n".join(reports))
    return 0


if __name__ == "__main__":
    sys.exit(main())
