"""vmm.share() and vmm.open(): a buffer's physical memory mapped in another process.

    handle = vmm.share(vector)              # the pages as file descriptors, and a manifest
    connection.send(handle)                 # multiprocessing: Pipe, Queue, spawn arguments
    handle.send(unix_socket)                # or any Unix socket (SCM_RIGHTS)
    ...
    shared = vmm.open(handle)               # in the other process: the same memory, mapped
    numpy.asarray(shared)                   # zero-copy

The memory travels as the file descriptors of its chunks (vmm::ipc::exporter: memfd pages on
OS host memory, POSIX-fd handles of cuMemExportToShareableHandle on a GPU), never copied, and
no pidfd_getfd: a Unix socket and SCM_RIGHTS are all it takes, unprivileged. The receiver's
mapping keeps the memory alive while it lives, whatever the sender does with its buffer
afterwards; a shared tensor's or CuPy array's handle also carries a lease, so that the
sender's resource does not hand that memory out again before every receiver let go. What is shared is what the buffer maps when share() is called; growth after it
is not seen. ``read_only=True`` maps the receiver's view read-only (a write to it raises in
numpy; DLPack, which has no read-only flag, is refused).
"""

import json
import os
import socket

from . import _vmm
from ._vector import _DLPACK_CODES, Vector

# SCM_RIGHTS carries at most 253 descriptors a message (Linux's SCM_MAX_FD).
_FDS_PER_MESSAGE = 250
_HEADER_LIMIT = 1 << 20


class SharedHandle:
    """What vmm.share() returns: a manifest and the descriptors it names (owned: closed by
    close() or when the handle is collected). Travels through multiprocessing (Pipe, Queue,
    spawn arguments: the descriptors go by SCM_RIGHTS) or send() / receive() on a Unix socket.
    """

    def __init__(self, manifest, fds, dtype="|u1", length=None, read_only=False, offset=0, tensor=None, lease=False):
        self.manifest = bytes(manifest)
        self.fds = list(fds)
        self.lease = bool(lease)  # the last fd is the sender's lease (an allocation's free waits for it)
        if self.lease and not self.fds:
            raise _vmm.InvalidArgumentError("a handle with a lease carries at least its lease's descriptor")
        self.dtype = dtype
        self.length = length
        self.read_only = bool(read_only)
        self.offset = int(offset)  # where the shared bytes start in the mapping
        self.tensor = tensor  # an array's layout (a torch tensor's or a CuPy array's), or None

    def close(self):
        """Closes the descriptors (a receiver that opened the handle keeps its mapping)."""
        fds, self.fds = self.fds, []
        for fd in fds:
            os.close(fd)

    def __del__(self):
        try:
            self.close()
        except Exception:  # the interpreter is shutting down
            pass

    def _header(self):
        """The header's JSON text, checked as a receiver checks it (handle_header.hpp)."""
        text = json.dumps(dict(self._meta(), manifest=len(self.manifest), fds=len(self.fds)))
        _vmm.parse_handle_header(text)
        return text

    def _meta(self):
        return {
            "dtype": self.dtype,
            "length": self.length,
            "read_only": self.read_only,
            "offset": self.offset,
            "tensor": self.tensor,
            "lease": self.lease,
        }

    def send(self, sock):
        """Sends the handle over a connected Unix stream socket (socket.socket or a file number)."""
        sock = _as_socket(sock)
        header = self._header().encode()
        sock.sendall(len(header).to_bytes(8, "little") + header + self.manifest)
        for start in range(0, len(self.fds), _FDS_PER_MESSAGE):
            socket.send_fds(sock, [b"f"], self.fds[start : start + _FDS_PER_MESSAGE])

    @classmethod
    def receive(cls, sock):
        """Receives a handle that send() sent.

        Raises:
            vmm.InvalidArgumentError: what arrived is not a handle (the message says why).
        """
        sock = _as_socket(sock)
        size = int.from_bytes(_receive_exactly(sock, 8), "little")
        if size > _HEADER_LIMIT:
            raise _vmm.InvalidArgumentError(f"a handle's header of {size} bytes is past {_HEADER_LIMIT}")
        header = _vmm.parse_handle_header(_receive_exactly(sock, size))  # every field checked
        manifest_size, fd_count = header["manifest"], header["fds"]
        manifest = _receive_exactly(sock, manifest_size)
        fds = []
        try:
            while len(fds) < fd_count:
                wanted = min(_FDS_PER_MESSAGE, fd_count - len(fds))
                data, received, _, _ = socket.recv_fds(sock, 1, wanted)
                fds += received
                if data != b"f" or len(received) != wanted:
                    raise _vmm.InvalidArgumentError(f"expected {wanted} descriptors, got {len(received)}")
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        meta = {key: header[key] for key in ("dtype", "length", "read_only", "offset", "tensor", "lease")}
        return cls(manifest, fds, **meta)

    def __reduce__(self):
        raise TypeError(
            "a vmm.SharedHandle holds file descriptors: send it through multiprocessing "
            "(Pipe, Queue, spawn arguments) or with handle.send(unix_socket), not plain pickle"
        )


