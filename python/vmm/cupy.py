"""vmm's memory resource as CuPy's allocator, over the same resource per GPU as vmm.torch.

    import vmm.cupy
    vmm.cupy.use()        # cupy.cuda.set_allocator: arrays from vmm, freed in stream order

torch and CuPy share one resource per GPU in one process: ``torch.as_tensor(array)`` and
``cupy.asarray(tensor)`` stay zero-copy; the statistics are vmm.torch.memory_stats().
"""

import threading
import weakref

from . import _vmm
from . import torch as _vmm_torch

__all__ = ["use", "is_used"]

_lock = threading.Lock()
_in_use = False


class _Block:
    """Owns one vmm allocation behind a CuPy array; frees it in stream order when CuPy drops it.

    The free goes on the stream the memory was allocated on (CuPy's current stream then, as
    CuPy's own pool and PyTorch do), or on the current stream if that one is gone.
    """

    __slots__ = ("ptr", "size", "device", "stream", "stream_ptr", "__weakref__")

    def __init__(self, ptr, size, device, stream):
        self.ptr = ptr
        self.size = size
        self.device = device
        self.stream_ptr = stream.ptr
        try:
            self.stream = weakref.ref(stream)
        except TypeError:  # a stream object without weak references: keep it
            self.stream = lambda stream=stream: stream

    def __del__(self):
        try:
            stream_ptr = self.stream_ptr
            if self.stream() is None:
                import cupy

                stream_ptr = cupy.cuda.get_current_stream().ptr
            _vmm.deallocate(self.ptr, self.size, self.device, stream_ptr)
        except Exception:  # the interpreter is shutting down: the process frees everything
            pass


def _malloc(nbytes):
    import cupy

    device = cupy.cuda.runtime.getDevice()
    if nbytes == 0:
        return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(0, 0, None, device), 0)
    stream = cupy.cuda.get_current_stream()
    try:
        ptr = _vmm.allocate(nbytes, device, stream.ptr)
    except _vmm.OutOfMemoryError:
        raise cupy.cuda.memory.OutOfMemoryError(nbytes, _vmm.statistics(device).used_current) from None
    owner = _Block(ptr, nbytes, device, stream)
    return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(ptr, nbytes, owner, device), 0)


def use(*, max_size=None, release_threshold=None, headroom=None, large_page_size=None):
    """Makes vmm CuPy's device allocator (cupy.cuda.set_allocator) on every device.

    A second call does nothing. Settings as vmm.torch.use() (and $VMM_CONF).

    Raises:
        vmm.InvalidArgumentError: a bad setting, or settings after a resource was made.
    """
    global _in_use
    import cupy

    with _lock:
        if _in_use:
            return
        _vmm_torch._configure(max_size, release_threshold, headroom, large_page_size)
        cupy.cuda.set_allocator(_malloc)
        _in_use = True


def is_used():
    """Whether use() made vmm CuPy's allocator in this process."""
    return _in_use
