"""vmm.share / vmm.open across processes on OS host memory: the same physical memory, no copy."""

import multiprocessing
import socket

import pytest

import vmm

numpy = pytest.importorskip("numpy", reason="numpy is not installed")

MIB = 1 << 20


def _child(connection):
    """Receives a handle, checks what the parent wrote, writes back, reports."""
    import numpy

    import vmm

    handle = connection.recv()
    shared = vmm.open(handle)
    handle.close()  # the mapping keeps the memory
    view = numpy.asarray(shared)
    connection.send((view.dtype.str, len(view), float(view[:1000].sum()), shared.read_only))
    if not shared.read_only:
        view[0] = -7.0  # the parent sees it: the same pages
        connection.send("written")
    else:
        try:
            view[0] = -7.0
        except ValueError:
            connection.send("refused")
    connection.recv()  # wait until the parent has looked


def _child_of_spawn_arguments(handle, connection):
    import numpy

    import vmm

    connection.send(float(numpy.asarray(vmm.open(handle))[:10].sum()))


def test_a_handle_crosses_as_a_spawn_argument_and_many_times_over_one_pipe():
    # Spawn arguments carry the descriptors themselves; later sends bundle them into one
    # socket pair each (vmm._sharing._BUNDLED_FDS), many in a row.
    context = multiprocessing.get_context("spawn")
    vector = vmm.Vector("float64", max_size=64 * MIB)
    vector.extend(numpy.arange(1000, dtype=numpy.float64))
    parent, child = context.Pipe()
    process = context.Process(target=_child_of_spawn_arguments, args=(vmm.share(vector), child))
    process.start()
    assert parent.recv() == 45.0
    process.join(timeout=120)
    assert process.exitcode == 0
    for _ in range(50):
        parent.send(vmm.share(vector))
        assert float(numpy.asarray(vmm.open(child.recv()))[:10].sum()) == 45.0


@pytest.mark.parametrize("read_only", [False, True])
def test_a_vector_crosses_to_another_process_without_a_copy(read_only):
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=_child, args=(child,))
    process.start()
    vector = vmm.Vector("float64", max_size=64 * MIB)
    vector.extend(numpy.arange(100_000, dtype=numpy.float64))
    parent.send(vmm.share(vector, read_only=read_only))
    dtype, length, total, mapped_read_only = parent.recv()
    assert (dtype, length, total, mapped_read_only) == ("<f8", 100_000, float(sum(range(1000))), read_only)
    if read_only:
        assert parent.recv() == "refused"
        assert numpy.asarray(vector)[0] == 0.0
    else:
        assert parent.recv() == "written"
        assert numpy.asarray(vector)[0] == -7.0  # written by the other process into our memory
    parent.send("done")
    process.join(timeout=120)
    assert process.exitcode == 0


def test_a_handle_travels_over_a_unix_socket_and_outlives_the_senders_buffer():
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with left, right:
        buffer = vmm.GrowableBuffer("os_host", max_size=16 * MIB)
        buffer.resize(3 * MIB)
        buffer.write(0, b"shared bytes")
        handle = vmm.share(buffer)
        handle.send(left)
        handle.close()
        received = vmm.SharedHandle.receive(right)
    del buffer  # the sender lets go: the receiver's mapping keeps the memory
    shared = vmm.open(received)
    received.close()
    assert len(shared) == 3 * MIB and shared.location == "os_host"
    assert bytes(memoryview(shared.buffer)[:12]) == b"shared bytes"
    assert bytes(numpy.from_dlpack(shared)[:6]) == b"shared"


def test_bad_handles_are_refused_naming_the_problem():
    with pytest.raises(vmm.InvalidArgumentError, match="obj"):
        vmm.share(bytearray(10))
    with pytest.raises(vmm.InvalidArgumentError, match="handle"):
        vmm.open("not a handle")
    with pytest.raises(vmm.InvalidArgumentError):
        vmm.open(vmm.SharedHandle(b"garbage", []))
    buffer = vmm.GrowableBuffer("os_host", max_size=4 * MIB)
    buffer.resize(MIB)
    handle = vmm.share(buffer)
    with pytest.raises(vmm.InvalidArgumentError):  # the manifest names more fds than given
        vmm.open(vmm.SharedHandle(handle.manifest, []))
    with pytest.raises(TypeError, match="multiprocessing"):
        __import__("pickle").dumps(handle)
    read_only = vmm.open(vmm.share(buffer, read_only=True))
    with pytest.raises(BufferError, match="read-only"):
        read_only.__dlpack__()
    assert numpy.asarray(read_only).flags.writeable is False


