"""vmm's stream-ordered memory resource under PyTorch and CuPy.

Two ways to put vmm under PyTorch, and one for CuPy, all over the same resource per GPU
(one vmm::memory_resource per device, in libvmm_torch_allocator.so):

``vmm_torch.use()``
    Every CUDA allocation of the process goes to vmm (torch.cuda.memory.
    change_current_allocator). vmm sees each tensor's own size: no caching allocator sits
    on top, so reserved memory stays close to what is in use (pages are mapped only under
    live bytes; idle pages are moved to where they are needed instead of creating more).
    Sleep and wake act on tensors by tag. Must run before CUDA is initialized.

``torch.cuda.use_mem_pool(vmm_torch.mem_pool())``
    torch's caching allocator stays, and asks vmm for its segments (2 MiB, 20 MiB or the
    rounded size of large tensors) inside the ``with`` block only. Works at any time, keeps
    torch.cuda.memory_stats() and torch's graph pools; vmm sees segments, not tensors.

``vmm_torch.use_cupy()``
    cupy.cuda.set_allocator with memory from the same resources: torch and CuPy share one
    resource per GPU in one process.

Statistics with torch's key names: ``memory_stats()``, ``memory_allocated()``,
``max_memory_allocated()``, ``memory_reserved()``, ``max_memory_reserved()``,
``reset_peak_memory_stats()``; ``trim()`` gives idle memory back to the GPU. Sleep mode
(what vLLM's CuMemAllocator does): ``with vmm_torch.tag("weights"): ...`` labels the
allocations made inside; ``sleep(offload_tags=("weights",))`` copies those to pinned host
memory, drops the rest and gives every page back to the GPU; ``wake()`` maps fresh memory
at the same addresses and restores the saved bytes, so every tensor, pointer and captured
CUDA graph stays valid. ``last_error()`` is the latest message of the C layer.

The library is found at $VMM_TORCH_LIBRARY, next to this file, or in <repo>/build/python/
(``cmake --build build --target vmm_torch_allocator``). See python/README.md.
"""

import contextlib
import ctypes
import gc
import glob
import os
import sys
import threading
import weakref

__all__ = [
    "VmmError",
    "OutOfMemoryError",
    "library_path",
    "use",
    "is_used",
    "mem_pool",
    "use_cupy",
    "memory_stats",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "reset_peak_memory_stats",
    "trim",
    "tag",
    "tag_id",
    "current_tag",
    "sleep",
    "wake",
    "asleep",
    "devices",
    "last_error",
]

_LIBRARY_NAME = "libvmm_torch_allocator.so"
_SIZE_MAX = ctypes.c_size_t(-1).value


class VmmError(RuntimeError):
    """A vmm_torch call failed or was refused; nothing was changed. The message says why."""


class OutOfMemoryError(VmmError, MemoryError):
    """vmm could not have the memory (a wake, or a CuPy allocation: see last_error())."""


class _Statistics(ctypes.Structure):
    # vmm_torch_statistics of vmm_torch.h, field for field.
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "reserved_current",
            "reserved_high",
            "used_current",
            "used_high",
            "allocations",
            "allocations_total",
            "segments",
            "handles",
            "largest_free_block",
            "pages_stitched",
            "pages_created",
            "pages_released",
            "host_waits",
            "slow_path_ns",
            "host_wait_ns",
            "bad_deallocations",
            "out_of_memory",
            "failed",
            "frees_deferred",
            "host_copy_bytes",
            "page_size",
        )
    ] + [("asleep", ctypes.c_uint32), ("exportable", ctypes.c_uint32)]


_lock = threading.RLock()
_library_handle = None
_library_file = None
_use_allocator = None  # the CUDAPluggableAllocator of use(), kept for the process's life
_pool_allocator = None  # the one behind mem_pool(): pools free their segments through it
_cupy_in_use = False
_tags = {"default": 0}


# ---- the library -------------------------------------------------------------------------


