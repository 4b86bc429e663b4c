#!/usr/bin/env python3
"""A CUDA tensor sent to another process through torch.multiprocessing: vmm's path against
torch's own CUDA IPC (cudaIpcGetMemHandle / cudaIpcOpenMemHandle), in the same run.

    python3 bench/torch_sharing.py                    # 1 GiB, 20 timed rounds, 1,000 for leaks
    python3 bench/torch_sharing.py --bytes 256M --rounds 50 --leak-rounds 200 --json out.json

Each allocator runs in a process of its own (this script runs itself with --child):
  native  torch's caching allocator; a tensor travels as a legacy CUDA IPC handle
  vmm     vmm.torch.use(); a tensor travels as the file descriptors of its pages and a lease
          (vmm.share: the pages under the allocation, mapped again by the receiver)
A round: the sender puts the tensor into a Queue; the receiver (a spawned process, started
once) gets it, reads it with a kernel (the sum of its first and last bytes), answers, and
drops it. Timed from the put to the answer: median and minimum milliseconds of the timed
rounds after two warm-up rounds. For vmm also the driver's part of a round alone
("in_process"): the tensor shared and opened again in its own process, read and dropped,
no transport (its share over the whole round: how much of the round the pages' export,
import and mapping take). Leaks: --leak-rounds more rounds of a 64 MiB tensor; the
descriptors open in both processes, the GPU memory in use (cudaMemGetInfo) and, for vmm,
the frees still held for receivers, before and after. Prints one JSON object (and writes
it to --json).

    python3 bench/torch_sharing.py --host           # no GPU: how the descriptors travel

--host measures the transport alone on OS host memory, in this process and a spawned
receiver: a --bytes allocation of vmm's resource shared (one descriptor a page, and the
lease) through a multiprocessing Pipe, opened, read and dropped, each round once with every
descriptor passed by multiprocessing's own DupFd (a connection to the sender a descriptor)
and once bundled in one socket pair (vmm's path for up to 200 descriptors), interleaved.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def receiver(queue, answers):
    import torch

    while True:
        tensor = queue.get()
        if tensor is None:
            answers.put(len(os.listdir("/proc/self/fd")))
            return
        value = int(tensor[0]) + int(tensor[-1])  # kernels on the mapped memory
        del tensor
        answers.put(value)


def rounds(torch, context, tensor, count):
    queue, answers = context.Queue(), context.Queue()
    process = context.Process(target=receiver, args=(queue, answers))
    process.start()
    times = []
    for _ in range(count):
        start = time.perf_counter()
        queue.put(tensor)
        value = answers.get(timeout=600)
        times.append((time.perf_counter() - start) * 1e3)
        assert value == int(tensor[0]) + int(tensor[-1]), value
    queue.put(None)
    receiver_fds = answers.get(timeout=600)
    process.join(timeout=600)
    return times, receiver_fds


def host_receiver(connection):
    import ctypes

    import vmm

    while True:
        handle = connection.recv()
        if handle is None:
            return
        shared = vmm.open(handle)
        del handle
        connection.send(ctypes.string_at(shared.data, 1))
        del shared


def host_transport(size, timed):
    import ctypes
    import multiprocessing

    import vmm
    from vmm import _sharing, _vmm

    _vmm.use_host_memory()
    ptr = _vmm.allocate(size, 0)
    ctypes.memset(ptr, 7, size)
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=host_receiver, args=(child,))
    process.start()
    times = {"per_descriptor": [], "bundled": []}
    descriptors = 0
    for index in range(2 * (timed + 2)):
        mode = "per_descriptor" if index % 2 == 0 else "bundled"
        _sharing._BUNDLED_FDS = 0 if mode == "per_descriptor" else 200
        handle = _sharing._share_allocation(ptr, size, 0)
        descriptors = len(handle.fds)
        start = time.perf_counter()
        parent.send(handle)
        handle.close()
        assert parent.recv() == bytes([7])
        if index >= 4:
            times[mode].append((time.perf_counter() - start) * 1e3)
    parent.send(None)
    process.join(timeout=600)
    _vmm.deallocate(ptr, size, 0)
    result = {"bytes": size, "descriptors": descriptors, "rounds": timed}
    for mode, values in times.items():
        result[f"{mode}_median_ms"] = statistics.median(values)
    result["bundled_over_per_descriptor"] = result["bundled_median_ms"] / result["per_descriptor_median_ms"]
    return result


def in_process_rounds(torch, tensor, count):
    """What a round costs vmm with no second process and no transport: the same tensor
    shared and opened again in this process, read by the same kernel and dropped. Its share
    (exporting every page and making the lease) and its open (importing, mapping and granting
    every page, then unmapping and releasing them) are the driver's work a round needs."""
    import vmm

    shares, opens, pages = [], [], 0
    for _ in range(count):
        torch.cuda.synchronize()
        start = time.perf_counter()
        handle = vmm.share(tensor)
        shared = time.perf_counter()
        pages = len(handle.fds) - int(handle.lease)
        opened = vmm.open(handle)
        handle.close()
        assert int(opened[0]) + int(opened[-1]) == int(tensor[0]) + int(tensor[-1])
        del opened
        torch.cuda.synchronize()
        done = time.perf_counter()
        shares.append((shared - start) * 1e3)
        opens.append((done - shared) * 1e3)
    shares, opens = shares[2:], opens[2:]
    return {
        "pages": pages,
        "share_median_ms": statistics.median(shares),
        "open_read_drop_median_ms": statistics.median(opens),
        "share_open_median_ms": statistics.median([a + b for a, b in zip(shares, opens)]),
    }


