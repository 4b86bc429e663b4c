#!/usr/bin/env python3
"""docs/benchmarks.md, with PNG plots, from the JSON that scripts/bench.sh writes.

    bash scripts/bench.sh [--quick] --out DIR              # every benchmark -> DIR/bench.json
    python3 scripts/bench_report.py DIR/bench.json --out docs
        -> docs/benchmarks.md and docs/bench/*.png
    python3 scripts/bench_report.py build/grow.json        # one program's --benchmark_out JSON:
                                                           # the markdown on stdout, no plots
    python3 scripts/bench_report.py --self-test            # synthetic data, every section
    python3 scripts/bench_report.py --merge WORK DIR/bench.json   # bench.sh's merge step
    python3 scripts/bench_report.py DIR/bench.json --fill-from EARLIER.json --out docs
        # a run cut short: what it lacks from another run of the same kind of machine, each
        # section saying so (--fill-from again: what is still missing from a third)

More JSON files after the first add their multi-GPU rows to the striping section (a run on
an x2 and one on an x4 machine give bandwidth against GPU count); every other section reads
the first file. Each section renders the rows that are there and says what is missing and
why (no GPU, a program that failed or was not run). Unknown programs and rows get a generic
table, so a new bench/vmm_bench_* program shows up without changes here.

The issue's targets are printed beside the numbers, never enforced: the exit status is 0
whenever the files could be read. Python 3 standard library; the plots need matplotlib
(Debian: python3-matplotlib, which scripts/bench.sh installs). Without it the report has
its tables and says that the plots were skipped.
"""

import argparse
import glob
import gzip
import json
import math
import os
import re
import shutil
import statistics
import sys
import tempfile

GIB = float(1 << 30)
MIB = float(1 << 20)
TO_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORMAT = "vmm-bench/1"

# ---- the issues' targets (printed, never enforced) ------------------------------------------
# Issue 1, growth on a GPU (the GPU set only).
TARGET_AHEAD_TO_WARM = 1.05
TARGET_CASE = "16GiB_by_256MiB"
TARGET_FLOOR_RATIO = 1.25
TARGET_SPEEDUP = {"realloc_copy_2x": 2.0, "thrust_resize": 4.0}
TARGET_REACH_SHARE = 0.99
TARGET_GROW_ONCE_RATIO = 1.05
# Issue 16: the gaps to the raw driver.
TARGET_COLD_TO_RAW = 1.10     # cold geometric growth / raw driver, same bytes
# vmm's cold growth rows and the raw rows that create the same handles (bench/gpu_baselines.cu).
COLD_SAME_HANDLES = {"vmm_geometric_cold": "raw_vmm_geometric_cold", "vmm_fixed64MiB_cold": "raw_vmm_64MiB_cold"}
TARGET_WARM_GROW_TO_RAW = 1.05  # warm 2 MiB grow / raw calls in the same reservation
TARGET_IMPORT_TO_RAW = 1.10   # vmm re-import / raw import + map + access
TARGET_RESOURCE_PAIR_US = 0.3  # bench/resource_bench.cu: vmm's median pair on the GPU
TARGET_STRIPES = {2: 1.95, 4: 3.8}

ALLOCATOR_ORDER = ["vmm", "native", "expandable", "cudaMallocAsync"]


# ---- Google Benchmark rows ------------------------------------------------------------------

# Name parts Google Benchmark adds that say how a row ran, not what it is.
RUN_SUFFIX = re.compile(r"^(manual_time|real_time|process_time|iterations:\d+|min_time:[^/]+|"
                        r"min_warmup_time:[^/]+|repeats:\d+|threads:\d+)$")


class Run:
    """One benchmark row: its name split into family / case / contender (the path parts
    before any "name:value" argument) and its arguments; time in seconds."""

    def __init__(self, entry):
        self.source = None  # the caption of the run it came from when another run filled it in
        name = entry.get("run_name") or entry.get("name", "?")
        parts = [p for p in name.split("/") if not RUN_SUFFIX.match(p)]
        self.name = "/".join(parts)
        self.parts = [p for p in parts if ":" not in p]
        self.args = {}
        for p in parts:
            if ":" in p:
                key, _, value = p.partition(":")
                try:
                    self.args[key] = float(value)
                except ValueError:
                    self.args[key] = value
        self.family = self.parts[0] if self.parts else name
        self.case = self.parts[1] if len(self.parts) > 1 else ""
        self.contender = "/".join(self.parts[2:]) if len(self.parts) > 2 else self.name
        self.role = entry.get("label", "")
        self.error = None
        if entry.get("error_occurred") or entry.get("skipped"):
            self.error = entry.get("error_message") or entry.get("skip_message") or "skipped"
        scale = TO_SECONDS.get(entry.get("time_unit", "ns"), 1e-9)
        self.seconds = float(entry.get("real_time", 0.0)) * scale
        skip = {"family_index", "per_family_instance_index", "repetitions", "repetition_index",
                "threads", "iterations", "real_time", "cpu_time"}
        self.counters = {k: v for k, v in entry.items()
                         if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in skip}
        self.iterations = entry.get("iterations")

    def counter(self, key, default=None):
        return self.counters.get(key, default)

    def arg(self, key, default=None):
        return self.args.get(key, default)

    @property
    def ok(self):
        return self.error is None


def load_runs(benchmarks):
    """Runs in the order they were registered (Google Benchmark's family_index), else of first
    appearance (repetitions interleaved at random come in any order); the median aggregate
    wins where there are repetitions, else the median of the iteration entries."""
    order, iterations, medians, registered = [], {}, {}, {}
    for entry in benchmarks:
        run = Run(entry)
        key = run.name
        if key not in order:
            order.append(key)
            if "family_index" in entry:
                registered[key] = (entry["family_index"], entry.get("per_family_instance_index", 0))
        if entry.get("run_type") == "aggregate":
            if entry.get("aggregate_name") == "median":
                medians[key] = run
        else:
            iterations.setdefault(key, []).append(run)
    if len(registered) == len(order):
        order.sort(key=registered.get)
    runs = []
    for key in order:
        if key in medians:
            runs.append(medians[key])
            continue
        reps = iterations.get(key, [])
        if not reps:
            continue
        ok = [r for r in reps if r.ok]
        if not ok:
            runs.append(reps[0])
            continue
        middle = statistics.median_low([r.seconds for r in ok])
        runs.append(next(r for r in ok if r.seconds == middle))
    return runs


# ---- formatting -----------------------------------------------------------------------------

def fmt_time(seconds):
    if seconds is None:
        return "–"
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms" if seconds < 0.1 else f"{seconds * 1e3:.0f} ms"
    if seconds >= 1e-6:
        return f"{seconds * 1e6:.2f} µs"
    return f"{seconds * 1e9:.0f} ns"


def fmt_us(us):
    return "–" if us is None else fmt_time(us * 1e-6)


def fmt_bytes(n):
    if n is None:
        return "–"
    if n >= GIB:
        return f"{n / GIB:.2f} GiB"
    if n >= MIB:
        return f"{n / MIB:.0f} MiB"
    return f"{n / 1024:.0f} KiB" if n >= 1024 else f"{n:.0f} B"


def fmt_ratio(x):
    return "–" if x is None else f"{x:.2f}×"


def fmt_num(x):
    if x is None:
        return "–"
    if isinstance(x, float) and not x.is_integer():
        return f"{x:.4g}"
    return f"{x:.0f}" if isinstance(x, (int, float)) else str(x)


def verdict(ok):
    return "met" if ok else "NOT met"


def ratio(a, b):
    return a / b if a is not None and b else None


def table(out, header, rows):
    out.append("| " + " | ".join(header) + " |")
    out.append("|" + "---|" * len(header))
    for row in rows:
        cells = [str(c) for c in row] + [""] * (len(header) - len(row))
        out.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    out.append("")


def unique(values):
    seen = []
    for v in values:
        if v not in seen:
            seen.append(v)
    return seen


def marked(run):
    """The contender's name, with "(floor)" where the name does not say it."""
    return run.contender + (" (floor)" if run.role == "floor" and run.contender != "floor" else "")


def size_of_case(case):
    """'16GiB_by_256MiB' -> (16 GiB, 256 MiB) in bytes, or (None, None)."""
    if "_by_" not in case:
        return None, None
    final, append = case.split("_by_", 1)
    return parse_size(final), parse_size(append)


def parse_size(text):
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", 1024.0), ("B", 1.0)):
        if text.endswith(unit):
            try:
                return float(text[: -len(unit)]) * scale
            except ValueError:
                return None
    return None


def describe_case(case):
    final, append = size_of_case(case)
    if final is None or append is None:
        return case
    return f"0 → {fmt_bytes(final)} in {fmt_bytes(append)} appends"


# ---- the merged document --------------------------------------------------------------------

class Program:
    """One section of bench.json: a benchmark program, vmm-replay, or torch_allocators.py."""

    def __init__(self, name, data):
        self.name = name
        self.data = data
        self.kind = data.get("kind", "google_benchmark")
        self.status = data.get("status", "ok")
        self.why = data.get("why", "")
        self.context = data.get("context", {})
        self.runs = load_runs(data.get("benchmarks", []))
        self.filled = ""  # what of it came from another run (Document.fill_from), and why

    def run_label(self, section):
        """Where its rows come from, for a row's label: this run, or another (see `section`)."""
        return f"another run, see {section}" if self.filled else "this run"

    def has_rows(self):
        if self.kind == "google_benchmark":
            return any(r.ok for r in self.runs)
        return self.status == "ok"

    def rows(self, family=None, prefix=None):
        return [r for r in self.runs
                if (family is None or r.family == family) and (prefix is None or r.name.startswith(prefix))]

    def missing_note(self):
        """Why this program has no rows to show, or "" when it has some."""
        if self.kind == "google_benchmark" and any(r.ok for r in self.runs):
            return ""
        if self.status == "ok" and self.runs:
            reasons = unique(r.error for r in self.runs if r.error)
            return "every row skipped: " + "; ".join(reasons[:3])
        return f"{self.status}" + (f": {self.why}" if self.why else "")


class Document:
    def __init__(self, path, data):
        self.path = path
        if "programs" in data:
            self.context = data.get("context", {})
            self.programs = {n: Program(n, p) for n, p in data["programs"].items()}
            self.references = data.get("trace_references", {})
        else:  # one program's --benchmark_out JSON
            gb = data.get("context", {})
            name = os.path.basename(gb.get("executable", "")) or os.path.splitext(os.path.basename(path))[0]
            self.context = {"date": gb.get("date", "?"), "host": gb.get("host_name", "?"),
                            "single_program": name}
            if gb.get("vmm_bench_set") == "gpu":
                self.context.update(gpu=True, gpu_names=[gb.get("vmm_memory", "?")])
            elif gb.get("vmm_no_gpu_reason"):
                self.context.update(gpu=False, no_gpu_reason=gb["vmm_no_gpu_reason"])
            self.programs = {name: Program(name, {"kind": "google_benchmark", "status": "ok",
                                                  "context": gb, "benchmarks": data.get("benchmarks", [])})}
            self.references = {}

    def program(self, name):
        return self.programs.get(name)

    def fill_from(self, other):
        """Completes a run cut short with the rows of `other`, a run on the same kind of machine
        (ValueError otherwise): a program that did not run here, or ran no row, is taken whole;
        one that timed out gets each group of rows (family / case: one table, whose ratios
        compare its rows) that it did not finish, whole, so that every ratio stays between rows
        of one run. Called again with a third run, it fills what is still missing. Each program
        so filled says what came from where (Program.filled), beside its rows. A program that ran
        only the rows of a --benchmark_filter (status "partial", bench.sh --filter) is completed
        as one that timed out."""
        if (self.gpu, self.machine()) != (other.gpu, other.machine()):
            raise ValueError(f"{other.path} is a run on {other.machine()}, this one on {self.machine()}: "
                             "a report's rows come from one kind of machine")
        source = f"`{os.path.basename(other.path)}` ({other.caption()})"
        for name, theirs in other.programs.items():
            if not theirs.has_rows():
                continue
            mine = self.programs.get(name)
            if mine is None or not mine.has_rows():
                why = "not in this run" if mine is None else mine.missing_note()
                theirs.filled = f"every row of `{name}` is from {source}, not from this run ({why})"
                for r in theirs.runs:
                    r.source = r.source or other.caption()
                self.programs[name] = theirs
            elif mine.kind == "google_benchmark" and mine.status in ("timed_out", "partial"):
                reached = {r.name for r in mine.runs}
                groups = unique((r.family, r.case) for r in theirs.runs)
                unfinished = [g for g in groups
                              if any(r.name not in reached for r in theirs.runs if (r.family, r.case) == g)]
                if not unfinished:
                    continue
                described = []
                for group in unfinished:
                    here = sum(1 for r in mine.runs if (r.family, r.case) == group)
                    described.append("/".join(part for part in group if part)
                                     + (f" (this run finished {here} of its rows)" if here else ""))
                taken = [r for r in theirs.runs if (r.family, r.case) in unfinished]
                for r in taken:
                    r.source = r.source or other.caption()
                mine.runs = [r for r in mine.runs if (r.family, r.case) not in unfinished] + taken
                note = "the rows of " + ", ".join(described) + f" are all from {source}"
                cut = "timed out" if mine.status == "timed_out" else "ran a part of its rows"
                mine.filled = (f"{mine.filled}; " if mine.filled else f"`{name}` {cut} in this run ({mine.why}); ") + note

    @property
    def gpu(self):
        return bool(self.context.get("gpu"))

    def machine(self):
        c = self.context
        if c.get("gpu_names"):
            names = c["gpu_names"]
            first = names[0]
            return first if len(names) == 1 else f"{len(names)} × {first}"
        if "gpu" in c and not c["gpu"]:
            cpu = c.get("cpu") or c.get("host", "?")
            return f"no GPU, OS provider on {cpu}"
        return c.get("host", "?")

    def caption(self):
        c = self.context
        parts = [self.machine()]
        if c.get("driver"):
            cuda = f" (CUDA {c['cuda_driver_api']})" if c.get("cuda_driver_api") else ""
            parts.append(f"driver {c['driver']}{cuda}")
        parts.append(str(c.get("date", "?"))[:10])
        if c.get("quick"):
            parts.append("--quick")
        return ", ".join(parts)


