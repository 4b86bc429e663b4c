"""vmm's stream-ordered memory resource under PyTorch.

Two ways in, over the same resource per GPU (one vmm::memory_resource per device, in the
package's native module vmm._vmm, which CuPy's allocator (vmm.cupy) shares):

``vmm.torch.use()``
    Every CUDA allocation of the process goes to vmm (torch.cuda.memory.
    change_current_allocator). vmm sees each tensor's own size: no caching allocator sits
    on top, so reserved memory stays close to what is in use. Sleep and wake act on tensors
    by tag. Must run before CUDA is initialized; ``python -m vmm.torch.run script.py`` does
    it for an unmodified program. Settings: keyword arguments, or $VMM_CONF
    (``max_size:40G,headroom:0.0078``; vmm._conf), read strictly when this module is imported.

``torch.cuda.use_mem_pool(vmm.torch.mem_pool())``
    torch's caching allocator stays, and asks vmm for its segments inside the ``with``
    block only. Works at any time, keeps torch.cuda.memory_stats() and torch's graph pools.

Statistics with torch's key names: ``memory_stats()``, ``memory_allocated()``,
``max_memory_allocated()``, ``memory_reserved()``, ``max_memory_reserved()``,
``reset_peak_memory_stats()``; ``trim()`` gives idle memory back to the GPU. Sleep mode:
``with vmm.torch.tag("weights"): ...``, ``sleep(offload_tags=("weights",))``, ``wake()``.
History: ``record_memory_history()``, ``memory_snapshot()`` (torch's snapshot structure, for
memory_viz), ``dump_trace(path)`` (vmm-replay's trace format). See python/README.md.
"""

import contextlib
import gc
import sys
import threading

from .. import _checks, _conf, _vmm
from .._vmm import Error, OutOfMemoryError
from ._history import dump_trace, memory_snapshot, record_memory_history

__all__ = [
    "Error",
    "OutOfMemoryError",
    "library_path",
    "use",
    "is_used",
    "mem_pool",
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
    "record_memory_history",
    "memory_snapshot",
    "dump_trace",
]

# $VMM_CONF, parsed strictly at import: a bad setting fails here, naming it.
_environment_settings = _conf.from_environment()

_lock = threading.RLock()
_use_allocator = None  # the CUDAPluggableAllocator of use(), kept for the process's life
_pool_allocator = None  # the one behind mem_pool(): pools free their segments through it
_configured = False
_tags = {"default": 0}


def library_path():
    """The shared library torch's CUDAPluggableAllocator loads: the package's native module,
    which exports vmm_alloc, vmm_alloc_throwing and vmm_free (python/native/vmm_torch.h)."""
    return _vmm.__file__


def last_error():
    """The latest error message of the C functions torch calls ('' when there was none).

    For failures that surface elsewhere: a NULL under mem_pool(), a refused free, an
    allocation while asleep. One message for the process, the latest.
    """
    return _vmm.last_error()


def _optional_size(value, name):
    return None if value is None else _checks.count(value, name)


def _settings(max_size, release_threshold, headroom, large_page_size):
    """$VMM_CONF's settings, overridden by the keyword arguments given (not None)."""
    settings = dict(_environment_settings)
    sizes = (("max_size", max_size), ("release_threshold", release_threshold), ("large_page_size", large_page_size))
    for name, value in sizes:
        if value is not None:
            settings[name] = _optional_size(value, name)
    if headroom is not None:
        if isinstance(headroom, bool) or not isinstance(headroom, (int, float)):
            raise _vmm.InvalidArgumentError(f"headroom must be a number from 0 to 1, not {type(headroom).__name__}")
        settings["headroom"] = float(headroom)
    return settings


def _configure(max_size=None, release_threshold=None, headroom=None, large_page_size=None):
    global _configured
    given = any(value is not None for value in (max_size, release_threshold, headroom, large_page_size))
    if not given and (_configured or not _environment_settings):
        return  # nothing new: a resource may exist already, and configure() would refuse
    settings = _settings(max_size, release_threshold, headroom, large_page_size)
    release = settings.get("release_threshold")
    _vmm.configure(
        settings.get("max_size") or 0,
        (1 << 64) - 1 if release is None else release,
        settings.get("headroom", 0.0),
        settings.get("large_page_size", 0),
    )
    _configured = True


# ---- PyTorch -------------------------------------------------------------------------------


