"""vmm.torch and vmm.cupy with PyTorch and CuPy on a GPU.

Every test runs its scenario in a fresh interpreter: vmm.torch.use() must come before CUDA
is initialized and holds for the whole process, and an out-of-memory or a fault must not
poison the next test. The scenario prints "ok" at its end; a failed assertion there fails
the test with the scenario's output.

Skipped with the reason where torch (or, for its tests, CuPy) is missing or where no GPU is
visible. The package is the installed one (tests/python/pip_install_check.sh).

    python3 -m pytest -v tests/python
"""

import os
import subprocess
import sys
import textwrap

import pytest
from conftest import run_scenario

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no GPU visible to PyTorch", allow_module_level=True)

PRELUDE = """
import gc, sys
import torch
import vmm, vmm.torch, vmm.cupy
"""


def run(code, timeout=600):
    """Runs `code` (after PRELUDE) in a new interpreter; returns its output, which ends in ok."""
    return run_scenario(code, timeout=timeout, prelude=PRELUDE).stdout


def test_tensors_are_allocated_by_vmm_and_the_statistics_move():
    run(
        """
        vmm.torch.use()
        vmm.torch.use()  # a second call does nothing
        assert vmm.torch.is_used()
        x = torch.randn(1024, 1024, device="cuda")
        before = vmm.torch.memory_stats()
        y = x @ x
        z = torch.nn.functional.relu(y).sum()
        torch.cuda.synchronize()
        after = vmm.torch.memory_stats()
        assert after["allocated_bytes.all.current"] >= before["allocated_bytes.all.current"] + (4 << 20), (before, after)
        assert after["active.all.current"] >= before["active.all.current"] + 2
        assert after["reserved_bytes.all.current"] >= after["allocated_bytes.all.current"]
        assert after["vmm.slow_path_ns"] > 0 and after["vmm.host_wait_ns"] <= after["vmm.slow_path_ns"], after
        assert vmm.torch.max_memory_allocated() >= after["allocated_bytes.all.current"]
        assert vmm.torch.memory_reserved() == after["reserved_bytes.all.current"]
        assert torch.allclose(z, torch.relu(x.cpu() @ x.cpu()).sum().cuda(), rtol=1e-3)
        live = vmm.torch.memory_allocated()
        del y
        assert vmm.torch.memory_allocated() == live - (4 << 20)
        vmm.torch.reset_peak_memory_stats()
        assert vmm.torch.max_memory_allocated() == vmm.torch.memory_allocated()
        del x, z
        gc.collect()
        vmm.torch.trim()
        stats = vmm.torch.memory_stats()  # what is left: the pages under live blocks, edges included
        edges = 2 * stats["vmm.page_size"] * stats["active.all.current"]
        assert stats["reserved_bytes.all.current"] <= stats["allocated_bytes.all.current"] + edges, stats
        # a model's step, backward included (autograd allocates on its own thread)
        model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).cuda()
        optimizer = torch.optim.AdamW(model.parameters())
        for _ in range(3):
            loss = model(torch.randn(64, 512, device="cuda")).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        torch.cuda.synchronize()
        assert torch.isfinite(loss)
        assert vmm.torch.memory_stats()["vmm.bad_deallocations"] == 0
        assert vmm.torch.devices() == [0]
        """
    )


def test_use_after_cuda_allocated_is_refused_and_changes_nothing():
    out = run(
        """
        x = torch.ones(1024, device="cuda")
        try:
            vmm.torch.use()
        except vmm.Error as error:
            print(error)
        else:
            raise AssertionError("use() after CUDA was initialized was accepted")
        assert not vmm.torch.is_used()
        assert torch.cuda.memory_allocated() == 4096  # torch's own allocator, untouched
        assert float((x + 1).sum()) == 2048.0
        """
    )
    assert "too late" in out and "before" in out