def load_document(path):
    with open(path, encoding="utf-8") as f:
        return Document(path, json.load(f))


# ---- plots ----------------------------------------------------------------------------------

class Plots:
    """PNG files under <out>/bench/, or nothing (with the reason) where matplotlib is missing
    or no output folder was given."""

    def __init__(self, folder, enabled, caption):
        self.folder = folder
        self.caption = caption
        self.files = []
        self.plt = None
        self.why_not = ""
        if not enabled or folder is None:
            self.why_not = "no --out folder" if folder is None else "--no-plots"
            return
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
            self.plt = plt
        except ImportError as e:
            self.why_not = f"matplotlib is not importable ({e}); apt-get install python3-matplotlib"

    @property
    def on(self):
        return self.plt is not None

    def figure(self, columns=1, width=7.5, height=4.2):
        fig, axes = self.plt.subplots(1, columns, figsize=(width * columns if columns > 1 else width, height),
                                      squeeze=False)
        return fig, list(axes[0])

    def save(self, fig, name, title, out, caption_text, rows=()):
        """Writes <folder>/bench/<name>.png and the markdown that shows it. Its caption names
        the run of the report, or the runs its `rows` came from where another run filled them."""
        caption = " and ".join(unique(r.source or self.caption for r in rows)) or self.caption
        fig.suptitle(f"{title}\n{caption}", fontsize=10)
        fig.tight_layout()
        os.makedirs(os.path.join(self.folder, "bench"), exist_ok=True)
        path = os.path.join(self.folder, "bench", f"{name}.png")
        fig.savefig(path, dpi=110)
        self.plt.close(fig)
        self.files.append(path)
        out.append(f"![{title}](bench/{name}.png)")
        out.append("")
        out.append(f"*{caption_text} {caption}.*")
        out.append("")


def grouped_bars(ax, groups, series, values, log=False, unit="", labels=None):
    """Bars per series inside each group: values[(group, series)] (missing ones left out)."""
    n = max(len(series), 1)
    width = 0.8 / n
    for i, s in enumerate(series):
        xs, ys = [], []
        for g, group in enumerate(groups):
            v = values.get((group, s))
            if v is not None and v > 0:
                xs.append(g - 0.4 + width * (i + 0.5))
                ys.append(v)
        if xs:
            bars = ax.bar(xs, ys, width, label=s)
            if labels:
                ax.bar_label(bars, fmt=labels, fontsize=6)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=0 if len(groups) < 5 else 20, fontsize=8)
    if log:
        ax.set_yscale("log")
    if unit:
        ax.set_ylabel(unit)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)


# ---- the report -----------------------------------------------------------------------------

class Report:
    def __init__(self, documents, plots):
        self.docs = documents
        self.doc = documents[0]
        self.plots = plots
        self.out = []
        self.shown = set()  # (program, run name) shown by a section
        self.pending = []  # notes printed under the next heading (rows from another run)

    def program(self, name):
        return self.doc.program(name)

    def use(self, program, runs):
        for r in runs:
            self.shown.add((program.name, r.name))
        return runs

    def heading(self, text):
        self.out.append(f"## {text}")
        self.out.append("")
        for pending in self.pending:
            self.note(pending)
        self.pending = []

    def note(self, text):
        self.out.append(f"_{text}_")
        self.out.append("")

    def missing(self, what, program_name):
        program = self.program(program_name)
        if program is None:
            self.note(f"{what}: {program_name} is not in this run.")
        else:
            self.note(f"{what}: {program.missing_note()}.")


def section_context(report):
    doc, c, out = report.doc, report.doc.context, report.out
    out.append("# vmm benchmarks")
    out.append("")
    out.append(f"Generated by `scripts/bench_report.py` from `{os.path.basename(doc.path)}` "
               "(`bash scripts/bench.sh`). Every ratio is between rows of the same run; the issues' "
               "targets are printed beside the numbers, never enforced.")
    out.append("")
    out.append(f"**{doc.caption()}**")
    out.append("")
    rows = [("machine", doc.machine())]
    if c.get("gpu_memories"):
        rows.append(("GPU memory", ", ".join(unique(c["gpu_memories"])) + " each"))
    if "gpu" in c and not c["gpu"]:
        rows.append(("GPU", f"none ({c.get('no_gpu_reason', '?')}): only the OS-provider rows ran; "
                            "GPU rows are skipped with the reason"))
    for key, label in (("driver", "driver"), ("cuda_driver_api", "CUDA (driver API)"), ("nvcc", "nvcc"),
                       ("cpu", "CPU"), ("cpus", "CPU cores"), ("kernel", "kernel"), ("date", "date"),
                       ("host", "host")):
        if c.get(key):
            rows.append((label, c[key]))
    if c.get("memory_bytes"):
        rows.append(("host memory", fmt_bytes(float(c["memory_bytes"]))))
    if c.get("git_commit"):
        dirty = " (with uncommitted changes)" if c.get("git_dirty") else ""
        rows.append(("git commit", f"`{c['git_commit'][:12]}` on {c.get('git_branch', '?')}{dirty}"))
    if "quick" in c:
        rows.append(("mode", "--quick (short runs: min_time 0.05 s, fewer sizes)" if c["quick"] else "full"))
    if c.get("total_seconds"):
        rows.append(("time", f"{c['total_seconds']} s in all, of which build {c.get('build_seconds', '?')} s"))
    filled = [p.name for p in doc.programs.values() if p.filled]
    if filled:
        rows.append(("rows from another run", ", ".join(f"`{n}`" for n in filled)
                     + " (each section says which rows, and from which run)"))
    if len(report.docs) > 1:
        rows.append(("more runs", ", ".join(f"{os.path.basename(d.path)} ({d.machine()})" for d in report.docs[1:])
                     + " (multi-GPU rows only)"))
    table(out, ["", ""], rows)
    if not report.plots.on:
        report.note(f"Plots skipped: {report.plots.why_not}.")


def section_status(report):
    if report.doc.context.get("single_program"):
        return
    report.heading("What ran")
    rows = []
    for p in report.doc.programs.values():
        if p.kind == "google_benchmark":
            measured = sum(1 for r in p.runs if r.ok)
            skipped = len(p.runs) - measured
            reasons = unique(r.error for r in p.runs if r.error)
            note = p.why or ("; ".join(reasons[:2]) if reasons else "")
        elif p.kind == "replay":
            traces = p.data.get("traces", {})
            measured = sum(1 for t in traces.values() if t.get("status") == "ok")
            skipped = len(traces) - measured
            note = "; ".join(f"{n}: {t.get('why')}" for n, t in traces.items() if t.get("status") != "ok")
        else:
            measured = 1 if p.status == "ok" else 0
            skipped = 1 - measured
            note = p.why
        seconds = p.data.get("seconds")
        if p.filled:
            note = "rows from another run: see its section" + (f"; {note}" if note else "")
        rows.append([f"`{p.name}`", p.status, measured, skipped,
                     "–" if seconds is None else f"{float(seconds):.0f} s", note[:300]])
    table(report.out, ["program", "status", "rows measured", "rows skipped", "time", "note"], rows)


# -- growth (vmm_bench_grow) --

def section_growth(report):
    report.heading("Growing a buffer (`vmm_bench_grow`)")
    program = report.program("vmm_bench_grow")
    if program is None or not any(r.ok for r in program.runs):
        report.missing("Growth", "vmm_bench_grow")
        return
    out, gb = report.out, program.context
    is_gpu = gb.get("vmm_bench_set") == "gpu"
    if gb.get("vmm_memory"):
        out.append(f"On {gb['vmm_memory']}.")
        out.append("")
    if gb.get("vmm_no_gpu_reason"):
        report.note(f"No GPU set: {gb['vmm_no_gpu_reason']}; OS-provider set "
                    "(vmm on location::os_host() against host baselines, at 1/16 of the GPU sizes)")
    if gb.get("vmm_peak_memory_source"):
        out.append(f"Peak extra memory: {gb['vmm_peak_memory_source']}.")
        out.append("")
    if gb.get("library_build_type") == "debug":
        out.append("(\"library_build_type: debug\" is Google Benchmark's own library, not vmm.)")
        out.append("")
    runs = report.use(program, program.rows("grow"))
    grow_tables(runs, is_gpu, out)
    plot_growth(report, runs)
    once = report.use(program, program.rows("grow_once"))
    grow_once_table(once, is_gpu, out, gb.get("vmm_grow_once_floor"))
    plot_grow_once(report, once)
    reach = report.use(program, program.rows("reach"))
    if reach:
        reach_lines(reach, out)
    elif not is_gpu:
        report.note("Largest vector reachable: GPU only (it would take all of the machine's memory).")


def grow_tables(runs, is_gpu, out):
    for case in unique(r.case for r in runs):
        rows = [r for r in runs if r.case == case]
        floor = next((r for r in rows if r.role == "floor" and r.ok), None)
        baselines = [r for r in rows if r.role == "baseline" and r.ok]
        out.append(f"### Grow {describe_case(case)}, each slice written once")
        out.append("")
        header = ["contender", "time", "time / floor"]
        header += [f"× faster than {b.contender}" for b in baselines]
        header += ["GB/s", "peak extra memory", "peak / size", "chunks (vmm) / allocations"]
        body = []
        for r in rows:
            if not r.ok:
                body.append([r.contender, f"skipped: {r.error}"])
                continue
            cells = [marked(r), fmt_time(r.seconds)]
            cells.append(fmt_ratio(ratio(r.seconds, floor.seconds)) if floor else "–")
            for b in baselines:
                cells.append(fmt_ratio(ratio(b.seconds, r.seconds)))
            rate = r.counter("bytes_per_second")
            cells.append(f"{rate / 1e9:.1f}" if rate else "–")
            cells.append(fmt_bytes(r.counter("peak_extra_bytes")))
            cells.append(fmt_ratio(r.counter("peak_extra_x")))
            handles = r.counter("chunks", r.counter("allocations"))
            cells.append("–" if handles is None else f"{handles:.0f}")
            body.append(cells)
        table(out, header, body)
        if is_gpu:
            grow_targets(rows, floor, baselines, case, out)
        else:
            os_mapping_limit(rows, out)


def os_mapping_limit(rows, out):
    """On the OS provider: vmm's warm growth against the OS's own cost of mapping the same
    committed pages (map_committed_pages), which bounds any growth by mapping there."""
    limit = next((r for r in rows if r.contender == "map_committed_pages" and r.ok and r.seconds), None)
    if limit is None:
        return
    lines = [f"- {r.contender}: {r.seconds / limit.seconds:.2f}× map_committed_pages"
             for r in rows if r.role == "vmm" and r.ok and r.contender.endswith("_warm")]
    if lines:
        out.append("Warm growth against the OS mapping the same committed pages (its 4 KiB page tables are the limit):")
        out.extend(lines)
        out.append("")


def grow_targets(rows, floor, baselines, case, out):
    final, _ = size_of_case(case)
    lines = []
    raws = {r.contender: r for r in rows if r.contender.startswith("raw_vmm") and r.contender.endswith("_cold")
            and r.ok and r.seconds}
    raw_64 = raws.get("raw_vmm_64MiB_cold")
    for r in rows:
        if r.role != "vmm" or not r.ok:
            continue
        parts = []
        if case == TARGET_CASE:
            if floor and floor.seconds:
                x = r.seconds / floor.seconds
                parts.append(f"{x:.2f}× the floor (≤ {TARGET_FLOOR_RATIO}×: {verdict(x <= TARGET_FLOOR_RATIO)})")
            for b in baselines:
                want = TARGET_SPEEDUP.get(b.contender)
                if want is not None and r.seconds:
                    speedup = b.seconds / r.seconds
                    parts.append(f"{speedup:.2f}× faster than {b.contender} (≥ {want}×: {verdict(speedup >= want)})")
            peak = r.counter("peak_extra_bytes")
            if peak is not None and final:
                parts.append(f"peak {fmt_bytes(peak)} = size + {fmt_bytes(max(peak - final, 0))} "
                             f"(target: at most size + one chunk)")
        # Issue 16's cold target, against the raw driver creating the very handles this
        # policy creates, and against raw 64 MiB handles (the baseline the issue measured).
        if r.contender.endswith("_cold"):
            same = raws.get(COLD_SAME_HANDLES.get(r.contender, ""))
            against = [(same, "the same handles")] + ([(raw_64, "64 MiB handles")] if raw_64 is not same else [])
            for raw, what in against:
                if raw:
                    x = r.seconds / raw.seconds
                    parts.append(f"{x:.2f}× {raw.contender}, {what} (issue 16: ≤ {TARGET_COLD_TO_RAW}×: "
                                 f"{verdict(x <= TARGET_COLD_TO_RAW)})")
        if parts:
            lines.append(f"- {r.contender}: " + "; ".join(parts))
    small, large = raws.get("raw_vmm_64MiB_cold"), raws.get("raw_vmm_256MiB_cold")
    if lines and small and large:
        lines.append(f"- the raw driver in this run: 256 MiB handles took {large.seconds / small.seconds:.2f}× "
                     "the time of 64 MiB handles for the same bytes. Every timed run starts once the driver "
                     "is done with what the run before it released (bench/settle.hpp; docs/GPU-FACTS.md, "
                     "\"Freed memory\")")
    if lines:
        out.append(f"Targets ({describe_case(case)}):")
        out.append("")
        out.extend(lines)
        out.append("")