def _receive_exactly(sock, size):
    chunks = []
    while size:
        chunk = sock.recv(size)
        if not chunk:
            raise _vmm.InvalidArgumentError("the socket closed in the middle of a handle")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _as_socket(sock):
    if isinstance(sock, socket.socket):
        return sock
    if isinstance(sock, int):
        return socket.socket(fileno=os.dup(sock))
    raise _vmm.InvalidArgumentError(f"sock must be a socket.socket or a file number, not {type(sock).__name__}")


# multiprocessing moves each descriptor by a connection of its own to the sender's resource
# sharer (multiprocessing.reduction.DupFd): a handle of many pages would pay one connection a
# page. Up to this many descriptors travel instead inside one socket pair: the handle is sent
# into it (send(): SCM_RIGHTS), and only the pair's other end goes by DupFd. Its messages sit
# in the socket's buffer until the receiver reads them, so the whole handle must fit there.
_BUNDLED_FDS = 200


def _reduce_for_multiprocessing(handle):
    from multiprocessing import context
    from multiprocessing.reduction import DupFd

    # Spawn arguments: the descriptors go to the child at its start, no connection each.
    if len(handle.fds) > _BUNDLED_FDS or context.get_spawning_popen() is not None:
        return _rebuild, (handle.manifest, [DupFd(fd) for fd in handle.fds], handle._meta())
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs:
        handle.send(ours)
        return _rebuild_from_bundle, (DupFd(theirs.fileno()),)


def _rebuild(manifest, duplicates, meta):
    return SharedHandle(manifest, [duplicate.detach() for duplicate in duplicates], **meta)


def _rebuild_from_bundle(duplicate):
    with socket.socket(fileno=duplicate.detach()) as bundle:
        return SharedHandle.receive(bundle)


def _register():
    from multiprocessing.reduction import register

    register(SharedHandle, _reduce_for_multiprocessing)


_register()


def _share_allocation(ptr, size, device, read_only=False, tensor=None):
    """A handle to the pages under a live allocation of a device's resource (vmm.torch's and
    vmm.cupy's), with a lease: the allocation's free waits until every receiver let go."""
    manifest, fds, offset, lease = _vmm.share_allocation(ptr, size, device, bool(read_only))
    return SharedHandle(manifest, fds + [lease], "|u1", size, read_only, offset, tensor, lease=True)


def _share_tensor(tensor, read_only):
    if read_only:
        raise _vmm.InvalidArgumentError("read_only: a torch tensor has no read-only form (DLPack has no such flag)")
    storage = tensor.untyped_storage()
    base = storage.data_ptr()
    device = tensor.device.index if tensor.device.type == "cuda" else None
    if device is None or not _vmm.owns(device, base):
        raise _vmm.InvalidArgumentError(
            f"tensor: its memory ({tensor.device}) is not vmm's: only tensors allocated under vmm.torch.use() are shared"
        )
    layout = {
        "kind": "torch",
        "dtype": str(tensor.dtype).replace("torch.", ""),
        "shape": list(tensor.shape),
        "stride": list(tensor.stride()),
        "storage_offset": tensor.storage_offset(),
    }
    return _share_allocation(base, storage.nbytes(), device, False, layout)


def _share_cupy(array, read_only):
    if read_only:
        raise _vmm.InvalidArgumentError("read_only: a CuPy array has no read-only form; a write would fault the GPU")
    memory = array.data.mem
    device = array.device.id
    if not _vmm.owns(device, memory.ptr):
        raise _vmm.InvalidArgumentError(
            f"array: its memory (gpu {device}) is not vmm's: only arrays allocated under vmm.cupy.use() are shared"
        )
    layout = {
        "kind": "cupy",
        "dtype": array.dtype.str,
        "shape": list(array.shape),
        "strides": list(array.strides),
        "offset": array.data.ptr - memory.ptr,
    }
    return _share_allocation(memory.ptr, memory.size, device, False, layout)


def share(obj, *, read_only=False):
    """A handle to the physical memory of a vmm.GrowableBuffer, a vmm.Vector, a torch tensor
    of vmm's memory (vmm.torch.use()) or a CuPy array of it (vmm.cupy.use()), for another
    process.

    A tensor's or array's memory lives while any receiver maps it: the sender's free of it is
    held (vmm.torch.memory_stats()'s ``vmm.held_for_receivers``) until every process that
    received the handle has let go of what it opened (or exited), then done in the sender's
    stream order. Close a handle once it is sent (multiprocessing does): a handle still open
    in the sender holds the free too.

    Raises:
        vmm.InvalidArgumentError: obj is none of these, a tensor's memory is not vmm's, or its
            memory cannot be exported (pinned host memory).
    """
    if type(obj).__module__.startswith("torch") and hasattr(obj, "untyped_storage"):
        return _share_tensor(obj, read_only)
    if type(obj).__module__.startswith("cupy") and hasattr(obj, "__cuda_array_interface__"):
        return _share_cupy(obj, read_only)
    if isinstance(obj, Vector):
        manifest, fds = _vmm.share_buffer(obj.buffer, bool(read_only))
        return SharedHandle(manifest, fds, obj.dtype.str, len(obj), read_only)
    if isinstance(obj, _vmm.GrowableBuffer):
        manifest, fds = _vmm.share_buffer(obj, bool(read_only))
        return SharedHandle(manifest, fds, "|u1", obj.size, read_only)
    raise _vmm.InvalidArgumentError(f"obj: expected a vmm.GrowableBuffer or vmm.Vector, not {type(obj).__name__}")