def test_sleep_and_wake_keep_offloaded_tensors_bit_identical_and_every_pointer():
    run(
        """
        vmm.torch.use()
        torch.manual_seed(0)
        with vmm.torch.tag("weights"):
            weights = [torch.randn(n, device="cuda") for n in (1, 1000, 257 * 1024, 3 << 20)]
            weights.append(torch.randint(0, 255, (5 << 20,), dtype=torch.uint8, device="cuda"))
        with vmm.torch.tag("kv"):
            cache = torch.full((16 << 20,), 7, dtype=torch.int32, device="cuda")
        assert vmm.torch.current_tag() == 0
        saved = [w.cpu() for w in weights]
        pointers = [w.data_ptr() for w in weights] + [cache.data_ptr()]
        torch.cuda.synchronize()
        free_before, _ = torch.cuda.mem_get_info()

        vmm.torch.sleep(offload_tags=("weights",))
        assert vmm.torch.asleep()
        assert vmm.torch.memory_reserved() == 0
        free_asleep, _ = torch.cuda.mem_get_info()
        assert free_asleep >= free_before + (64 << 20), (free_before, free_asleep)  # given back

        vmm.torch.wake()
        assert not vmm.torch.asleep()
        assert [w.data_ptr() for w in weights] + [cache.data_ptr()] == pointers
        for w, s in zip(weights, saved):
            assert torch.equal(w.cpu().view(torch.uint8), s.view(torch.uint8)), "weights changed"
        cache.fill_(3)  # dropped, but mapped again and usable
        assert int(cache.sum()) == 3 * (16 << 20)
        # tags by id work too, and a partial wake keeps the rest asleep
        vmm.torch.sleep(offload_tags=["weights", "kv"], collect_garbage=False)
        vmm.torch.wake(tags=["weights"])
        assert vmm.torch.asleep()
        assert torch.equal(weights[1].cpu(), saved[1])  # awake already
        vmm.torch.wake()
        assert not vmm.torch.asleep()
        assert int(cache.sum()) == 3 * (16 << 20)
        for w, s in zip(weights, saved):
            assert torch.equal(w.cpu().view(torch.uint8), s.view(torch.uint8))
        # A loop whose wakes keep the pinned host copies: each later sleep copies into them,
        # and saves what the weights hold then.
        assert vmm.torch.memory_stats()["vmm.host_copy_bytes"] == 0
        vmm.torch.sleep(offload_tags=("weights",), collect_garbage=False)
        kept = vmm.torch.memory_stats()["vmm.host_copy_bytes"]
        vmm.torch.wake(keep_host_copies=True)
        assert vmm.torch.memory_stats()["vmm.host_copy_bytes"] == kept > 0
        for cycle in range(3):
            weights[3].add_(1)
            saved = [w.cpu() for w in weights]
            vmm.torch.sleep(offload_tags=("weights",), collect_garbage=False)
            assert vmm.torch.memory_stats()["vmm.host_copy_bytes"] == kept
            vmm.torch.wake(keep_host_copies=True)
            for w, s in zip(weights, saved):
                assert torch.equal(w.cpu().view(torch.uint8), s.view(torch.uint8)), cycle
        vmm.torch.trim()
        assert vmm.torch.memory_stats()["vmm.host_copy_bytes"] == 0
        """
    )


def test_sleep_frees_tensors_only_cycles_keep_alive_unless_told_not_to():
    run(
        """
        import gc
        vmm.torch.use()
        gc.disable()  # only sleep() collects

        def make_garbage():
            holder = {}
            holder["self"] = holder  # a cycle: only gc.collect() frees the tensor
            holder["tensor"] = torch.empty(1 << 20, device="cuda")

        def live():
            return vmm.torch.memory_stats()["allocation.all.current"]

        kept = torch.ones(1 << 20, device="cuda")
        base = live()
        make_garbage()
        assert live() == base + 1
        vmm.torch.sleep(offload_tags=("default",), collect_garbage=False)
        assert live() == base + 1  # saved or dropped with the rest
        vmm.torch.wake()
        vmm.torch.sleep(offload_tags=("default",))
        assert live() == base  # collected before the sleep
        vmm.torch.wake()
        assert float(kept.sum()) == float(1 << 20)
        """
    )


