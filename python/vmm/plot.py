"""Draws reserved and live bytes over an allocation trace, reserved split by page size.

    python -m vmm.plot SERIES.csv out.png [--title T]
    python -m vmm.plot TRACE.trace.gz out.png --replay PATH/TO/vmm-replay [-- REPLAY_OPTIONS...]

The live line is the most live bytes between a row of the series and the one before, so
that peaks between rows show; reserved is what the resource held at each row, in small and
large pages stacked. SERIES.csv is what `vmm-replay TRACE --series SERIES.csv` writes (docs/tools.md). Given a
trace instead (any input not ending in .csv), vmm-replay (--replay) replays it with --series
into a temporary file first; the options after `--` go to vmm-replay, e.g.
`-- --location os_host --simulate 24GiB`. A trace comes from vmm.torch.dump_trace() or
bench/record_trace.py.

Exit status: 0 done; 1 vmm-replay failed (its message is passed on) or the picture could not
be written; 2 a bad argument or a missing or malformed series, named with its line.
"""

import argparse
import csv
import os
import subprocess
import sys
import tempfile

COLUMNS = (
    "event",
    "live_bytes",
    "live_high_bytes",
    "reserved_bytes",
    "reserved_small_page_bytes",
    "reserved_large_page_bytes",
)
GIB = float(1 << 30)


class SeriesError(Exception):
    """A series that cannot be read: the message names the file and, where there is one, the line."""


def read_series(path):
    """The columns of a series as a dict of lists of ints, by COLUMNS' names.

    Raises SeriesError naming the file and line: a missing file, another header, a row
    without six non-negative integers, events not increasing, no rows."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise SeriesError(f"{path}: cannot read: {error}") from None
    if not rows or tuple(rows[0]) != COLUMNS:
        found = ",".join(rows[0]) if rows else "an empty file"
        raise SeriesError(f"{path}:1: expected the header {','.join(COLUMNS)} (vmm-replay --series), found {found!r}")
    series = {name: [] for name in COLUMNS}
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != len(COLUMNS) or not all(field.isdigit() for field in row):
            raise SeriesError(f"{path}:{line}: expected {len(COLUMNS)} non-negative integers, found {','.join(row)!r}")
        values = [int(field) for field in row]
        if series["event"] and values[0] <= series["event"][-1]:
            raise SeriesError(f"{path}:{line}: event {values[0]} does not follow event {series['event'][-1]}")
        for name, value in zip(COLUMNS, values):
            series[name].append(value)
    if not series["event"]:
        raise SeriesError(f"{path}:2: no rows after the header")
    return series


def draw(series, out, title):
    """Writes the picture of `series` (read_series) to the PNG file `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gib = {name: [value / GIB for value in series[name]] for name in COLUMNS[1:]}
    figure, axes = plt.subplots(figsize=(10, 5), dpi=100)
    try:
        layers = [("reserved_small_page_bytes", "reserved: small pages", "#9ecae1")]
        if any(series["reserved_large_page_bytes"]):
            layers.append(("reserved_large_page_bytes", "reserved: large pages", "#3182bd"))
        axes.stackplot(
            series["event"],
            *[gib[name] for name, _, _ in layers],
            labels=[label for _, label, _ in layers],
            colors=[colour for _, _, colour in layers],
            step="pre",
        )
        peak_reserved = max(series["reserved_bytes"]) / GIB
        peak_live = max(series["live_high_bytes"]) / GIB
        axes.step(series["event"], gib["reserved_bytes"], where="pre", color="#08306b", linewidth=0.8,
                  label=f"reserved (peak {peak_reserved:.3f} GiB)")
        # Each row's figures span the events since the row before (where="pre"): the most live
        # bytes over them, so that peaks between rows show, and reserved after the last of them.
        axes.step(series["event"], gib["live_high_bytes"], where="pre", color="#e6550d", linewidth=1.2,
                  label=f"live (peak {peak_live:.3f} GiB)")
        axes.set_xlabel("trace event")
        axes.set_ylabel("GiB")
        axes.set_xlim(0, series["event"][-1])
        axes.set_ylim(0, max(peak_reserved, peak_live) * 1.08 or 1)
        axes.grid(True, alpha=0.3)
        axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=len(layers) + 2, frameon=False)
        axes.set_title(title)
        figure.tight_layout()
        figure.savefig(out, format="png")
    finally:
        plt.close(figure)


def replay_series(replay, trace, options, series):
    """Runs `replay TRACE --series SERIES OPTIONS`; returns its exit status, its output passed on."""
    done = subprocess.run([replay, trace, "--series", series, *options], capture_output=True, text=True)
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    return done.returncode


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    replay_options = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(
        prog="python -m vmm.plot",
        description="Draws reserved and live bytes over a trace, reserved by page size (GiB over events).",
        epilog="Options after -- go to vmm-replay, for a trace.",
    )
    parser.add_argument("input", metavar="SERIES_OR_TRACE", help="vmm-replay --series's CSV, or a trace")
    parser.add_argument("out", metavar="OUT.png", help="the picture to write (PNG)")
    parser.add_argument("--title", help="the picture's title (default: the input's file name)")
    parser.add_argument("--replay", metavar="VMM_REPLAY", help="vmm-replay, to replay a trace given as input")
    args = parser.parse_args(argv)
    is_series = args.input.endswith(".csv")
    if is_series and (args.replay or replay_options):
        parser.error("--replay and vmm-replay's options are for a trace, not a series (.csv)")
    if not is_series and not args.replay:
        parser.error(f"{args.input} is a trace (not .csv): give --replay PATH/TO/vmm-replay, or a series")
    title = args.title if args.title is not None else os.path.basename(args.input)
    try:
        if is_series:
            series = read_series(args.input)
        else:
            with tempfile.TemporaryDirectory() as directory:
                path = os.path.join(directory, "series.csv")
                try:
                    status = replay_series(args.replay, args.input, replay_options, path)
                except OSError as error:
                    print(f"vmm.plot: --replay {args.replay}: cannot run: {error}", file=sys.stderr)
                    return 1
                if status != 0:
                    print(f"vmm.plot: vmm-replay exited with status {status}", file=sys.stderr)
                    return 1
                series = read_series(path)
    except SeriesError as error:
        print(f"vmm.plot: {error}", file=sys.stderr)
        return 2
    try:
        draw(series, args.out, title)
    except OSError as error:
        print(f"vmm.plot: {args.out}: cannot write: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