def plot_growth(report, runs):
    plots = report.plots
    ok = [r for r in runs if r.ok and size_of_case(r.case)[0]]
    if not plots.on or not ok:
        return
    cases = sorted(unique(r.case for r in ok), key=lambda c: size_of_case(c)[0])
    fig, (left, right) = plots.figure(columns=2, width=6.0)
    for contender in unique(r.contender for r in ok):
        points = [(size_of_case(r.case)[0] / GIB, r.seconds * 1e3, r.counter("peak_extra_bytes"))
                  for c in cases for r in ok if r.case == c and r.contender == contender]
        xs = [p[0] for p in points]
        style = "o-" if any(r.role == "vmm" for r in ok if r.contender == contender) else "s--"
        left.plot(xs, [p[1] for p in points], style, label=contender, markersize=4)
        if all(p[2] is not None for p in points):
            right.plot(xs, [p[2] / GIB for p in points], style, label=contender, markersize=4)
    labels = [describe_case(c).replace("0 → ", "").replace(" appends", "") for c in cases]
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks([size_of_case(c)[0] / GIB for c in cases])
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_xlabel("final size (append step)")
        ax.grid(alpha=0.3)
    left.set_yscale("log")
    left.set_ylabel("time to grow and write (ms)")
    right.set_ylabel("peak extra memory (GiB)")
    left.legend(fontsize=6)
    plots.save(fig, "growth", "Growing a buffer: time and peak memory against size", report.out,
               "Time to grow from 0 and write each appended slice once (left, log scale) and the "
               "peak of memory held (right), for every contender.", ok)


def grow_once_table(rows, is_gpu, out, floor_note):
    if not rows:
        return
    out.append("### One grow of one chunk, warm pool, against the raw calls it needs")
    out.append("")
    if floor_note:
        out.append(f"Floor: {floor_note}.")
        out.append("")
    body, target_lines = [], []
    for case in unique(r.case for r in rows):
        group = [r for r in rows if r.case == case]
        raw = next((r for r in group if r.role == "floor" and r.ok), None)
        for r in group:
            if not r.ok:
                body.append([case, r.contender, f"skipped: {r.error}"])
                continue
            x = ratio(r.seconds, raw.seconds) if raw else None
            undo = r.counter("undo_us")
            created = r.counter("chunks_created")
            body.append([case, marked(r), fmt_time(r.seconds), fmt_ratio(x),
                         "–" if undo is None else f"{undo:.2f} µs",
                         "–" if created is None else f"{created:.0f}"])
            if is_gpu and r.contender == "vmm_growable_warm" and x is not None:
                target_lines.append(f"- {case}: growable_buffer grow = {x:.3f}× {raw.contender} "
                                    f"(within 5 %: {verdict(x <= TARGET_GROW_ONCE_RATIO)})")
        # Like for like: the same calls into a reservation of the same size (1 GiB).
        raw_1g = next((r for r in group if r.contender == "raw_driver_1GiB" and r.ok), None)
        vmm_1g = next((r for r in group if r.contender == "vmm_growable_warm_1GiB" and r.ok), None)
        if is_gpu and raw_1g and vmm_1g and raw_1g.seconds:
            x = vmm_1g.seconds / raw_1g.seconds
            target_lines.append(f"- {case}, both in a 1 GiB reservation: growable_buffer grow = {x:.3f}× "
                                f"raw_driver_1GiB (within 5 %: {verdict(x <= TARGET_GROW_ONCE_RATIO)})")
    table(out, ["chunk", "contender", "grow", "× raw", "undo (unmap, untimed)", "chunks created while timed"], body)
    if target_lines:
        out.append("Target (a grow with a warm pool within 5 % of the raw driver calls):")
        out.append("")
        out.extend(target_lines)
        out.append("")


def plot_grow_once(report, rows):
    plots = report.plots
    ok = [r for r in rows if r.ok and parse_size(r.case)]
    if not plots.on or not ok:
        return
    fig, (ax,) = plots.figure()
    for contender in unique(r.contender for r in ok):
        points = sorted((parse_size(r.case) / MIB, r.seconds * 1e6) for r in ok if r.contender == contender)
        ax.plot([p[0] for p in points], [p[1] for p in points], "o-", label=contender, markersize=4)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("chunk size (MiB)")
    ax.set_ylabel("one grow (µs)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    plots.save(fig, "grow_once", "One grow by one chunk (warm pool) against chunk size", report.out,
               "Host time of one grow by one chunk with a warm pool, vmm against the raw calls it needs.", ok)


def reach_lines(rows, out):
    for case in unique(r.case for r in rows):
        out.append(f"### Largest vector reachable by growing ({case.replace('_', ' ')})")
        out.append("")
        for r in (x for x in rows if x.case == case):
            if not r.ok:
                out.append(f"- {r.contender}: skipped: {r.error}")
                continue
            share = r.counter("reached_share")
            percent = "–" if share is None else f"{share * 100:.2f} %"
            line = (f"- {r.contender}: {fmt_bytes(r.counter('reached_bytes'))} of "
                    f"{fmt_bytes(r.counter('free_at_start_bytes'))} free ({percent}) in {fmt_time(r.seconds)}")
            if (r.role == "vmm" or r.contender == "vmm") and share is not None:
                line += f" (≥ {TARGET_REACH_SHARE * 100:.0f} %: {verdict(share >= TARGET_REACH_SHARE)})"
            out.append(line)
        out.append("")


# -- the driver's costs (vmm_bench_driver) --

def section_driver(report):
    report.heading("What the driver's calls cost (`vmm_bench_driver`)")
    program = report.program("vmm_bench_driver")
    if program is None or not any(r.ok for r in program.runs):
        report.missing("Driver costs", "vmm_bench_driver")
        return
    out = report.out
    raw = report.use(program, [r for r in program.rows("raw_grow_in_reservation") if r.ok])
    vmm = report.use(program, [r for r in program.rows("vmm_grow_one_chunk") if r.ok])
    if raw or vmm:
        out.append("### One grow by one chunk (a recycled handle) against reservation size")
        out.append("")
        body = []
        for r in raw:
            where = "middle" if r.arg("middle") else "start"
            body.append(["raw", fmt_num(r.arg("chunk_mib")), fmt_num(r.arg("reservation_mib")),
                         fmt_num(r.arg("alignment_mib")), where, fmt_us(r.counter("grow_us")),
                         fmt_us(r.counter("map_us")), fmt_us(r.counter("access_us")), fmt_us(r.counter("unmap_us")), ""])
        targets = []
        for r in vmm:
            chunk = r.arg("chunk_mib")
            actual = r.counter("reservation_mib", r.arg("reservation_mib"))
            # The default reservation (the GPU's memory, rounded) next to the raw row of about its size.
            same = next((x for x in raw if x.arg("chunk_mib") == chunk and actual and x.arg("reservation_mib")
                         and abs(math.log(x.arg("reservation_mib") / actual)) < 0.1
                         and not x.arg("middle") and x.arg("alignment_mib") in (2, chunk)), None)
            tight = next((x for x in raw if x.arg("chunk_mib") == chunk and x.arg("reservation_mib") == chunk
                          and not x.arg("middle")), None)
            x_same = ratio(r.counter("grow_us"), same.counter("grow_us")) if same else None
            x_tight = ratio(r.counter("grow_us"), tight.counter("grow_us")) if tight else None
            label = "default" if not r.arg("reservation_mib") else fmt_num(r.arg("reservation_mib"))
            body.append(["vmm growable_buffer", fmt_num(chunk), f"{label} ({fmt_num(actual)})", "", "start",
                         fmt_us(r.counter("grow_us")), "", "", "",
                         f"{fmt_ratio(x_same)} raw same reservation; {fmt_ratio(x_tight)} raw tight"])
            if chunk == 2 and x_same is not None:
                targets.append(f"- 2 MiB grow, reservation {label}: {x_same:.3f}× the raw calls in the same "
                               f"reservation (issue 16: ≤ {TARGET_WARM_GROW_TO_RAW}×: "
                               f"{verdict(x_same <= TARGET_WARM_GROW_TO_RAW)})")
            if chunk == 2 and not r.arg("reservation_mib") and x_tight is not None:
                line = (f"- 2 MiB grow in the default reservation: {x_tight:.3f}× the raw calls in a tight "
                        "reservation (issue 16: no more than a tight one where the driver allows)")
                # What the driver itself charges for a reservation that can hold growth: its
                # smallest raw row larger than four chunks, against tight.
                roomy = min((x for x in raw if x.arg("chunk_mib") == chunk and not x.arg("middle")
                             and (x.arg("reservation_mib") or 0) > 4 * chunk), default=None,
                            key=lambda x: x.arg("reservation_mib"))
                if roomy is not None and tight is not None:
                    x_roomy = ratio(roomy.counter("grow_us"), tight.counter("grow_us"))
                    line += (f". The raw calls alone, in a reservation of {fmt_num(roomy.arg('reservation_mib'))} MiB: "
                             f"{fmt_ratio(x_roomy)} tight, in this run; a buffer's reservation holds its maximum size "
                             "(its address never moves), so "
                             + ("the driver does not allow it here." if x_roomy and x_roomy > TARGET_WARM_GROW_TO_RAW
                                else "the driver allows it here: NOT met."))
                targets.append(line)
        table(out, ["who", "chunk MiB", "reservation MiB", "alignment MiB", "where", "grow", "cuMemMap",
                    "cuMemSetAccess", "cuMemUnmap", "vs raw"], body)
        if targets:
            out.extend(targets)
            out.append("")
        plot_driver_grow(report, raw, vmm)
    cold = report.use(program, [r for r in program.rows("raw_cold_growth") if r.ok])
    if cold:
        out.append("### Fresh memory: 16 GiB created, mapped and given access, raw")
        out.append("")
        table(out, ["handle MiB", "total", "cuMemCreate", "cuMemMap", "cuMemSetAccess"],
              [[fmt_num(r.arg("chunk_mib")), fmt_time(r.seconds), f"{r.counter('create_ms', 0):.2f} ms",
                f"{r.counter('map_ms', 0):.2f} ms", f"{r.counter('access_ms', 0):.2f} ms"] for r in cold])
    imports = report.use(program, [r for r in program.rows() if r.family in ("raw_import", "vmm_import") and r.ok])
    if imports:
        out.append("### Import on the importer's side (one handle: import + map + access)")
        out.append("")
        body = []
        for r in imports:
            raw_row = next((x for x in imports if x.family == "raw_import" and x.arg("chunk_mib") == r.arg("chunk_mib")), None)
            x = ratio(r.counter("import_us"), raw_row.counter("import_us")) if raw_row and r is not raw_row else None
            cell = fmt_ratio(x)
            if x is not None:
                cell += f" (issue 16: ≤ {TARGET_IMPORT_TO_RAW}×: {verdict(x <= TARGET_IMPORT_TO_RAW)})"
            body.append([r.family, fmt_num(r.arg("chunk_mib")), fmt_us(r.counter("import_us")), cell])
        table(out, ["who", "chunk MiB", "median", "vs raw"], body)


def plot_driver_grow(report, raw, vmm):
    plots = report.plots
    if not plots.on or not (raw or vmm):
        return
    fig, (ax,) = plots.figure()
    for chunk in unique(r.arg("chunk_mib") for r in raw):
        points = sorted((r.arg("reservation_mib"), r.counter("grow_us")) for r in raw
                        if r.arg("chunk_mib") == chunk and not r.arg("middle") and r.arg("alignment_mib") == 2
                        and r.counter("grow_us") is not None)
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], "o-", markersize=4,
                    label=f"raw cuMemMap + cuMemSetAccess, {fmt_num(chunk)} MiB handle")
    for chunk in unique(r.arg("chunk_mib") for r in vmm):
        points = sorted((r.counter("reservation_mib", r.arg("reservation_mib")), r.counter("grow_us")) for r in vmm
                        if r.arg("chunk_mib") == chunk and r.counter("grow_us") is not None)
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], "D", markersize=7, fillstyle="none",
                    label=f"vmm growable_buffer, {fmt_num(chunk)} MiB chunk")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("reservation size (MiB)")
    ax.set_ylabel("one grow (µs, median)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    plots.save(fig, "driver_grow", "Per-grow cost against reservation size", report.out,
               "Median host time of mapping one recycled handle and setting its access, against the size "
               "of the reservation around it and the handle's size; vmm's points use the reservation it made.")


# -- several GPUs (vmm_bench_multi_gpu, over every document) --