def test_a_captured_cuda_graph_replays_after_wake():
    run(
        """
        vmm.torch.use()
        with vmm.torch.tag("weights"):
            x = torch.full((1 << 20,), 2.0, device="cuda")
            y = torch.zeros(1 << 20, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up outside the capture
            torch.mul(x, 2, out=y)
            y.add_(1)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # nothing allocates inside: static buffers only
            torch.mul(x, 2, out=y)
            y.add_(1)
        graph.replay()
        torch.cuda.synchronize()
        assert float(y[123]) == 5.0

        vmm.torch.sleep(offload_tags=("weights",))
        vmm.torch.wake()
        graph.replay()  # the addresses it captured hold the same memory contents again
        torch.cuda.synchronize()
        assert float(y[0]) == 5.0 and float(y[-1]) == 5.0
        x.fill_(10.0)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.all(y == 21.0)
        """
    )


def test_bad_use_of_sleep_and_wake_is_refused_and_loses_nothing():
    out = run(
        """
        vmm.torch.use()
        try:
            vmm.torch.wake()
        except vmm.Error as error:
            print("wake without sleep:", error)
        else:
            raise AssertionError("wake without sleep was accepted")
        kept = torch.arange(1 << 20, device="cuda")
        doomed = torch.ones(1 << 20, device="cuda")
        allocations = vmm.torch.memory_stats()["active.all.current"]
        vmm.torch.sleep()
        try:
            vmm.torch.sleep()
        except vmm.Error as error:
            print("sleep twice:", error)
        else:
            raise AssertionError("a second sleep was accepted")
        try:
            torch.empty(1024, device="cuda")
        except RuntimeError as error:
            print("allocate while asleep:", error)
            assert "asleep" in str(error)
        else:
            raise AssertionError("an allocation during sleep was accepted")
        assert "asleep" in vmm.torch.last_error()
        del doomed  # freed while asleep: kept for the wake
        stats = vmm.torch.memory_stats()
        assert stats["vmm.frees_deferred"] == 1 and stats["active.all.current"] == allocations
        vmm.torch.wake()
        stats = vmm.torch.memory_stats()
        assert stats["active.all.current"] == allocations - 1
        assert stats["vmm.bad_deallocations"] == 0
        assert torch.equal(kept.cpu(), torch.arange(1 << 20))
        assert float(torch.ones(16, device="cuda").sum()) == 16.0
        """
    )
    for expected in ("wake without sleep: ", "sleep() first", "sleep twice: ", "asleep already", "wake it first"):
        assert expected in out, out


def test_out_of_memory_is_an_error_the_process_survives():
    out = run(
        """
        vmm.torch.use(max_size=1 << 30)
        small = torch.ones(1 << 20, device="cuda")
        try:
            too_big = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
        except RuntimeError as error:
            print(error)
            assert "CUDA out of memory." in str(error), str(error)
        else:
            raise AssertionError("2 GiB fit in a resource of 1 GiB")
        assert vmm.torch.memory_stats()["num_ooms"] == 1
        assert float((small * 2).sum()) == 2.0 * (1 << 20)  # the CUDA context is fine
        more = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        more.fill_(1)
        torch.cuda.synchronize()
        """
    )
    assert "CUDA out of memory." in out


def test_a_mem_pool_scopes_vmm_under_torchs_caching_allocator():
    run(
        """
        before = torch.zeros(4, device="cuda")  # CUDA is initialized: mem_pool works anyway
        pool = vmm.torch.mem_pool()
        baseline = vmm.torch.memory_stats()["active.all.current"]
        with torch.cuda.use_mem_pool(pool):
            inside = torch.randn(8 << 20, device="cuda")
        outside = torch.randn(8 << 20, device="cuda")
        stats = vmm.torch.memory_stats()
        assert stats["active.all.current"] >= baseline + 1  # the segment under `inside`
        assert stats["allocated_bytes.all.current"] >= 32 << 20
        assert torch.cuda.memory_stats()["allocated_bytes.all.current"] >= 64 << 20  # torch's stay
        assert torch.allclose((inside + outside).sum(), inside.sum() + outside.sum(), rtol=1e-3)
        try:
            vmm.torch.use()
        except vmm.Error as error:
            assert "mem_pool" in str(error) or "too late" in str(error)
        else:
            raise AssertionError("use() after mem_pool() was accepted")
        del inside
        del pool
        gc.collect()
        torch.cuda.empty_cache()
        assert vmm.torch.memory_stats()["active.all.current"] == baseline
        """
    )


