#!/usr/bin/env python3
"""vmm-replay's checks, run by ctest on the OS provider (no GPU needed).

    replay_check.py VMM_REPLAY shared      TRACE   # the shared trace, simulated: ratio <= 1.04
    replay_check.py VMM_REPLAY bad-input           # malformed traces and arguments are refused
    replay_check.py VMM_REPLAY trade       TRACE   # bench/data/vit_live: no trade at the default
    replay_check.py VMM_REPLAY series      TRACE   # --series: the CSV agrees with the JSON

`shared`: replays the trace with --simulate (pages at first touch, so a 16 GiB trace runs
on a small machine) and --max-ratio 1.04, the figure PyTorch's expandable segments reach on
it; checks the JSON. Exit 77 (ctest's skip) when the process may not open a descriptor per
page, with vmm-replay's reason.

`bad-input`: every malformed trace (bad lines, reused or unknown ids, negative sizes and
sizes and streams out of range, a damaged gzip, no events) and an allocation the OS refuses
end with exit status 1 and a message naming the problem, the line and its text; every bad
argument ends with exit status 2 naming the option, never a crash; --max-ratio fails a
replay that passes it with exit status 3; --headroom reaches the resource; the JSON report
parses whatever the trace's path holds.

`trade`: the live ViT training trace, whose page sizes trade memory (a page given back in one
size to make one in the other) every step when the resource keeps too little idle memory.
At the default headroom (1/128) the replay gives back at most 64 pages over two passes with
the device 150 events behind, within 1.02 of peak live; at 1/256 the same replay gives back
500 or more, so the trace still trades and the check can fail.

`series`: replays the trace (simulated) with --series and --json, once and over two passes:
the CSV has its header, at most 2000 rows at events increasing by a fixed step, the last at
the last event; at every row the two page sizes add up to reserved and reserved covers live
(every live byte lies in a mapped page, which reserved counts); the most live of the rows is
the JSON's peak live, the most reserved at most its peak, and the last row's page sizes are
the JSON's. An unwritable --series path ends with exit status 1 naming it before the trace is
read, and a replay that fails leaves no series behind.
"""

import csv
import gzip
import json
import os
import subprocess
import sys
import tempfile

SKIP = 77


def run(replay, *args):
    return subprocess.run([replay, *args], capture_output=True, text=True, errors="replace", timeout=600)


def replay_report(replay, trace, *args):
    """vmm-replay TRACE ARGS --json, its output passed on: (exit status, the JSON report, or
    None when it failed). Exit status 4: the process may not open a descriptor per page."""
    with tempfile.TemporaryDirectory() as directory:
        out = os.path.join(directory, "replay.json")
        result = run(replay, trace, *args, "--json", out)
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        if result.returncode == 4:
            print("skipped: the process may not open a descriptor per page (see above)")
        if result.returncode != 0:
            return result.returncode, None
        with open(out) as f:
            return 0, json.load(f)


def shared(replay, trace):
    status, report = replay_report(replay, trace, "--location", "os_host", "--simulate", "24GiB", "--max-ratio", "1.04")
    if status == 4:
        return SKIP
    if status != 0:
        print(f"FAILED: vmm-replay exited with {status}")
        return 1
    failures = []
    if not report["simulated"]:
        failures.append("the JSON does not say the run was simulated")
    if report["events"] != 129539:
        failures.append(f"{report['events']} events, the shared trace has 129539")
    if report["peak_live_bytes"] != 17538178248:
        failures.append(f"peak live {report['peak_live_bytes']}, the trace's is 17538178248 (16.334 GiB)")
    if not 1.0 <= report["reserved_over_live"] <= 1.04:
        failures.append(f"reserved/live {report['reserved_over_live']} outside [1, 1.04]")
    if report["peak_reserved_bytes"] < report["peak_live_bytes"]:
        failures.append("peak reserved below peak live")
    for failure in failures:
        print("FAILED:", failure)
    return 1 if failures else 0


