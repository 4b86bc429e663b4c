"""One copy of a model's weights for several processes, through vmm.store (python/README.md).

    python3 python/examples/store_weights.py

Runs a vmm-store daemon on a thread (in production: ``vmm-store serve``, then
``vmm-store load model.safetensors --name NAME`` or Client().put), puts a small model's
state dict once, and starts two worker processes that each get it zero-copy and read-only;
the second makes one tensor private (a writable copy of its own) and changes it.
On OS host memory; pass --location cuda:0 on a GPU.
"""

import argparse
import multiprocessing
import os
import tempfile

import torch

import vmm.store


def model():
    torch.manual_seed(0)
    layers = [torch.nn.Linear(64, 64) for _ in range(4)]
    return torch.nn.Sequential(torch.nn.Embedding(256, 64), *layers).to(torch.bfloat16)


def worker(path, index, expected):
    # {name: tensor}: views of the one mapping. Worker 1 changes a tensor after loading: it
    # gets that one private (a copy of its own, writable; the other worker reads the original).
    private = ["0.weight"] if index == 1 else []
    weights = vmm.store.Client(path).get("tiny", private=private)
    checksum = sum(float(t.double().sum()) for t in weights.values())
    if private:
        weights["0.weight"].zero_()
        print(f"worker {index}: zeroed its private copy of 0.weight (private here: {len(weights.private)} tensors)")
    net = model()
    with torch.no_grad():
        for name, param in net.named_parameters():
            param.copy_(weights[name])  # a serving engine would use the tensors in place
    print(f"worker {index} (pid {os.getpid()}): {len(weights)} tensors, checksum {checksum:.3f}, "
          f"{'same' if abs(checksum - expected) < 1e-6 else 'DIFFERENT'} as the put")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--location", default="os_host", help="os_host or cuda:N")
    location = parser.parse_args().location
    with tempfile.TemporaryDirectory() as directory, vmm.store.Daemon(os.path.join(directory, "socket")) as daemon:
        state = {name: tensor.contiguous() for name, tensor in model().state_dict().items()}
        if location != "os_host":
            state = {name: tensor.to(location) for name, tensor in state.items()}
        client = vmm.store.Client(daemon.path)
        client.put("tiny", state, location=location)
        expected = sum(float(t.double().sum()) for t in state.values())
        context = multiprocessing.get_context("spawn")
        workers = [context.Process(target=worker, args=(daemon.path, i, expected)) for i in range(2)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        print(client.list())
        return 0 if all(w.exitcode == 0 for w in workers) else 1


if __name__ == "__main__":
    raise SystemExit(main())