def test_cupy_arrays_come_from_the_same_resource():
    pytest.importorskip("cupy", reason="CuPy is not installed")
    run(
        """
        import cupy
        vmm.cupy.use()
        baseline = vmm.torch.memory_stats(0)
        a = cupy.arange(1 << 20, dtype=cupy.int64)
        b = (a * 2).sum()
        assert int(b) == ((1 << 20) - 1) * (1 << 20)
        stats = vmm.torch.memory_stats(0)
        assert stats["active.all.current"] >= baseline["active.all.current"] + 1
        assert stats["allocated_bytes.all.current"] >= baseline["allocated_bytes.all.current"] + (8 << 20)
        with cupy.cuda.Stream() as stream:  # freed in order on the stream it was made on
            c = cupy.ones(1 << 20, dtype=cupy.float64)
            d = float(c.sum())
        assert d == float(1 << 20)
        del a, b, c
        gc.collect()
        stream.synchronize()
        assert vmm.torch.memory_stats(0)["active.all.current"] == baseline["active.all.current"]
        empty = cupy.empty(0)
        assert empty.size == 0
        """
    )


def test_torch_and_cupy_share_one_resource_in_one_process():
    pytest.importorskip("cupy", reason="CuPy is not installed")
    run(
        """
        import cupy
        vmm.torch.use()
        vmm.cupy.use()
        t = torch.arange(1 << 20, dtype=torch.float64, device="cuda")
        baseline = vmm.torch.memory_stats()["active.all.current"]
        c = cupy.ones(1 << 20, dtype=cupy.float64)
        assert vmm.torch.memory_stats()["active.all.current"] == baseline + 1
        shared = torch.as_tensor(c, device="cuda")  # zero copy: the same vmm memory
        assert shared.data_ptr() == c.data.ptr
        total = (t + shared).sum()
        assert float(total) == float(sum(range(1 << 20)) + (1 << 20))
        back = cupy.asarray(t)  # and the other way
        assert back.data.ptr == t.data_ptr()
        del shared, back, total
        del c
        gc.collect()
        torch.cuda.synchronize()
        assert vmm.torch.memory_stats()["active.all.current"] == baseline
        """
    )