def _allocation_child(connection):
    import ctypes

    import numpy

    import vmm

    handle = connection.recv()
    shared = vmm.open(handle)
    view = numpy.asarray(shared)
    connection.send(bytes(view[:16]))
    view[:4] = numpy.frombuffer(b"back", dtype=numpy.uint8)
    connection.send(ctypes.addressof(ctypes.c_char.from_address(shared.data)) != 0)
    connection.recv()


def test_an_allocation_of_a_devices_resource_crosses_with_its_offset_into_its_pages(scenario, tmp_path):
    # vmm.torch's path for tensors (vmm.share(tensor) exports the pages under the tensor's
    # allocation), on OS host memory standing in for a GPU.
    scenario(
        f"""
        import ctypes, multiprocessing, sys
        sys.path.insert(0, {str(__import__("os").path.dirname(__file__))!r})
        import test_sharing
        from vmm import _vmm, _sharing
        first = _vmm.allocate(1000, 0)   # so that the next one starts inside a page
        ptr = _vmm.allocate(3 << 20, 0)
        ctypes.memmove(ptr, b"tensor bytes 123", 16)
        handle = _sharing._share_allocation(ptr, 3 << 20, 0)
        assert handle.offset == ptr % (2 << 20) or handle.offset > 0, handle.offset
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        process = context.Process(target=test_sharing._allocation_child, args=(child,))
        process.start()
        parent.send(handle)
        assert parent.recv() == b"tensor bytes 123"
        assert parent.recv() is True
        assert ctypes.string_at(ptr, 4) == b"back"  # the other process wrote our allocation
        parent.send("done")
        process.join(timeout=120)
        assert process.exitcode == 0
        try:
            _sharing._share_allocation(ptr + 256, 4096, 0)
        except vmm.InvalidArgumentError:
            pass
        else:
            raise AssertionError("a pointer inside an allocation was shared")
        """
    )


# The lease of a shared allocation (vmm.torch's and vmm.cupy's tensors): the sender's free of
# it waits until every receiver let go. The handle goes over a socket pair inherited by a
# forked child (handle.send copies the descriptors into the message), so that when the
# parent closes its own copy, only the child holds the lease.
LEASE_SCENARIO = """
import ctypes, os, signal, socket
from vmm import _vmm, _sharing
MIB = 1 << 20

def held():
    return _vmm.held_for_receivers(0)

def used():
    return _vmm.statistics(0).used_current

ptr = _vmm.allocate(3 * MIB, 0)
ctypes.memmove(ptr, b"first bytes", 11)
ours, theirs = socket.socketpair()
child = os.fork()
if child == 0:
    try:
        ours.close()
        shared = vmm.open(_sharing.SharedHandle.receive(theirs))  # the handle itself is dropped here
        while True:
            command = theirs.recv(16)
            if command == b"read":
                theirs.sendall(ctypes.string_at(shared.data, 11))
            elif command == b"drop":
                del shared
                theirs.sendall(b"dropped")
            else:
                os._exit(0)
    except BaseException as error:
        print("child:", repr(error), flush=True)
        os._exit(1)
theirs.close()
handle = _sharing._share_allocation(ptr, 3 * MIB, 0)
assert handle.lease
handle.send(ours)
handle.close()
ours.sendall(b"read")
assert ours.recv(16) == b"first bytes"
before = used()
_vmm.deallocate(ptr, 3 * MIB, 0)
assert held() == (1, 3 * MIB), held()
assert used() == before, "a free held for a receiver gave its memory back"
other = _vmm.allocate(3 * MIB, 0)     # must not be the held memory
ctypes.memmove(other, b"other bytes", 11)
ours.sendall(b"read")
assert ours.recv(16) == b"first bytes", "the held memory was handed out again"
"""


def test_a_shared_allocations_free_waits_until_its_receiver_lets_go(scenario):
    scenario(
        LEASE_SCENARIO
        + """
ours.sendall(b"drop")
assert ours.recv(16) == b"dropped"
assert held() == (0, 0), held()      # the free is done now, at this call
assert used() == before, (used(), before)  # ptr's 3 MiB went, `other`'s came
ours.sendall(b"exit")
assert os.waitpid(child, 0)[1] == 0
_vmm.deallocate(other, 3 * MIB, 0)
assert used() == before - 3 * MIB
"""
    )


def test_a_receiver_killed_while_it_maps_a_shared_allocation_ends_its_lease(scenario):
    scenario(
        LEASE_SCENARIO
        + """
os.kill(child, signal.SIGKILL)
assert os.waitpid(child, 0)[1] != 0
assert held() == (0, 0), held()
_vmm.deallocate(other, 3 * MIB, 0)
assert used() == before - 3 * MIB
"""
    )