def section_striping(report):
    report.heading("One pointer over several GPUs (`vmm_bench_multi_gpu`)")
    machines = []
    for doc in report.docs:
        p = doc.program("vmm_bench_multi_gpu")
        if p is not None and any(r.ok for r in p.runs):
            machines.append((doc, p))
    if not machines:
        report.missing("Striping", "vmm_bench_multi_gpu")
        report.note("Bandwidth against GPU count needs runs on machines of 2 and more GPUs: pass their "
                    "bench.json files after the first.")
        return
    out = report.out
    series = []  # (gpus, local GB/s, {stripe: GB/s}, doc)
    for doc, p in machines:
        runs = [r for r in p.runs if r.ok]
        if doc is report.doc:
            report.use(p, runs)
        local = next((r for r in runs if r.family == "one_gpu_local"), None)
        local_gbps = local.counter("GB_per_s") if local else None
        own = [r for r in runs if r.family == "own_stripes"]
        gpus = next((r.counter("gpus") for r in own if r.counter("gpus")), None)
        out.append(f"### {doc.machine()} ({gpus and int(gpus)} GPUs, {str(doc.context.get('date', '?'))[:10]})")
        out.append("")
        body = []
        if local:
            body.append(["one_gpu_local (baseline)", "", f"{local_gbps:.0f}" if local_gbps else "–", "", ""])
        stripes = {}
        for r in own:
            target = r.counter("target_ratio") or TARGET_STRIPES.get(int(gpus or 0))
            x = r.counter("ratio_to_one_gpu")
            body.append([f"own_stripes, {fmt_num(r.arg('stripe_MiB'))} MiB" + (", contiguous" if r.arg("contiguous") else ""),
                         fmt_num(r.arg("stripe_MiB")), fmt_num(r.counter("GB_per_s")), fmt_ratio(x),
                         "" if not target or x is None else f"≥ {target}: {verdict(x >= target)}"])
            if not r.arg("contiguous"):
                stripes[fmt_num(r.arg("stripe_MiB"))] = r.counter("GB_per_s")
        for r in runs:
            if r.family == "one_gpu_reads_all":
                x = r.counter("ratio_to_raw")
                body.append([f"GPU 0 reads all, {r.contender if r.contender != r.name else r.parts[-1]}",
                             fmt_num(r.arg("stripe_MiB")), fmt_num(r.counter("GB_per_s")),
                             "" if x is None else f"{x:.3f}× raw", "" if x is None else f"≥ 0.95: {verdict(x >= 0.95)}"])
        table(out, ["row", "stripe MiB", "GB/s", "ratio", "target"], body)
        for r in runs:
            if r.family == "spill_reach":
                out.append(f"- A growable buffer spilling over every GPU reached {fmt_num(r.counter('reach_GiB'))} of "
                           f"{fmt_num(r.counter('free_GiB'))} GiB free ({fmt_num(r.counter('percent_of_free'))} %).")
                out.append("")
        series.append((gpus, local_gbps, stripes, doc))
    plots = report.plots
    if plots.on:
        fig, (ax,) = plots.figure()
        locals_ = [s[1] for s in series if s[1]]
        if locals_:
            one = statistics.median(locals_)
            most = max(int(s[0] or 1) for s in series)
            ax.plot([1, most], [one, one * most], ":", color="gray", label="linear from one GPU")
            ax.plot([1], [one], "ks", label="one GPU, local cudaMalloc")
        for stripe in unique(k for s in series for k in s[2]):
            points = sorted((s[0], s[2][stripe]) for s in series if stripe in s[2] and s[0])
            ax.plot([p[0] for p in points], [p[1] for p in points], "o-", label=f"own stripes, {stripe} MiB")
        ax.set_xlabel("GPUs")
        ax.set_ylabel("aggregate read bandwidth (GB/s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        plots.save(fig, "striping", "Striping: bandwidth against GPU count", report.out,
                   "Each GPU reads its own stripes of one vmm::striped_buffer, all at once, against one GPU "
                   "reading a local buffer of the same size; one point per machine (bench.json file).")


# -- hand-off between processes (vmm_bench_ipc, vmm_bench_resource_ipc) --

def mean_us(run):
    return run.seconds * 1e6


def section_replicated(report):
    report.heading("Read-mostly data on every GPU (`vmm_bench_replicated`)")
    program = report.program("vmm_bench_replicated")
    if program is None or not any(r.ok for r in program.runs):
        report.missing("Replication", "vmm_bench_replicated")
        return
    out = report.out
    local = report.use(program, [r for r in program.rows("one_gpu_local") if r.ok])
    reads = report.use(program, [r for r in program.rows("reads") if r.ok])
    casts = report.use(program, [r for r in program.rows("broadcast") if r.ok])
    gpus = next((r.counter("gpus") for r in reads + casts if r.counter("gpus")), None)
    out.append(f"### Every GPU reads the whole array ({gpus and int(gpus)} GPUs)")
    out.append("")
    body = []
    for r in local:
        body.append(["one GPU, its own cudaMalloc (baseline)", fmt_num(r.counter("GB_per_s")), "1.00×", ""])
    for r in reads:
        x = r.counter("ratio_to_one_gpu")
        target = r.counter("target_ratio")
        body.append([r.case, fmt_num(r.counter("GB_per_s")), fmt_ratio(x),
                     "" if not target or x is None else f"≥ {target:.2f}: {verdict(x >= target)}"])
    table(out, ["how", "aggregate GB/s", "vs one GPU", "target"], body)
    if casts:
        out.append("### Broadcast of 1 GiB")
        out.append("")
        body = []
        for r in casts:
            x = r.counter("ratio_to_limit")
            target = r.counter("target_ratio")
            body.append(["update from host memory" if r.arg("from_host") else "publish from the owner",
                         fmt_time(r.seconds), fmt_num(r.counter("rounds")), fmt_num(r.counter("peer_limit_ms")),
                         fmt_ratio(x), "" if not target or x is None else f"≤ {target}: {verdict(x <= target)}"])
        table(out, ["broadcast", "time", "rounds", "peer limit ms", "vs limit", "target"], body)
    plots = report.plots
    if plots.on and reads:
        fig, (ax,) = plots.figure()
        names = [r.case for r in reads]
        ax.bar(names, [r.counter("GB_per_s") or 0 for r in reads])
        if local and local[0].counter("GB_per_s"):
            one = local[0].counter("GB_per_s")
            ax.axhline(one, color="gray", linestyle=":", label="one GPU, local")
            if gpus:
                ax.axhline(one * gpus, color="black", linestyle="--", label=f"{int(gpus)}× one GPU")
            ax.legend(fontsize=7)
        ax.set_ylabel("aggregate read bandwidth (GB/s)")
        ax.grid(alpha=0.3, axis="y")
        plots.save(fig, "replicated", "Replicated reads against the alternatives", report.out,
                   "A kernel on every GPU reads the whole array at once: from its own replica, from one copy "
                   "on GPU 0 over peer mappings, from a striped buffer, and from managed memory with "
                   "SetReadMostly.")


def section_ipc(report):
    report.heading("Handing memory to another process (`vmm_bench_ipc`)")
    program = report.program("vmm_bench_ipc")
    if program is None or not any(r.ok for r in program.runs):
        report.missing("IPC hand-off", "vmm_bench_ipc")
        return
    runs = report.use(program, [r for r in program.rows("hand_off") if r.ok])
    methods = unique(r.case for r in runs)
    sizes = unique(r.contender for r in runs if r.case != "round_trip")
    report.out.append("Mean time from \"the exporter has the buffer\" to \"the importer can launch a kernel on "
                      "it\", socket round trip included (round_trip alone: "
                      + ", ".join(fmt_us(mean_us(r)) for r in runs if r.case == "round_trip") + ").")
    report.out.append("")
    by = {(r.case, r.contender): r for r in runs}
    body = []
    for m in methods:
        if m == "round_trip":
            continue
        row = [m]
        for s in sizes:
            r = by.get((m, s))
            legacy = by.get(("legacy", s))
            if r is None:
                row.append("–")
                continue
            x = ratio(mean_us(r), mean_us(legacy)) if legacy and m != "legacy" else None
            cell = fmt_us(mean_us(r)) + (f" ({x:.2f}× legacy)" if x else "")
            if r.counter("importer_us") is not None:
                cell += f"; importer {fmt_us(r.counter('importer_us'))}"
            row.append(cell)
        body.append(row)
    table(report.out, ["mechanism"] + sizes, body)
    plot_latency_bars(report, "ipc_handoff", "IPC hand-off latency per mechanism",
                      {(s, m): mean_us(by[(m, s)]) for (m, s) in by if m != "round_trip"}, sizes,
                      [m for m in methods if m != "round_trip"],
                      "Mean hand-off latency per mechanism and buffer size (log scale), socket round trip included.")


def section_resource_ipc(report):
    report.heading("Sharing a pool's pointer with another process (`vmm_bench_resource_ipc`)")
    program = report.program("vmm_bench_resource_ipc")
    if program is None or not any(r.ok for r in program.runs):
        report.missing("Pointer sharing", "vmm_bench_resource_ipc")
        return
    runs = report.use(program, [r for r in program.rows("pointer") if r.ok])
    out = report.out
    if any(r.case == "os" for r in runs):
        report.note("vmm rows on the OS host-memory provider (no GPU: no cudaMemPool rows)")

    def method_size(r):
        parts = r.parts[1:]
        if parts and parts[0] == "os":
            parts = parts[1:]
        return (parts[0] if parts else r.name), (parts[1] if len(parts) > 1 else "")

    by = {method_size(r): r for r in runs}
    methods = unique(m for m, _ in by)
    sizes = unique(s for _, s in by if s)
    body = []
    for m in methods:
        if m == "round_trip":
            out.append(f"round_trip alone: {fmt_us(mean_us(by[(m, '')]))}.")
            out.append("")
            continue
        row = [m]
        for s in sizes:
            r = by.get((m, s))
            if r is None:
                row.append("–")
                continue
            x = r.counter("x_mempool")
            row.append(fmt_us(mean_us(r)) + (f" ({x:.2f}× mempool)" if x else ""))
        body.append(row)
    table(out, ["method"] + sizes, body)
    plot_latency_bars(report, "resource_ipc", "Pool pointer sharing latency per method",
                      {(s, m): mean_us(r) for (m, s), r in by.items() if m != "round_trip"}, sizes,
                      [m for m in methods if m != "round_trip"],
                      "Export-pointer + import-pointer latency per method and size (log scale).")


def plot_latency_bars(report, name, title, values, groups, series, caption, unit="µs (log scale)"):
    plots = report.plots
    if not plots.on or not values:
        return
    fig, (ax,) = plots.figure(width=8.5)
    grouped_bars(ax, groups, series, values, log=True, unit=unit)
    plots.save(fig, name, title, report.out, caption)


# -- re-layout (vmm_bench_relayout) --