def test_a_vmm_tensor_crosses_torch_multiprocessing_as_a_mapping_of_the_same_memory(tmp_path):
    # A file, not `python -c`: spawn's children import the parent's main module by its path.
    script = tmp_path / "share_tensor.py"
    script.write_text(PRELUDE + textwrap.dedent(
        """
        import torch.multiprocessing as mp
        vmm.torch.use()

        def child(queue, done):
            tensor = queue.get()
            assert tensor.is_cuda and tensor.dtype == torch.float32 and tuple(tensor.shape) == (256, 1024)
            assert float(tensor[3, 5]) == 3 * 1024 + 5
            tensor[0, 0] = -1.0  # the parent sees it: the same physical memory
            torch.cuda.synchronize()
            done.put("written")

        if __name__ == "__main__":
            context = mp.get_context("spawn")
            queue, done = context.Queue(), context.Queue()
            tensor = torch.arange(256 * 1024, dtype=torch.float32, device="cuda").view(256, 1024)
            torch.cuda.synchronize()
            process = context.Process(target=child, args=(queue, done))
            process.start()
            queue.put(tensor)
            assert done.get(timeout=300) == "written"
            process.join(timeout=300)
            assert process.exitcode == 0
            assert float(tensor[0, 0]) == -1.0
            other = torch.ones(4)  # a CPU tensor keeps torch's own path
            queue.put(other)
            assert torch.equal(queue.get(timeout=60), other)
            print("ok")
        """
    ))
    environment = dict(os.environ)
    environment.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    environment.pop("VMM_CONF", None)
    done = subprocess.run([sys.executable, str(script)], env=environment, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.rstrip().endswith("ok"), (done.stdout, done.stderr)


def _run_script(tmp_path, name, code):
    # A file, not `python -c`: spawn's children import the parent's main module by its path.
    script = tmp_path / name
    script.write_text(PRELUDE + textwrap.dedent(code))
    environment = dict(os.environ)
    environment.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    environment.pop("VMM_CONF", None)
    done = subprocess.run([sys.executable, str(script)], env=environment, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.rstrip().endswith("ok"), (done.stdout, done.stderr)


def test_a_sent_tensor_outlives_the_senders_free_until_the_receiver_lets_go(tmp_path):
    _run_script(tmp_path, "lease.py", """
        import torch.multiprocessing as mp
        vmm.torch.use()

        def child(queue, answers):
            tensor = queue.get()
            answers.put("got")
            assert queue.get() == "check"
            # The sender freed its tensor and allocated another of the same size since.
            answers.put(bool(torch.equal(tensor, torch.arange(1 << 20, device="cuda", dtype=torch.float32))))
            del tensor
            gc.collect()
            answers.put("dropped")
            assert queue.get() == "exit"

        if __name__ == "__main__":
            context = mp.get_context("spawn")
            queue, answers = context.Queue(), context.Queue()
            process = context.Process(target=child, args=(queue, answers))
            process.start()
            tensor = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
            torch.cuda.synchronize()
            queue.put(tensor)
            assert answers.get(timeout=300) == "got"
            del tensor
            gc.collect()
            stats = vmm.torch.memory_stats()
            assert stats["vmm.held_for_receivers.frees"] == 1, stats
            other = torch.full((1 << 20,), 7.0, device="cuda")
            torch.cuda.synchronize()
            queue.put("check")
            assert answers.get(timeout=300) is True, "the receiver saw its memory reused"
            assert answers.get(timeout=300) == "dropped"
            stats = vmm.torch.memory_stats()
            assert stats["vmm.held_for_receivers.frees"] == 0, stats
            assert stats["allocated_bytes.all.current"] == other.untyped_storage().nbytes(), stats
            queue.put("exit")
            process.join(timeout=300)
            assert process.exitcode == 0
            print("ok")
        """)


def test_a_vmm_cupy_array_crosses_to_another_process_as_the_same_memory(tmp_path):
    pytest.importorskip("cupy", reason="CuPy is not installed")
    _run_script(tmp_path, "share_cupy.py", """
        import multiprocessing
        import cupy

        def child(connection):
            import vmm, vmm.cupy
            array = vmm.open(connection.recv())
            assert isinstance(array, cupy.ndarray) and array.shape == (512, 256) and array.dtype == cupy.int32
            assert int(array[2, 3]) == 2 * 256 + 3 and int(array.sum()) == int(cupy.arange(512 * 256).sum())
            array[0, 0] = -5  # a kernel writes the sender's memory
            cupy.cuda.runtime.deviceSynchronize()
            connection.send("written")

        if __name__ == "__main__":
            vmm.cupy.use()
            array = cupy.arange(512 * 256, dtype=cupy.int32).reshape(512, 256)
            cupy.cuda.runtime.deviceSynchronize()
            context = multiprocessing.get_context("spawn")
            parent, theirs = context.Pipe()
            process = context.Process(target=child, args=(theirs,))
            process.start()
            parent.send(vmm.share(array))
            assert parent.recv() == "written"
            process.join(timeout=300)
            assert process.exitcode == 0 and int(array[0, 0]) == -5
            try:
                vmm.share(array, read_only=True)
            except vmm.InvalidArgumentError as error:
                assert "read_only" in str(error)
            else:
                raise AssertionError("a read-only CuPy share was accepted")
            print("ok")
        """)
