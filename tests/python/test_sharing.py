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