class SharedArray:
    """What vmm.open() returns: the shared memory mapped here, as a 1-D array of the sender's
    dtype and length (numpy.asarray, torch.from_dlpack, cupy.from_dlpack: zero-copy). The
    mapping lives while this object or a view of it does."""

    def __init__(self, imported, dtype, length, offset=0):
        import numpy

        self.buffer = imported  # vmm._vmm.ImportedBuffer: the mapping, with the buffer protocol
        self.dtype = numpy.dtype(dtype)
        self._offset = int(offset)
        available = max(imported.size - self._offset, 0)
        self._length = available // self.dtype.itemsize if length is None else int(length)
        if self._offset < 0 or self._length < 0 or self._length * self.dtype.itemsize > available:
            raise _vmm.InvalidArgumentError(
                f"the handle says {self._length} elements of {self.dtype} at offset {self._offset}, "
                f"past the {imported.size} bytes shared"
            )

    def __len__(self):
        return self._length

    @property
    def data(self):
        return self.buffer.data + self._offset

    @property
    def read_only(self):
        return self.buffer.read_only

    @property
    def location(self):
        return self.buffer.location

    def _interface(self):
        return {
            "shape": (self._length,),
            "typestr": self.dtype.str,
            "data": (self.data, self.read_only),
            "version": 3,
        }

    @property
    def __array_interface__(self):
        if self.location.startswith("cuda"):
            raise AttributeError(f"{self.location} memory has no __array_interface__")
        return self._interface()

    @property
    def __cuda_array_interface__(self):
        if not self.location.startswith("cuda"):
            raise AttributeError(f"{self.location} memory has no __cuda_array_interface__")
        return self._interface()

    def __dlpack__(self, stream=None):
        if self.read_only:
            raise BufferError("a read-only shared array has no DLPack (DLPack has no read-only flag): use numpy.asarray")
        device_type, device_id = self.buffer.__dlpack_device__()
        return _vmm.dlpack_capsule(
            self, self.data, [self._length], _DLPACK_CODES[self.dtype.kind], self.dtype.itemsize * 8, device_type, device_id
        )

    def __dlpack_device__(self):
        return self.buffer.__dlpack_device__()


def open(handle, *, read_only=False):  # noqa: A001 (vmm.open, as the issue names it)
    """Maps the memory of a handle from vmm.share() (sent from another process, or this one):
    a vmm.SharedArray, or for a tensor's (a CuPy array's) handle a torch tensor (a CuPy
    array) of the same dtype, shape and strides over the same memory. What it returns holds
    the mapping, and the sender's lease, until it and every view of it are gone.

    Args:
        read_only: map read-only even where the sender granted writing.

    Raises:
        vmm.InvalidArgumentError: not a handle, a malformed manifest, or descriptors that are
            not the memory it names.
        vmm.OutOfMemoryError, vmm.Error: mapping failed (nothing is left mapped).
    """
    if not isinstance(handle, SharedHandle):
        raise _vmm.InvalidArgumentError(f"handle: expected a vmm.SharedHandle, not {type(handle).__name__}")
    try:
        handle._header()  # the same checks as on the wire (a handle's fields may have been changed)
    except TypeError as error:  # not JSON at all
        raise _vmm.InvalidArgumentError(f"handle: {error}") from None
    fds, lease = (handle.fds[:-1], handle.fds[-1]) if handle.lease else (handle.fds, -1)
    imported = _vmm.ImportedBuffer(handle.manifest, fds, bool(read_only or handle.read_only), lease)
    shared = SharedArray(imported, handle.dtype, handle.length, handle.offset)
    layout = handle.tensor
    if layout is None:
        return shared
    if layout.get("kind") == "cupy":
        return _open_cupy(shared, layout)
    import torch

    raw = torch.from_dlpack(shared)  # uint8 over the storage's bytes; holds the mapping
    return raw.view(getattr(torch, layout["dtype"])).as_strided(
        layout["shape"], layout["stride"], layout["storage_offset"]
    )


def _open_cupy(shared, layout):
    import cupy

    _, device = shared.buffer.__dlpack_device__()
    memory = cupy.cuda.UnownedMemory(shared.data, len(shared), shared, device)  # holds the mapping
    pointer = cupy.cuda.MemoryPointer(memory, layout["offset"])
    return cupy.ndarray(tuple(layout["shape"]), layout["dtype"], pointer, tuple(layout["strides"]))
