#!/usr/bin/env python3
"""PyTorch's allocators against vmm on the same workloads, one process per allocator.

    python3 bench/torch_allocators.py                 # several minutes on one GPU
    python3 bench/torch_allocators.py --quick         # about 2 minutes, no largest-batch search
    python3 bench/torch_allocators.py --allocators native,vmm --workloads gpt2,grow
    python3 bench/torch_allocators.py --quick --rounds 3   # every process three times, interleaved

Allocators, each in a process of its own (this script runs itself with --child):
  native           torch's caching allocator (PYTORCH_CUDA_ALLOC_CONF unset)
  expandable       PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  cudaMallocAsync  PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
  vmm              vmm.torch.use(): the installed package vmm (pip install --no-build-isolation .,
                   python/README.md), imported by this interpreter's processes
  vmm_run          vmm as an unmodified program gets it: the child runs under
                   python -m vmm.torch.run (so $VMM_CONF applies) and never calls vmm itself
                   but to read its statistics; not in the default list
  pluggable_floor  torch.empty + del only: CUDAPluggableAllocator over a C allocator that
                   does nothing (built here with cc; it hands out one address that nothing
                   touches), so the cost of torch's pluggable interface by itself

Workloads (random weights, fixed seeds: every allocator runs the same sequence):
  gpt2   GPT-2 small (GPT2Config in code), bf16, AdamW, 60 steps whose sequence lengths vary
         between 128 and 2048 at about 16k tokens a step: the workload of bench/data/gpt2.trace.gz.
  llama  a small Llama (LlamaConfig in code: 8 layers, hidden 1024, GQA), bf16, AdamW,
         training at lengths 256..4096, then generate() (greedy, KV cache) at three shapes.
  vit    ViT-B/16 (transformers' ViTConfig; torchvision's vit_b_16 refuses other image
         sizes) at resolutions 160..384 with interpolated position embeddings, about the same
         pixels a step, bf16, AdamW. cuDNN runs in heuristic mode (cudnn.benchmark off: its
         find mode asks the allocator for cacheInfo, which pluggable allocators lack).
  grow   a tensor grown to 16 GiB by 256 MiB appends the way PyTorch users write it,
         x = torch.cat([x, chunk]) (what transformers' DynamicCache does to the KV cache at
         every generated token): each append allocates the new size and frees the old one.

For each: median (and mean) time per step after warm-up, with Python's garbage collector off
inside the timed step (a collection takes 70-200 ms here and comes at random steps), the
host's share of each step (issued_ms: until the step's Python returned, before it waited
for the GPU; close to the step time means the host, not the GPU, sets the pace), and peak
reserved / peak allocated
(torch.cuda.max_memory_reserved/max_memory_allocated for torch's allocators; vmm.torch's for
vmm), the caches emptied and the peaks reset before each workload; for vmm also its own
figures (vmm.torch.memory_stats()'s "vmm." keys and num_ooms; the counts, such as pages
stitched and host_waits, over that workload alone) and each step's slow-path host time
(vmm_slow_path_ms: allocations that mapped, stitched, created or gave back pages, or waited
for the GPU; the rest of vmm's host time is its fast path). Also: torch.empty + del
(median microseconds a pair, 4 KiB and 1 MiB), the largest batch of gpt2 at sequence length
2048 that fits (a search over batch sizes, each probe a process of its own so that an out
of memory never poisons a measurement), and for vmm a sleep/wake of 8 GiB of weights (plus
4 GiB dropped), two cycles, then two whose wake keeps the host copies for the next sleep
(vmm.torch.wake(keep_host_copies=True)), against a pinned-memory copy of the same bytes in
the same process (the sleep is timed without the gc.collect() vmm.torch.sleep() runs by
default, which is timed on its own).

torch.empty + del is also measured side by side (--side-by-side, on unless "off"): every
allocator's process runs the loop over the same seconds, each on a CPU of a core of its own
(the CPUs rotated over --side-by-side-repeats), with vmm_pool beside them when vmm is one:
vmm.torch.mem_pool() under torch.cuda.use_mem_pool, torch's caching allocator on top of vmm.
A host may run the same Python at two speeds (docs/GPU-FACTS.md, "The host") and move
between them within seconds, so processes measured one after the other compare moments of
the host more than allocators. Each process also times a fixed
piece of pure-Python work between its rounds (the host's speed as it sees it); the target is
checked on the pair over that reference (the median over 250 ms bins), against native's.
--empty-del-only runs only that.

--rounds N runs every allocator's process N times, in alternating order (A B C D, then
D C B A, ...), so that the machine's drift (clocks, temperature, the host's other guests)
falls on every allocator alike. A
workload's step time is then the median of the rounds' medians, its reserved / allocated
the largest of the rounds', torch.empty + del the median; each round's figures are kept
(*_rounds).

--steps N runs N steps of each training workload instead of the settings' (warm-up included).
A host's speed can move from one second to the next (docs/GPU-FACTS.md, "The host"), and a
full vit process times only a second or two of steps: one process samples one moment of the
host.
Longer runs (e.g. --steps 400, ~16 s of vit steps) spread every process over many moments.

--cpus 0-7 runs every process on those CPUs (os.sched_setaffinity), the same set for every
allocator. Pinning steadies a GPU-bound step; host-bound workloads (gpt2, llama) still move
with the host's speed.

Attention runs off cuDNN: torch.nn.functional.scaled_dot_product_attention picks cuDNN's
kernels on some GPUs, and cuDNN builds a plan on the host for every new sequence length
(docs/GPU-FACTS.md, "PyTorch"), so with lengths that change every step gpt2 and llama would
time cuDNN's planner and the host's speed, not the allocator. Off cuDNN, torch takes flash
attention and the steps are the GPU's. --cudnn-attention leaves torch's choice.

--vmm-headroom X runs vmm with vmm.torch.use(headroom=X): the idle share of its peak use a
resource may learn to keep mapped (vmm's default 1/128; less reserves less and, when shapes
change every step, moves more pages).

Writes one JSON (--json) and prints a table with the targets checked.
"""

import argparse
import gc
import importlib.util
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
import traceback

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALLOCATORS = ("native", "expandable", "cudaMallocAsync", "vmm", "pluggable_floor", "vmm_run")
DEFAULT_ALLOCATORS = ALLOCATORS[:-1]
VMM_ALLOCATORS = ("vmm", "vmm_run")
# vmm.torch.memory_stats() keys that count over the process's life: reported per workload.
VMM_COUNTS = (
    "num_ooms",
    "vmm.pages_stitched",
    "vmm.pages_created",
    "vmm.pages_released",
    "vmm.host_waits",
    "vmm.slow_path_ns",
    "vmm.host_wait_ns",
    "vmm.bad_deallocations",
    "vmm.failed_allocations",
    "vmm.frees_deferred",
)
TORCH_ALLOCATORS = ("native", "expandable", "cudaMallocAsync")
WORKLOADS = ("gpt2", "llama", "vit", "grow")
OOM_EXIT = 3
GIB = 1 << 30
MIB = 1 << 20


# ---- settings ------------------------------------------------------------------------------


def settings(quick, steps=None):
    """The sizes of every workload: the full run, or the --quick one; `steps` (--steps) sets
    the steps of the training workloads, warm-up included."""
    chosen = quick_settings() if quick else full_settings()
    if steps is not None:
        for name in ("gpt2", "llama", "vit"):
            chosen[name]["steps"] = steps
    return chosen