def child(allocator, size, timed, leak_rounds):
    import multiprocessing

    import torch

    if allocator == "vmm":
        import vmm.torch

        vmm.torch.use()
    import torch.multiprocessing  # noqa: F401 (torch's reductions, then vmm's for its tensors)

    context = multiprocessing.get_context("spawn")
    tensor = torch.zeros(size, dtype=torch.uint8, device="cuda")
    tensor[0], tensor[-1] = 3, 4
    torch.cuda.synchronize()
    times, _ = rounds(torch, context, tensor, timed + 2)
    times = times[2:]
    floor = in_process_rounds(torch, tensor, timed + 2) if allocator == "vmm" else None
    del tensor

    small = torch.ones(64 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    rounds(torch, context, small, 2)  # warm: what the first rounds make once stays
    fds_before = len(os.listdir("/proc/self/fd"))
    free_before = torch.cuda.mem_get_info()[0]
    _, receiver_fds_first = rounds(torch, context, small, 1)
    _, receiver_fds = rounds(torch, context, small, leak_rounds)
    torch.cuda.synchronize()
    free_after = torch.cuda.mem_get_info()[0]
    del small
    result = {
        "allocator": allocator,
        "bytes": size,
        "median_ms": statistics.median(times),
        "min_ms": min(times),
        "rounds": len(times),
        "leak_rounds": leak_rounds,
        "sender_fds_before": fds_before,
        "sender_fds_after": len(os.listdir("/proc/self/fd")),
        "receiver_fds_after_1_round": receiver_fds_first,
        "receiver_fds_after_leak_rounds": receiver_fds,
        "gpu_free_change_bytes": free_after - free_before,
    }
    if floor is not None:
        result["in_process"] = floor
        result["in_process_over_round"] = floor["share_open_median_ms"] / result["median_ms"]
    if allocator == "vmm":
        stats = vmm.torch.memory_stats()
        result["held_for_receivers_frees"] = stats["vmm.held_for_receivers.frees"]
        result["allocated_bytes_after"] = stats["allocated_bytes.all.current"]
    else:
        result["allocated_bytes_after"] = torch.cuda.memory_allocated()
    print(json.dumps(result))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bytes", default="1G", help="the tensor's size (4096, 256M, 1G; default 1G)")
    parser.add_argument("--rounds", type=int, default=20, help="timed rounds (default 20)")
    parser.add_argument("--leak-rounds", type=int, default=1000, help="rounds of the leak check (default 1000)")
    parser.add_argument("--allocators", default="native,vmm", help="comma-separated: native, vmm")
    parser.add_argument("--json", help="also write the result here")
    parser.add_argument("--host", action="store_true", help="the transport alone, on OS host memory (no GPU)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    from vmm import _vmm

    size = _vmm.parse_byte_size(arguments.bytes)
    if arguments.rounds < 1 or arguments.leak_rounds < 1:
        parser.error("--rounds and --leak-rounds must be at least 1")
    if arguments.child:
        child(arguments.child, size, arguments.rounds, arguments.leak_rounds)
        return
    if arguments.host:
        text = json.dumps(host_transport(size, arguments.rounds), indent=2)
        print(text)
        if arguments.json:
            with open(arguments.json, "w") as out:
                out.write(text + "\n")
        return
    allocators = arguments.allocators.split(",")
    unknown = set(allocators) - {"native", "vmm"}
    if unknown:
        parser.error(f"--allocators: unknown {', '.join(sorted(unknown))} (native, vmm)")
    environment = dict(os.environ)
    environment.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    results = {}
    for allocator in allocators:
        command = [sys.executable, __file__, "--child", allocator, "--bytes", str(size), "--rounds",
                   str(arguments.rounds), "--leak-rounds", str(arguments.leak_rounds)]
        done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            sys.exit(f"torch_sharing.py: the {allocator} process failed:\n{done.stderr[-4000:]}")
        results[allocator] = json.loads(done.stdout.strip().splitlines()[-1])
    if "native" in results and "vmm" in results:
        results["vmm_over_native_median"] = results["vmm"]["median_ms"] / results["native"]["median_ms"]
    text = json.dumps(results, indent=2)
    print(text)
    if arguments.json:
        with open(arguments.json, "w") as out:
            out.write(text + "\n")


if __name__ == "__main__":
    main()