# (name, trace text or bytes, words the message must hold)
BAD_TRACES = [
    ("unknown kind", "a 1 4096 0\nx 1\n", ["2:", "must start with 'a' or 'f'", '"x 1"']),
    ("missing size", "a 1\n", ["1:", "an allocation needs an id, a size and a stream number"]),
    ("extra field", "a 1 4096 0 7\n", ["1:", "extra fields"]),
    ("huge size", "a 1 281474976710657 0\n", ["1:", "a size past 2^48 bytes (281474976710657)"]),
    ("negative size", "a 1 -1 0\n", ["1:", "a negative size (-1)", '"a 1 -1 0"']),
    ("size of 2^64", "a 1 18446744073709551616 0\n", ["1:", "size 18446744073709551616 is out of range"]),
    ("size not a number", "a 1 4k 0\n", ["1:", "the size 4k is not a whole number"]),
    ("negative id", "a -3 4096 0\n", ["1:", "a negative id (-3)"]),
    ("negative stream", "a 1 4096 -1\n", ["1:", "a negative stream number (-1)"]),
    ("stream past 1023", "a 1 4096 1024\n", ["1:", "stream number past 1023"]),
    ("reused id", "# c\na 1 4096 0\na 1 4096 0\n", ["3:", "allocation id 1 is live already"]),
    ("free of unknown id", "a 1 4096 0\nf 2\n", ["2:", "free of id 2, which is not live"]),
    ("double free", "a 1 4096 0\nf 1\nf 1\n", ["3:", "free of id 1, which is not live"]),
    ("free without id", "a 1 4096 0\nf\n", ["2:", "a free needs an id"]),
    ("no events", "# only a comment\n\n", ["no events"]),
    ("binary junk", b"\x00\xff\xfe garbage\n", ["must start with 'a' or 'f'", "\\x00\\xff\\xfe garbage"]),
    # An allocation the resource refuses (128 TiB: past the OS provider's max_size, which the
    # commit budget bounds, and past what the OS would map): the reason, and the trace's line
    # number and text.
    ("refused by the resource", "# big\na 1 140737488355328 0\n",
     ["2:", "allocating 140737488355328 bytes on stream 0 failed", "max_size", '"a 1 140737488355328 0"']),
]

# (arguments after the trace, exit status, words stderr must hold): a bad option exits 2 and
# names the option and the value; a missing file exits 1.
BAD_ARGUMENTS = [
    (["--repeat", "0"], 2, ["--repeat", "0"]),
    (["--repeat", "x"], 2, ["--repeat", "x"]),
    (["--simulate", "0"], 2, ["--simulate", "0 is out of range"]),
    (["--simulate", "12XB"], 2, ["--simulate", '"12XB"', "unknown unit"]),
    (["--simulate", "-1G"], 2, ["--simulate", '"-1G"', "negative"]),
    (["--simulate", "99999999999GiB"], 2, ["--simulate", "99999999999GiB", "2^64 bytes or more"]),
    (["--simulate", "512TiB"], 2, ["--simulate", "512TiB", "out of range"]),
    (["--max-ratio", "0.5"], 2, ["--max-ratio", "0.5"]),
    (["--max-ratio", "nan"], 2, ["--max-ratio", "nan"]),
    (["--headroom", "2"], 2, ["--headroom", "2"]),
    (["--headroom", "-0.5"], 2, ["--headroom", "-0.5"]),
    (["--headroom", "nan"], 2, ["--headroom", "nan"]),
    (["--headroom", "0.1x"], 2, ["--headroom", "0.1x"]),
    (["--location", "gpu-1"], 2, ["--location", "gpu-1"]),
    (["--location", "tpu0"], 2, ["--location", "tpu0"]),
    (["--json"], 2, ["--json"]),
    (["--lag", "x"], 2, ["--lag", "x"]),
    (["--lag", "-1"], 2, ["--lag", "-1"]),
    (["--after"], 2, ["--after"]),
    (["--bogus"], 2, ["--bogus"]),
    (["--after", "/nonexistent/first.trace"], 1, ["cannot open"]),
]