def library_path():
    """The path of libvmm_torch_allocator.so that this module loads (or would load).

    Raises:
        VmmError: it is nowhere this module looks.
    """
    explicit = os.environ.get("VMM_TORCH_LIBRARY")
    if explicit:
        if not os.path.isfile(explicit):
            raise VmmError(f"VMM_TORCH_LIBRARY={explicit!r} is not a file")
        return os.path.abspath(explicit)
    here = os.path.dirname(os.path.abspath(__file__))
    repository = os.path.dirname(os.path.dirname(here))
    candidates = [os.path.join(here, _LIBRARY_NAME), os.path.join(repository, "build", "python", _LIBRARY_NAME)]
    # Other build folders, but not the sanitizer builds (their library needs the sanitizer
    # runtime loaded first, which a Python interpreter does not have).
    for folder in sorted(glob.glob(os.path.join(repository, "build*", "python"))):
        if "asan" not in folder and "tsan" not in folder:
            candidates.append(os.path.join(folder, _LIBRARY_NAME))
    for candidate in candidates:
        if os.path.isfile(candidate):
            return candidate
    raise VmmError(
        f"{_LIBRARY_NAME} not found; build it (cmake -S . -B build && cmake --build build "
        f"--target vmm_torch_allocator) or set VMM_TORCH_LIBRARY. Looked at: {', '.join(candidates)}"
    )


def _library():
    global _library_handle, _library_file
    with _lock:
        if _library_handle is not None:
            return _library_handle
        path = library_path()
        lib = ctypes.CDLL(path)
        c_int, c_size_t, c_void_p, c_uint32 = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_uint32
        signatures = {
            "vmm_free": (None, [c_void_p, c_size_t, c_int, c_void_p]),
            "vmm_torch_allocate": (c_int, [c_int, c_void_p, c_size_t, ctypes.POINTER(c_void_p)]),
            "vmm_torch_configure": (c_int, [c_size_t, c_size_t, ctypes.c_double]),
            "vmm_torch_set_tag": (c_uint32, [c_uint32]),
            "vmm_torch_tag": (c_uint32, []),
            "vmm_torch_statistics_of": (c_int, [c_int, ctypes.POINTER(_Statistics)]),
            "vmm_torch_reset_peak": (c_int, [c_int]),
            "vmm_torch_trim": (c_int, [c_int, c_size_t]),
            "vmm_torch_sleep": (c_int, [c_int, ctypes.POINTER(c_uint32), c_size_t]),
            "vmm_torch_wake": (c_int, [c_int, ctypes.POINTER(c_uint32), c_size_t, c_int]),
            "vmm_torch_asleep": (c_int, [c_int]),
            "vmm_torch_devices": (c_size_t, [ctypes.POINTER(c_int), c_size_t]),
            "vmm_torch_last_error": (c_size_t, [ctypes.c_char_p, c_size_t]),
            "vmm_torch_clear_last_error": (None, []),
        }
        for name, (result, arguments) in signatures.items():
            function = getattr(lib, name)
            function.restype = result
            function.argtypes = arguments
        _library_handle, _library_file = lib, path
        return lib


def last_error():
    """The latest error message of the C layer ('' when there was none).

    One message for the process, the latest: torch allocates on its autograd threads too.
    """
    lib = _library()
    size = lib.vmm_torch_last_error(None, 0)
    if size == 0:
        return ""
    buffer = ctypes.create_string_buffer(size + 1)
    lib.vmm_torch_last_error(buffer, size + 1)
    return buffer.value.decode("utf-8", "replace")


def _check(status, what):
    if status == 0:
        return
    message = f"{what}: {last_error()}"
    if status == 1:
        raise OutOfMemoryError(message)
    raise VmmError(message)


def _configure(max_size, release_threshold, headroom=None):
    if max_size is None and release_threshold is None and headroom is None:
        return
    lib = _library()
    _check(
        lib.vmm_torch_configure(
            0 if max_size is None else int(max_size),
            _SIZE_MAX if release_threshold is None else int(release_threshold),
            0.0 if headroom is None else float(headroom),
        ),
        "vmm_torch: max_size, release_threshold and headroom must be set before the first allocation",
    )


# ---- PyTorch -------------------------------------------------------------------------------


