"""Memory history on OS host memory: snapshot (torch's structure), trace dump and vmm-replay."""

import gzip
import os
import subprocess

import pytest


def test_history_becomes_a_snapshot_of_torchs_structure_and_a_replayable_trace(scenario, tmp_path):
    trace = tmp_path / "workload.trace.gz"
    scenario(
        f"""
        import gzip, pickle
        from vmm import _vmm
        before = _vmm.allocate(1 << 20, 0)  # before recording: in no history
        vmm.torch.record_memory_history(stacks="python")

        def workload():
            kept = _vmm.allocate(3 << 20, 0)
            side = _vmm.allocate(1000, 0, 0x1234)  # "another stream" (the OS provider ignores it)
            gone = _vmm.allocate(5 << 20, 0)
            _vmm.deallocate(gone, 5 << 20, 0)
            _vmm.deallocate(before, 1 << 20, 0)
            return kept, side

        kept, side = workload()
        vmm.torch.record_memory_history(None)
        _vmm.deallocate(_vmm.allocate(4096, 0), 4096, 0)  # after: not recorded

        snapshot = vmm.torch.memory_snapshot()
        pickle.dumps(snapshot)  # what memory_viz's page loads
        trace = snapshot["device_traces"][0]
        assert [e["action"] for e in trace] == ["alloc", "alloc", "alloc", "free_requested", "free_completed",
                                                "free_requested", "free_completed"], trace
        assert [e["size"] for e in trace[:3]] == [3 << 20, 1000, 5 << 20]
        assert trace[1]["stream"] == 0x1234 and trace[0]["stream"] == 0
        assert trace[0]["time_us"] <= trace[1]["time_us"] <= trace[-1]["time_us"]
        assert any(f["name"] == "workload" for f in trace[0]["frames"]), trace[0]["frames"]
        segments = snapshot["segments"]
        assert sorted(s["address"] for s in segments) == sorted([kept, side])
        for segment in segments:
            (block,) = segment["blocks"]
            assert block["state"] == "active_allocated" and block["size"] == segment["total_size"]
            assert block["requested_size"] <= block["size"] and block["size"] % 256 == 0
        assert {{s["requested_size"] for s in segments}} == {{3 << 20, 1000}}

        assert vmm.torch.dump_trace({str(trace)!r}) == 4  # the free of `before` is left out
        with gzip.open({str(trace)!r}, "rt") as written:
            lines = [line.split() for line in written if not line.startswith("#")]
        assert lines == [["a", "0", str(3 << 20), "0"], ["a", "1", "1000", "1"], ["a", "2", str(5 << 20), "0"],
                         ["f", "2"]], lines
        """
    )
    replay = os.environ.get("VMM_REPLAY")
    if not replay:
        pytest.skip("VMM_REPLAY (the vmm-replay program) is not set: the ctest sets it")
    # Simulated: the probe for the largest allocation at the end would commit the machine's memory.
    done = subprocess.run([replay, str(trace), "--location", "os_host", "--simulate", "1GiB"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done
    # The trace's own peak of live bytes: 3 MiB, 1000 bytes and 5 MiB at once.
    assert f"({(8 << 20) + 1000} bytes)" in done.stdout.split("peak live")[1].splitlines()[0], done.stdout


def test_bad_history_arguments_are_refused_naming_them(scenario):
    scenario(
        """
        import pytest
        for call, name in [
            (lambda: vmm.torch.record_memory_history("some"), "enabled"),
            (lambda: vmm.torch.record_memory_history(stacks="cpp"), "stacks"),
            (lambda: vmm.torch.record_memory_history(max_entries=0), "max_entries"),
            (lambda: vmm.torch.dump_trace("/nonexistent/never.trace"), "history is empty"),
        ]:
            with pytest.raises(vmm.InvalidArgumentError, match=name):
                call()
        """
    )


def test_the_oldest_events_go_first_past_max_entries(scenario):
    scenario(
        """
        from vmm import _vmm
        vmm.torch.record_memory_history(max_entries=3)
        pointers = [_vmm.allocate(4096 * (i + 1), 0) for i in range(5)]
        assert [e.size for e in _vmm.history()] == [3 * 4096, 4 * 4096, 5 * 4096]
        """
    )


def test_memory_viz_renders_a_snapshot(scenario):
    pytest.importorskip("torch", reason="PyTorch is not installed: torch.cuda._memory_viz is PyTorch's")
    scenario(
        """
        from vmm import _vmm
        from torch.cuda import _memory_viz
        vmm.torch.record_memory_history(stacks="python")
        kept = [_vmm.allocate(n, 0) for n in (1000, 3 << 20, 25 << 20)]
        _vmm.deallocate(kept.pop(), 25 << 20, 0)
        snapshot = vmm.torch.memory_snapshot()
        rendered = 0
        for name in ("segsum", "trace", "trace_plot", "segment_plot"):
            function = getattr(_memory_viz, name, None)
            if function is not None:
                text = function(snapshot)
                assert isinstance(text, str) and text, name
                rendered += 1
        # PyTorch before 2.0 (Debian's 1.13) has the first form of memory_viz: functions over
        # the list of segments; its flame graphs are text here (format_flamegraph would fetch
        # flamegraph.pl), and stats() checks every segment's size against its blocks.
        if hasattr(_memory_viz, "stats") and hasattr(_memory_viz, "segments"):
            plain = lambda text: text
            for name in ("segments", "memory"):
                text = getattr(_memory_viz, name)(snapshot["segments"], format_flamegraph=plain)
                assert isinstance(text, str) and text, name
                rendered += 1
            stats = _memory_viz.stats(snapshot["segments"])
            assert stats["segments"] == 2 and stats["total_size"].value >= 1000 + (3 << 20), stats
            rendered += 1
        assert rendered, "this torch's _memory_viz has none of segsum, trace, trace_plot, segment_plot, stats"
        """
    )
