"""vmm.torch's resources on OS host memory, without torch, CuPy or a GPU.

The native module's test hook (vmm._vmm.use_host_memory) makes every "device" plain host
memory of the OS provider; allocations go through the functions CuPy's allocator uses
(vmm._vmm.allocate / deallocate), the same path as torch's vmm_alloc.
"""

MIB = 1 << 20


def test_statistics_tags_sleep_wake_and_trim(scenario):
    scenario(
        """
        import ctypes
        from vmm import _vmm
        MIB = 1 << 20
        vmm.torch._configure(max_size=256 * MIB, headroom=0.25)
        assert vmm.torch.devices() == []
        with vmm.torch.tag("weights"):
            assert vmm.torch.current_tag() == vmm.torch.tag_id("weights") == 1
            weights = _vmm.allocate(3 * MIB + 5, 0)
        assert vmm.torch.current_tag() == 0
        with vmm.torch.tag("kv"):
            cache = _vmm.allocate(5 * MIB, 0)
        assert vmm.torch.tag_id("default") == 0 and vmm.torch.tag_id("kv") == 2 and vmm.torch.tag_id(9) == 9
        ctypes.memmove(weights, bytes(range(256)) * 4, 1024)

        stats = vmm.torch.memory_stats()
        assert vmm.torch.devices() == [0]
        assert stats["allocated_bytes.all.current"] == (3 * MIB + 256) + 5 * MIB, stats
        assert stats["active.all.current"] == 2 and stats["allocation.all.allocated"] == 2
        assert stats["reserved_bytes.all.current"] >= stats["allocated_bytes.all.current"]
        assert stats["vmm.page_size"] == 2 * MIB and stats["vmm.asleep"] == 0
        assert stats["vmm.slow_path_ns"] > 0, stats
        assert vmm.torch.memory_allocated() == stats["allocated_bytes.all.current"]
        assert vmm.torch.max_memory_allocated("cuda:0") == stats["allocated_bytes.all.peak"]
        assert vmm.torch.memory_reserved(0) == stats["reserved_bytes.all.current"]
        assert vmm.torch.max_memory_reserved() == stats["reserved_bytes.all.peak"]

        try:
            vmm.torch.wake()
        except vmm.InvalidArgumentError as error:
            assert "sleep() first" in str(error), error
        else:
            raise AssertionError("wake without sleep was accepted")

        vmm.torch.sleep(offload_tags=("weights",))
        assert vmm.torch.asleep() and vmm.torch.memory_reserved() == 0
        try:
            vmm.torch.sleep()
        except vmm.InvalidArgumentError as error:
            assert "asleep already" in str(error), error
        else:
            raise AssertionError("a second sleep was accepted")
        try:
            _vmm.allocate(MIB, 0)
        except vmm.InvalidArgumentError as error:
            assert "asleep" in str(error), error
        else:
            raise AssertionError("an allocation while asleep was accepted")
        _vmm.deallocate(cache, 5 * MIB, 0)  # kept for the wake
        assert vmm.torch.memory_stats()["vmm.frees_deferred"] == 1

        vmm.torch.wake(tags=["weights"])
        assert vmm.torch.asleep()  # "kv" sleeps still
        assert ctypes.string_at(weights, 1024) == bytes(range(256)) * 4
        vmm.torch.wake()
        assert not vmm.torch.asleep()
        stats = vmm.torch.memory_stats()
        assert stats["active.all.current"] == 1 and stats["vmm.bad_deallocations"] == 0, stats
        assert stats["vmm.host_copy_bytes"] == 0, stats

        vmm.torch.sleep(offload_tags=("weights",))
        kept = vmm.torch.memory_stats()["vmm.host_copy_bytes"]
        assert kept >= 3 * MIB + 5, kept
        vmm.torch.wake(keep_host_copies=True)
        assert vmm.torch.memory_stats()["vmm.host_copy_bytes"] == kept
        vmm.torch.trim()
        assert vmm.torch.memory_stats()["vmm.host_copy_bytes"] == 0
        assert ctypes.string_at(weights, 1024) == bytes(range(256)) * 4

        _vmm.deallocate(weights, 3 * MIB + 5, 0)
        vmm.torch.trim()
        assert vmm.torch.memory_reserved() == 0
        vmm.torch.reset_peak_memory_stats()
        assert vmm.torch.max_memory_allocated() == 0
        """
    )


def test_out_of_memory_is_a_memory_error_and_counted(scenario):
    scenario(
        """
        from vmm import _vmm
        vmm.torch._configure(max_size=64 << 20)
        small = _vmm.allocate(1 << 20, 0)
        try:
            _vmm.allocate(1 << 30, 0)
        except MemoryError as error:
            assert isinstance(error, vmm.OutOfMemoryError), type(error)
        else:
            raise AssertionError("1 GiB fit in a resource of 64 MiB")
        assert vmm.torch.memory_stats()["num_ooms"] == 1
        assert vmm.torch.memory_allocated() == 1 << 20  # nothing else changed
        _vmm.deallocate(small, 1 << 20, 0)
        """
    )


def test_bad_arguments_are_refused_naming_them_and_change_nothing(scenario):
    scenario(
        """
        from vmm import _vmm
        import pytest
        checks = [
            (lambda: vmm.torch._configure(headroom=1.5), "headroom"),
            (lambda: vmm.torch._configure(headroom="a lot"), "headroom"),
            (lambda: vmm.torch._configure(max_size=-1), "max_size"),
            (lambda: vmm.torch._configure(release_threshold=2.5), "release_threshold"),
            (lambda: vmm.torch.memory_stats("cpu"), "device"),
            (lambda: vmm.torch.memory_stats(64), "device"),
            (lambda: vmm.torch.memory_stats(-1), "device"),
            (lambda: vmm.torch.tag_id(-1), "tag"),
            (lambda: vmm.torch.tag_id(2 ** 32), "tag"),
            (lambda: vmm.torch.tag_id(1.5), "tag"),
            (lambda: vmm.torch.trim(keep=-5), "keep"),
            (lambda: vmm.torch.sleep(offload_tags=[object()]), "tag"),
            (lambda: _vmm.allocate(16, 99), "device 99"),
            (lambda: _vmm.deallocate(12345, 16, 0), "no vmm resource"),
        ]
        for call, name in checks:
            with pytest.raises(vmm.InvalidArgumentError, match=name):
                call()
        assert vmm.torch.devices() == []  # nothing was made
        ptr = _vmm.allocate(4096, 0)
        with pytest.raises(vmm.InvalidArgumentError, match="before the first allocation"):
            vmm.torch._configure(max_size=1 << 20)
        _vmm.deallocate(ptr, 4096, 0)
        """
    )