def _too_late_message(torch, cause=None):
    allocated = ""
    try:
        allocated = f" (torch.cuda.memory_allocated() is {torch.cuda.memory_allocated()} bytes)"
    except Exception:  # another allocator is current: it has no statistics
        pass
    text = (
        "vmm_torch.use() is too late: CUDA is initialized in this process already"
        f"{allocated}, and torch swaps its allocator only before that "
        "(torch.cuda.memory.change_current_allocator: \"Can't swap an already initialized allocator\"). "
        "Call vmm_torch.use() first thing, before any tensor goes to the GPU and before "
        "torch.cuda.init(), current_device(), set_device() or anything that initializes CUDA; or use "
        "torch.cuda.use_mem_pool(vmm_torch.mem_pool()), which works at any time. Nothing was changed."
    )
    if cause is not None:
        text += f" torch said: {cause}"
    return text


def use(*, max_size=None, release_threshold=None, headroom=None):
    """Makes vmm PyTorch's CUDA allocator for the whole process (every device).

    Must run before CUDA is initialized. A second call does nothing. PyTorch's own
    statistics functions refuse a pluggable allocator: use this module's.

    Args:
        max_size: the most physical memory each device's resource reserves (None: the GPU's).
        release_threshold: reserved bytes above which a free gives idle pages back at once
            (None: keep them for reuse until trim()).
        headroom: the most idle memory each resource learns to keep mapped, as a share of
            its peak use, from 0 to 1 (None: 1/128). More is faster where shapes change
            every step (fewer pages moved) and reserves more; see
            vmm::memory_resource_properties::headroom.

    Raises:
        VmmError: CUDA is initialized already (the message says what to do instead), or
            mem_pool() was used already, or the library is missing. Nothing was changed.
    """
    global _use_allocator
    import torch

    with _lock:
        if _use_allocator is not None:
            return
        if _pool_allocator is not None:
            raise VmmError(
                "vmm_torch.use() after mem_pool(): torch's caching allocator is in use already "
                "(mem_pool() keeps it and asks vmm for segments); use one mode per process. Nothing was changed."
            )
        if torch.cuda.is_initialized():
            raise VmmError(_too_late_message(torch))
        path = library_path()
        _configure(max_size, release_threshold, headroom)
        # vmm_alloc_throwing: torch does not check a pluggable allocator's result for NULL
        # here (see vmm_torch.h); a failure must be an exception to reach Python.
        allocator = torch.cuda.memory.CUDAPluggableAllocator(path, "vmm_alloc_throwing", "vmm_free")
        try:
            torch.cuda.memory.change_current_allocator(allocator)
        except RuntimeError as error:
            raise VmmError(_too_late_message(torch, error)) from error
        _use_allocator = allocator


def is_used():
    """Whether use() made vmm torch's allocator in this process."""
    return _use_allocator is not None


def mem_pool(*, use_on_oom=False):
    """A new torch.cuda.MemPool whose segments come from vmm, for scoped use:

        pool = vmm_torch.mem_pool()
        with torch.cuda.use_mem_pool(pool):
            weights = load()

    torch's caching allocator stays on top: vmm sees segment-sized requests, torch's
    statistics (torch.cuda.memory_stats) and CUDA graph pools keep working. Works at any
    time. Allocations inside ``vmm_torch.tag(...)`` tag the segments made there: for sleep
    and wake by tag, give each tag a pool of its own. Keep the pool alive while its tensors
    are; torch.cuda.empty_cache() gives its unused segments back to vmm.

    Raises:
        VmmError: use() is in effect (every allocation goes to vmm already).
    """
    global _pool_allocator
    import torch

    with _lock:
        if _use_allocator is not None:
            raise VmmError(
                "vmm_torch.mem_pool() after use(): every allocation goes to vmm already, and a "
                "MemPool needs torch's caching allocator, which use() replaced"
            )
        if _pool_allocator is None:
            # vmm_alloc returns NULL on failure, which the caching allocator turns into
            # torch.OutOfMemoryError after freeing its cache and trying again.
            _pool_allocator = torch.cuda.memory.CUDAPluggableAllocator(library_path(), "vmm_alloc", "vmm_free")
        _library()
        if use_on_oom:
            return torch.cuda.MemPool(_pool_allocator.allocator(), use_on_oom=True)
        return torch.cuda.MemPool(_pool_allocator.allocator())