def _too_late_message(torch, cause=None):
    allocated = ""
    try:
        allocated = f" (torch.cuda.memory_allocated() is {torch.cuda.memory_allocated()} bytes)"
    except Exception:  # another allocator is current: it has no statistics
        pass
    text = (
        "vmm.torch.use() is too late: CUDA is initialized in this process already"
        f"{allocated}, and torch swaps its allocator only before that "
        "(torch.cuda.memory.change_current_allocator: \"Can't swap an already initialized allocator\"). "
        "Call vmm.torch.use() first thing, before any tensor goes to the GPU and before "
        "torch.cuda.init(), current_device(), set_device() or anything that initializes CUDA "
        "(python -m vmm.torch.run script.py does it for a program); or use "
        "torch.cuda.use_mem_pool(vmm.torch.mem_pool()), which works at any time. Nothing was changed."
    )
    if cause is not None:
        text += f" torch said: {cause}"
    return text


def use(*, max_size=None, release_threshold=None, headroom=None, large_page_size=None):
    """Makes vmm PyTorch's CUDA allocator for the whole process (every device).

    Must run before CUDA is initialized. A second call does nothing. PyTorch's own
    statistics functions refuse a pluggable allocator: use this module's. From then on a
    tensor of vmm's memory sent through torch.multiprocessing arrives as a mapping of the
    same memory (vmm.share / vmm.open; its free waits until every receiver let go).

    Args (each None: $VMM_CONF's value, else vmm's default):
        max_size: the most physical memory each device's resource reserves (default: the GPU's).
        release_threshold: reserved bytes above which a free gives idle pages back at once
            (default: keep them for reuse until trim()).
        headroom: the most idle memory each resource learns to keep mapped, as a share of
            its peak use, from 0 to 1 (default 1/128).
        large_page_size: the pages of requests of two of them or more, a power of two up to
            1 GiB (default 32 MiB; 2 MiB, the granularity, turns them off). Larger pages mean
            fewer physical handles for a large tensor: fewer driver calls to map it again
            after layouts change, and to share it with another process (its receiver imports
            and maps each page), for up to a large page more memory at each end of a run of
            large blocks.

    Raises:
        vmm.Error: CUDA is initialized already (the message says what to do instead), or
            mem_pool() was used already. Nothing was changed.
        vmm.InvalidArgumentError: a bad argument (named), or a resource exists already.
    """
    global _use_allocator
    import torch

    with _lock:
        if _use_allocator is not None:
            return
        if _pool_allocator is not None:
            raise Error(
                "vmm.torch.use() after mem_pool(): torch's caching allocator is in use already "
                "(mem_pool() keeps it and asks vmm for segments); use one mode per process. Nothing was changed."
            )
        if torch.cuda.is_initialized():
            raise Error(_too_late_message(torch))
        _configure(max_size, release_threshold, headroom, large_page_size)
        # vmm_alloc_throwing: torch does not check a pluggable allocator's result for NULL
        # here (see vmm_torch.h); a failure must be an exception to reach Python.
        allocator = torch.cuda.memory.CUDAPluggableAllocator(library_path(), "vmm_alloc_throwing", "vmm_free")
        try:
            torch.cuda.memory.change_current_allocator(allocator)
        except RuntimeError as error:
            raise Error(_too_late_message(torch, error)) from error
        _use_allocator = allocator
        _share_through_multiprocessing(torch)


def _open_tensor(handle, requires_grad):
    from .. import _sharing

    tensor = _sharing.open(handle)
    return tensor.requires_grad_(requires_grad) if requires_grad else tensor


def _share_through_multiprocessing(torch):
    """Tensors of vmm's memory travel through torch.multiprocessing (Queue, Pipe, spawn
    arguments) as vmm.share() handles: their pages' descriptors, by SCM_RIGHTS, mapped
    again by the receiver (torch's own CUDA IPC is refused under a pluggable allocator).
    Every other tensor keeps torch's own reduction."""
    from multiprocessing.reduction import ForkingPickler

    from torch.multiprocessing import reductions

    from .. import _sharing

    def reduce(tensor):
        if tensor.is_cuda and _vmm.owns(tensor.device.index, tensor.untyped_storage().data_ptr()):
            return (_open_tensor, (_sharing._share_tensor(tensor.detach(), False), tensor.requires_grad))
        return reductions.reduce_tensor(tensor)

    for kind in (torch.Tensor, torch.nn.parameter.Parameter):
        ForkingPickler.register(kind, reduce)


def is_used():
    """Whether use() made vmm torch's allocator in this process."""
    return _use_allocator is not None


