#!/usr/bin/env python3
"""Records the allocation trace of a PyTorch workload, for vmm-replay.

    python3 bench/record_trace.py gpt2  [--steps 60] [--out gpt2.trace.gz]
    python3 bench/record_trace.py llama [--steps 30] [--new-tokens 256]
    python3 bench/record_trace.py vit   [--steps 60]
    python3 bench/record_trace.py --self-test      # the conversion alone, no torch needed

Workloads (random weights, configs built here: nothing is downloaded):
  gpt2   GPT-2 small (transformers GPT2Config, 124M parameters, n_positions 2048), bf16
         weights, AdamW; each step a sequence length drawn from 128-2048 (multiples of 64)
         and as many sequences as make about 16k tokens.
  llama  a small Llama (transformers LlamaConfig: 8 layers, hidden 1024, GQA 16/4 heads),
         bf16, AdamW, the same kind of steps; then generate() of --new-tokens tokens for 8
         prompts of 128 tokens (greedy, KV cache, no early stop).
  vit    ViT-B/16, bf16, AdamW, at a resolution drawn each step from 160-384 pixels with the
         batch sized to keep about 12.5k patches a step: timm's vit_base_patch16_224 with
         dynamic_img_size when timm is installed, else transformers' ViTForImageClassification
         with interpolate_pos_encoding (torchvision's ViT has a fixed resolution).
The first step runs before recording (so that the optimizer state exists, as in a long
run); --steps counts it. --from-start records from before the model is built instead: the
weights, and the optimizer state the first step creates among that step's activations,
land where a live run puts them (the layout a long run inherits).

How: torch.cuda.memory._record_memory_history(context=None) keeps a history of every call to
the CUDA caching allocator; a snapshot taken when recording starts gives the allocations
live then (they open the trace, oldest address first), and one taken at the end gives the
history (device_traces: 'alloc' and 'free_requested' entries, in the allocator's order,
which is program order). Sizes are the bytes asked for (requested_size), not the
allocator's rounded blocks. Streams (cudaStream_t values) are numbered 0, 1, ... with the
default stream 0.

Output: the trace format of bench/data/README.md, gzip-compressed when the name ends in .gz:

    # comments (torch version, workload, allocator, device, counts, peaks)
    a <id> <bytes> <stream>
    f <id>

Printed: the trace's peak live bytes and torch.cuda.max_memory_allocated() over the recorded
steps. They agree to within the caching allocator's rounding: it counts whole blocks (each
request rounded up to 512 bytes, and a cached block reused whole when splitting it would
leave less than the split threshold), so max_memory_allocated() is the larger by that.
Also printed: max_memory_reserved() / max_memory_allocated(), the figure vmm-replay's
reserved/live is compared with.

Needs PyTorch with CUDA and a GPU, and transformers (timm optional, for vit). The allocator
must be PyTorch's native one (PYTORCH_CUDA_ALLOC_CONF may set expandable_segments):
backend:cudaMallocAsync keeps no history.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import os
import random
import sys
from dataclasses import dataclass, field

DEFAULT_STEPS = {"gpt2": 60, "llama": 30, "vit": 60}
GIB = float(1 << 30)


class RecordError(Exception):
    """A failure with a message for the user (no traceback)."""


# ---- the conversion: snapshots to trace lines (pure Python, checked by --self-test) ---------


@dataclass
class Trace:
    lines: list = field(default_factory=list)  # "a ..." / "f ..." lines, no newline
    live_at_start: int = 0
    allocations: int = 0  # live at start included
    frees: int = 0
    streams: dict = field(default_factory=dict)  # cudaStream_t value -> number
    peak_live: int = 0  # bytes requested
    peak_live_rounded: int = 0  # each request rounded up to 512 bytes, as the allocator does
    live_at_end: int = 0
    size_mismatches: int = 0  # frees whose size differs from the allocation's (the allocation's is kept)
    ignored_actions: dict = field(default_factory=dict)


def _round_block(size: int) -> int:
    return 512 if size < 512 else (size + 511) // 512 * 512


def _stream_number(trace: Trace, stream: int) -> int:
    if stream not in trace.streams:
        if not trace.streams and stream != 0:
            trace.streams[0] = 0  # the default stream keeps number 0 even if unused so far
        trace.streams[stream] = len(trace.streams)
    return trace.streams[stream]


def convert(start_snapshot: dict, end_snapshot: dict, device: int) -> Trace:
    """The trace of what happened on `device` between two torch.cuda.memory._snapshot()s
    taken with history recording on from (just before) the first."""
    trace = Trace()
    live: dict[int, tuple[int, int]] = {}  # address -> (id, bytes)
    live_bytes = 0
    live_rounded = 0

    def allocate(address: int, size: int, stream: int, what: str) -> None:
        nonlocal live_bytes, live_rounded
        if address in live:
            raise RecordError(f"{what}: address {address:#x} is allocated twice without a free")
        ident = trace.allocations
        trace.allocations += 1
        live[address] = (ident, size)
        trace.lines.append(f"a {ident} {size} {_stream_number(trace, stream)}")
        live_bytes += size
        live_rounded += _round_block(size)
        trace.peak_live = max(trace.peak_live, live_bytes)
        trace.peak_live_rounded = max(trace.peak_live_rounded, live_rounded)

    # The allocations live when recording began, lowest address first.
    initial = []
    for segment in start_snapshot.get("segments", []):
        if segment.get("device", device) != device:
            continue
        offset = segment["address"]
        for block in segment.get("blocks", []):
            address = block.get("address", offset)  # old snapshots: blocks tile the segment
            offset = address + block["size"]
            if block.get("state") != "active_allocated":
                continue  # free, or freed by the program and waiting for streams
            requested = block.get("requested_size") or block["size"]
            initial.append((address, requested, segment.get("stream", 0)))
    for address, size, stream in sorted(initial):
        allocate(address, size, stream, "the snapshot at the start")
    trace.live_at_start = len(initial)

    traces = end_snapshot.get("device_traces", [])
    if device >= len(traces):
        raise RecordError(f"the snapshot has no trace for device {device}")
    for number, entry in enumerate(traces[device]):
        action = entry.get("action")
        where = f"trace entry {number} ({action})"
        if action == "alloc":
            allocate(entry["addr"], entry["size"], entry.get("stream", 0), where)
        elif action == "free_requested":
            address = entry["addr"]
            if address not in live:
                raise RecordError(
                    f"{where}: free of {address:#x}, which is not live: the history lost its start "
                    "(raise --max-entries) or recording began while the allocator was busy"
                )
            ident, size = live.pop(address)
            if entry.get("size", size) != size:  # torch reports requested_size for both: never seen
                trace.size_mismatches += 1
            trace.lines.append(f"f {ident}")
            trace.frees += 1
            live_bytes -= size
            live_rounded -= _round_block(size)
        else:  # free_completed, segment_*, snapshot, oom: not the program's calls
            trace.ignored_actions[action] = trace.ignored_actions.get(action, 0) + 1
    trace.live_at_end = len(live)
    return trace


def write_trace(path: str, header: list, trace: Trace) -> None:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt", encoding="ascii") as out:
        for line in header:
            out.write(f"# {line}\n")
        out.write("\n".join(trace.lines))
        out.write("\n")


# ---- the workloads --------------------------------------------------------------------------


def _require(module: str, why: str):
    try:
        return __import__(module)
    except ImportError as error:
        raise RecordError(f"{why} needs the Python package '{module}', which is not importable: {error}")


def _sequence_lengths(steps: int, seed: int, low: int = 128, high: int = 2048, multiple: int = 64) -> list:
    chooser = random.Random(seed)
    return [chooser.randrange(low, high + 1, multiple) for _ in range(steps)]


class Workload:
    """Builds a model and runs steps; step(i) must leave nothing of step i alive but what a
    training loop keeps (weights, gradients set to None, optimizer state)."""

    name = ""
    description = ""

    def __init__(self, torch, args):
        self.torch = torch
        self.args = args
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(args.seed)

    def step(self, index: int) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        """After the last step, still recorded (llama: generate())."""


class CausalLMWorkload(Workload):
    tokens_per_step = 16384

    def __init__(self, torch, args, model, vocab_size):
        super().__init__(torch, args)
        self.model = model.to(device=self.device, dtype=torch.bfloat16)
        self.model.train()
        self.vocab = vocab_size
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.lengths = _sequence_lengths(args.steps, args.seed)

    def step(self, index: int) -> None:
        torch = self.torch
        length = self.lengths[index]
        batch = max(1, self.tokens_per_step // length)
        tokens = torch.randint(0, self.vocab, (batch, length), device=self.device, generator=self.generator)
        loss = self.model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        del loss, tokens


class Gpt2(CausalLMWorkload):
    name = "gpt2"

    def __init__(self, torch, args):
        transformers = _require("transformers", "the gpt2 workload")
        config = transformers.GPT2Config(n_positions=2048)  # small: 12 layers, 768 wide, 12 heads
        model = transformers.GPT2LMHeadModel(config)
        self.description = (
            f"GPT-2 small ({sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters, "
            f"transformers {transformers.__version__}), random weights, bf16, AdamW, "
            f"sequence lengths 128-2048 at about {self.tokens_per_step} tokens a step"
        )
        super().__init__(torch, args, model, config.vocab_size)


class Llama(CausalLMWorkload):
    name = "llama"

    def __init__(self, torch, args):
        transformers = _require("transformers", "the llama workload")
        config = transformers.LlamaConfig(
            vocab_size=32000,
            hidden_size=1024,
            intermediate_size=2816,
            num_hidden_layers=8,
            num_attention_heads=16,
            num_key_value_heads=4,
            max_position_embeddings=4096,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
            tie_word_embeddings=False,
        )
        model = transformers.LlamaForCausalLM(config)
        self.description = (
            f"small Llama ({sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters: 8 layers, "
            f"hidden 1024, 16/4 heads, transformers {transformers.__version__}), random weights, bf16, AdamW, "
            f"sequence lengths 128-2048 at about {self.tokens_per_step} tokens a step, then generate() of "
            f"{args.new_tokens} tokens for 8 prompts of 128"
        )
        super().__init__(torch, args, model, config.vocab_size)

    def finish(self) -> None:
        torch = self.torch
        self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        prompts = torch.randint(3, self.vocab, (8, 128), device=self.device, generator=self.generator)
        with torch.no_grad():
            out = self.model.generate(
                input_ids=prompts,
                attention_mask=torch.ones_like(prompts),
                max_new_tokens=self.args.new_tokens,
                min_new_tokens=self.args.new_tokens,  # random weights: never stop early
                do_sample=False,
                pad_token_id=0,
            )
        if out.shape[1] != 128 + self.args.new_tokens:
            raise RecordError(f"generate() made {out.shape[1] - 128} tokens, not {self.args.new_tokens}")
        del out, prompts


class Vit(Workload):
    name = "vit"
    patches_per_step = 64 * 196
    resolutions = (160, 192, 224, 256, 288, 320, 384)

    def __init__(self, torch, args):
        super().__init__(torch, args)
        model = None
        try:
            import timm  # optional

            model = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=1000, dynamic_img_size=True)
            self.forward = lambda images: model(images)
            source = f"timm {timm.__version__} vit_base_patch16_224, dynamic_img_size"
        except ImportError:
            pass
        except TypeError as error:  # a timm without dynamic_img_size
            print(f"record_trace: timm cannot vary the resolution ({error}); using transformers' ViT", file=sys.stderr)
        if model is None:
            transformers = _require("transformers", "the vit workload (without timm)")
            config = transformers.ViTConfig(
                image_size=224,
                patch_size=16,
                hidden_size=768,
                num_hidden_layers=12,
                num_attention_heads=12,
                intermediate_size=3072,
                num_labels=1000,
            )
            model = transformers.ViTForImageClassification(config)
            self.forward = lambda images: model(pixel_values=images, interpolate_pos_encoding=True).logits
            source = f"transformers {transformers.__version__} ViTForImageClassification, interpolate_pos_encoding"
        self.model = model.to(device=self.device, dtype=torch.bfloat16)
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        chooser = random.Random(args.seed)
        self.sizes = [chooser.choice(self.resolutions) for _ in range(args.steps)]
        self.description = (
            f"ViT-B/16 ({sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters, {source}), random "
            f"weights, bf16, AdamW, resolutions {self.resolutions[0]}-{self.resolutions[-1]} at about "
            f"{self.patches_per_step} patches a step"
        )

    def step(self, index: int) -> None:
        torch = self.torch
        size = self.sizes[index]
        batch = max(1, round(self.patches_per_step / (size // 16) ** 2))
        images = torch.randn(
            (batch, 3, size, size), device=self.device, dtype=torch.bfloat16, generator=self.generator
        )
        labels = torch.randint(0, 1000, (batch,), device=self.device, generator=self.generator)
        loss = torch.nn.functional.cross_entropy(self.forward(images).float(), labels)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        del loss, images, labels


WORKLOADS = {"gpt2": Gpt2, "llama": Llama, "vit": Vit}


# ---- recording ------------------------------------------------------------------------------


def _import_torch():
    try:
        import torch
    except ImportError as error:
        raise RecordError(f"PyTorch is not importable ({error}): install torch with CUDA support")
    if not torch.cuda.is_available():
        raise RecordError(
            f"torch {torch.__version__} sees no usable CUDA GPU (torch.version.cuda={torch.version.cuda}); "
            "a trace can only be recorded on a GPU"
        )
    backend = torch.cuda.get_allocator_backend() if hasattr(torch.cuda, "get_allocator_backend") else "native"
    if backend != "native":
        raise RecordError(
            f"the allocator backend is '{backend}' (PYTORCH_CUDA_ALLOC_CONF="
            f"{os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '')!r}): only PyTorch's native allocator keeps a "
            "history; unset backend:cudaMallocAsync"
        )
    memory = getattr(torch.cuda, "memory", None)
    if memory is None or not hasattr(memory, "_record_memory_history") or not hasattr(memory, "_snapshot"):
        raise RecordError(f"torch {torch.__version__} has no torch.cuda.memory._record_memory_history: use torch 2.1 or later")
    return torch


def record(args) -> int:
    torch = _import_torch()
    torch.manual_seed(args.seed)
    device = torch.cuda.current_device()
    memory = torch.cuda.memory

    def begin():
        memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=args.max_entries)
        return memory._snapshot()

    if args.from_start:  # the model's creation and the first step recorded too
        start = begin()
        first = 0
    else:
        first = 1
    try:
        workload = WORKLOADS[args.workload](torch, args)
        if not args.from_start:
            workload.step(0)  # unrecorded: builds the optimizer state, warms cuBLAS and the kernels
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            start = begin()
        for index in range(first, args.steps):
            workload.step(index)
        workload.finish()
        torch.cuda.synchronize()
        end = memory._snapshot()
    finally:
        memory._record_memory_history(enabled=None)
    peak_allocated = torch.cuda.max_memory_allocated()
    peak_reserved = torch.cuda.max_memory_reserved()

    entries = len(end.get("device_traces", [[]])[device]) if device < len(end.get("device_traces", [])) else 0
    if entries >= args.max_entries:
        raise RecordError(f"the history holds {entries} entries, the most --max-entries keeps: it lost its start")
    trace = convert(start, end, device)

    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    allocator = "the native caching allocator" + (f" (PYTORCH_CUDA_ALLOC_CONF={conf})" if conf else "")
    header = [
        f"{args.workload} allocation trace, torch {torch.__version__}, recorded under {allocator}; "
        f"the first {trace.live_at_start} allocations were live before recording began",
        f"workload: {workload.description}; "
        + (f"{args.steps} steps, all recorded from the model's creation on" if args.from_start
           else f"{args.steps - 1} recorded steps after 1 unrecorded")
        + f", seed {args.seed}",
        f"device: {torch.cuda.get_device_name(device)}, CUDA {torch.version.cuda}; recorded "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d} by bench/record_trace.py",
        f"{trace.allocations} allocations, {trace.frees} frees, {len(trace.streams)} stream(s), "
        f"{trace.live_at_end} live at the end",
        f"peak live {trace.peak_live} bytes ({trace.peak_live / GIB:.3f} GiB; {trace.peak_live_rounded} with each "
        f"request rounded to 512); torch.cuda.max_memory_allocated() {peak_allocated} "
        f"({peak_allocated / GIB:.3f} GiB); max_memory_reserved() {peak_reserved} ({peak_reserved / GIB:.3f} GiB)",
    ]
    out = args.out or f"{args.workload}.trace.gz"
    write_trace(out, header, trace)

    print(f"wrote {out}: {trace.allocations} allocations ({trace.live_at_start} live at the start), "
          f"{trace.frees} frees, {len(trace.streams)} stream(s)")
    print(f"peak live (trace, bytes requested)      {trace.peak_live / GIB:9.3f} GiB  {trace.peak_live}")
    print(f"peak live (trace, rounded to 512 B)     {trace.peak_live_rounded / GIB:9.3f} GiB  {trace.peak_live_rounded}")
    print(f"torch.cuda.max_memory_allocated()       {peak_allocated / GIB:9.3f} GiB  {peak_allocated}")
    print(f"torch.cuda.max_memory_reserved()        {peak_reserved / GIB:9.3f} GiB  {peak_reserved}")
    if peak_allocated:
        print(f"trace peak / max_memory_allocated       {trace.peak_live / peak_allocated:9.4f}")
        print(f"reserved / allocated (this allocator)   {peak_reserved / peak_allocated:9.4f}")
    if trace.size_mismatches:
        print(f"warning: {trace.size_mismatches} frees named another size than their allocation's "
              "(the allocation's is in the trace)")
    if trace.ignored_actions:
        print("other history entries (not in the trace): "
              + ", ".join(f"{k} {v}" for k, v in sorted(trace.ignored_actions.items())))
    return 0


# ---- the self-test ----------------------------------------------------------------------------


def self_test() -> int:
    """The conversion on hand-made snapshots shaped like torch 2.x's."""
    start = {
        "segments": [
            {"device": 0, "address": 0x1000, "stream": 0, "total_size": 4096, "blocks": [
                {"address": 0x1000, "size": 1024, "requested_size": 1000, "state": "active_allocated"},
                {"address": 0x1400, "size": 1024, "requested_size": 0, "state": "inactive"},
                {"address": 0x1800, "size": 2048, "requested_size": 2000, "state": "active_pending_free"},
            ]},
            # No block addresses (older snapshots): they tile the segment.
            {"device": 0, "address": 0x9000, "stream": 77, "total_size": 2048, "blocks": [
                {"size": 512, "requested_size": 0, "state": "inactive"},
                {"size": 1536, "requested_size": 1500, "state": "active_allocated"},
            ]},
            {"device": 1, "address": 0x5000, "stream": 0, "total_size": 512, "blocks": [
                {"address": 0x5000, "size": 512, "requested_size": 512, "state": "active_allocated"},
            ]},
        ]
    }
    end = {
        "device_traces": [
            [
                {"action": "snapshot", "addr": 0, "size": 0, "stream": 0},
                {"action": "alloc", "addr": 0xa000, "size": 300, "stream": 0},
                {"action": "free_requested", "addr": 0x1000, "size": 1000, "stream": 0},
                {"action": "free_completed", "addr": 0x1000, "size": 1000, "stream": 0},
                {"action": "alloc", "addr": 0x1000, "size": 700, "stream": 77},
                {"action": "free_completed", "addr": 0x1800, "size": 2000, "stream": 0},
                {"action": "free_requested", "addr": 0x9200, "size": 1500, "stream": 77},
                {"action": "segment_alloc", "addr": 0xb000, "size": 1 << 21, "stream": 0},
                {"action": "alloc", "addr": 0xb000, "size": 5000, "stream": 99},
            ],
            [],
        ]
    }
    trace = convert(start, end, 0)
    expected = ["a 0 1000 0", "a 1 1500 1", "a 2 300 0", "f 0", "a 3 700 1", "f 1", "a 4 5000 2"]
    failures = []
    if trace.lines != expected:
        failures.append(f"lines {trace.lines} != {expected}")
    if trace.live_at_start != 2:
        failures.append(f"live_at_start {trace.live_at_start} != 2")
    if trace.peak_live != 700 + 300 + 5000:  # at the end: 0x1000 again, 0xa000, 0xb000
        failures.append(f"peak_live {trace.peak_live} != 6000")
    if trace.peak_live_rounded != 1024 + 512 + 5120:
        failures.append(f"peak_live_rounded {trace.peak_live_rounded} != 6656")
    if trace.live_at_end != 3:
        failures.append(f"live_at_end {trace.live_at_end} != 3")
    if trace.streams != {0: 0, 77: 1, 99: 2}:
        failures.append(f"streams {trace.streams}")
    if trace.ignored_actions != {"snapshot": 1, "free_completed": 2, "segment_alloc": 1}:
        failures.append(f"ignored {trace.ignored_actions}")
    # A stream other than the default first: 0 stays the default stream's number.
    first_other = convert({"segments": []}, {"device_traces": [[{"action": "alloc", "addr": 1, "size": 1, "stream": 5}]]}, 0)
    if first_other.lines != ["a 0 1 1"]:
        failures.append(f"first non-default stream: {first_other.lines}")
    # Broken histories are errors that say what is wrong.
    for broken, words in (
        ([{"action": "free_requested", "addr": 0x42, "size": 1, "stream": 0}], "not live"),
        ([{"action": "alloc", "addr": 0xa, "size": 1, "stream": 0}, {"action": "alloc", "addr": 0xa, "size": 1, "stream": 0}],
         "twice"),
    ):
        try:
            convert({"segments": []}, {"device_traces": [broken]}, 0)
            failures.append(f"no error for {broken}")
        except RecordError as error:
            if words not in str(error):
                failures.append(f"error '{error}' does not say '{words}'")
    mismatched = convert({"segments": []}, {"device_traces": [[
        {"action": "alloc", "addr": 0xa, "size": 1, "stream": 0},
        {"action": "free_requested", "addr": 0xa, "size": 2, "stream": 0}]]}, 0)
    if mismatched.size_mismatches != 1 or mismatched.lines != ["a 0 1 0", "f 0"]:
        failures.append(f"a free of another size: {mismatched.lines}, {mismatched.size_mismatches} counted")
    # The file: header comments, then the lines; gzip when the name says so.
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        for name in ("t.trace", "t.trace.gz"):
            path = os.path.join(folder, name)
            write_trace(path, ["one", "two"], trace)
            opener = gzip.open if name.endswith(".gz") else open
            with opener(path, "rt", encoding="ascii") as f:
                text = f.read()
            if text != "# one\n# two\n" + "\n".join(expected) + "\n":
                failures.append(f"{name}: {text!r}")
    for failure in failures:
        print(f"FAILED: {failure}")
    checks = 9
    print(f"record_trace self-test: {checks - min(len(failures), checks)} passed, {len(failures)} failed")
    return 1 if failures else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload", nargs="?", choices=sorted(WORKLOADS))
    parser.add_argument("--steps", type=int, help="steps in all, the first unrecorded (default: gpt2 60, llama 30, vit 60)")
    parser.add_argument("--new-tokens", type=int, default=256, help="llama: tokens generate() makes (default 256)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--from-start", action="store_true", help="record from before the model is built: its weights, the first step and the optimizer state it creates (where a long run's layout comes from)")
    parser.add_argument("--out", help="the trace file (default: WORKLOAD.trace.gz)")
    parser.add_argument("--max-entries", type=int, default=20_000_000, help="history entries kept (default 20M)")
    parser.add_argument("--self-test", action="store_true", help="check the conversion on made-up snapshots; no torch needed")
    args = parser.parse_args(argv)
    if args.self_test:
        return self_test()
    if args.workload is None:
        parser.error("a workload is needed: " + ", ".join(sorted(WORKLOADS)))
    if args.steps is None:
        args.steps = DEFAULT_STEPS[args.workload]
    if args.steps < 2:
        parser.error("--steps must be at least 2 (the first is not recorded)")
    if args.new_tokens < 1:
        parser.error("--new-tokens must be at least 1")
    try:
        return record(args)
    except RecordError as error:
        print(f"record_trace: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