# ---- CuPy ------------------------------------------------------------------------------------


class _CupyBlock:
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
            _library_handle.vmm_free(self.ptr, self.size, self.device, stream_ptr)
        except Exception:  # the interpreter is shutting down: the process frees everything
            pass


def _cupy_malloc(nbytes):
    import cupy

    device = cupy.cuda.runtime.getDevice()
    if nbytes == 0:
        return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(0, 0, None, device), 0)
    lib = _library_handle
    stream = cupy.cuda.get_current_stream()
    out = ctypes.c_void_p()
    status = lib.vmm_torch_allocate(device, stream.ptr, nbytes, ctypes.byref(out))
    if status == 1:
        raise cupy.cuda.memory.OutOfMemoryError(nbytes, memory_allocated(device))
    if status != 0:
        raise VmmError(f"vmm_torch: CuPy allocation of {nbytes} bytes on gpu {device}: {last_error()}")
    owner = _CupyBlock(out.value, nbytes, device, stream)
    memory = cupy.cuda.UnownedMemory(out.value, nbytes, owner, device)
    return cupy.cuda.MemoryPointer(memory, 0)


def use_cupy(*, max_size=None, release_threshold=None, headroom=None):
    """Makes vmm CuPy's device allocator (cupy.cuda.set_allocator) on every device.

    CuPy arrays then come from the same resource per GPU as PyTorch's tensors (after use(),
    or inside a mem_pool()), and count in the same statistics. Frees are stream-ordered on
    the stream each array was allocated on. A second call does nothing. max_size,
    release_threshold and headroom: as for use().
    """
    global _cupy_in_use
    import cupy

    with _lock:
        if _cupy_in_use:
            return
        _library()
        _configure(max_size, release_threshold, headroom)
        cupy.cuda.set_allocator(_cupy_malloc)
        _cupy_in_use = True


# ---- statistics ------------------------------------------------------------------------------


def _device_index(device):
    if device is None:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            return torch.cuda.current_device()
        cupy = sys.modules.get("cupy")
        if cupy is not None:
            return cupy.cuda.runtime.getDevice()
        return 0
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    if isinstance(device, str):  # before the attributes below: str has an index() method
        head, _, tail = device.partition(":")
        if head == "cuda":
            return int(tail) if tail else _device_index(None)
    elif getattr(device, "type", None) == "cuda":  # torch.device
        index = getattr(device, "index", None)
        return index if isinstance(index, int) else _device_index(None)
    raise VmmError(f"vmm_torch: {device!r} is not a CUDA device")


def _statistics(device):
    stats = _Statistics()
    _check(_library().vmm_torch_statistics_of(device, ctypes.byref(stats)), f"vmm_torch: statistics of gpu {device}")
    return stats


def memory_stats(device=None):
    """The resource's statistics, with torch.cuda.memory_stats()'s key names where one exists.

    ``allocated_bytes.all.{current,peak}``: bytes handed out (each rounded up to 256);
    ``reserved_bytes.all.{current,peak}``: physical memory mapped or kept spare;
    ``active*`` and ``allocation.all.*``: live allocations; ``segment.all.current``: vmm's
    address ranges (arenas); ``num_ooms``; ``inactive_split_bytes.all.current``: reserved but
    not handed out. vmm's own figures are under ``vmm.``. Under mem_pool(), vmm's
    "allocations" are torch's segments: torch.cuda.memory_stats() has the tensors.
    """
    index = _device_index(device)
    s = _statistics(index)
    return {
        "allocated_bytes.all.current": s.used_current,
        "allocated_bytes.all.peak": s.used_high,
        "active_bytes.all.current": s.used_current,
        "active_bytes.all.peak": s.used_high,
        "reserved_bytes.all.current": s.reserved_current,
        "reserved_bytes.all.peak": s.reserved_high,
        "inactive_split_bytes.all.current": s.reserved_current - min(s.reserved_current, s.used_current),
        "active.all.current": s.allocations,
        "allocation.all.current": s.allocations,
        "allocation.all.allocated": s.allocations_total,
        "segment.all.current": s.segments,
        "num_ooms": s.out_of_memory,
        "num_device_alloc": s.pages_created,
        "num_device_free": s.pages_released,
        "vmm.handles": s.handles,
        "vmm.page_size": s.page_size,
        "vmm.largest_free_block": s.largest_free_block,
        "vmm.pages_stitched": s.pages_stitched,
        "vmm.pages_created": s.pages_created,
        "vmm.pages_released": s.pages_released,
        "vmm.host_waits": s.host_waits,
        "vmm.slow_path_ns": s.slow_path_ns,
        "vmm.host_wait_ns": s.host_wait_ns,
        "vmm.bad_deallocations": s.bad_deallocations,
        "vmm.failed_allocations": s.failed,
        "vmm.frees_deferred": s.frees_deferred,
        "vmm.host_copy_bytes": s.host_copy_bytes,
        "vmm.asleep": s.asleep,
        "vmm.exportable": s.exportable,
    }