def quick_settings():
    return {
        "gpt2": {"steps": 20, "warmup": 5, "tokens": 16384},
        "llama": {"steps": 12, "warmup": 4, "tokens": 16384, "generate": [(8, 256)], "new_tokens": 16},
        "vit": {"steps": 12, "warmup": 4, "batch_at_224": 64},
        "grow": {"target": 4 * GIB, "chunk": 256 * MIB},
        "empty_del": {"rounds": 15, "per_round": 1000},
        "sleep_wake": {"weights": 2 * GIB, "dropped": 1 * GIB, "cycles": 2},
    }


def full_settings():
    return {
        "gpt2": {"steps": 60, "warmup": 10, "tokens": 16384},
        "llama": {"steps": 40, "warmup": 8, "tokens": 16384, "generate": [(8, 512), (16, 128), (4, 1024)], "new_tokens": 64},
        "vit": {"steps": 40, "warmup": 8, "batch_at_224": 64},
        "grow": {"target": 16 * GIB, "chunk": 256 * MIB},
        "empty_del": {"rounds": 40, "per_round": 2000},
        "sleep_wake": {"weights": 8 * GIB, "dropped": 4 * GIB, "cycles": 2},
    }


def environment_for(allocator):
    environment = dict(os.environ)
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        environment.pop(name, None)
    if allocator == "expandable":
        environment["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    elif allocator == "cudaMallocAsync":
        environment["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
    return environment


# ---- the child: one allocator, in its own process ------------------------------------------


FLOOR_SOURCE = r"""
#include <stddef.h>
#include <stdint.h>
/* An allocator that does nothing: one address (never dereferenced: torch.empty + del do
   not touch memory), the same for every request, and a free that forgets it. */
void* floor_alloc(size_t size, int device, void* stream) {
  (void)size; (void)device; (void)stream;
  return (void*)(uintptr_t)(UINT64_C(1) << 46);
}
void floor_free(void* ptr, size_t size, int device, void* stream) {
  (void)ptr; (void)size; (void)device; (void)stream;
}
"""


def build_floor_allocator():
    """Compiles FLOOR_SOURCE into a shared library in a temporary folder; returns its path."""
    import shutil
    import tempfile

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("pluggable_floor needs a C compiler (cc or gcc) on PATH")
    folder = tempfile.mkdtemp(prefix="vmm-floor-")
    source, library = os.path.join(folder, "floor.c"), os.path.join(folder, "libfloor.so")
    with open(source, "w") as file:
        file.write(FLOOR_SOURCE)
    subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", library, source], check=True)
    return library


class Child:
    """Sets up one allocator before CUDA starts, and measures with its statistics."""

    def __init__(self, allocator, vmm_headroom=None, cudnn_attention=False):
        self.allocator = allocator
        self.vmm = None
        self.vmm_before = {}
        if allocator == "pluggable_floor":
            import torch

            self.torch = torch
            self.device = torch.device("cuda", 0)
            library = build_floor_allocator()
            torch.cuda.memory.change_current_allocator(
                torch.cuda.memory.CUDAPluggableAllocator(library, "floor_alloc", "floor_free"))
            return  # no memory is ever touched: nothing may run a kernel here
        if allocator in ("vmm", "vmm_pool", "vmm_run"):
            import vmm.torch
        if allocator == "vmm":
            vmm.torch.use(headroom=vmm_headroom)
            self.vmm = vmm.torch
        if allocator == "vmm_run":
            if not vmm.torch.is_used():
                raise RuntimeError("vmm_run: this child must run under python -m vmm.torch.run")
            self.vmm = vmm.torch
        import torch

        self.torch = torch
        self.device = torch.device("cuda", 0)
        torch.zeros(1, device=self.device)  # CUDA starts here, on the chosen allocator
        if allocator == "vmm_pool":
            # Every later allocation of this thread goes to a pool over vmm, torch's caching
            # allocator on top (autograd's backward threads would still use torch's own: this
            # mode runs only torch.empty + del, on the main thread).
            self.pool = vmm.torch.mem_pool()
            self.pool_scope = torch.cuda.use_mem_pool(self.pool)
            self.pool_scope.__enter__()
        assert not torch.backends.cudnn.benchmark
        # cuDNN's attention plans every new sequence length on the host (see --cudnn-attention).
        torch.backends.cuda.enable_cudnn_sdp(cudnn_attention)

    def clean(self):
        import gc

        gc.collect()
        self.torch.cuda.synchronize()
        if self.vmm is not None:
            self.vmm.trim()
            self.vmm.reset_peak_memory_stats()
            self.vmm_before = self.vmm.memory_stats()  # the counts, for peaks() to take from
        else:
            self.torch.cuda.empty_cache()
            self.torch.cuda.reset_peak_memory_stats()

    def peaks(self):
        self.torch.cuda.synchronize()
        if self.vmm is not None:
            reserved, allocated = self.vmm.max_memory_reserved(), self.vmm.max_memory_allocated()
        else:
            reserved = self.torch.cuda.max_memory_reserved()
            allocated = self.torch.cuda.max_memory_allocated()
        result = {
            "peak_reserved": reserved,
            "peak_allocated": allocated,
            "reserved_over_allocated": reserved / allocated if allocated else None,
        }
        if self.vmm is not None:
            stats = self.vmm.memory_stats()
            result["vmm"] = {
                key: value - self.vmm_before.get(key, 0) if key in VMM_COUNTS else value
                for key, value in stats.items()
                if key.startswith("vmm.") or key == "num_ooms"
            }
        return result

    def is_oom(self, error):
        return isinstance(error, self.torch.OutOfMemoryError) or "out of memory" in str(error)

    def slow_path_seconds(self):
        """vmm's slow-path host time so far (0 for torch's allocators)."""
        return self.vmm.memory_stats()["vmm.slow_path_ns"] / 1e9 if self.vmm is not None else 0.0

    def timed(self, fn, issued=None, slow=None):
        """Seconds from a synchronized start to the end of fn's GPU work, and fn's result.
        Python's garbage collector is off meanwhile: a collection of the heap of torch and
        transformers takes 70-200 ms and comes at random steps, which would hide the
        allocators' differences in its noise (cyclic garbage is collected between steps, the
        same for every allocator). issued, a list, gets the seconds until fn returned: the
        host's share of the step, before it waited for the GPU; slow, a list, gets the
        seconds of vmm's slow path in the step (read outside the timed span)."""
        slow_before = self.slow_path_seconds() if slow is not None else 0.0
        self.torch.cuda.synchronize()
        gc.disable()
        try:
            start = time.perf_counter()
            result = fn()
            returned = time.perf_counter()
            self.torch.cuda.synchronize()
            end = time.perf_counter()
        finally:
            gc.enable()
        if issued is not None:
            issued.append(returned - start)
        if slow is not None:
            slow.append(self.slow_path_seconds() - slow_before)
        return end - start, result


def lengths(seed, count, low, high):
    """The same sequence of lengths for every allocator."""
    generator = random.Random(seed)
    return [generator.randint(low, high) for _ in range(count)]


def train_steps(child, model, optimizer, batches, warmup):
    """Runs one training step per maker of inputs; returns the median and mean step time after
    warm-up, and every step's time and host share."""
    times, issued, slow = [], [], []
    for make in batches:
        inputs = make()
        seconds, loss = child.timed(lambda: _step(model, optimizer, inputs), issued, slow)
        if not math.isfinite(float(loss)):
            raise RuntimeError(f"the loss is {float(loss)}")
        times.append(seconds)
        del inputs
    measured = times[warmup:] or times
    return {
        "step_ms_median": 1000 * statistics.median(measured),
        "step_ms_mean": 1000 * statistics.fmean(measured),
        "step_ms": [round(1000 * t, 3) for t in times],
        "issued_ms": [round(1000 * t, 3) for t in issued],
    } | (
        {
            "vmm_slow_path_ms": [round(1000 * t, 3) for t in slow],
            "vmm_slow_path_ms_median": 1000 * statistics.median(slow[warmup:] or slow),
        }
        if child.vmm is not None
        else {}
    )


def _step(model, optimizer, inputs):
    loss = model(**inputs).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def gpt2_model(child, seed=1234):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch = child.torch
    config = GPT2Config(n_positions=2048, n_embd=768, n_layer=12, n_head=12, vocab_size=50257)
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config).to(device=child.device, dtype=torch.bfloat16)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, optimizer, config


def token_batches(child, vocab, sequence_lengths, tokens, seed):
    torch = child.torch
    generator = torch.Generator(device=child.device)
    generator.manual_seed(seed)

    def maker(length):
        def make():
            batch = max(1, tokens // length)
            ids = torch.randint(0, vocab, (batch, length), device=child.device, generator=generator)
            return {"input_ids": ids, "labels": ids}

        return make

    return [maker(length) for length in sequence_lengths]


def workload_gpt2(child, s):
    model, optimizer, config = gpt2_model(child)
    sequence = lengths(1234, s["steps"], 128, 2048)
    result = train_steps(child, model, optimizer, token_batches(child, config.vocab_size, sequence, s["tokens"], 99), s["warmup"])
    result["lengths"] = sequence
    return result


def workload_llama(child, s):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch = child.torch
    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=4,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    torch.manual_seed(4321)
    model = LlamaForCausalLM(config).to(device=child.device, dtype=torch.bfloat16)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    sequence = lengths(4321, s["steps"], 256, 4096)
    result = train_steps(child, model, optimizer, token_batches(child, config.vocab_size, sequence, s["tokens"], 98), s["warmup"])
    del optimizer
    model.eval()
    generator = torch.Generator(device=child.device)
    generator.manual_seed(7)
    generated = []
    with torch.no_grad():
        for batch, prompt in s["generate"]:
            ids = torch.randint(3, config.vocab_size, (batch, prompt), device=child.device, generator=generator)
            seconds, out = child.timed(
                lambda: model.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=s["new_tokens"],
                    min_new_tokens=s["new_tokens"],
                    do_sample=False,
                    pad_token_id=0,
                )
            )
            assert out.shape == (batch, prompt + s["new_tokens"]), out.shape
            generated.append({"batch": batch, "prompt": prompt, "seconds": seconds, "tokens_per_s": batch * s["new_tokens"] / seconds})
    result["generate"] = generated
    result["generate_seconds"] = sum(g["seconds"] for g in generated)
    return result


def workload_vit(child, s):
    from transformers import ViTConfig, ViTForImageClassification

    torch = child.torch
    config = ViTConfig(
        image_size=224, patch_size=16, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
        intermediate_size=3072, num_labels=1000,
    )
    torch.manual_seed(2468)
    model = ViTForImageClassification(config).to(device=child.device, dtype=torch.bfloat16)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    choices = random.Random(2468)
    resolutions = [choices.choice((160, 192, 224, 256, 288, 320, 384)) for _ in range(s["steps"])]
    generator = torch.Generator(device=child.device)
    generator.manual_seed(97)

    def maker(resolution):
        def make():
            batch = max(1, round(s["batch_at_224"] * (224 / resolution) ** 2))
            pixels = torch.randn(batch, 3, resolution, resolution, device=child.device, generator=generator, dtype=torch.bfloat16)
            labels = torch.randint(0, 1000, (batch,), device=child.device, generator=generator)
            return {"pixel_values": pixels, "labels": labels, "interpolate_pos_encoding": True}

        return make

    result = train_steps(child, model, optimizer, [maker(r) for r in resolutions], s["warmup"])
    result["resolutions"] = resolutions
    return result


def workload_grow(child, s):
    torch = child.torch
    chunk = torch.ones(s["chunk"] // 2, dtype=torch.bfloat16, device=child.device)
    x = torch.empty(0, dtype=torch.bfloat16, device=child.device)
    appends = s["target"] // s["chunk"]
    times = []
    for _ in range(appends):
        seconds, x = child.timed(lambda: torch.cat([x, chunk]))
        times.append(seconds)
    assert x.numel() * 2 == s["target"]
    return {
        "appends": appends,
        "chunk_bytes": s["chunk"],
        "final_bytes": s["target"],
        "seconds": sum(times),
        "step_ms_median": 1000 * statistics.median(times),
        "pattern": "x = torch.cat([x, chunk])",
    }


EMPTY_DEL_SIZES = (4096, MIB)


def empty_del_round(child, size, per_round):
    """Microseconds a torch.empty + del pair of `size` bytes, over per_round pairs."""
    torch = child.torch
    start = time.perf_counter_ns()
    for _ in range(per_round):
        t = torch.empty(size, dtype=torch.uint8, device=child.device)
        del t
    return (time.perf_counter_ns() - start) / per_round / 1000


def empty_del_samples(child, rounds, per_round):
    """Microseconds a torch.empty + del pair, one sample per round of per_round pairs, for
    4 KiB and 1 MiB: `rounds` rounds of each, the sizes alternating round by round, so that
    both sizes meet the same moments of the host (whose speed moves from one to the next)."""
    for size in EMPTY_DEL_SIZES:  # warm-up
        empty_del_round(child, size, 2000)
    samples = {size: [] for size in EMPTY_DEL_SIZES}
    for i in range(2 * rounds):
        size = EMPTY_DEL_SIZES[i % 2]
        samples[size].append(empty_del_round(child, size, per_round))
    return samples


def empty_del(child, s):
    samples = empty_del_samples(child, s["rounds"], s["per_round"])
    return {str(size): statistics.median(times) for size, times in samples.items()}


# ---- torch.empty + del side by side ------------------------------------------------------
# A host may run the same Python at two speeds (docs/GPU-FACTS.md, "The host") and a process
# can sit at either for seconds, so processes measured one after the other
# compare moments of the host more than allocators. Side by side, every allocator's process
# runs the loop over the same seconds, each on a core of its own, their CPUs rotated from one
# repeat to the next, and each process times a fixed piece of pure-Python work (no torch, no
# allocator) between its rounds: the speed of the host as that process sees it at that moment.
# An allocator's figure is its pair over the reference work of the same process in the same
# 250 ms (the median over such bins), compared with native's.

SIDE_BY_SIDE_PER_ROUND = 500
SIDE_BY_SIDE_BIN_NS = 250_000_000
REFERENCE = "reference"


class _ReferenceWork:
    __slots__ = ("index", "name", "shape")

    def __init__(self, index, name):
        self.index = index
        self.name = name
        self.shape = (index, 1)


def reference_round(per_round):
    """Microseconds of one piece of pure-Python work (an object made and dropped), per_round
    times: the host's speed as this process sees it now."""
    start = time.perf_counter_ns()
    for i in range(per_round):
        t = _ReferenceWork(i, "uint8")
        del t
    return (time.perf_counter_ns() - start) / per_round / 1000


def context_switches():
    """This process's involuntary context switches so far (0 where /proc does not say)."""
    try:
        with open("/proc/self/status") as file:
            for line in file:
                if line.startswith("nonvoluntary_ctxt_switches:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_side_child(arguments):
    """One allocator's loop of torch.empty + del: prints "ready" once warm, reads the start and
    end (time.monotonic_ns, the same clock in every process) from stdin, waits for the start,
    then runs rounds of 4 KiB, the reference, 1 MiB, the reference, ... until the end. Writes
    its rounds, and how much of the time its thread ran, to --child-out."""
    child = Child(arguments.allocator, arguments.vmm_headroom)
    for size in EMPTY_DEL_SIZES:
        empty_del_round(child, size, 5000)
    reference_round(5000)
    print("ready", flush=True)
    start, end = (int(x) for x in sys.stdin.readline().split())
    while time.monotonic_ns() < start:
        time.sleep(0.001)
    kinds = (EMPTY_DEL_SIZES[0], REFERENCE, EMPTY_DEL_SIZES[1], REFERENCE)
    rounds = []  # (ns when the round began, size or REFERENCE, us a pair or a piece of the reference)
    gc.disable()  # the process ends after the loop: nothing turns it on again
    switches, ran, began = context_switches(), time.thread_time_ns(), time.monotonic_ns()
    while (now := time.monotonic_ns()) < end:
        kind = kinds[len(rounds) % len(kinds)]
        us = reference_round(SIDE_BY_SIDE_PER_ROUND) if kind == REFERENCE else empty_del_round(child, kind, SIDE_BY_SIDE_PER_ROUND)
        rounds.append((now, kind, us))
    ran, wall = time.thread_time_ns() - ran, time.monotonic_ns() - began
    switches = context_switches() - switches
    with open(arguments.child_out, "w") as file:
        json.dump({"allocator": arguments.allocator, "cpu": sorted(os.sched_getaffinity(0)), "rounds": rounds,
                   "thread_ran_share": ran / wall, "involuntary_switches": switches}, file)


def one_cpu_per_core(cpus):
    """The CPUs of `cpus`, one per physical core where the kernel says which share a core
    (SMT siblings would slow each other's loop), the rest after them."""
    first, rest, seen = [], [], set()
    for cpu in sorted(cpus):
        try:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as file:
                core = file.read().strip()
        except OSError:
            core = str(cpu)
        (rest if core in seen else first).append(cpu)
        seen.add(core)
    return first + rest


def side_by_side(allocators, arguments, folder):
    """torch.empty + del of every allocator in `allocators` at the same moments (see above)."""
    cpus = one_cpu_per_core(os.sched_getaffinity(0))
    if len(cpus) < len(allocators):
        return {"error": f"{len(allocators)} allocators side by side need as many CPUs; this process may use {cpu_ranges(cpus)}"}
    cpus = cpus[: len(allocators)]
    repeats = []
    for repeat in range(arguments.side_by_side_repeats):
        placed = {a: cpus[(i + repeat) % len(cpus)] for i, a in enumerate(allocators)}
        children = {}
        try:
            for allocator, cpu in placed.items():
                path = os.path.join(folder, f"side-{repeat}-{allocator}.json")
                command = child_command(allocator, ["--child", "side", "--child-out", path], arguments, cpus=str(cpu))
                children[allocator] = (subprocess.Popen(command, env=environment_for(allocator), stdin=subprocess.PIPE,
                                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), path)
            for allocator, (process, _) in children.items():
                line = process.stdout.readline()
                if line.strip() != "ready":
                    process.wait(timeout=60)
                    raise RuntimeError(f"{allocator}'s process did not start (exit {process.returncode}): {process.stderr.read()[-3000:]}")
            start = time.monotonic_ns() + 200_000_000
            end = start + int(arguments.side_by_side_seconds * 1e9)
            for process, _ in children.values():
                process.stdin.write(f"{start} {end}\n")
                process.stdin.flush()
            loaded = {}
            for allocator, (process, path) in children.items():
                _, error = process.communicate(timeout=arguments.side_by_side_seconds + 120)
                if process.returncode != 0:
                    raise RuntimeError(f"{allocator}'s process failed (exit {process.returncode}): {error[-3000:]}")
                with open(path) as file:
                    loaded[allocator] = json.load(file)
        finally:
            for process, _ in children.values():
                if process.poll() is None:
                    process.kill()
                    process.wait()
        repeats.append({"cpus": placed, "start_ns": start, "end_ns": end,
                        "rounds": {a: loaded[a]["rounds"] for a in allocators},
                        "process": {a: {k: loaded[a][k] for k in ("thread_ran_share", "involuntary_switches")} for a in allocators}})
        print(f"[side by side] repeat {repeat + 1}: " + ", ".join(
            f"{a} (CPU {placed[a]}) {statistics.median(us for _, kind, us in loaded[a]['rounds'] if kind == EMPTY_DEL_SIZES[0]):.2f} us, "
            f"reference {statistics.median(us for _, kind, us in loaded[a]['rounds'] if kind == REFERENCE):.3f}" for a in allocators),
            file=sys.stderr, flush=True)
    return summarize_side_by_side(allocators, repeats, arguments)


def summarize_side_by_side(allocators, repeats, arguments):
    """Per allocator and size: the plain median pair over every repeat, and the median over
    every 250 ms bin of every repeat of the bin's pair over the bin's reference work (the
    same process, the same moments), and that divided by native's."""
    result = {"seconds": arguments.side_by_side_seconds, "repeats": len(repeats), "pairs_a_round": SIDE_BY_SIDE_PER_ROUND,
              "bin_ms": SIDE_BY_SIDE_BIN_NS / 1e6, "median_us": {}, "reference_us": {}, "over_reference": {},
              "ratio_to_native": {}, "each_repeat": []}
    kinds = list(EMPTY_DEL_SIZES) + [REFERENCE]
    over = {a: {size: [] for size in EMPTY_DEL_SIZES} for a in allocators}
    for r in repeats:
        each = {"cpus": r["cpus"], "bins": {}, "median_us": {}}
        for a in allocators:
            bins = {}
            for at, kind, us in r["rounds"][a]:
                bins.setdefault((at - r["start_ns"]) // SIDE_BY_SIDE_BIN_NS, {}).setdefault(kind, []).append(us)
            medians = {str(k): [statistics.median(b[k]) if k in b else None for _, b in sorted(bins.items())] for k in kinds}
            each["bins"][a] = medians
            each["median_us"][a] = {str(k): statistics.median(us for _, kind, us in r["rounds"][a] if kind == k) for k in kinds}
            for size in EMPTY_DEL_SIZES:
                over[a][size] += [x / y for x, y in zip(medians[str(size)], medians[REFERENCE]) if x is not None and y is not None]
            for key in ("thread_ran_share", "involuntary_switches"):
                if key in r.get("process", {}).get(a, {}):
                    each.setdefault(key, {})[a] = r["process"][a][key]
        result["each_repeat"].append(each)
    for a in allocators:
        every = [(kind, us) for r in repeats for _, kind, us in r["rounds"][a]]
        result["reference_us"][a] = statistics.median(us for kind, us in every if kind == REFERENCE)
        for size in EMPTY_DEL_SIZES:
            result["median_us"].setdefault(a, {})[str(size)] = statistics.median(us for kind, us in every if kind == size)
            result["over_reference"].setdefault(a, {})[str(size)] = statistics.median(over[a][size])
    if "native" in allocators:
        for a in allocators:
            result["ratio_to_native"][a] = {size: result["over_reference"][a][size] / result["over_reference"]["native"][size]
                                            for size in result["over_reference"][a]}
    return result


def sleep_wake(child, s):
    """vmm only: sleep/wake of tagged weights, bit for bit, against pinned copies of the same bytes."""
    torch, vmm = child.torch, child.vmm
    piece = 256 * MIB
    with vmm.tag("weights"):
        weights = [torch.empty(piece // 4, dtype=torch.int32, device=child.device).random_() for _ in range(s["weights"] // piece)]
    with vmm.tag("kv"):
        dropped = [torch.empty(piece, dtype=torch.uint8, device=child.device) for _ in range(s["dropped"] // piece)]
    saved = [w.cpu() for w in weights]
    pointers = [t.data_ptr() for t in weights + dropped]
    torch.cuda.synchronize()
    cycles = []
    # s["cycles"] cycles whose wake gives the host copies back (the default), then two whose
    # wake keeps them (keep_host_copies=True): the second of those sleeps into kept copies.
    plan = [False] * s["cycles"] + [True, True]
    for index, keep in enumerate(plan):
        free_before, _ = torch.cuda.mem_get_info()
        # vmm.torch.sleep() runs gc.collect() first by default; timed apart, since its cost is
        # the Python heap's (large with torch and transformers loaded), not the memory's.
        start = time.perf_counter()
        gc.collect()
        collected = time.perf_counter() - start
        start = time.perf_counter()
        vmm.sleep(offload_tags=("weights",), collect_garbage=False)
        slept = time.perf_counter() - start
        free_asleep, _ = torch.cuda.mem_get_info()
        start = time.perf_counter()
        vmm.wake(keep_host_copies=keep)
        torch.cuda.synchronize()
        woke = time.perf_counter() - start
        cycles.append({"sleep_ms": 1000 * slept, "gc_collect_ms": 1000 * collected, "wake_ms": 1000 * woke,
                       "freed_bytes": free_asleep - free_before, "wake_keeps_host_copies": keep,
                       "sleep_into_kept_copies": index > 0 and plan[index - 1]})
    vmm.trim()  # gives the kept copies back
    identical = all(torch.equal(w.cpu(), copy) for w, copy in zip(weights, saved))
    same_pointers = [t.data_ptr() for t in weights + dropped] == pointers
    del saved

    # The floor: the same bytes through one pinned buffer, in this process.
    total = sum(w.numel() * 4 for w in weights)
    start = time.perf_counter()
    pinned = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    pin_ms = 1000 * (time.perf_counter() - start)
    views = []
    offset = 0
    for w in weights:
        views.append(pinned[offset : offset + w.numel() * 4])
        offset += w.numel() * 4
    d2h, h2d = [], []
    for _ in range(3):
        seconds, _ = child.timed(lambda: [v.copy_(w.view(torch.uint8).view(-1), non_blocking=True) for v, w in zip(views, weights)])
        d2h.append(seconds)
        seconds, _ = child.timed(lambda: [w.view(torch.uint8).view(-1).copy_(v, non_blocking=True) for v, w in zip(views, weights)])
        h2d.append(seconds)
    last = cycles[s["cycles"] - 1]  # the last cycle with fresh host copies
    kept = cycles[-1]
    result = {
        "offloaded_bytes": total,
        "dropped_bytes": sum(t.numel() for t in dropped),
        "cycles": cycles,
        "sleep_ms": last["sleep_ms"],
        "wake_ms": last["wake_ms"],
        "sleep_kept_ms": kept["sleep_ms"],
        "wake_kept_ms": kept["wake_ms"],
        "pinned_alloc_ms": pin_ms,
        "pinned_d2h_ms": 1000 * min(d2h),
        "pinned_h2d_ms": 1000 * min(h2d),
        "bit_identical": identical,
        "pointers_unchanged": same_pointers,
    }
    result["sleep_over_d2h"] = result["sleep_ms"] / result["pinned_d2h_ms"]
    result["wake_over_h2d"] = result["wake_ms"] / result["pinned_h2d_ms"]
    result["sleep_kept_over_d2h"] = result["sleep_kept_ms"] / result["pinned_d2h_ms"]
    result["sleep_over_pin_and_d2h"] = result["sleep_ms"] / (result["pinned_d2h_ms"] + pin_ms)
    return result


def run_child(arguments):
    child = Child(arguments.allocator, arguments.vmm_headroom, arguments.cudnn_attention)
    s = settings(arguments.quick, arguments.steps)
    torch = child.torch
    properties = torch.cuda.get_device_properties(0)
    out = {
        "allocator": arguments.allocator,
        "gpu": properties.name,
        "gpu_memory": properties.total_memory,
        "torch": torch.__version__,
        "workloads": {},
    }
    try:
        import transformers

        out["transformers"] = transformers.__version__
    except ImportError:
        out["transformers"] = None
    functions = {"gpt2": workload_gpt2, "llama": workload_llama, "vit": workload_vit, "grow": workload_grow}
    # The floor allocator has no memory behind its address: only torch.empty + del run on it.
    names = [] if arguments.allocator == "pluggable_floor" else arguments.workloads.split(",")
    for name in names:
        child.clean()
        try:
            if arguments.record:
                result = recorded(child, name, lambda: functions[name](child, s[name]), arguments.record)
            elif arguments.history and child.vmm is not None:
                result = with_history(child, name, lambda: functions[name](child, s[name]), arguments.history)
            else:
                result = functions[name](child, s[name])
            result.update(child.peaks())
        except Exception as error:  # an out of memory is a result; anything else too, with its trace
            result = {"error": f"{type(error).__name__}: {error}"[:2000], "oom": child.is_oom(error)}
            if not result["oom"]:
                result["traceback"] = traceback.format_exc()[-4000:]
        out["workloads"][name] = result
        print(f"[{arguments.allocator}] {name}: {summary(result)}", file=sys.stderr, flush=True)
    if arguments.allocator != "pluggable_floor":
        child.clean()
    out["empty_del_us"] = empty_del(child, s["empty_del"])
    if child.vmm is not None and not arguments.no_sleep_wake:
        child.clean()
        try:
            out["sleep_wake"] = sleep_wake(child, s["sleep_wake"])
        except Exception as error:
            out["sleep_wake"] = {"error": f"{type(error).__name__}: {error}"[:2000], "traceback": traceback.format_exc()[-4000:]}
    with open(arguments.child_out, "w") as file:
        json.dump(out, file)


def with_history(child, name, run, folder):
    """Runs one workload under vmm's memory history; writes folder/NAME-ALLOCATOR.html (torch's
    memory_viz trace_plot of vmm.torch.memory_snapshot(), no stacks, so that the page stays
    small) and folder/NAME-ALLOCATOR.trace.gz (vmm.torch.dump_trace(), for vmm-replay)."""
    import torch.cuda._memory_viz as memory_viz

    base = os.path.join(folder, f"{name}-{child.allocator}")
    os.makedirs(folder, exist_ok=True)
    child.vmm.record_memory_history(stacks=None)
    try:
        result = run()
        child.torch.cuda.synchronize()
    finally:
        child.vmm.record_memory_history(None)
    snapshot = child.vmm.memory_snapshot()
    with open(base + ".html", "w") as file:
        file.write(memory_viz.trace_plot(snapshot))
    child.vmm.dump_trace(base + ".trace.gz")
    result["history"] = {"events": len(snapshot["device_traces"][0]) if snapshot["device_traces"] else 0,
                         "html": base + ".html", "trace": base + ".trace.gz"}
    return result


def recorded(child, name, run, folder):
    """Runs one workload under torch's allocation history; writes folder/NAME.trace.gz for
    vmm-replay (bench/record_trace.py's format), from before the workload built its model."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import record_trace

    memory = child.torch.cuda.memory
    memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=20_000_000)
    try:
        start = memory._snapshot()
        result = run()
        child.torch.cuda.synchronize()
        end = memory._snapshot()
    finally:
        memory._record_memory_history(enabled=None)
    trace = record_trace.convert(start, end, child.torch.cuda.current_device())
    os.makedirs(folder, exist_ok=True)
    header = [
        f"{name} of bench/torch_allocators.py, torch {child.torch.__version__}, recorded under the native "
        "allocator from before the model was built",
        f"{trace.allocations} allocations, {trace.frees} frees, {len(trace.streams)} stream(s), peak live {trace.peak_live} bytes",
    ]
    record_trace.write_trace(os.path.join(folder, f"{name}.trace.gz"), header, trace)
    return result


def run_probe(arguments):
    """One attempt at a gpt2 batch: exit 0 when two training steps fit, OOM_EXIT when not."""
    child = Child(arguments.allocator, arguments.vmm_headroom, arguments.cudnn_attention)
    try:
        model, optimizer, config = gpt2_model(child)
        ids = child.torch.randint(0, config.vocab_size, (arguments.batch, arguments.sequence), device=child.device)
        for _ in range(2):
            _step(model, optimizer, {"input_ids": ids, "labels": ids})
        child.torch.cuda.synchronize()
    except Exception as error:
        if child.is_oom(error):
            sys.exit(OOM_EXIT)
        raise


# ---- the parent -----------------------------------------------------------------------------


def summary(result):
    if "error" in result:
        return ("out of memory: " if result.get("oom") else "error: ") + result["error"][:200]
    ratio = result.get("reserved_over_allocated")
    return f"{result.get('step_ms_median', 0):.2f} ms/step, reserved/allocated {ratio:.3f}" if ratio else str(result)


def parse_cpus(text):
    """The CPUs of a list such as 0-7 or 0,2,4-6, checked against those this process may use."""
    cpus = set()
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"{part!r} is not a CPU number or a range of them (such as 0-7)")
        low, high = int(first), int(last or first)
        if low > high:
            raise ValueError(f"the range {part!r} runs backwards")
        cpus.update(range(low, high + 1))
    missing = cpus - os.sched_getaffinity(0)
    if missing:
        raise ValueError(f"CPUs {cpu_ranges(missing)} are not available to this process (it may use {cpu_ranges(os.sched_getaffinity(0))})")
    return cpus


def cpu_ranges(cpus):
    """0-3,6 for {0, 1, 2, 3, 6}."""
    runs = []
    for cpu in sorted(cpus):
        if runs and runs[-1][1] == cpu - 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in runs)


def child_command(allocator, extra, arguments, cpus=None):
    """This script as one allocator's child, with the options every child takes from the
    parent's; cpus (a CPU list such as "3") replaces --cpus."""
    runner = ["-m", "vmm.torch.run"] if allocator == "vmm_run" else []
    command = [sys.executable] + runner + [os.path.abspath(__file__), "--allocator", allocator] + extra
    if allocator == "vmm" and arguments.vmm_headroom is not None:
        command += ["--vmm-headroom", repr(arguments.vmm_headroom)]
    cpus = cpus if cpus is not None else arguments.cpus
    if cpus is not None:
        command += ["--cpus", cpus]
    if arguments.cudnn_attention:
        command.append("--cudnn-attention")
    return command


def spawn(allocator, extra, timeout, arguments):
    return subprocess.run(child_command(allocator, extra, arguments), env=environment_for(allocator), timeout=timeout,
                          capture_output=True, text=True)


def measure(allocator, arguments, folder):
    path = os.path.join(folder, f"{allocator}.json")
    extra = ["--child", "measure", "--child-out", path, "--workloads", arguments.workloads]
    if arguments.quick:
        extra.append("--quick")
    if arguments.steps is not None:
        extra += ["--steps", str(arguments.steps)]
    if arguments.no_sleep_wake:
        extra.append("--no-sleep-wake")
    if arguments.record and allocator == "native":
        extra += ["--record", os.path.abspath(arguments.record)]
    if arguments.history and allocator in VMM_ALLOCATORS:
        extra += ["--history", os.path.abspath(arguments.history)]
    started = time.time()
    done = spawn(allocator, extra, arguments.timeout, arguments)
    sys.stderr.write(done.stderr[-6000:] if done.returncode else "".join(l + "\n" for l in done.stderr.splitlines() if l.startswith("[")))
    if done.returncode != 0 or not os.path.exists(path):
        return {"allocator": allocator, "error": f"exit {done.returncode}", "stderr": done.stderr[-6000:]}
    with open(path) as file:
        result = json.load(file)
    result["process_seconds"] = time.time() - started
    return result


def combine(rounds):
    """One allocator's result over --rounds processes (see the file comment)."""
    ok = [r for r in rounds if "error" not in r]
    if len(ok) < len(rounds):
        return next(r for r in rounds if "error" in r)  # a failed process is the result
    result = dict(ok[0])
    result["rounds"] = len(ok)
    result["process_seconds"] = sum(r.get("process_seconds", 0) for r in ok)
    workloads = {}
    for name, first in ok[0].get("workloads", {}).items():
        each = [r.get("workloads", {}).get(name, {}) for r in ok]
        failed = [w for w in each if "error" in w or "step_ms_median" not in w]
        if failed:
            workloads[name] = failed[0]
            continue
        w = dict(first)
        w["step_ms_median_rounds"] = [x["step_ms_median"] for x in each]
        w["step_ms_median"] = statistics.median(w["step_ms_median_rounds"])
        if all("vmm_slow_path_ms_median" in x for x in each):
            w["vmm_slow_path_ms_median_rounds"] = [x["vmm_slow_path_ms_median"] for x in each]
            w["vmm_slow_path_ms_median"] = statistics.median(w["vmm_slow_path_ms_median_rounds"])
        ratios = [x.get("reserved_over_allocated") for x in each]
        if all(r is not None for r in ratios):
            w["reserved_over_allocated_rounds"] = ratios
            w["reserved_over_allocated"] = max(ratios)
        workloads[name] = w
    result["workloads"] = workloads
    if all("empty_del_us" in r for r in ok):
        result["empty_del_us_rounds"] = [r["empty_del_us"] for r in ok]
        result["empty_del_us"] = {size: statistics.median(r["empty_del_us"][size] for r in ok) for size in ok[0]["empty_del_us"]}
    return result


def largest_batch(allocator, arguments, start, step=1.5):
    """The largest gpt2 batch at --sequence that fits: from `start`, up by `step` while it fits
    (down while it does not), then bisect to 2 %."""
    probes = []

    def fits(batch):
        done = spawn(allocator, ["--child", "probe", "--batch", str(batch), "--sequence", str(arguments.sequence)], 600, arguments)
        if done.returncode not in (0, OOM_EXIT):
            raise RuntimeError(f"probe of batch {batch} failed (exit {done.returncode}): {done.stderr[-3000:]}")
        probes.append({"batch": batch, "fits": done.returncode == 0})
        print(f"[{allocator}] batch {batch} x {arguments.sequence}: {'fits' if done.returncode == 0 else 'out of memory'}", file=sys.stderr, flush=True)
        return done.returncode == 0

    low, high, batch = 0, None, max(1, start)
    if fits(batch):
        low = batch
        while high is None:
            batch = max(batch + 1, int(batch * step))
            if batch > 4096:
                return {"batch": low, "sequence": arguments.sequence, "probes": probes, "note": "no limit found below 4096"}
            if fits(batch):
                low = batch
            else:
                high = batch
    else:
        high = batch
        while low == 0 and batch > 1:
            batch = min(batch - 1, int(batch / step))
            if fits(batch):
                low = batch
            else:
                high = batch
        if low == 0:
            return {"batch": 0, "sequence": arguments.sequence, "probes": probes, "note": "not even a batch of 1 fits"}
    while high - low > max(1, int(low * 0.02)):
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return {"batch": low, "tokens": low * arguments.sequence, "sequence": arguments.sequence, "probes": probes}


def first_guess(results, sequence):
    """A starting batch from a gpt2 measurement: the tokens that would fill 90 % of the GPU."""
    for result in results.values():
        gpt2 = result.get("workloads", {}).get("gpt2", {})
        if gpt2.get("peak_allocated"):
            tokens = 16384 * 0.9 * result["gpu_memory"] / gpt2["peak_allocated"]
            return max(1, int(tokens / sequence))
    return 16


def ratio(value, floor):
    return value / floor if value is not None and floor else None


def fmt(value, pattern="{:.3f}"):
    return "-" if value is None else pattern.format(value)


def report(results, arguments, side=None):
    rows = []
    header = ["allocator"]
    for name in arguments.workloads.split(","):
        header += [f"{name} ms", f"{name} res/alloc"]
    header += ["empty+del 4K us", "empty+del 1M us", "max batch"]
    for allocator, result in results.items():
        row = [allocator]
        for name in arguments.workloads.split(","):
            w = result.get("workloads", {}).get(name, {})
            if "error" in w:
                row += ["OOM" if w.get("oom") else "error", "-"]
            else:
                row += [fmt(w.get("step_ms_median"), "{:.2f}"), fmt(w.get("reserved_over_allocated"))]
        micro = result.get("empty_del_us", {})
        row += [fmt(micro.get("4096"), "{:.2f}"), fmt(micro.get(str(MIB)), "{:.2f}"), str(result.get("max_batch", {}).get("batch", "-"))]
        rows.append(row)
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    if rows:
        print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
    for name in arguments.workloads.split(","):
        if name == "llama":
            for allocator, result in results.items():
                g = result.get("workloads", {}).get("llama", {}).get("generate_seconds")
                if g is not None:
                    print(f"llama generate(): {allocator} {g:.3f} s")
    sleep = results.get("vmm", {}).get("sleep_wake")
    if sleep and "error" not in sleep:
        every_sleep = ", ".join(f"{cycle['sleep_ms']:.1f}" for cycle in sleep["cycles"])
        print(
            f"vmm sleep/wake: {sleep['offloaded_bytes'] / GIB:.1f} GiB offloaded ({sleep['dropped_bytes'] / GIB:.1f} GiB dropped): "
            f"sleep {sleep['sleep_ms']:.1f} ms (+ gc.collect() {sleep['cycles'][-1]['gc_collect_ms']:.1f} ms), wake {sleep['wake_ms']:.1f} ms "
            f"(last cycle with fresh host copies; each cycle's sleep: {every_sleep} ms); into host copies the wake before kept: "
            f"sleep {sleep['sleep_kept_ms']:.1f} ms, wake {sleep['wake_kept_ms']:.1f} ms; pinned copy of the same bytes: "
            f"D2H {sleep['pinned_d2h_ms']:.1f} ms, H2D {sleep['pinned_h2d_ms']:.1f} ms (pinning them {sleep['pinned_alloc_ms']:.1f} ms); "
            f"bit-identical {sleep['bit_identical']}, pointers unchanged {sleep['pointers_unchanged']}"
        )
    elif sleep:
        print(f"vmm sleep/wake: {sleep['error']}")
    if side and "error" not in side:
        print(f"torch.empty + del side by side ({side['repeats']} x {side['seconds']:g} s, the same moments, a CPU each):")
        for allocator, figures in side["median_us"].items():
            ratios = side["ratio_to_native"].get(allocator, {})
            print(f"  {allocator:16s}" + "".join(
                f"  {size} B {figures[size]:.2f} us, {side['over_reference'][allocator][size]:.2f} reference" + (f" ({ratios[size]:.3f}x native)" if size in ratios and allocator != "native" else "")
                for size in figures) + f"; reference {side['reference_us'][allocator]:.3f} us")
    elif side:
        print(f"torch.empty + del side by side: {side['error']}")
    print()
    print("targets:")
    for line in check_targets(results, arguments, side):
        print("  " + line)


def check_targets(results, arguments, side=None):
    lines = []
    vmm = results.get("vmm", {})
    workloads = arguments.workloads.split(",") if results else []
    for name in workloads:
        torch_times = [
            results[a]["workloads"][name]["step_ms_median"]
            for a in TORCH_ALLOCATORS
            if a in results and "step_ms_median" in results[a].get("workloads", {}).get(name, {})
        ]
        for label in (a for a in VMM_ALLOCATORS if a in results):
            w = results[label].get("workloads", {}).get(name, {})
            if torch_times and "step_ms_median" in w:
                r = w["step_ms_median"] / min(torch_times)
                slow = f" (vmm's slow path: median {w['vmm_slow_path_ms_median']:.1f} ms a step)" if "vmm_slow_path_ms_median" in w else ""
                lines.append(f"{'PASS' if r <= 1.02 else 'FAIL'} {name}: {label} step time {r:.3f}x the fastest of torch's allocators (target <= 1.02){slow}")
            if w.get("reserved_over_allocated") is not None:
                r = w["reserved_over_allocated"]
                lines.append(f"{'PASS' if r <= 1.02 else 'FAIL'} {name}: {label} reserved/allocated {r:.3f} (target <= 1.02)")
            elif "error" in w:
                lines.append(f"FAIL {name}: {label} {w['error'][:200]}")
    native = results.get("native", {}).get("empty_del_us", {})
    ours = vmm.get("empty_del_us", {})
    floor = results.get("pluggable_floor", {}).get("empty_del_us", {})
    for size in native:
        if size in ours:
            r = ours[size] / native[size]
            beside = f"; torch's pluggable interface over an allocator that does nothing {floor[size]:.2f} us" if size in floor else ""
            lines.append(f"{'PASS' if r <= 1.0 else 'FAIL'} torch.empty+del {size} B, one process after the other: vmm {ours[size]:.2f} us, native {native[size]:.2f} us ({r:.2f}x, target <= 1){beside}")
    if side and "error" not in side:
        for allocator in ("vmm", "vmm_pool"):
            for size, r in side["ratio_to_native"].get(allocator, {}).items():
                lines.append(f"{'PASS' if r <= 1.0 else 'FAIL'} torch.empty+del {size} B side by side, over each process's reference work: {allocator} {r:.3f}x native "
                             f"({side['over_reference'][allocator][size]:.2f} against {side['over_reference']['native'][size]:.2f}; plain medians "
                             f"{side['median_us'][allocator][size]:.2f} and {side['median_us']['native'][size]:.2f} us) (target <= 1)")
    sleep = vmm.get("sleep_wake")
    if sleep and "error" not in sleep:
        ok = sleep["bit_identical"] and sleep["pointers_unchanged"]
        lines.append(f"{'PASS' if ok else 'FAIL'} sleep/wake bit-identical and every pointer unchanged")
        for key, what in (("sleep_over_d2h", "sleep / pinned D2H"), ("wake_over_h2d", "wake / pinned H2D"),
                          ("sleep_kept_over_d2h", "sleep into kept host copies / pinned D2H")):
            lines.append(f"{'PASS' if sleep[key] <= 1.2 else 'FAIL'} {what} {sleep[key]:.2f}x (target <= 1.2)")
    batches = {a: r.get("max_batch", {}).get("batch") for a, r in results.items() if r.get("max_batch")}
    if "vmm" in batches and batches["vmm"] is not None:
        best = max((b for a, b in batches.items() if a != "vmm" and b is not None), default=None)
        if best:
            lines.append(f"{'PASS' if batches['vmm'] >= best else 'NOTE'} largest gpt2 batch: vmm {batches['vmm']}, best of torch's {best}")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="about 2 minutes: fewer steps, smaller sizes, no largest-batch search")
    parser.add_argument("--allocators", default=",".join(DEFAULT_ALLOCATORS), help=f"comma-separated, of {', '.join(ALLOCATORS)}")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--json", default=os.path.join(REPOSITORY, "bench-torch-allocators.json"))
    parser.add_argument("--max-batch", choices=("on", "off", "auto"), default="auto", help="the largest-batch search (auto: off with --quick)")
    parser.add_argument("--steps", type=int, help="steps of gpt2, llama and vit, their warm-up included (default: 60 / 40 / 40, --quick 20 / 12 / 12); a long run spreads each process over more of the host's moments")
    parser.add_argument("--sequence", type=int, default=2048, help="sequence length of the largest-batch search")
    parser.add_argument("--no-sleep-wake", action="store_true")
    parser.add_argument("--record", metavar="DIR", help="native allocator only: also write each workload's allocation trace (from before its model is built) to DIR/NAME.trace.gz, for vmm-replay")
    parser.add_argument("--history", metavar="DIR", help="vmm and vmm_run only: record vmm's memory history over each workload and write DIR/WORKLOAD-ALLOCATOR.html (memory_viz) and .trace.gz (vmm-replay)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds for one allocator's process")
    parser.add_argument("--vmm-headroom", type=float, help="vmm only: vmm.torch.use(headroom=X), the idle share of its peak a resource may keep mapped (default: vmm's, 1/128)")
    parser.add_argument("--rounds", type=int, default=1, help="every allocator's process this many times, in alternating order")
    parser.add_argument("--cudnn-attention", action="store_true", help="leave cuDNN's attention in torch's scaled_dot_product_attention (torch's choice on Hopper; it plans every new sequence length on the host, so gpt2 and llama time cuDNN's planner)")
    parser.add_argument("--cpus", help="run every process on these CPUs, e.g. 0-7 or 0,2,4-6 (default: wherever the OS puts it)")
    # the children
    parser.add_argument("--side-by-side", default="auto", help="torch.empty + del of these allocators side by side, at the same moments (comma-separated; auto: those of --allocators, and vmm_pool, vmm.torch.mem_pool() with torch's caching allocator on top, when vmm is one of them; off: none)")
    parser.add_argument("--side-by-side-seconds", type=float, help="seconds of each side-by-side repeat (default 8, --quick 3)")
    parser.add_argument("--side-by-side-repeats", type=int, help="side-by-side repeats, the CPUs rotated between them (default 3, --quick 1)")
    parser.add_argument("--empty-del-only", action="store_true", help="only torch.empty + del side by side: no workloads, no largest-batch search")
    parser.add_argument("--allocator", choices=ALLOCATORS + ("vmm_pool",))
    parser.add_argument("--child", choices=("measure", "probe", "side"))
    parser.add_argument("--child-out")
    parser.add_argument("--batch", type=int)
    arguments = parser.parse_args()
    if arguments.cpus is not None:
        try:
            cpus = parse_cpus(arguments.cpus)
        except ValueError as error:
            parser.error(f"--cpus {arguments.cpus!r}: {error}")
        os.sched_setaffinity(0, cpus)  # the children inherit it, and set it again themselves

    if arguments.child == "measure":
        return run_child(arguments)
    if arguments.child == "probe":
        return run_probe(arguments)
    if arguments.child == "side":
        return run_side_child(arguments)

    import tempfile

    allocators = [a for a in arguments.allocators.split(",") if a]
    for a in allocators:
        if a not in ALLOCATORS:
            parser.error(f"unknown allocator {a}")
    for w in arguments.workloads.split(","):
        if w not in WORKLOADS:
            parser.error(f"unknown workload {w}")
    if arguments.record and "native" not in allocators:
        parser.error("--record records under the native allocator: add native to --allocators")
    if arguments.vmm_headroom is not None and not 0 <= arguments.vmm_headroom <= 1:
        parser.error(f"--vmm-headroom {arguments.vmm_headroom}: expected a share from 0 to 1")
    if arguments.steps is not None:
        warmup = max(w["warmup"] for w in settings(arguments.quick).values() if "warmup" in w)
        if not warmup < arguments.steps <= 100000:
            parser.error(f"--steps {arguments.steps}: expected more than the {warmup} warm-up steps and at most 100000")
    if not 1 <= arguments.rounds <= 100:
        parser.error(f"--rounds {arguments.rounds}: expected 1 to 100")
    if arguments.record and arguments.rounds != 1:
        parser.error("--record writes one trace per workload: use it with --rounds 1")
    if arguments.side_by_side == "auto":
        side = allocators + (["vmm_pool"] if "vmm" in allocators else [])
    elif arguments.side_by_side == "off":
        side = []
    else:
        side = [a for a in arguments.side_by_side.split(",") if a]
        for a in side:
            if a not in ALLOCATORS + ("vmm_pool",):
                parser.error(f"--side-by-side: unknown allocator {a}")
    if arguments.side_by_side_seconds is None:
        arguments.side_by_side_seconds = 3.0 if arguments.quick else 8.0
    if arguments.side_by_side_repeats is None:
        arguments.side_by_side_repeats = 1 if arguments.quick else 3
    if not 0.5 <= arguments.side_by_side_seconds <= 600:
        parser.error(f"--side-by-side-seconds {arguments.side_by_side_seconds}: expected 0.5 to 600")
    if not 1 <= arguments.side_by_side_repeats <= 100:
        parser.error(f"--side-by-side-repeats {arguments.side_by_side_repeats}: expected 1 to 100")
    if arguments.empty_del_only:
        if len(side) < 2:
            parser.error("--empty-del-only compares allocators side by side: name two or more (--side-by-side, --allocators)")
        allocators = []
    # The children import vmm as this interpreter finds it (they run with sys.executable).
    if arguments.history and arguments.rounds != 1:
        parser.error("--history writes one history per workload and allocator: use it with --rounds 1")
    if arguments.history and not set(VMM_ALLOCATORS) & set(allocators):
        parser.error("--history records vmm's history: add vmm or vmm_run to --allocators")
    if {"vmm", "vmm_pool", "vmm_run"} & set(allocators + side) and importlib.util.find_spec("vmm") is None:
        sys.exit(f"torch_allocators.py: the package vmm is not installed for {sys.executable}: "
                 f"pip install --no-build-isolation {REPOSITORY} (python/README.md), or leave vmm out of --allocators")
    started = time.time()
    runs = {allocator: [] for allocator in allocators}
    with tempfile.TemporaryDirectory() as folder:
        for round_index in range(arguments.rounds):
            for allocator in allocators if round_index % 2 == 0 else allocators[::-1]:
                runs[allocator].append(measure(allocator, arguments, folder))
        results = {allocator: combine(runs[allocator]) for allocator in allocators}
        side_result = None
        if len(side) >= 2:
            try:
                side_result = side_by_side(side, arguments, folder)
            except Exception as error:
                side_result = {"error": f"{type(error).__name__}: {error}"[:3000]}
    search = not arguments.empty_del_only and (arguments.max_batch == "on" or (arguments.max_batch == "auto" and not arguments.quick))
    if search:
        guess, step = first_guess(results, arguments.sequence), 1.5
        for allocator in allocators:
            if allocator == "pluggable_floor":
                continue  # no memory to train in
            try:
                results[allocator]["max_batch"] = largest_batch(allocator, arguments, guess, step)
                # the next allocator's limit is near this one's: start there, in smaller steps
                guess, step = max(1, results[allocator]["max_batch"]["batch"]), 1.1
            except Exception as error:
                results[allocator]["max_batch"] = {"error": str(error)[:3000]}
    document = {
        "benchmark": "bench/torch_allocators.py",
        "quick": arguments.quick,
        "rounds": arguments.rounds,
        "vmm_headroom": arguments.vmm_headroom,
        "cpus": sorted(os.sched_getaffinity(0)) if arguments.cpus is not None else None,
        "cudnn_attention": arguments.cudnn_attention,
        "max_batch_search": search,
        "settings": settings(arguments.quick, arguments.steps),
        "seconds": time.time() - started,
        "results": results,
        "empty_del_side_by_side": side_result,
    }
    document["targets"] = check_targets(results, arguments, side_result)
    with open(arguments.json, "w") as file:
        json.dump(document, file, indent=1)
    print()
    report(results, arguments, side_result)
    print(f"\n{time.time() - started:.0f} s; JSON: {arguments.json}")


if __name__ == "__main__":
    main()