def mem_pool(*, use_on_oom=False):
    """A new torch.cuda.MemPool whose segments come from vmm, for scoped use:

        pool = vmm.torch.mem_pool()
        with torch.cuda.use_mem_pool(pool):
            weights = load()

    torch's caching allocator stays on top: vmm sees segment-sized requests, torch's
    statistics and CUDA graph pools keep working. Works at any time. Keep the pool alive
    while its tensors are; torch.cuda.empty_cache() gives its unused segments back to vmm.

    Raises:
        vmm.Error: use() is in effect (every allocation goes to vmm already).
    """
    global _pool_allocator
    import torch

    with _lock:
        if _use_allocator is not None:
            raise Error(
                "vmm.torch.mem_pool() after use(): every allocation goes to vmm already, and a "
                "MemPool needs torch's caching allocator, which use() replaced"
            )
        if _pool_allocator is None:
            # vmm_alloc returns NULL on failure, which the caching allocator turns into
            # torch.OutOfMemoryError after freeing its cache and trying again.
            _pool_allocator = torch.cuda.memory.CUDAPluggableAllocator(library_path(), "vmm_alloc", "vmm_free")
        if use_on_oom:
            return torch.cuda.MemPool(_pool_allocator.allocator(), use_on_oom=True)
        return torch.cuda.MemPool(_pool_allocator.allocator())


# ---- statistics ------------------------------------------------------------------------------


def _device_index(device, name="device"):
    if device is None:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            return torch.cuda.current_device()
        cupy = sys.modules.get("cupy")
        if cupy is not None:
            return cupy.cuda.runtime.getDevice()
        return 0
    if isinstance(device, int) and not isinstance(device, bool):
        index = device
    elif isinstance(device, str):  # before the attributes below: str has an index() method
        head, _, tail = device.partition(":")
        if head != "cuda" or (tail and not tail.isdigit()):
            raise _vmm.InvalidArgumentError(f"{name} {device!r} is not a CUDA device (\"cuda\" or \"cuda:N\")")
        return int(tail) if tail else _device_index(None)
    elif getattr(device, "type", None) == "cuda":  # torch.device
        index = getattr(device, "index", None)
        return index if isinstance(index, int) else _device_index(None)
    else:
        raise _vmm.InvalidArgumentError(f"{name} {device!r} is not a CUDA device")
    if not 0 <= index < _vmm.max_devices:
        raise _vmm.InvalidArgumentError(f"{name} {index} is out of range [0, {_vmm.max_devices})")
    return index


def memory_stats(device=None):
    """The resource's statistics, with torch.cuda.memory_stats()'s key names where one exists.

    ``allocated_bytes.all.{current,peak}``: bytes handed out (each rounded up to 256);
    ``reserved_bytes.all.{current,peak}``: physical memory mapped or kept spare;
    ``active*`` and ``allocation.all.*``: live allocations; ``segment.all.current``: vmm's
    address ranges (arenas); ``num_ooms``; ``inactive_split_bytes.all.current``: reserved but
    not handed out. vmm's own figures are under ``vmm.``; ``vmm.held_for_receivers.*``: frees
    of tensors shared with other processes, held until those let go (vmm.share).
    """
    index = _device_index(device)
    s = _vmm.statistics(index)
    held_frees, held_bytes = _vmm.held_for_receivers(index)
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
        "vmm.asleep": int(s.asleep),
        "vmm.exportable": int(s.exportable),
        "vmm.held_for_receivers.frees": held_frees,
        "vmm.held_for_receivers.bytes": held_bytes,
    }


def memory_allocated(device=None):
    """Bytes handed out now (torch.cuda.memory_allocated's meaning)."""
    return _vmm.statistics(_device_index(device)).used_current


def max_memory_allocated(device=None):
    """The most bytes handed out at once since the start or reset_peak_memory_stats()."""
    return _vmm.statistics(_device_index(device)).used_high


def memory_reserved(device=None):
    """Physical bytes the resource holds now (mapped or spare)."""
    return _vmm.statistics(_device_index(device)).reserved_current


def max_memory_reserved(device=None):
    """The most physical bytes held at once since the start or reset_peak_memory_stats()."""
    return _vmm.statistics(_device_index(device)).reserved_high


def reset_peak_memory_stats(device=None):
    """Sets the peaks (allocated and reserved) to the current values."""
    _vmm.reset_peak(_device_index(device))


def devices():
    """The devices that have a vmm resource, ascending."""
    return _vmm.devices()


def _torch_in_use():
    torch = sys.modules.get("torch")
    return torch if torch is not None and torch.cuda.is_initialized() else None


def trim(device=None, keep=0):
    """Gives idle memory back to the GPU, keeping at most ``keep`` bytes reserved, and host
    copies that wake(keep_host_copies=True) kept back to the system.

    Like torch.cuda.empty_cache(), it waits for the device first. Under mem_pool(),
    torch.cuda.empty_cache() runs first, so that torch hands its unused segments back to
    vmm. device None: every device with a resource.
    """
    keep = _optional_size(keep, "keep")
    targets = devices() if device is None else [_device_index(device)]
    torch = _torch_in_use()
    if torch is not None and _pool_allocator is not None:
        torch.cuda.empty_cache()
    for index in targets:
        _vmm.trim(index, keep)