def memory_allocated(device=None):
    """Bytes handed out now (torch.cuda.memory_allocated's meaning)."""
    return _statistics(_device_index(device)).used_current


def max_memory_allocated(device=None):
    """The most bytes handed out at once since the start or reset_peak_memory_stats()."""
    return _statistics(_device_index(device)).used_high


def memory_reserved(device=None):
    """Physical bytes the resource holds now (mapped or spare)."""
    return _statistics(_device_index(device)).reserved_current


def max_memory_reserved(device=None):
    """The most physical bytes held at once since the start or reset_peak_memory_stats()."""
    return _statistics(_device_index(device)).reserved_high


def reset_peak_memory_stats(device=None):
    """Sets the peaks (allocated and reserved) to the current values."""
    index = _device_index(device)
    _check(_library().vmm_torch_reset_peak(index), f"vmm_torch: reset_peak_memory_stats(gpu {index})")


def devices():
    """The devices that have a vmm resource, ascending."""
    lib = _library()
    count = lib.vmm_torch_devices(None, 0)
    array = (ctypes.c_int * max(count, 1))()
    count = lib.vmm_torch_devices(array, count)
    return [array[i] for i in range(count)]


def _torch_in_use():
    torch = sys.modules.get("torch")
    return torch if torch is not None and torch.cuda.is_initialized() else None


def trim(device=None, keep=0):
    """Gives idle memory back to the GPU, keeping at most ``keep`` bytes reserved, and host
    copies that wake(keep_host_copies=True) kept back to the system.

    Like torch.cuda.empty_cache(), it waits for the device first: what was freed on any
    stream can go only once the work before the free is done.

    Under mem_pool(), torch.cuda.empty_cache() runs first, so that torch hands its unused
    segments back to vmm. device None: every device with a resource.
    """
    torch = _torch_in_use()
    if torch is not None and _pool_allocator is not None:
        torch.cuda.empty_cache()
    targets = devices() if device is None else [_device_index(device)]
    for index in targets:
        _check(_library().vmm_torch_trim(index, int(keep)), f"vmm_torch: trim(gpu {index})")


# ---- tags, sleep and wake ----------------------------------------------------------------------


def tag_id(name):
    """The small integer of a tag: "default" is 0, other names get 1, 2, ... in first-use order.

    An int in [0, 2**32) is its own id.
    """
    if isinstance(name, int) and not isinstance(name, bool):
        if not 0 <= name < 2**32:
            raise VmmError(f"vmm_torch: tag {name} is not in [0, 2**32)")
        return name
    if not isinstance(name, str):
        raise VmmError(f"vmm_torch: a tag is a str or an int, not {type(name).__name__}")
    with _lock:
        if name not in _tags:
            _tags[name] = max(_tags.values()) + 1
        return _tags[name]


def current_tag():
    """The calling thread's tag id (0, "default", unless inside tag())."""
    return _library().vmm_torch_tag()


@contextlib.contextmanager
def tag(name):
    """Tags the allocations the calling thread makes inside the block (sleep and wake act by tag).

        with vmm_torch.tag("weights"):
            model = build().cuda()

    Per thread, like torch.cuda.use_mem_pool: autograd's backward threads keep their own tag.
    """
    lib = _library()
    previous = lib.vmm_torch_set_tag(tag_id(name))
    try:
        yield
    finally:
        lib.vmm_torch_set_tag(previous)