def bad_input(replay):
    failures = []
    with tempfile.TemporaryDirectory() as directory:
        good = os.path.join(directory, "good.trace")
        with open(good, "w") as f:
            f.write("# one small allocation\na 1 4096 0\na 2 0 0\nf 1\n")
        for name, text, words in BAD_TRACES:
            path = os.path.join(directory, "bad.trace")
            with open(path, "wb") as f:
                f.write(text if isinstance(text, bytes) else text.encode())
            result = run(replay, path, "--location", "os_host")
            missing = [w for w in words if w not in result.stderr]
            if result.returncode != 1 or missing:
                failures.append(f"{name}: exit {result.returncode}, stderr {result.stderr!r}, missing {missing}")
        # A gzip file cut short.
        damaged = os.path.join(directory, "damaged.trace.gz")
        with open(damaged, "wb") as f:
            f.write(gzip.compress(b"a 1 4096 0\n" * 10000)[:200])
        result = run(replay, damaged, "--location", "os_host")
        if result.returncode != 1 or "damaged.trace.gz" not in result.stderr:
            failures.append(f"damaged gzip: exit {result.returncode}, stderr {result.stderr!r}")
        missing_file = os.path.join(directory, "absent.trace")
        result = run(replay, missing_file)
        if result.returncode != 1 or "cannot open" not in result.stderr:
            failures.append(f"absent file: exit {result.returncode}, stderr {result.stderr!r}")
        for arguments, status, words in BAD_ARGUMENTS:
            result = run(replay, good, *arguments)
            missing = [w for w in words if w not in result.stderr]
            if result.returncode != status or missing:
                failures.append(f"{arguments}: exit {result.returncode}, stderr {result.stderr!r}, missing {missing}")
        result = run(replay)
        if result.returncode != 2 or "TRACE is required" not in result.stderr:
            failures.append(f"no trace: exit {result.returncode}, stderr {result.stderr!r}")
        # The JSON report escapes what it quotes: a trace path with a quote and a backslash
        # gives JSON that parses, holding the path.
        odd = os.path.join(directory, 'odd "name" \\ here.trace')
        with open(odd, "w") as f:
            f.write("a 1 4096 0\nf 1\n")
        out = os.path.join(directory, "odd.json")
        result = run(replay, odd, "--location", "os_host", "--simulate", "1GiB", "--json", out)
        try:
            with open(out) as f:
                report = json.load(f)
            if result.returncode != 0 or report["trace"] != odd or report["events"] != 2:
                failures.append(f"odd path: exit {result.returncode}, trace {report['trace']!r}, expected {odd!r}")
        except (OSError, ValueError, KeyError) as error:
            failures.append(f"odd path: exit {result.returncode}, the JSON does not parse: {error}")
        result = run(replay, good, "--location", "gpu0", "--simulate", "1GiB")
        if result.returncode != 1 or "--simulate is for --location os_host only" not in result.stderr:
            failures.append(f"--simulate on a GPU: exit {result.returncode}, stderr {result.stderr!r}")
        result = run(replay, good, "--location", "gpu0", "--lag", "10")
        if result.returncode != 1 or "--lag is for --location os_host only" not in result.stderr:
            failures.append(f"--lag on a GPU: exit {result.returncode}, stderr {result.stderr!r}")
        # A device behind the host, and another trace replayed first: both run.
        result = run(replay, good, "--location", "os_host", "--simulate", "1GiB", "--lag", "1", "--after", good)
        if result.returncode != 0 or "device 1 events behind the host" not in result.stdout:
            failures.append(f"--lag --after: exit {result.returncode}, stdout {result.stdout!r}, stderr {result.stderr!r}")
        # The counts are TRACE's alone, not those of the trace replayed first and its trim.
        counts = []
        for extra in ([], ["--after", good]):
            out = os.path.join(directory, "after.json")
            result = run(replay, good, "--location", "os_host", "--simulate", "1GiB", "--json", out, *extra)
            with open(out) as f:
                report = json.load(f)
            counts.append({k: report.get(k) for k in ("pages_created", "pages_stitched", "pages_released", "host_waits")})
        if counts[0] != counts[1] or counts[0]["pages_created"] != 1:
            failures.append(f"--after: the counts alone {counts[0]}, after the trace replayed first {counts[1]}")
        # --headroom reaches the resource (its properties() say what it runs with); without
        # it the resource's own default, 1/128 with large pages.
        for extra, expected in (([], 1 / 128), (["--headroom", "0.015625"], 0.015625)):
            out = os.path.join(directory, "headroom.json")
            result = run(replay, good, "--location", "os_host", "--simulate", "1GiB", "--json", out, *extra)
            with open(out) as f:
                headroom = json.load(f).get("headroom")
            if result.returncode != 0 or headroom != expected:
                failures.append(f"{extra}: exit {result.returncode}, headroom {headroom}, expected {expected}")
        # The good trace replays (simulated: the search for the largest allocation at the end
        # would commit the whole budget); a page held for 4096 bytes is far past a ratio of 1.5.
        result = run(replay, good, "--location", "os_host", "--simulate", "1GiB")
        if result.returncode != 0 or "reserved/live" not in result.stdout:
            failures.append(f"good trace: exit {result.returncode}, stderr {result.stderr!r}")
        result = run(replay, good, "--location", "os_host", "--simulate", "1GiB", "--max-ratio", "1.5")
        if result.returncode != 3 or "past --max-ratio" not in result.stderr:
            failures.append(f"--max-ratio: exit {result.returncode}, stderr {result.stderr!r}")
    for failure in failures:
        print("FAILED:", failure)
    print(f"{len(BAD_TRACES) + 2} bad traces, {len(BAD_ARGUMENTS) + 3} bad arguments, 8 good runs checked")
    return 1 if failures else 0