# ---- tags, sleep and wake ----------------------------------------------------------------------


def tag_id(name):
    """The small integer of a tag: "default" is 0, other names get 1, 2, ... in first-use order.

    An int in [0, 2**32) is its own id.

    Raises:
        vmm.InvalidArgumentError: an int out of range, or neither a str nor an int.
    """
    if isinstance(name, int) and not isinstance(name, bool):
        if not 0 <= name < 2**32:
            raise _vmm.InvalidArgumentError(f"tag {name} is not in [0, 2**32)")
        return name
    if not isinstance(name, str):
        raise _vmm.InvalidArgumentError(f"a tag is a str or an int, not {type(name).__name__}")
    with _lock:
        if name not in _tags:
            _tags[name] = max(_tags.values()) + 1
        return _tags[name]


def current_tag():
    """The calling thread's tag id (0, "default", unless inside tag())."""
    return _vmm.current_tag()


@contextlib.contextmanager
def tag(name):
    """Tags the allocations the calling thread makes inside the block (sleep and wake act by tag).

        with vmm.torch.tag("weights"):
            model = build().cuda()

    Per thread, like torch.cuda.use_mem_pool: autograd's backward threads keep their own tag.
    """
    previous = _vmm.set_tag(tag_id(name))
    try:
        yield
    finally:
        _vmm.set_tag(previous)


def _tag_ids(tags, default, name):
    if tags is None:
        tags = default
    elif isinstance(tags, (str, int)):
        tags = (tags,)
    try:
        return [tag_id(each) for each in tags]
    except TypeError:
        raise _vmm.InvalidArgumentError(f"{name} must be a tag or an iterable of tags") from None


def asleep(device=None):
    """Whether some tag of the device sleeps."""
    return _vmm.asleep(_device_index(device))


def sleep(offload_tags=None, device=None, collect_garbage=True):
    """Puts vmm's resources to sleep, as vLLM's sleep mode does.

    The allocations tagged with one of ``offload_tags`` (default: ("default",), every
    untagged allocation) are copied to pinned host memory; the others are dropped (their
    contents are lost, their addresses stay theirs); every page goes back to the GPU.
    Tensors keep their pointers. While asleep an allocation on the device fails with a
    clear message and frees wait for the wake.

    Before sleeping: gc.collect() unless ``collect_garbage`` is False (so that unreachable
    tensors are freed, not saved), and with torch, torch.cuda.synchronize() of each device
    (a pluggable allocator does not see Tensor.record_stream), and under mem_pool()
    torch.cuda.empty_cache().

    Raises:
        vmm.InvalidArgumentError: a device is asleep already, or a bad argument (named).
        vmm.OutOfMemoryError: the host copies could not be had.
        The devices put to sleep by this call are woken again: nothing changed.
    """
    offload = _tag_ids(offload_tags, ("default",), "offload_tags")
    targets = devices() if device is None else [_device_index(device)]
    if collect_garbage:
        gc.collect()
    torch = _torch_in_use()
    if torch is not None:
        if _pool_allocator is not None:
            torch.cuda.empty_cache()
        for index in targets:
            torch.cuda.synchronize(index)
    done = []
    try:
        for index in targets:
            _vmm.sleep(index, offload)
            done.append(index)
    except BaseException:
        for other in done:
            _vmm.wake(other, [], False)
        raise


def wake(tags=None, device=None, keep_host_copies=False):
    """Wakes the given tags (None: all): fresh memory at the same addresses, saved bytes back.

    Once every tag of a device is awake it allocates again, and the frees that arrived
    during the sleep are done. The pinned host copies are given back, or, with
    ``keep_host_copies``, kept for the next sleep (trim() gives them back;
    ``memory_stats()["vmm.host_copy_bytes"]`` counts them).

    Raises:
        vmm.InvalidArgumentError: no device (or not ``device``) is asleep, or a bad argument.
        vmm.OutOfMemoryError: the memory is not there (another process holds it); those
            tags still sleep; nothing was lost.
    """
    waking = _tag_ids(tags, (), "tags")
    targets = devices() if device is None else [_device_index(device)]
    sleeping = [index for index in targets if _vmm.asleep(index)]
    if not sleeping:
        where = "no device" if device is None else f"gpu {targets[0]}"
        raise _vmm.InvalidArgumentError(f"vmm.torch.wake(): {where} is asleep (sleep() first); nothing changed")
    for index in sleeping:
        _vmm.wake(index, waking, bool(keep_host_copies))
