"""python -m vmm.plot: a picture of vmm-replay's --series, from the CSV or straight from a trace."""

import os
import subprocess
import sys

import pytest

HEADER = "event,live_bytes,live_high_bytes,reserved_bytes,reserved_small_page_bytes,reserved_large_page_bytes\n"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MIB = 1 << 20

# A trace whose large requests (128 MiB: large pages of 32 MiB on OS host memory) and small
# ones give both page sizes.
TRACE = "".join(
    [f"a {i} {(i % 5 + 1) * MIB} 0\n" for i in range(40)]
    + [f"a {100 + i} {128 * MIB} 0\n" for i in range(3)]
    + [f"f {i}\n" for i in range(0, 40, 2)]
    + ["f 101\n"]
)


def plot(*args):
    return subprocess.run([sys.executable, "-m", "vmm.plot", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def replay_program():
    replay = os.environ.get("VMM_REPLAY")
    if not replay:
        pytest.skip("VMM_REPLAY (the vmm-replay program) is not set: the ctest sets it")
    return replay


def assert_png(path):
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC), data[:16]
    assert len(data) > 10_000, f"{len(data)} bytes: hardly a picture"


def test_a_small_series_becomes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    series = tmp_path / "small.csv"
    rows = [(i * 10, i * MIB, i * MIB + 512, (i + 2) * MIB, 2 * MIB, i * MIB) for i in range(1, 50)]
    series.write_text(HEADER + "".join(",".join(map(str, row)) + "\n" for row in rows))
    out = tmp_path / "small.png"
    done = plot(series, out, "--title", "a small series")
    assert done.returncode == 0, done
    assert_png(out)


def test_a_series_of_vmm_replay_and_a_trace_straight_become_pngs(tmp_path):
    replay = replay_program()
    pytest.importorskip("matplotlib")
    trace = tmp_path / "mixed.trace"
    trace.write_text(TRACE)
    series = tmp_path / "mixed.csv"
    done = subprocess.run([replay, trace, "--location", "os_host", "--simulate", "1GiB", "--series", series],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done
    lines = series.read_text().splitlines()
    assert lines[0] + "\n" == HEADER and len(lines) == 1 + TRACE.count("\n"), lines
    assert int(lines[-1].split(",")[-1]) > 0, "no large pages: the trace should make some"
    out = tmp_path / "from_series.png"
    done = plot(series, out)
    assert done.returncode == 0, done
    assert_png(out)
    # Straight from the trace: vmm-replay runs with --series and the options after --.
    out = tmp_path / "from_trace.png"
    done = plot(trace, out, "--replay", replay, "--", "--location", "os_host", "--simulate", "1GiB")
    assert done.returncode == 0, done
    assert "peak live" in done.stdout, done.stdout  # vmm-replay's report, passed on
    assert_png(out)


@pytest.mark.parametrize(
    "text, words",
    [
        ("", ["bad.csv:1:", "expected the header"]),
        ("event,live\n1,2\n", ["bad.csv:1:", "expected the header"]),
        (HEADER + "1,2,3,4,2,2\n2,3,x,4,2,2\n", ["bad.csv:3:", "6 non-negative integers", "2,3,x,4,2,2"]),
        (HEADER + "1,2,3,4,2\n", ["bad.csv:2:", "6 non-negative integers"]),
        (HEADER + "5,2,3,4,2,2\n5,2,3,4,2,2\n", ["bad.csv:3:", "event 5 does not follow event 5"]),
        (HEADER, ["bad.csv:2:", "no rows"]),
    ],
    ids=["empty", "other header", "not a number", "short row", "events not increasing", "no rows"],
)
def test_a_garbled_series_exits_2_naming_the_file_and_line(tmp_path, text, words):
    series = tmp_path / "bad.csv"
    series.write_text(text)
    out = tmp_path / "never.png"
    done = plot(series, out)
    assert done.returncode == 2, done
    for word in words:
        assert word in done.stderr, (word, done.stderr)
    assert not out.exists()


def test_bad_arguments_and_a_failed_replay_are_refused(tmp_path):
    out = tmp_path / "never.png"
    done = plot(tmp_path / "absent.csv", out)
    assert done.returncode == 2 and "absent.csv: cannot read" in done.stderr, done
    done = plot(tmp_path / "some.trace.gz", out)
    assert done.returncode == 2 and "give --replay" in done.stderr, done
    done = plot(tmp_path / "s.csv", out, "--replay", "vmm-replay")
    assert done.returncode == 2 and "not a series" in done.stderr, done
    done = plot(tmp_path / "s.csv")
    assert done.returncode == 2 and "OUT.png" in done.stderr, done
    done = plot(tmp_path / "t.trace", out, "--replay", tmp_path / "no-such-program")
    assert done.returncode == 1 and "cannot run" in done.stderr, done
    replay = replay_program()
    trace = tmp_path / "bad.trace"
    trace.write_text("a 1 4096 0\nf 2\n")
    done = plot(trace, out, "--replay", replay, "--", "--location", "os_host")
    assert done.returncode == 1, done
    assert "bad.trace:2:" in done.stderr and "vmm-replay exited with status 1" in done.stderr, done.stderr
    assert not out.exists()