def _tag_array(names):
    ids = [tag_id(name) for name in names]
    return (ctypes.c_uint32 * max(len(ids), 1))(*ids), len(ids)


def _normalize_tags(tags, default):
    if tags is None:
        return default
    if isinstance(tags, (str, int)):
        return (tags,)
    return tuple(tags)


def asleep(device=None):
    """Whether some tag of the device sleeps."""
    return bool(_library().vmm_torch_asleep(_device_index(device)))


def sleep(offload_tags=None, device=None, collect_garbage=True):
    """Puts vmm's resources to sleep, as vLLM's sleep mode does.

    The allocations tagged with one of ``offload_tags`` (default: ("default",), every
    untagged allocation) are copied to pinned host memory; the others are dropped (their
    contents are lost, their addresses stay theirs); every page goes back to the GPU, for
    other processes. Tensors keep their pointers. While asleep an allocation on the device
    fails with a clear message and frees wait for the wake.

    Before sleeping: gc.collect() unless ``collect_garbage`` is False (so that unreachable
    tensors are freed, not saved; in a process with torch and transformers loaded it can cost
    about as much as the sleep itself: docs/design/memory_resource.md, "Sleep and wake"), and
    with torch, torch.cuda.synchronize() of each device (a pluggable allocator does not see
    Tensor.record_stream, so work of other streams may still use the memory), and under
    mem_pool() torch.cuda.empty_cache(). Don't allocate into a vmm mem_pool() while asleep:
    torch's cache on top may hand out a cached block of a segment whose pages are gone.

    Args:
        offload_tags: tag names or ids to keep; () keeps nothing.
        device: one device, or None for every device with a resource.
        collect_garbage: False skips the gc.collect(): tensors that only reference cycles
            keep alive are then saved or dropped with the rest, and freed at the wake.

    Raises:
        VmmError: a device is asleep already, or the host copies could not be had. The
            devices put to sleep by this call are woken again: nothing changed.
    """
    offload, count = _tag_array(_normalize_tags(offload_tags, ("default",)))
    if collect_garbage:
        gc.collect()
    targets = devices() if device is None else [_device_index(device)]
    torch = _torch_in_use()
    if torch is not None:
        if _pool_allocator is not None:
            torch.cuda.empty_cache()
        for index in targets:
            torch.cuda.synchronize(index)
    lib = _library()
    done = []
    for index in targets:
        status = lib.vmm_torch_sleep(index, offload, count)
        if status != 0:
            message = f"vmm_torch.sleep(gpu {index}): {last_error()}"
            for other in done:
                lib.vmm_torch_wake(other, None, 0, 0)
            raise VmmError(message)
        done.append(index)


def wake(tags=None, device=None, keep_host_copies=False):
    """Wakes the given tags (None: all): fresh memory at the same addresses, saved bytes back.

    Once every tag of a device is awake it allocates again, and the frees that arrived
    during the sleep are done. The pinned host copies are given back on a thread of their
    own right after (the next sleep waits for it), or, with ``keep_host_copies``, kept for
    the next sleep, which then only copies: for a program that sleeps and wakes in a loop
    (making fresh host memory ready is most of a sleep's time). trim() gives kept copies
    back; ``memory_stats()["vmm.host_copy_bytes"]`` counts them.

    Raises:
        VmmError: no device (or not ``device``) is asleep: wake without sleep.
        OutOfMemoryError: the memory is not there (another process holds it); the message
            says how much was missing. Those tags still sleep; nothing was lost.
    """
    names = _normalize_tags(tags, ())
    waking, count = _tag_array(names)
    lib = _library()
    targets = devices() if device is None else [_device_index(device)]
    sleeping = [index for index in targets if lib.vmm_torch_asleep(index)]
    if not sleeping:
        where = "no device" if device is None else f"gpu {targets[0]}"
        raise VmmError(f"vmm_torch.wake(): {where} is asleep (sleep() first); nothing changed")
    for index in sleeping:
        _check(lib.vmm_torch_wake(index, waking, count, 1 if keep_host_copies else 0), f"vmm_torch.wake(gpu {index})")