def section_relayout(report):
    report.heading("Re-layout against copying (`vmm_bench_relayout`)")
    program = report.program("vmm_bench_relayout")
    if program is None or not any(r.ok for r in program.runs):
        report.missing("Re-layout", "vmm_bench_relayout")
        return
    out = report.out
    relayout = report.use(program, [r for r in program.rows("concat_relayout") if r.ok])
    memcpy = report.use(program, [r for r in program.rows("concat_memcpy") if r.ok])
    if relayout or memcpy:
        out.append("### Concatenating buffers that hold 8 GiB together")
        out.append("")
        body = []
        for r in memcpy:
            body.append(["cudaMalloc + cudaMemcpy", fmt_num(r.arg("k")), "", fmt_time(r.seconds),
                         f"{fmt_num(r.counter('peak_extra_MiB'))} MiB", fmt_num(r.counter("teardown_ms")), ""])
        for r in relayout:
            base = next((m for m in memcpy if m.arg("k") == r.arg("k")), None)
            chunk = r.arg("chunk_MiB")
            body.append(["vmm re-layout", fmt_num(r.arg("k")), "one per buffer" if not chunk else fmt_num(chunk),
                         fmt_time(r.seconds), f"{fmt_num(r.counter('peak_extra_MiB'))} MiB",
                         fmt_num(r.counter("teardown_ms")),
                         fmt_ratio(ratio(base.seconds, r.seconds)) + " faster" if base else "–"])
        table(out, ["how", "buffers k", "chunk MiB", "time", "extra memory", "teardown ms", "vs memcpy"], body)
        plots = report.plots
        if plots.on:
            fig, (ax,) = plots.figure()
            points = sorted((r.arg("k"), r.seconds * 1e3) for r in memcpy)
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], "ks--", label="cudaMalloc + cudaMemcpy")
            for chunk in unique(r.arg("chunk_MiB") for r in relayout):
                points = sorted((r.arg("k"), r.seconds * 1e3) for r in relayout if r.arg("chunk_MiB") == chunk)
                ax.plot([p[0] for p in points], [p[1] for p in points], "o-",
                        label=f"vmm re-layout, {'one chunk per buffer' if not chunk else fmt_num(chunk) + ' MiB chunks'}")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("buffers concatenated (8 GiB in all)")
            ax.set_ylabel("time until usable (ms)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
            plots.save(fig, "relayout", "Re-layout against memcpy", report.out,
                       "Concatenating k buffers of 8 GiB in all: vmm maps the chunks back to back (no copy, no "
                       "extra memory) against allocating and copying.")
    ring = report.use(program, [r for r in program.rows("ring_windows") if r.ok])
    if ring:
        out.append("### Reading windows across the wrap of a ring")
        out.append("")
        caps = unique(r.arg("capacity_MiB") for r in ring)
        kinds = unique(r.case for r in ring)
        body = []
        for c in caps:
            row = [fmt_num(c)]
            for k in kinds:
                r = next((x for x in ring if x.case == k and x.arg("capacity_MiB") == c), None)
                rate = r.counter("bytes_per_second") if r else None
                row.append(f"{rate / 1e9:.0f} GB/s" if rate else "–")
            body.append(row)
        table(out, ["ring MiB"] + kinds, body)


# -- the memory resource (vmm_bench_resource) --

def section_resource(report):
    report.heading("Stream-ordered allocation (`vmm_bench_resource`)")
    program = report.program("vmm_bench_resource")
    if program is None or not any(r.ok for r in program.runs):
        report.missing("Memory resource", "vmm_bench_resource")
        return
    out = report.out
    runs = report.use(program, program.rows())
    skipped = unique(r.error for r in runs if not r.ok)
    if skipped:
        report.note("Rows skipped: " + "; ".join(skipped[:2]))
    ok = [r for r in runs if r.ok]
    timed = [r for r in ok if r.family in ("pair", "pair_os", "window", "window_os")]
    if timed:
        body = []
        for r in timed:
            note = ""
            if r.family == "pair" and r.contender == "vmm" and r.counter("median_ns") is not None:
                met = r.counter("median_ns") <= TARGET_RESOURCE_PAIR_US * 1000
                note = f"target ≤ {TARGET_RESOURCE_PAIR_US} µs: {verdict(met)}"
            vs = r.counter("vs_baseline")
            body.append([f"{r.family}/{r.case}", r.contender, fmt_num(r.counter("median_ns")),
                         fmt_num(r.counter("p99_ns")),
                         "" if vs is None else f"{vs:.2f}× {r.role.replace('vs ', '') or 'itself'}", note])
        table(out, ["group", "contender", "median ns", "p99 ns", "vs baseline", "target"], body)
    frag = [r for r in ok if r.family.startswith("fragmented")]
    if frag:
        out.append("Largest allocation left after fragmentation:")
        out.append("")
        table(out, ["group", "contender", "largest", "of free", "share", "vs baseline"],
              [[f"{r.family}/{r.case}", r.contender, fmt_bytes(r.counter("largest_bytes")),
                fmt_bytes(r.counter("available_bytes")), fmt_num(r.counter("share")),
                fmt_ratio(r.counter("vs_baseline"))] for r in frag])
    pairs = [r for r in ok if r.family in ("pair", "pair_os") and r.counter("median_ns")]
    plots = report.plots
    if plots.on and pairs:
        families = unique(r.family for r in pairs)
        fig, axes = plots.figure(columns=len(families), width=5.5 if len(families) > 1 else 7.5)
        for ax, family in zip(axes, families):
            rows = [r for r in pairs if r.family == family]
            grouped_bars(ax, unique(r.case for r in rows), unique(r.contender for r in rows),
                         {(r.case, r.contender): r.counter("median_ns") for r in rows}, log=True,
                         unit="median ns per allocate + free (log)")
            ax.set_title("GPU: against cudaMallocAsync" if family == "pair" else "host: against malloc", fontsize=9)
        plots.save(fig, "resource_pair", "Memory resource: allocate + free pair latency", report.out,
                   "Median host time of an allocate + deallocate pair of one size on one stream, "
                   "vmm::memory_resource against cudaMallocAsync and cudaMalloc (GPU) or malloc (host).")


# -- fragmentation: traces and PyTorch --

def section_fragmentation(report):
    report.heading("Fragmentation: peak reserved / peak live per trace and allocator")
    out = report.out
    replay = report.program("vmm_replay")
    torch = report.program("torch_allocators")
    # Where the rows come from: this run, or the one that filled them (Document.fill_from).
    replay_run = replay.run_label("the note under this heading") if replay else "this run"
    torch_run = torch.run_label("the PyTorch section") if torch else "this run"
    refs = report.doc.references
    values = {}  # (group, allocator) -> ratio
    body = []
    traces = replay.data.get("traces", {}) if replay else {}
    for name, t in traces.items():
        r = t.get("result") or {}
        if t.get("status") == "ok" and r.get("reserved_over_live"):
            group = f"trace {name}"
            values[(group, "vmm")] = r["reserved_over_live"]
            where = r.get("location", "?") + (", simulated" if r.get("simulated") else "")
            body.append([group, f"vmm (vmm-replay on {where}, {replay_run})",
                         f"{r['reserved_over_live']:.4f}", fmt_bytes(r.get("peak_live_bytes")),
                         fmt_bytes(r.get("peak_reserved_bytes"))])
        else:
            body.append([f"trace {name}", "vmm (vmm-replay)", f"not measured: {t.get('why', t.get('status'))}", "", ""])
    for name, ref in refs.items():
        for allocator, x in ref.get("pytorch", {}).items():
            group = f"trace {name}"
            values[(group, allocator)] = x
            body.append([group, f"PyTorch {allocator} ({ref.get('source', 'recorded with the trace')})",
                         f"{x:.3f}", "", ""])
    if torch and torch.status == "ok":
        for allocator, result in torch.data.get("data", {}).get("results", {}).items():
            for workload, w in (result.get("workloads") or {}).items():
                x = w.get("reserved_over_allocated")
                if x is None:
                    continue
                group = f"{workload} (torch_allocators.py)"
                values[(group, allocator)] = x
                body.append([group, f"{allocator} (live, {torch_run})", f"{x:.3f}",
                             fmt_bytes(w.get("peak_allocated")), fmt_bytes(w.get("peak_reserved"))])
    if not body:
        report.note("No trace replayed and no PyTorch figures: vmm_replay and torch_allocators are not in this run.")
        return
    table(out, ["workload", "allocator", "peak reserved / peak live", "peak live", "peak reserved"], body)
    if replay is None:
        report.note("vmm-replay is not in this run.")
    if torch is None or torch.status != "ok":
        report.note("torch_allocators.py: " + ("not in this run" if torch is None else f"{torch.status}: {torch.why}"))
    latency = [(n, t["result"]) for n, t in traces.items() if t.get("status") == "ok" and t.get("result")]
    if latency:
        out.append("Host time of vmm-replay's calls (ns, median / p99):")
        out.append("")
        table(out, ["trace", "location", "allocate", "deallocate", "pair", "clock read (in each timing)",
                    "pages created", "stitched"],
              [[n, r.get("location"), *(f"{r.get(k, {}).get('median', 0):.0f} / {r.get(k, {}).get('p99', 0):.0f}"
                                        for k in ("allocate_ns", "deallocate_ns", "pair_ns")),
                f"{r.get('clock_ns', 0):.0f} ns ({r.get('clock', 'steady_clock')})",
                fmt_num(r.get("pages_created")), fmt_num(r.get("pages_stitched"))] for n, r in latency])
    plots = report.plots
    if plots.on and values:
        groups = unique(g for g, _ in values)
        allocators = [a for a in ALLOCATOR_ORDER if any(k[1] == a for k in values)]
        allocators += unique(a for _, a in values if a not in allocators)
        fig, (ax,) = plots.figure(width=9.0)
        grouped_bars(ax, groups, allocators, values, unit="peak reserved / peak live", labels="%.3f")
        ax.axhline(1.0, color="gray", linewidth=0.8)
        plots.save(fig, "fragmentation", "Fragmentation per trace and allocator", report.out,
                   "Peak memory held over peak memory in use (1.0: nothing wasted). Traces: vmm replayed in "
                   f"{replay_run}, PyTorch's figures as recorded with the trace (bench/data); workloads: every allocator "
                   f"live in {torch_run} (bench/torch_allocators.py).")


# -- kernels that append (vmm_bench_append) --

def section_append(report):
    report.heading("Kernels that append (`vmm_bench_append`)")
    program = report.program("vmm_bench_append")
    if program is None or not any(r.ok for r in program.runs):
        report.missing("Append", "vmm_bench_append")
        return
    runs = report.use(program, [r for r in program.runs if r.ok])
    body = []
    for r in sorted(runs, key=lambda r: (r.arg("per_mille", 0), r.parts[-1], r.name)):
        rate = r.counter("bytes_per_second")
        body.append([fmt_num(r.arg("per_mille")), "/".join(r.parts[:-1]) or r.name, r.parts[-1], fmt_time(r.seconds),
                     f"{rate / 1e9:.0f}" if rate else "–", fmt_ratio(r.counter("vs_best")),
                     fmt_ratio(r.counter("vs_worst_case_best")), fmt_num(r.counter("peak_MiB")),
                     fmt_ratio(r.counter("peak_over_output"))])
    table(report.out, ["kept ‰", "contender", "output", "time", "GB/s", "vs best, same output",
                       "vs best worst-case (grow ≤ 1.05)", "peak MiB", "peak / output (grow ≤ 1.13)"], body)
    keys = next((r.counter("keys") for r in runs if r.counter("keys")), None)
    report.out.append("Targets (issue 15" + (f", {keys / 2**30:.3g} Gi keys" if keys else "") +
                      "): the fastest append with growth from a small start, against the faster of "
                      "cub_select_if and append/thread with worst-case outputs:")
    report.out.append("")
    for per_mille in unique(r.arg("per_mille") for r in runs if r.parts[-1] == "grow"):
        grown = [r for r in runs if r.parts[-1] == "grow" and r.arg("per_mille") == per_mille
                 and r.parts[0] == "append" and r.counter("vs_worst_case_best") is not None]
        if not grown:
            continue
        best = min(grown, key=lambda r: r.seconds)
        time_ratio = best.counter("vs_worst_case_best")
        peak = best.counter("peak_over_output")
        report.out.append(f"- {fmt_num(per_mille)} ‰ kept: {'/'.join(best.parts[:-1])} {fmt_time(best.seconds)} = "
                          f"{time_ratio:.3f}× (≤ 1.05: {verdict(time_ratio <= 1.05)}), peak "
                          f"{peak:.3f}× the output (≤ 1.13: {verdict(peak is not None and peak <= 1.13)})")
    report.out.append("")


# -- PyTorch's allocators (bench/torch_allocators.py) --

def section_torch(report):
    report.heading("PyTorch's allocators against vmm (`bench/torch_allocators.py`)")
    torch = report.program("torch_allocators")
    if torch is None or torch.status != "ok":
        report.note("Not measured: " + ("not in this run" if torch is None else f"{torch.status}: {torch.why}"))
        return
    data = torch.data.get("data", {})
    results = data.get("results", {})
    allocators = [a for a in ALLOCATOR_ORDER if a in results] + [a for a in results if a not in ALLOCATOR_ORDER]
    workloads = unique(w for a in allocators for w in (results[a].get("workloads") or {}))
    if data.get("quick"):
        report.note("--quick: fewer steps and smaller sizes")
    body = []
    for w in workloads:
        row = [w]
        for a in allocators:
            x = (results[a].get("workloads") or {}).get(w, {})
            if "step_ms_median" in x:
                row.append(f"{x['step_ms_median']:.1f} ms, {x.get('reserved_over_allocated', 0):.3f}")
            else:
                row.append(str(x.get("error", "–"))[:80])
        body.append(row)
    for size in unique(k for a in allocators for k in (results[a].get("empty_del_us") or {})):
        body.append([f"torch.empty + del, {fmt_bytes(float(size))}"]
                    + [fmt_us((results[a].get("empty_del_us") or {}).get(size)) for a in allocators])
    table(report.out, ["workload (median step, reserved / allocated)"] + allocators, body)
    for a in allocators:
        sw = results[a].get("sleep_wake")
        if isinstance(sw, dict) and "sleep_ms" in sw:
            report.out.append(f"- {a} sleep/wake of {fmt_bytes(sw.get('offloaded_bytes'))}: sleep "
                              f"{sw['sleep_ms']:.1f} ms ({fmt_ratio(sw.get('sleep_over_d2h'))} a pinned copy), wake "
                              f"{sw.get('wake_ms', 0):.1f} ms ({fmt_ratio(sw.get('wake_over_h2d'))})"
                              + (f"; into host copies the wake before kept: sleep {sw['sleep_kept_ms']:.1f} ms "
                                 f"({fmt_ratio(sw.get('sleep_kept_over_d2h'))})" if "sleep_kept_ms" in sw else ""))
    if data.get("targets"):
        report.out.append("")
        report.out.append("Targets, as the script checked them:")
        report.out.append("")
        report.out.extend(f"- {t}" for t in data["targets"])
    report.out.append("")


# -- whatever no section above knows --

def section_other(report):
    blocks = []
    for p in report.doc.programs.values():
        if p.kind != "google_benchmark":
            continue
        rest = [r for r in p.runs if (p.name, r.name) not in report.shown]
        if not rest:
            continue
        known = p.name in KNOWN_PROGRAMS
        blocks.append((p, rest, known))
    if not blocks:
        return
    report.heading("Other rows")
    for p, rest, known in blocks:
        report.out.append(f"### `{p.name}`" + (" (rows no section above shows)" if known else ""))
        report.out.append("")
        if p.filled:
            report.note(p.filled)
        if not any(r.ok for r in rest):
            report.note(f"{len(rest)} rows, every one skipped: " + "; ".join(unique(r.error for r in rest)[:2]))
            continue
        counters = unique(k for r in rest if r.ok for k in r.counters if k not in ("time_unit",))[:8]
        body = []
        for r in rest:
            if not r.ok:
                body.append([r.name, f"skipped: {r.error}"])
                continue
            body.append([r.name, fmt_time(r.seconds), r.role] + [fmt_num(r.counter(k)) for k in counters])
        table(report.out, ["row", "time", "label"] + counters, body)
        if p.name == "vmm_bench_growth_ahead":
            growth_ahead_targets(rest, report.out)


def growth_ahead_targets(rows, out):
    """Issue 16's growth-ahead target, beside the raw driver growing the same loop in the same run."""
    by_name = {r.name: r for r in rows if r.ok}
    lines = []
    for name in ("append_loop/ahead", "append_loop/ahead_learn"):
        r = by_name.get(name)
        x = r.counter("vs_warm") if r else None
        if x is not None:
            lines.append(f"- {name.split('/')[-1]}: {x:.3f}× the warm pool (issue 16: ≤ {TARGET_AHEAD_TO_WARM}×: "
                         f"{verdict(x <= TARGET_AHEAD_TO_WARM)})")
    if not lines:
        return
    out.append("Target (issue 16: an append loop with growth ahead within 5 % of the warm pool):")
    out.append("")
    out.extend(lines)
    def vs_warm(name):
        r = by_name.get(f"append_loop/{name}")
        return r.counter("vs_warm") if r else None
    cold_x, fresh_x, geometric_x = vs_warm("raw_cold"), vs_warm("raw_fresh"), vs_warm("raw_cold_geometric")
    if cold_x is not None and fresh_x is not None:
        same = ""
        if geometric_x is not None:
            same = f" and {geometric_x:.3f}× in the handles vmm's geometric policy creates"
            ahead_x = vs_warm("ahead")
            if ahead_x is not None:
                same += f" (ahead: {ahead_x / geometric_x:.3f}× that)"
        out.append(f"- the raw driver, no vmm: creating, mapping and granting each append's memory inside the "
                   f"loop took {cold_x:.3f}× the warm pool in 64 MiB handles{same}; the same calls made before "
                   f"the loop {fresh_x:.3f}×. Creating memory costs the GPU while the kernels run, whichever "
                   "thread calls the driver, so "
                   + ("no loop that grows into fresh memory reaches the target here."
                      if cold_x > TARGET_AHEAD_TO_WARM else "the target is within the driver's reach."))
    out.append("")


KNOWN_PROGRAMS = ("vmm_bench_grow", "vmm_bench_driver", "vmm_bench_multi_gpu", "vmm_bench_replicated", "vmm_bench_ipc",
                  "vmm_bench_resource_ipc", "vmm_bench_relayout", "vmm_bench_resource", "vmm_bench_append")

SECTIONS = (section_context, section_status, section_growth, section_driver, section_striping, section_replicated,
            section_ipc,
            section_resource_ipc, section_relayout, section_resource, section_fragmentation, section_append,
            section_torch, section_other)


def render(documents, folder=None, plots=True):
    """The markdown for documents[0] (and the multi-GPU rows of the others); the plots go to
    <folder>/bench/ when folder is given and matplotlib is there."""
    report = Report(documents, Plots(folder, plots, documents[0].caption()))
    single = documents[0].context.get("single_program")
    for section in SECTIONS:
        if single and section not in (section_context, section_other) and not any(
                single == p for p in section_programs(section)):
            continue
        programs = [report.program(name) for name in section_programs(section)]
        report.pending = [p.filled for p in programs if p is not None and p.filled]
        section(report)
    return "\n".join(report.out).rstrip() + "\n", report.plots


def section_programs(section):
    return {section_growth: ["vmm_bench_grow"], section_driver: ["vmm_bench_driver"],
            section_striping: ["vmm_bench_multi_gpu"], section_replicated: ["vmm_bench_replicated"],
            section_ipc: ["vmm_bench_ipc"],
            section_resource_ipc: ["vmm_bench_resource_ipc"], section_relayout: ["vmm_bench_relayout"],
            section_resource: ["vmm_bench_resource"], section_append: ["vmm_bench_append"],
            section_fragmentation: ["vmm_replay"], section_torch: ["torch_allocators"]}.get(section, [])


# ---- merging bench.sh's outputs into one JSON -----------------------------------------------

def read_text(path, default=""):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return default


def read_status(base):
    """bench.sh's <base>.status: "exited\\tseconds\\trc", "timed_out\\tseconds\\twhy" or
    "skipped\\t0\\twhy"."""
    fields = read_text(base + ".status").rstrip("\n").split("\t", 2)
    if len(fields) < 3:
        return {"state": "not_run", "seconds": None, "detail": "no status recorded"}
    try:
        seconds = float(fields[1])
    except ValueError:
        seconds = None
    return {"state": fields[0], "seconds": seconds, "detail": fields[2]}


def log_tail(base, lines=25):
    return read_text(base + ".log").splitlines()[-lines:]


def load_benchmark_json(path):
    """Google Benchmark's JSON, repaired where the program was killed half-way (the entries
    written so far are kept)."""
    text = read_text(path)
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError:
        cut = text.rfind("\n    }")
        if cut < 0:
            return None
        try:
            data = json.loads(text[: cut + 6] + "\n  ]\n}\n")
            data.setdefault("context", {})["vmm_truncated"] = True
            return data
        except ValueError:
            return None


def status_of(st, have_output, tail):
    """(status, why) of one program from its status record."""
    if st["state"] == "skipped":
        return "skipped", st["detail"]
    if st["state"] == "timed_out":
        return "timed_out", st["detail"]
    if st["state"] != "exited":
        return st["state"], st["detail"]
    rc = st["detail"]
    if rc != "0":
        last = next((line for line in reversed(tail) if line.strip()), "")
        return "failed", f"exit status {rc}: {last[:300]}"
    if not have_output:
        first = next((line for line in tail if line.strip()), "")
        return "no_output", first[:300] or "no JSON written"
    return "ok", ""


def merge_google_benchmark(base):
    st = read_status(base)
    tail = log_tail(base)
    data = load_benchmark_json(base + ".json")
    status, why = status_of(st, data is not None, tail)
    command = read_text(base + ".command").strip()
    chosen = re.search(r"--benchmark_filter=(\S+)", command)
    if status == "ok" and chosen:  # a part of a program split over several runs (bench.sh --filter)
        status, why = "partial", f"only the rows matching --benchmark_filter={chosen.group(1)} ran"
    elif status == "no_output" and chosen and any(line.startswith("Failed to match any benchmarks") for line in tail):
        why = f"no row of this machine's set matches --benchmark_filter={chosen.group(1)}"
    if status == "timed_out" and data and data.get("benchmarks"):
        why += f" (the {len(data['benchmarks'])} rows finished before are kept)"
    return {"kind": "google_benchmark", "status": status, "why": why, "seconds": st["seconds"],
            "command": command, "log_tail": tail,
            "context": (data or {}).get("context", {}), "benchmarks": (data or {}).get("benchmarks", [])}


def trace_references(data_dir):
    """PyTorch's figures for each trace: bench/data/README.md's table (its last column), else
    what the trace's own comments say (max_memory_reserved over peak live)."""
    refs = {}
    readme = read_text(os.path.join(data_dir, "README.md"))
    for path in sorted(glob.glob(os.path.join(data_dir, "*.trace.gz"))):
        name = os.path.basename(path)[: -len(".trace.gz")]
        comments = []
        try:
            with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
                for line in f:
                    if not line.startswith("#"):
                        break
                    comments.append(line[1:].strip())
        except OSError:
            pass
        figures, source = {}, ""
        row = next((line for line in readme.splitlines() if f"`{name}.trace.gz`" in line), "")
        if row:
            last = row.strip().strip("|").split("|")[-1]
            for allocator, x in re.findall(r"(native|expandable|cudaMallocAsync) (\d+\.\d+)", last):
                figures[allocator] = float(x)
            source = "bench/data/README.md"
        if "native" not in figures:
            text = " ".join(comments)
            live = re.search(r"peak live (\d+) bytes", text)
            reserved = re.search(r"max_memory_reserved\(\) (\d+)", text)
            if live and reserved and "native" in text:
                figures["native"] = int(reserved.group(1)) / int(live.group(1))
                source = source or "the trace's comments"
        refs[name] = {"comments": comments, "pytorch": figures, "source": source}
    return refs


def merge(work, destination):
    """bench.sh's work folder -> one JSON: context, one section per program."""
    context = {}
    for line in read_text(os.path.join(work, "context.txt")).splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        lists = {"gpu_name": "gpu_names", "gpu_memory": "gpu_memories", "driver": "drivers"}
        if key in lists:  # one line a GPU
            context.setdefault(lists[key], []).append(value)
        else:
            context[key] = value
    for key in ("gpu", "quick", "git_dirty"):
        context[key] = context.get(key) == "1"
    for key in ("cpus", "build_seconds", "total_seconds", "memory_bytes"):
        if str(context.get(key, "")).isdigit():
            context[key] = int(context[key])
    if context.get("drivers"):
        context["driver"] = context.pop("drivers")[0]
    context["vmm_info"] = read_text(os.path.join(work, "vmm-info.txt")).splitlines()
    programs = {}
    for status in sorted(glob.glob(os.path.join(work, "programs", "*.status"))):
        base = status[: -len(".status")]
        programs[os.path.basename(base)] = merge_google_benchmark(base)
    traces = {}
    for status in sorted(glob.glob(os.path.join(work, "replay", "*.status"))):
        base = status[: -len(".status")]
        st = read_status(base)
        tail = log_tail(base)
        result = None
        try:
            result = json.loads(read_text(base + ".json") or "null")
        except ValueError:
            pass
        state, why = status_of(st, result is not None, tail)
        traces[os.path.basename(base)] = {"status": state, "why": why, "seconds": st["seconds"],
                                          "result": result, "log_tail": tail}
    if traces:
        measured = [t for t in traces.values() if t["status"] == "ok"]
        programs["vmm_replay"] = {"kind": "replay", "status": "ok" if measured else "skipped",
                                  "why": "" if measured else "; ".join(t["why"] for t in traces.values()),
                                  "seconds": sum(t["seconds"] or 0 for t in traces.values()), "traces": traces}
    base = os.path.join(work, "torch", "torch_allocators")
    if os.path.exists(base + ".status"):
        st = read_status(base)
        tail = log_tail(base)
        data = None
        try:
            data = json.loads(read_text(base + ".json") or "null")
        except ValueError:
            pass
        state, why = status_of(st, data is not None, tail)
        programs["torch_allocators"] = {"kind": "torch_allocators", "status": state, "why": why,
                                        "seconds": st["seconds"], "data": data, "log_tail": tail}
    document = {"format": FORMAT, "context": context, "programs": programs,
                "trace_references": trace_references(os.path.join(REPOSITORY, "bench", "data"))}
    with open(destination, "w", encoding="utf-8") as f:
        json.dump(document, f, indent=1)
    return document


# ---- self-test ------------------------------------------------------------------------------

def gb_entry(name, real_time, unit="us", label="", **counters):
    entry = {"name": name, "run_name": name, "run_type": "iteration", "iterations": 10,
             "real_time": real_time, "cpu_time": real_time, "time_unit": unit}
    if label:
        entry["label"] = label
    entry.update(counters)
    return entry


def gb_skipped(name, message):
    return {"name": name, "run_name": name, "run_type": "iteration", "error_occurred": True,
            "error_message": message, "real_time": 0, "time_unit": "ns", "iterations": 0}


def synthetic_document(gpus=1):
    """A bench.json with every section, as bench.sh would write it on a GPU machine."""
    gib = 1 << 30
    grow = []
    for case, size in (("16GiB_by_256MiB", 16 * gib), ("4GiB_by_16MiB", 4 * gib)):
        scale = size / (16 * gib)
        for contender, role, ms, peak in (("floor", "floor", 4.4, 1.0), ("vmm_geometric_cold", "vmm", 39.8, 1.11),
                                          ("vmm_geometric_warm", "vmm", 4.2, 1.11), ("vmm_fixed64MiB_warm", "vmm", 8.6, 1.0),
                                          ("realloc_copy_2x", "baseline", 65.4, 1.5), ("thrust_resize", "baseline", 72.8, 1.5),
                                          ("raw_vmm_64MiB_cold", "baseline", 43.2, 1.0),
                                          ("raw_vmm_256MiB_cold", "baseline", 51.8, 1.0),
                                          ("raw_vmm_geometric_cold", "baseline", 41.0, 1.0)):
            grow.append(gb_entry(f"grow/{case}/{contender}/manual_time", ms * scale, "ms", role,
                                 bytes_per_second=size / (ms * scale * 1e-3), peak_extra_bytes=peak * size,
                                 peak_extra_x=peak, chunks=8))
    for chunk in ("2MiB", "64MiB"):
        for contender, role, us in (("raw_driver", "floor", 22.6), ("vmm_provider", "vmm", 23.0),
                                    ("vmm_growable_warm", "vmm", 35.4), ("vmm_growable_warm_1GiB", "vmm", 36.9),
                                    ("raw_driver_1GiB", "baseline", 36.6)):
            grow.append(gb_entry(f"grow_once/{chunk}/{contender}/manual_time", us, "us", role,
                                 undo_us=14.0, chunk_bytes=parse_size(chunk), chunks_created=0))
    grow.append(gb_entry("reach/256MiB_appends/vmm/iterations:1/manual_time", 85, "ms", "vmm",
                         reached_bytes=139.25 * gib, free_at_start_bytes=139.28 * gib, reached_share=0.9998))
    driver = []
    for chunk, reservation in ((2, 2), (2, 1024), (2, 81920), (64, 64), (64, 81920)):
        grow_us = 22.6 if reservation == chunk else 36.6
        driver.append(gb_entry(f"raw_grow_in_reservation/chunk_mib:{chunk}/reservation_mib:{reservation}/"
                               f"alignment_mib:2/middle:0/iterations:200", grow_us + 20, map_us=0.9,
                               access_us=grow_us - 0.9, grow_us=grow_us, unmap_us=17.0))
    for chunk, reservation, actual, us in ((2, 2, 2, 23.0), (2, 1024, 1024, 37.0), (2, 0, 81920, 37.5), (64, 0, 81920, 37.0)):
        driver.append(gb_entry(f"vmm_grow_one_chunk/chunk_mib:{chunk}/reservation_mib:{reservation}/iterations:200",
                               us + 2, grow_us=us, reservation_mib=actual))
    for chunk in (64, 256, 1024):
        driver.append(gb_entry(f"raw_cold_growth/chunk_mib:{chunk}/iterations:3", 13.9, "ms", create_ms=4.9,
                               map_ms=0.4, access_ms=8.5))
    driver.append(gb_entry("raw_import/chunk_mib:64/iterations:100", 76, import_us=75.1))
    driver.append(gb_entry("vmm_import/chunk_mib:64/iterations:100", 78, import_us=77.0))
    multi = [gb_entry("one_gpu_local/manual_time", 10, "ms", GB_per_s=4300.0)]
    for stripe in (2, 64):
        multi.append(gb_entry(f"own_stripes/stripe_MiB:{stripe}/contiguous:0/manual_time", 5, "ms", GB_per_s=4300.0 * gpus * 0.98,
                              gpus=gpus, ratio_to_one_gpu=gpus * 0.98, target_ratio=TARGET_STRIPES.get(gpus, 1.9)))
        multi.append(gb_entry(f"one_gpu_reads_all/vmm/stripe_MiB:{stripe}/manual_time", 20, "ms", GB_per_s=750.0,
                              raw_GB_per_s=751.0, ratio_to_raw=0.998))
    multi.append(gb_entry("spill_reach/iterations:1/manual_time", 900, "ms", reach_GiB=278.56, free_GiB=278.57,
                          percent_of_free=99.997, chunks=300, gpus=gpus))
    replicated = [gb_entry("one_gpu_local/manual_time", 2, "ms", GB_per_s=4300.0)]
    for how, x in (("replicated", 1.98), ("one_copy", 0.6), ("striped", 0.9), ("managed_read_mostly", 1.9)):
        replicated.append(gb_entry(f"reads/{how}/manual_time", 4, "ms", GB_per_s=4300.0 * x, gpus=2,
                                   ratio_to_one_gpu=x, **({"target_ratio": 1.95} if how == "replicated" else {})))
    for from_host, x in ((0, 1.04), (1, 2.1)):
        replicated.append(gb_entry(f"broadcast/from_host:{from_host}/manual_time", 7.0 * x, "ms", gpus=2, rounds=1,
                                   peer_GB_per_s=150.0, peer_limit_ms=7.0, ratio_to_limit=x,
                                   **({} if from_host else {"target_ratio": 1.1})))
    ipc = [gb_entry("hand_off/round_trip/64MiB/iterations:500/manual_time", 387)]
    for size in ("64MiB", "4GiB"):
        for method, us in (("legacy", 1026), ("vmm_warm", 1032), ("vmm_handoff", 978), ("mempool_warm", 1027),
                           ("vmm_cold", 7954)):
            ipc.append(gb_entry(f"hand_off/{method}/{size}/iterations:200/manual_time", us, importer_us=us / 10,
                                first_us=us * 2))
    resource_ipc = [gb_entry("pointer/round_trip/iterations:500/manual_time", 380)]
    for size in ("64MiB", "4GiB"):
        for method, us, x in (("mempool_first", 900, None), ("mempool_repeated", 500, None),
                              ("vmm_first", 1200, 1.33), ("vmm_repeated", 600, 1.2), ("vmm_cached", 450, 0.9),
                              ("vmm_still_mapped", 400, 0.8)):
            extra = {"x_mempool": x} if x else {}
            resource_ipc.append(gb_entry(f"pointer/{method}/{size}/iterations:30/manual_time", us,
                                         importer_us=us / 3, **extra))
    relayout = []
    for k in (2, 16, 128):
        relayout.append(gb_entry(f"concat_memcpy/k:{k}/iterations:5/manual_time", 5.7, "ms",
                                 peak_extra_MiB=8192, teardown_ms=1.0, handles=0))
        for chunk in (2, 64, 0):
            relayout.append(gb_entry(f"concat_relayout/k:{k}/chunk_MiB:{chunk}/iterations:5/manual_time",
                                     120 if chunk == 2 else 3.5, "ms", peak_extra_MiB=0, teardown_ms=2.0, handles=128))
    for indexing in ("wrap", "modulo"):
        for cap in (24, 1024):
            relayout.append(gb_entry(f"ring_windows/{indexing}/capacity_MiB:{cap}/manual_time", 300,
                                     bytes_per_second=4.2e12))
    resource = []
    for size in ("1KiB", "1MiB", "64MiB"):
        for who, ns, label in (("cudaMallocAsync", 1840, ""), ("cudaMalloc", 90000, "vs cudaMallocAsync"),
                               ("vmm", 280, "vs cudaMallocAsync")):
            resource.append(gb_entry(f"pair/{size}/{who}/manual_time", ns / 1000, "us", label, median_ns=ns,
                                     p99_ns=ns * 3, clock_ns=40, vs_baseline=ns / 1840))
        for who, ns, label in (("malloc", 60, ""), ("vmm_os_host", 250, "vs malloc")):
            resource.append(gb_entry(f"pair_os/{size}/{who}/manual_time", ns / 1000, "us", label, median_ns=ns,
                                     p99_ns=ns * 2, vs_baseline=ns / 60))
    resource.append(gb_entry("fragmented/512B-128MiB/vmm/iterations:1/manual_time", 900, "ms", "vs cudaMallocAsync",
                             largest_bytes=40 * gib, available_bytes=60 * gib, share=0.66, vs_baseline=1.2))
    append = [gb_entry(f"{who}/{alloc}/per_mille:{pm}/manual_time", 1.5, "ms", bytes_per_second=2.8e12,
                       vs_best=1.01, vs_worst_case_best=1.02, peak_MiB=45.0, peak_over_output=1.07, keys=2**30)
              for who in ("cub_select_if", "append/batched") for alloc in ("worst_case", "grow") for pm in (10, 500)]
    store = [gb_entry("store/put/1MiB/manual_time", 12.0, frobs=3.0), gb_skipped("store/put/1GiB", "no GPU: test")]
    ahead = [gb_entry(f"append_loop/{row}", ms, "ms", vs_warm=x)
             for row, ms, x in (("warm", 11.4, 1.0), ("fresh_floor", 12.7, 1.121), ("ahead", 12.7, 1.116),
                                ("ahead_learn", 12.6, 1.107), ("raw_fresh", 11.3, 0.994), ("raw_cold", 12.2, 1.077),
                                ("raw_cold_geometric", 12.6, 1.11))]
    torch_results = {}
    for allocator, step, x in (("native", 200.9, 2.64), ("expandable", 174.1, 1.12),
                               ("cudaMallocAsync", 174.6, 1.09), ("vmm", 204.6, 1.10)):
        torch_results[allocator] = {
            "allocator": allocator, "workloads": {
                "gpt2": {"step_ms_median": step, "peak_reserved": x * 20e9, "peak_allocated": 20e9,
                         "reserved_over_allocated": x},
                "grow": {"step_ms_median": 2.0, "peak_reserved": 9e9, "peak_allocated": 8.6e9,
                         "reserved_over_allocated": 1.04}},
            "empty_del_us": {"4096": 4.1, "1048576": 3.9}}
    torch_results["vmm"]["sleep_wake"] = {"offloaded_bytes": 2 * gib, "sleep_ms": 120.0, "wake_ms": 80.0,
                                          "sleep_over_d2h": 1.4, "wake_over_h2d": 1.1}

    def program(benchmarks, **context):
        return {"kind": "google_benchmark", "status": "ok", "why": "", "seconds": 12.0, "command": "",
                "log_tail": [], "context": dict(date="2026-11-23T08:41:12+00:00", **context), "benchmarks": benchmarks}

    replay_result = {"trace": "bench/data/gpt2.trace.gz", "location": "gpu 0", "events": 129539, "passes": 1,
                     "peak_live_bytes": 17538178248, "peak_reserved_bytes": 17609785344,
                     "reserved_over_live": 1.004083, "largest_possible_bytes": 83684753408,
                     "allocate_ns": {"median": 299.0, "p99": 40549.0}, "deallocate_ns": {"median": 210.0, "p99": 3012.0},
                     "pair_ns": {"median": 538.0, "p99": 20199.0}, "pages_created": 8397, "pages_stitched": 79475,
                     "segments": 2}
    return {
        "format": FORMAT,
        "context": {"date": "2026-11-23T09:00:00Z", "host": "vm", "git_commit": "0123456789abcdef", "git_branch": "main",
                    "git_dirty": False, "cpu": "Test CPU", "cpus": 16, "memory_bytes": 128 * gib, "gpu": True,
                    "gpu_names": ["NVIDIA H100 80GB HBM3"] * gpus, "gpu_memories": ["81559 MiB"] * gpus,
                    "driver": "580.159.04", "cuda_driver_api": "13.0", "nvcc": "13.0.88", "quick": True,
                    "build_seconds": 95, "total_seconds": 460},
        "programs": {
            "vmm_bench_grow": program(grow, vmm_bench_set="gpu", vmm_memory="gpu 0: NVIDIA H100 80GB HBM3, 79.2 GiB",
                                      vmm_grow_once_floor="raw_driver: cuMemMap + cuMemSetAccess"),
            "vmm_bench_driver": program(driver),
            "vmm_bench_multi_gpu": program(multi),
            "vmm_bench_replicated": program(replicated),
            "vmm_bench_ipc": program(ipc),
            "vmm_bench_resource_ipc": program(resource_ipc),
            "vmm_bench_relayout": program(relayout),
            "vmm_bench_resource": program(resource),
            "vmm_bench_append": program(append),
            "vmm_bench_store": program(store),
            "vmm_bench_growth_ahead": program(ahead),
            "vmm_replay": {"kind": "replay", "status": "ok", "why": "", "seconds": 7.0, "traces": {
                "gpt2": {"status": "ok", "why": "", "seconds": 6.0, "result": replay_result, "log_tail": []},
                "gpt2_dynamic": {"status": "skipped", "why": "no room", "seconds": 0, "result": None, "log_tail": []}}},
            "torch_allocators": {"kind": "torch_allocators", "status": "ok", "why": "", "seconds": 150.0,
                                 "data": {"quick": True, "results": torch_results,
                                          "targets": ["PASS vit: vmm reserved/allocated 1.011 (target <= 1.02)"]}},
        },
        "trace_references": {"gpt2": {"comments": [], "pytorch": {"native": 1.219, "expandable": 1.040,
                                                                  "cudaMallocAsync": 1.130},
                                      "source": "bench/data/README.md"}},
    }


def self_test():
    """Renders synthetic data with and without plots, and an OS-only run; checks the markdown,
    the PNGs (where matplotlib is there) and the merge step. Returns 0 when every check holds."""
    failures = []

    def expect(condition, what):
        if not condition:
            failures.append(what)

    folder = tempfile.mkdtemp(prefix="bench_report_self_test_")
    try:
        first = os.path.join(folder, "bench.json")
        with open(first, "w", encoding="utf-8") as f:
            json.dump(synthetic_document(1), f)
        second = os.path.join(folder, "bench-x2.json")
        with open(second, "w", encoding="utf-8") as f:
            json.dump(synthetic_document(2), f)
        docs = [load_document(first), load_document(second)]
        out = os.path.join(folder, "docs")
        markdown, plots = render(docs, out)
        for text in ("# vmm benchmarks", "NVIDIA H100 80GB HBM3", "driver 580.159.04", "Growing a buffer",
                     "× faster than realloc_copy_2x", "issue 16: ≤ 1.1×", "One grow of one chunk",
                     "0.97× raw_vmm_geometric_cold, the same handles (issue 16: ≤ 1.1×: met); 0.92× raw_vmm_64MiB_cold",
                     "Largest vector reachable", "Per-grow" if plots.on else "reservation MiB",
                     "Fresh memory", "Import on the importer's side", "One pointer over several GPUs",
                     "own_stripes, 2 MiB", "Read-mostly data on every GPU", "≥ 1.95: met", "publish from the owner",
                     "≤ 1.1: met", "Handing memory to another process", "× legacy",
                     "Sharing a pool's pointer", "× mempool", "Re-layout against copying", "Reading windows",
                     "Stream-ordered allocation", "target ≤ 0.3 µs: met", "Fragmentation", "1.0041",
                     "PyTorch native (bench/data/README.md)", "gpt2 (torch_allocators.py)",
                     "not measured: no room", "Kernels that append",
                     "Targets (issue 15, 1 Gi keys)", "1.020× (≤ 1.05: met), peak 1.070×",
                     "256 MiB handles took 1.20× the time of 64 MiB handles",
                     "ahead: 1.116× the warm pool (issue 16: ≤ 1.05×: NOT met)", "1.110× in the handles vmm's geometric policy creates (ahead: 1.005× that)", "PyTorch's allocators against vmm",
                     "sleep/wake", "PASS vit", "Other rows", "`vmm_bench_store`", "frobs", "What ran"):
            expect(text in markdown, f"markdown lacks {text!r}")
        names = ("growth", "grow_once", "driver_grow", "striping", "replicated", "ipc_handoff", "resource_ipc", "relayout",
                 "resource_pair", "fragmentation")
        if plots.on:
            for name in names:
                path = os.path.join(out, "bench", f"{name}.png")
                expect(os.path.isfile(path) and os.path.getsize(path) > 1000, f"no plot {path}")
                expect(f"](bench/{name}.png)" in markdown, f"markdown does not show {name}.png")
        else:
            expect("Plots skipped: matplotlib" in markdown, "the report does not say that plots were skipped")
        # Without plots: tables alone, and it says so.
        markdown, plots = render(docs[:1], os.path.join(folder, "tables"), plots=False)
        expect("Plots skipped: --no-plots" in markdown and "](bench/" not in markdown, "--no-plots still plots")
        expect("Growing a buffer" in markdown, "--no-plots lost the tables")
        # An OS-only run: every GPU section says what is missing.
        os_doc = synthetic_document(1)
        os_doc["context"].update(gpu=False, no_gpu_reason="nvidia-smi not found", gpu_names=[], driver="")
        for name in ("vmm_bench_driver", "vmm_bench_ipc", "vmm_bench_relayout", "vmm_bench_append"):
            os_doc["programs"][name]["benchmarks"] = [gb_skipped(f"{name}/x", "no GPU: no driver")]
        del os_doc["programs"]["vmm_bench_multi_gpu"]
        os_doc["programs"]["torch_allocators"] = {"kind": "torch_allocators", "status": "skipped",
                                                  "why": "no GPU (nvidia-smi not found)", "seconds": 0, "data": None}
        path = os.path.join(folder, "os.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(os_doc, f)
        markdown, _ = render([load_document(path)], None)
        for text in ("no GPU, OS provider on Test CPU", "only the OS-provider rows ran",
                     "Driver costs: every row skipped: no GPU: no driver", "vmm_bench_multi_gpu is not in this run",
                     "Not measured: skipped: no GPU"):
            expect(text in markdown, f"OS-only markdown lacks {text!r}")
        # One program's raw JSON (scripts/run.sh's use): the growth tables alone.
        raw = os.path.join(folder, "grow.json")
        with open(raw, "w", encoding="utf-8") as f:
            json.dump({"context": {"executable": "build/bench/vmm_bench_grow", "vmm_bench_set": "os",
                                   "vmm_no_gpu_reason": "no driver", "date": "today"},
                       "benchmarks": synthetic_document()["programs"]["vmm_bench_grow"]["benchmarks"]}, f)
        markdown, _ = render([load_document(raw)], None)
        expect("Grow 0 → 16.00 GiB in 256 MiB appends" in markdown and "Handing memory" not in markdown,
               "a single program's JSON renders more or less than its section")
        # The merge step, on a work folder as bench.sh leaves it.
        work = os.path.join(folder, "work")
        for sub in ("programs", "replay", "torch"):
            os.makedirs(os.path.join(work, sub))
        with open(os.path.join(work, "context.txt"), "w") as f:
            f.write("date=2026-11-23T09:00:00Z\ngpu=0\nno_gpu_reason=nvidia-smi not found\nquick=1\ncpus=2\n")
        with open(os.path.join(work, "programs", "vmm_bench_grow.status"), "w") as f:
            f.write("exited\t3.5\t0\n")
        with open(os.path.join(work, "programs", "vmm_bench_grow.json"), "w") as f:
            text = json.dumps({"context": {"vmm_bench_set": "os"},
                               "benchmarks": synthetic_document()["programs"]["vmm_bench_grow"]["benchmarks"]}, indent=2)
            f.write(text[: text.rfind("\n    }") + 6] + "\n    {\n")  # cut off as a killed program leaves it
        with open(os.path.join(work, "programs", "vmm_bench_multi_gpu.status"), "w") as f:
            f.write("exited\t0.1\t0\n")
        with open(os.path.join(work, "programs", "vmm_bench_multi_gpu.log"), "w") as f:
            f.write("vmm_bench_multi_gpu: needs 2 GPUs with peer access\n")
        with open(os.path.join(work, "replay", "gpt2.status"), "w") as f:
            f.write("skipped\t0\tno GPU, and the budget is too small\n")
        with open(os.path.join(work, "torch", "torch_allocators.status"), "w") as f:
            f.write("skipped\t0\tno GPU\n")
        # A part of a program split over runs (bench.sh --filter): its command names the filter.
        grow_16 = [b for b in synthetic_document()["programs"]["vmm_bench_grow"]["benchmarks"]
                   if b["name"].startswith("grow/16GiB")]
        for suffix, text in ((".status", "exited\t2.0\t0\n"),
                             (".command", "build/bench/vmm_bench_driver --benchmark_filter=^grow/16GiB\n"),
                             (".json", json.dumps({"context": {"vmm_bench_set": "os"}, "benchmarks": grow_16}))):
            with open(os.path.join(work, "programs", "vmm_bench_driver" + suffix), "w") as f:
                f.write(text)
        # A filter that matches no row of the set: said so, not the program's first line.
        for suffix, text in ((".status", "exited\t0.0\t0\n"),
                             (".command", "build/bench/vmm_bench_append --benchmark_filter=^none\n"),
                             (".log", "vmm_bench_append: no GPU set; running the OS-provider set\n"
                                      "Failed to match any benchmarks against regex: ^none\n")):
            with open(os.path.join(work, "programs", "vmm_bench_append" + suffix), "w") as f:
                f.write(text)
        merged = merge(work, os.path.join(folder, "merged.json"))
        expect(merged["programs"]["vmm_bench_append"]["status"] == "no_output" and
               merged["programs"]["vmm_bench_append"]["why"] ==
               "no row of this machine's set matches --benchmark_filter=^none",
               f"merge does not say that the filter matched nothing: {merged['programs']['vmm_bench_append']['why']}")
        expect(merged["programs"]["vmm_bench_driver"]["status"] == "partial" and
               "--benchmark_filter=^grow/16GiB" in merged["programs"]["vmm_bench_driver"]["why"],
               "merge took a filtered part for a whole program")
        expect(merged["programs"]["vmm_bench_grow"]["status"] == "ok" and
               len(merged["programs"]["vmm_bench_grow"]["benchmarks"]) > 10, "merge lost a cut-off JSON's rows")
        expect(merged["programs"]["vmm_bench_multi_gpu"]["status"] == "no_output" and
               "needs 2 GPUs" in merged["programs"]["vmm_bench_multi_gpu"]["why"], "merge lost why nothing ran")
        expect(merged["programs"]["vmm_replay"]["status"] == "skipped", "merge lost the skipped replay")
        expect(merged["context"]["gpu"] is False and merged["context"]["cpus"] == 2, "merge misread the context")
        markdown, _ = render([load_document(os.path.join(folder, "merged.json"))], None)
        expect("needs 2 GPUs" in markdown and "no GPU, and the budget is too small" in markdown,
               "the merged report does not say why rows are missing")
        # A run cut short (the growth rows timed out after three; no replay, no
        # torch_allocators), filled from two others in turn: a run without torch_allocators,
        # then the whole synthetic run; each section says which rows came from where, and a run
        # on another kind of machine is refused.
        def written(name, document):
            path = os.path.join(folder, name)
            with open(path, "w", encoding="utf-8") as f:
                json.dump(document, f)
            return path
        short = synthetic_document(1)
        grow = short["programs"]["vmm_bench_grow"]
        grow["benchmarks"] = grow["benchmarks"][:3]
        grow.update(status="timed_out", why="killed after 9 s")
        del short["programs"]["torch_allocators"], short["programs"]["vmm_replay"]
        doc = load_document(written("short.json", short))
        reached = len(doc.program("vmm_bench_grow").runs)
        no_torch = synthetic_document(1)
        del no_torch["programs"]["torch_allocators"]
        no_torch["context"]["date"] = "2026-11-24T09:00:00Z"  # another run than short's: its own caption
        filler = load_document(written("no_torch.json", no_torch))
        doc.fill_from(filler)
        expect(doc.program("torch_allocators") is None, "fill_from invented torch_allocators' rows")
        doc.fill_from(load_document(first))
        markdown, _ = render([doc], None)
        expect(len(doc.program("vmm_bench_grow").runs) == len(load_document(first).program("vmm_bench_grow").runs),
               "fill_from did not complete the rows cut short")
        for text in ("`vmm_bench_grow` timed out in this run (killed after 9 s); the rows of grow/16GiB_by_256MiB"
                     f" (this run finished {reached} of its rows)",
                     "are all from `no_torch.json`", "every row of `torch_allocators` is from `bench.json`",
                     "every row of `vmm_replay` is from `no_torch.json`", "Largest vector reachable",
                     "rows from another run", "PyTorch's allocators against vmm",
                     "native (live, another run, see the PyTorch section)",
                     "vmm (vmm-replay on gpu 0, another run, see the note under this heading)"):
            expect(text in markdown, f"the filled report lacks {text!r}")
        expect("`bench.json` (NVIDIA H100 80GB HBM3, driver 560.35.03 (CUDA 12.6), 2026-11-23); " not in markdown
               and markdown.count("are all from") == 1, "the second fill replaced rows the first had filled")
        expect("every row of `vmm_bench_driver`" not in markdown, "fill_from replaced a program that ran")
        if plots_available():
            plotted, _ = render([doc], os.path.join(folder, "filled"))
            caption = [line for line in plotted.splitlines() if line.startswith("*Time to grow from 0")]
            expect(caption and caption[0].endswith(f" {filler.caption()}.*") and doc.caption() not in caption[0],
                   f"the growth plot, every row of it filled from no_torch.json, does not name that run: {caption}")
        # A run of only the 16 GiB rows (a part, bench.sh --filter), completed from a whole run:
        # its own rows stay, the other tables come whole from the other run.
        part = synthetic_document(1)
        part_grow = part["programs"]["vmm_bench_grow"]
        part_grow["benchmarks"] = [b for b in part_grow["benchmarks"] if b["name"].startswith("grow/16GiB")]
        part_grow.update(status="partial", why="only the rows matching --benchmark_filter=^grow/16GiB ran")
        doc = load_document(written("part.json", part))
        own = {r.name for r in doc.program("vmm_bench_grow").runs}
        doc.fill_from(load_document(first))
        grown = doc.program("vmm_bench_grow")
        expect(len(grown.runs) == len(load_document(first).program("vmm_bench_grow").runs) and
               all(r.source is None for r in grown.runs if r.name in own) and
               all(r.source for r in grown.runs if r.name not in own),
               "fill_from did not complete a filtered part with the other run's tables, keeping its own")
        expect("`vmm_bench_grow` ran a part of its rows in this run (only the rows matching "
               "--benchmark_filter=^grow/16GiB ran); the rows of grow/4GiB_by_16MiB, grow_once/2MiB" in grown.filled
               and "grow/16GiB" not in grown.filled.split("; ", 1)[1],
               f"the filled part does not say what came from where: {grown.filled}")
        other_gpu = synthetic_document(1)
        other_gpu["context"]["gpu_names"] = ["NVIDIA H200"]
        try:
            load_document(written("short.json", short)).fill_from(load_document(written("h200.json", other_gpu)))
            expect(False, "fill_from took rows of another kind of machine")
        except ValueError as e:
            expect("on NVIDIA H200, this one on NVIDIA H100 80GB HBM3" in str(e), f"the refusal does not say why: {e}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    for failure in failures:
        print(f"bench_report self-test: FAILED: {failure}", file=sys.stderr)
    if not failures:
        print("bench_report self-test: passed (plots " + ("checked" if plots_available() else
                                                           "skipped: no matplotlib") + ")")
    return 1 if failures else 0


def plots_available():
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        return False


# ---- main -----------------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("files", nargs="*", help="bench.json (scripts/bench.sh), or one program's "
                        "--benchmark_out JSON; more bench.json files add their multi-GPU rows")
    parser.add_argument("--out", help="folder for benchmarks.md and bench/*.png (default: the markdown on stdout, no plots)")
    parser.add_argument("--no-plots", action="store_true", help="tables only")
    parser.add_argument("--self-test", action="store_true", help="render synthetic data and check the result")
    parser.add_argument("--merge", metavar="WORK", help="merge bench.sh's work folder WORK into the one file given")
    parser.add_argument("--fill-from", metavar="OTHER", action="append", default=[],
                        help="another bench.json of the same kind of machine: the programs the first file lacks "
                        "or ran no row of, and the rows of those that timed out there, are taken from it, each "
                        "section saying so; given again, the next fills what is still missing")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    if args.merge:
        if len(args.files) != 1:
            parser.error("--merge WORK needs one output file")
        merge(args.merge, args.files[0])
        return 0
    if not args.files:
        parser.error("no JSON file given")
    if args.out and not args.no_plots and not plots_available() and sys.executable != "/usr/bin/python3" \
            and os.path.exists("/usr/bin/python3") and not os.environ.get("VMM_BENCH_REPORT_REEXEC"):
        # Debian's python3-matplotlib serves /usr/bin/python3; another python3 first on PATH
        # (pyenv, a venv) does not see it.
        os.environ["VMM_BENCH_REPORT_REEXEC"] = "1"
        try:
            os.execv("/usr/bin/python3", ["/usr/bin/python3", os.path.abspath(__file__)] + sys.argv[1:])
        except OSError:
            pass
    try:
        documents = [load_document(path) for path in args.files]
        for other in args.fill_from:
            documents[0].fill_from(load_document(other))
    except (OSError, ValueError, KeyError) as e:
        print(f"bench_report: {e}", file=sys.stderr)
        return 1
    markdown, plots = render(documents, args.out, plots=not args.no_plots)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, "benchmarks.md")
        with open(path, "w", encoding="utf-8") as f:
            f.write(markdown)
        print(f"bench_report: {path}" + (f" and {len(plots.files)} plots under {os.path.join(args.out, 'bench')}"
                                          if plots.files else f" (plots skipped: {plots.why_not})"))
    else:
        sys.stdout.write(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