def test_a_handle_closed_before_anyone_opened_it_holds_no_free(scenario):
    scenario(
        """
        from vmm import _vmm, _sharing
        ptr = _vmm.allocate(1 << 20, 0)
        handle = _sharing._share_allocation(ptr, 1 << 20, 0)
        kept = _sharing._share_allocation(ptr, 1 << 20, 0)   # a second share, a second lease
        handle.close()
        _vmm.deallocate(ptr, 1 << 20, 0)
        assert _vmm.held_for_receivers(0) == (1, 1 << 20)   # `kept` still holds it
        assert vmm.torch.memory_stats(0)["vmm.held_for_receivers.bytes"] == 1 << 20
        kept.close()
        assert _vmm.held_for_receivers(0) == (0, 0)
        # An allocation shared many times while it lives holds no descriptor of an ended lease.
        import os
        ptr = _vmm.allocate(1 << 20, 0)
        _sharing._share_allocation(ptr, 1 << 20, 0).close()
        descriptors = len(os.listdir("/proc/self/fd"))
        for _ in range(200):
            _sharing._share_allocation(ptr, 1 << 20, 0).close()
        assert len(os.listdir("/proc/self/fd")) == descriptors, (len(os.listdir("/proc/self/fd")), descriptors)
        _vmm.deallocate(ptr, 1 << 20, 0)
        assert _vmm.held_for_receivers(0) == (0, 0)
        assert vmm.torch.memory_stats(0)["allocated_bytes.all.current"] == 0
        """
    )


def test_a_forged_array_layout_is_refused_naming_it():
    import vmm

    buffer = vmm.GrowableBuffer(max_size=1 << 20)
    buffer.resize(4096)
    refused = [
        ({"kind": "nope"}, "tensor.kind"),
        ({"kind": "torch", "dtype": "float32", "shape": [4], "stride": "x", "storage_offset": 0}, "stride"),
        ({"kind": "torch", "dtype": "float33", "shape": [4], "stride": [1], "storage_offset": 0}, "tensor.dtype"),
        ({"kind": "cupy", "dtype": "<f4", "shape": [4], "strides": [4, 4], "offset": 0}, "differ in length"),
        # 1024 float32 from element 1 reach one element past the 4096 bytes shared
        ({"kind": "torch", "dtype": "float32", "shape": [1024], "stride": [1], "storage_offset": 1}, "reach outside"),
        ({"kind": "cupy", "dtype": "<f4", "shape": [2], "strides": [-8], "offset": 0}, "reach outside"),
        ({"kind": "torch", "dtype": "float32", "shape": [4], "stride": [1], "storage_offset": 0, "x": 1}, "unknown field"),
        (["x"], "expected null or an object"),
    ]
    for layout, named in refused:
        handle = vmm.share(buffer)
        handle.tensor, handle.length = layout, 4096
        with pytest.raises(vmm.InvalidArgumentError, match=f"a vmm handle's header: .*{named}"):
            vmm.open(handle)
        handle.close()
    handle = vmm.share(buffer)
    handle.tensor, handle.length = {"kind": "cupy", "dtype": "<f4", "shape": [2], "strides": [-4], "offset": 4}, 4096
    handle._header()  # a negative stride that stays inside is a layout
    handle.close()


@pytest.mark.parametrize(
    "text, named",
    [
        (b"[]", "not a JSON object"),
        (b"{", "not JSON"),
        (b'{"manifest": 1}', "fds: missing"),
        (b'{"manifest": -1, "fds": 0}', "manifest: expected an integer from 0"),
        (b'{"manifest": 2000000, "fds": 0}', "manifest: 2000000 is past"),
        (b'{"manifest": 0, "fds": 0, "dtype": "u1", "length": null, "read_only": false, "offset": 0, '
         b'"lease": false, "tensor": null}', "dtype"),
        (b'{"manifest": 0, "fds": 0, "dtype": "|u1", "length": null, "read_only": 0, "offset": 0, '
         b'"lease": false, "tensor": null}', "read_only: expected true or false"),
        (b'{"manifest": 0, "fds": 0, "dtype": "|u1", "length": null, "read_only": false, "offset": 0, '
         b'"lease": true, "tensor": null}', "lease"),
        (b'{"manifest": 0, "fds": 0, "dtype": "|u1", "length": 1.5, "read_only": false, "offset": 0, '
         b'"lease": false, "tensor": null}', "length"),
        (b'{"manifest": 0, "fds": 0, "dtype": "|u1", "length": null, "read_only": false, "offset": 0, '
         b'"lease": false, "tensor": null, "\\u0001": 1}', "unknown field \"\\x01\""),
    ],
)
def test_a_forged_handle_header_is_refused_naming_the_field(text, named):
    from vmm import _vmm

    with pytest.raises(vmm.InvalidArgumentError) as refusal:
        _vmm.parse_handle_header(text)
    assert str(refusal.value).startswith("a vmm handle's header: ") and named in str(refusal.value), refusal.value
