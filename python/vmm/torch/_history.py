"""Memory history of vmm's resources: record_memory_history(), memory_snapshot(), dump_trace().

The native module records every allocation and free of the resources (all devices) while
recording is on: address, size, stream, time, the allocating thread's tag, and the Python
stack when asked (the frames of a thread that holds the GIL; torch's autograd threads
allocate without it and record none). From that:

- memory_snapshot() builds torch.cuda.memory._snapshot()'s structure ("segments" with their
  "blocks", and "device_traces"), which torch's memory_viz functions and page read. vmm
  maps pages under live bytes only, so each live allocation is its own segment of its
  size rounded to vmm's 256 bytes (the rounding is the block's internal free space);
  allocations made before recording began are not known and not in it.
- dump_trace(path) writes vmm-replay's trace format ("a ID BYTES STREAM", "f ID"), so that a
  workload is replayed with other settings (vmm-replay --headroom, --simulate, ...).
"""

import gzip

from .. import _vmm

_ALIGNMENT = 256  # vmm::memory_resource::default_alignment: every size is rounded up to it
_DEFAULT_MAX_ENTRIES = 1_000_000


def record_memory_history(enabled="all", *, stacks=None, max_entries=_DEFAULT_MAX_ENTRIES):
    """Starts recording every allocation and free of vmm's resources, or stops (enabled None).

    As torch.cuda.memory._record_memory_history: starting again clears what was recorded;
    stopping keeps it for memory_snapshot() and dump_trace().

    Args:
        enabled: "all" (or True) to record, None (or False) to stop.
        stacks: "python" to keep each event's Python stack (costs a stack walk per event);
            None for none.
        max_entries: the most events kept; the oldest go first.

    Raises:
        vmm.InvalidArgumentError: a bad argument (named).
    """
    if enabled in (None, False):
        _vmm.record_history(False, 1, False)
        return
    if enabled not in ("all", True):
        raise _vmm.InvalidArgumentError(f"enabled {enabled!r}: expected \"all\", True, None or False")
    if stacks not in (None, "python"):
        raise _vmm.InvalidArgumentError(f"stacks {stacks!r}: expected None or \"python\"")
    if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
        raise _vmm.InvalidArgumentError(f"max_entries {max_entries!r}: expected an int of 1 or more")
    _vmm.record_history(True, max_entries, stacks == "python")


def _frames(context):
    frames = []
    for line in context.splitlines():
        filename, _, rest = line.partition("\t")
        number, _, name = rest.partition("\t")
        frames.append({"filename": filename, "line": int(number) if number.isdigit() else 0, "name": name})
    return frames


def _rounded(size):
    return -(-size // _ALIGNMENT) * _ALIGNMENT


def memory_snapshot():
    """torch.cuda.memory._snapshot()'s structure of what vmm recorded (see the module doc).

    Returns:
        dict: "segments" (the allocations live at the end of the history, one segment each,
        with one "active_allocated" block) and "device_traces" (per device, its events:
        "alloc", and "free_requested" followed by "free_completed" for each free, with
        "addr", "size", "stream", "time_us" and "frames").
    """
    events = _vmm.history()
    devices = 1 + max((event.device for event in events), default=-1)
    traces = [[] for _ in range(devices)]
    live = {}
    for event in events:
        frames = _frames(event.context)
        common = {
            "addr": event.ptr,
            "size": event.size,
            "stream": event.stream,
            "time_us": event.time_ns // 1000,
            "frames": frames,
            "device_free": 0,
        }
        if event.allocate:
            traces[event.device].append(dict(common, action="alloc"))
            live[(event.device, event.ptr)] = (event, frames)
        else:
            traces[event.device].append(dict(common, action="free_requested"))
            traces[event.device].append(dict(common, action="free_completed"))
            live.pop((event.device, event.ptr), None)
    segments = []
    for (device, ptr), (event, frames) in sorted(live.items()):
        size = _rounded(event.size)
        segments.append(
            {
                "device": device,
                "address": ptr,
                "total_size": size,
                "allocated_size": size,
                "active_size": size,
                "requested_size": event.size,
                "stream": event.stream,
                "segment_type": "large" if size >= (1 << 20) else "small",
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": frames,
                "blocks": [
                    {
                        "address": ptr,
                        "size": size,
                        "requested_size": event.size,
                        "state": "active_allocated",
                        "frames": frames,
                    }
                ],
            }
        )
    return {"segments": segments, "device_traces": traces}


def dump_trace(path, device=None):
    """Writes the recorded history of one device in vmm-replay's trace format.

    Each allocation gets an id ("a ID BYTES STREAM", the streams numbered 0, 1, ... in
    order of appearance, the default stream first when it appears), each free of a recorded
    allocation "f ID" (frees of allocations made before recording began are left out).
    gzip-compressed when `path` ends in ".gz".

    Args:
        device: the device whose events to write; None when the history has one device only.

    Returns:
        int: the number of events written.

    Raises:
        vmm.InvalidArgumentError: nothing was recorded, or several devices and no `device`.
        OSError: the file cannot be written.
    """
    events = _vmm.history()
    recorded = sorted({event.device for event in events})
    if device is None:
        if len(recorded) != 1:
            raise _vmm.InvalidArgumentError(
                f"device: the history has events of devices {recorded}; name one"
                if recorded
                else "the history is empty: record_memory_history() first, then allocate"
            )
        device = recorded[0]
    elif device not in recorded:
        raise _vmm.InvalidArgumentError(f"device {device!r}: no events recorded for it (devices {recorded})")
    streams = {0: 0}
    ids = {}
    lines = [f"# vmm.torch.dump_trace: vmm {_vmm.__version__}, device {device}\n"]
    next_id = 0
    for event in events:
        if event.device != device:
            continue
        if event.allocate:
            stream = streams.setdefault(event.stream, len(streams))
            ids[event.ptr] = next_id
            lines.append(f"a {next_id} {event.size} {stream}\n")
            next_id += 1
        elif event.ptr in ids:
            lines.append(f"f {ids.pop(event.ptr)}\n")
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt") as out:
        out.writelines(lines)
    return len(lines) - 1


__all__ = ["record_memory_history", "memory_snapshot", "dump_trace"]