def trade(replay, trace):
    failures = []
    for extra, check in (([], lambda r: r["headroom"] == 1 / 128 and r["pages_released"] <= 64
                          and 1 <= r["reserved_over_live"] <= 1.02),
                         (["--headroom", "0.00390625"], lambda r: r["pages_released"] >= 500)):
        status, report = replay_report(replay, trace, "--location", "os_host", "--simulate", "8GiB", "--lag", "150",
                                       "--repeat", "2", *extra)
        if status == 4:
            return SKIP
        if status != 0:
            failures.append(f"{extra}: exit {status}")
        elif not check(report):
            failures.append(f"{extra or 'the default'}: headroom {report['headroom']}, "
                            f"{report['pages_released']} pages given back, reserved/live {report['reserved_over_live']}")
    for failure in failures:
        print("FAILED:", failure)
    return 1 if failures else 0


SERIES_HEADER = ["event", "live_bytes", "live_high_bytes", "reserved_bytes", "reserved_small_page_bytes",
                 "reserved_large_page_bytes"]


def check_series(rows, report, passes):
    """What is wrong with the rows of a --series CSV against the JSON report of its replay."""
    failures = []
    if not rows or rows[0] != SERIES_HEADER:
        return [f"header {rows[:1]}, expected {SERIES_HEADER}"]
    values = [[int(field) for field in row] for row in rows[1:]]
    total = report["events"] * passes
    if not 1000 <= len(values) <= 2000:
        failures.append(f"{len(values)} rows for {total} events, expected from 1000 to 2000")
    events = [row[0] for row in values]
    step = events[0]
    if events[-1] != total or any(e != step * (i + 1) for i, e in enumerate(events[:-1])) or events[-2] >= total:
        failures.append(f"events {events[:3]} ... {events[-3:]}: not every {step} events up to {total}")
    for event, live, live_high, reserved, small, large in values:
        if small + large != reserved or reserved < live or live_high < live:
            failures.append(f"event {event}: live {live} (most {live_high}), reserved {reserved} = {small} small + "
                            f"{large} large pages?")
            break
    if max(row[2] for row in values) != report["peak_live_bytes"]:
        failures.append(f"the most live of the rows {max(row[2] for row in values)}, peak live {report['peak_live_bytes']}")
    if max(row[3] for row in values) > report["peak_reserved_bytes"]:
        failures.append(f"a row reserves {max(row[3] for row in values)}, past peak {report['peak_reserved_bytes']}")
    if values[-1][4:] != [report["reserved_small_pages_bytes"], report["reserved_large_pages_bytes"]]:
        failures.append(f"the last row's page sizes {values[-1][4:]}, the JSON's {report['reserved_small_pages_bytes']}, "
                        f"{report['reserved_large_pages_bytes']}")
    if values[-1][5] == 0:
        failures.append("no large pages at the end: the split by page size is not exercised")
    return failures


def series(replay, trace):
    failures = []
    with tempfile.TemporaryDirectory() as directory:
        out = os.path.join(directory, "series.csv")
        for passes in (1, 2):
            status, report = replay_report(replay, trace, "--location", "os_host", "--simulate", "8GiB", "--series", out,
                                           "--repeat", str(passes))
            if status == 4:
                return SKIP
            if status != 0:
                failures.append(f"--repeat {passes}: exit {status}")
                continue
            with open(out, newline="") as f:
                rows = list(csv.reader(f))
            failures += [f"--repeat {passes}: {failure}" for failure in check_series(rows, report, passes)]
            print(f"--repeat {passes}: {len(rows) - 1} rows, the last {rows[-1]}")
        # An unwritable path: refused before the trace is read (the absent trace goes unnamed).
        unwritable = os.path.join(directory, "absent", "series.csv")
        result = run(replay, os.path.join(directory, "absent.trace"), "--series", unwritable)
        if result.returncode != 1 or f"--series {unwritable}: cannot write" not in result.stderr:
            failures.append(f"unwritable --series: exit {result.returncode}, stderr {result.stderr!r}")
        # A replay that fails leaves no series.
        bad = os.path.join(directory, "bad.trace")
        with open(bad, "w") as f:
            f.write("a 1 4096 0\nf 2\n")
        left = os.path.join(directory, "left.csv")
        result = run(replay, bad, "--location", "os_host", "--series", left)
        if result.returncode != 1 or os.path.exists(left):
            failures.append(f"failed replay: exit {result.returncode}, series left behind: {os.path.exists(left)}")
    for failure in failures:
        print("FAILED:", failure)
    return 1 if failures else 0


def main():
    if len(sys.argv) == 4 and sys.argv[2] == "shared":
        return shared(sys.argv[1], sys.argv[3])
    if len(sys.argv) == 4 and sys.argv[2] == "trade":
        return trade(sys.argv[1], sys.argv[3])
    if len(sys.argv) == 4 and sys.argv[2] == "series":
        return series(sys.argv[1], sys.argv[3])
    if len(sys.argv) == 3 and sys.argv[2] == "bad-input":
        return bad_input(sys.argv[1])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
