"""vmm_torch's ctypes layer on host memory, without torch, CuPy or a GPU: runs in CI.

The library's test hook makes every "device" plain host memory of the OS provider; this
script then drives the module's functions that need no torch (statistics with torch's
names, tags, sleep and wake with their refusals, trim, last_error) and checks that every
ctypes signature matches the C header. Allocations are made through the C entry point
CuPy's allocator uses. Exits non-zero on the first failed check.

    VMM_TORCH_LIBRARY=build/python/libvmm_torch_allocator.so python3 tests/python/host_memory_check.py
"""

import ctypes
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "python"))
import vmm_torch  # noqa: E402

MIB = 1 << 20


def allocate(lib, size, device=0):
    out = ctypes.c_void_p()
    status = lib.vmm_torch_allocate(device, None, size, ctypes.byref(out))
    assert status == 0, (status, vmm_torch.last_error())
    return out.value


def main():
    lib = vmm_torch._library()
    assert ctypes.CDLL(vmm_torch.library_path()).vmm_torch_testing_use_host_memory() == 0, vmm_torch.last_error()
    for bad in (-0.5, 1.5, float("nan")):
        try:
            vmm_torch._configure(256 * MIB, None, bad)
            raise AssertionError(f"headroom {bad} accepted")
        except vmm_torch.VmmError as error:
            assert "headroom" in str(error), error
    vmm_torch._configure(256 * MIB, None, 0.25)
    assert vmm_torch.devices() == []

    with vmm_torch.tag("weights"):
        assert vmm_torch.current_tag() == vmm_torch.tag_id("weights") == 1
        weights = allocate(lib, 3 * MIB + 5)
    assert vmm_torch.current_tag() == 0
    with vmm_torch.tag("kv"):
        cache = allocate(lib, 5 * MIB)
    assert vmm_torch.tag_id("default") == 0 and vmm_torch.tag_id("kv") == 2 and vmm_torch.tag_id(9) == 9
    ctypes.memmove(weights, bytes(range(256)) * 4, 1024)

    stats = vmm_torch.memory_stats()
    assert vmm_torch.devices() == [0]
    assert stats["allocated_bytes.all.current"] == (3 * MIB + 256) + 5 * MIB, stats
    assert stats["active.all.current"] == 2 and stats["allocation.all.allocated"] == 2
    assert stats["reserved_bytes.all.current"] >= stats["allocated_bytes.all.current"]
    assert stats["vmm.page_size"] == 2 * MIB and stats["vmm.asleep"] == 0
    assert stats["vmm.host_waits"] == 0 == stats["vmm.host_wait_ns"], stats  # host memory has no stream to wait for
    assert stats["vmm.slow_path_ns"] > 0, stats  # the first allocations made pages
    assert vmm_torch.memory_allocated() == stats["allocated_bytes.all.current"]
    assert vmm_torch.max_memory_allocated("cuda:0") == stats["allocated_bytes.all.peak"]
    assert vmm_torch.memory_reserved(0) == stats["reserved_bytes.all.current"]
    assert vmm_torch.max_memory_reserved() == stats["reserved_bytes.all.peak"]

    try:
        vmm_torch.wake()
    except vmm_torch.VmmError as error:
        assert "sleep() first" in str(error), error
    else:
        raise AssertionError("wake without sleep was accepted")

    vmm_torch.sleep(offload_tags=("weights",))
    assert vmm_torch.asleep() and vmm_torch.memory_reserved() == 0
    try:
        vmm_torch.sleep()
    except vmm_torch.VmmError as error:
        assert "asleep already" in str(error), error
    else:
        raise AssertionError("a second sleep was accepted")
    out = ctypes.c_void_p()
    assert lib.vmm_torch_allocate(0, None, MIB, ctypes.byref(out)) == -1 and out.value is None
    assert "asleep" in vmm_torch.last_error()
    lib.vmm_free(cache, 5 * MIB, 0, None)  # kept for the wake
    assert vmm_torch.memory_stats()["vmm.frees_deferred"] == 1

    vmm_torch.wake(tags=["weights"])
    assert vmm_torch.asleep()  # "kv" sleeps still
    assert ctypes.string_at(weights, 1024) == bytes(range(256)) * 4
    vmm_torch.wake()
    assert not vmm_torch.asleep()
    stats = vmm_torch.memory_stats()
    assert stats["active.all.current"] == 1 and stats["vmm.bad_deallocations"] == 0, stats
    assert stats["vmm.host_copy_bytes"] == 0, stats  # given back by the wake

    # A wake that keeps the host copies for the next sleep; trim() gives them back.
    vmm_torch.sleep(offload_tags=("weights",))
    kept = vmm_torch.memory_stats()["vmm.host_copy_bytes"]
    assert kept >= 3 * MIB + 5, kept
    vmm_torch.wake(keep_host_copies=True)
    assert vmm_torch.memory_stats()["vmm.host_copy_bytes"] == kept
    vmm_torch.sleep(offload_tags=("weights",))
    vmm_torch.wake(keep_host_copies=True)
    assert vmm_torch.memory_stats()["vmm.host_copy_bytes"] == kept
    assert ctypes.string_at(weights, 1024) == bytes(range(256)) * 4
    vmm_torch.trim()
    assert vmm_torch.memory_stats()["vmm.host_copy_bytes"] == 0

    lib.vmm_free(weights, 3 * MIB + 5, 0, None)
    vmm_torch.trim()
    assert vmm_torch.memory_reserved() == 0
    vmm_torch.reset_peak_memory_stats()
    assert vmm_torch.max_memory_allocated() == 0

    out = ctypes.c_void_p()
    assert lib.vmm_torch_allocate(0, None, 1 << 30, ctypes.byref(out)) == 1  # past max_size
    assert vmm_torch.memory_stats()["num_ooms"] == 1
    try:
        vmm_torch._configure(MIB, None)
    except vmm_torch.VmmError as error:
        assert "before the first allocation" in str(error), error
    else:
        raise AssertionError("configure after the first allocation was accepted")
    try:
        vmm_torch.tag_id(-1)
    except vmm_torch.VmmError:
        pass
    else:
        raise AssertionError("a negative tag was accepted")
    print("host memory check: ok")


if __name__ == "__main__":
    main()
