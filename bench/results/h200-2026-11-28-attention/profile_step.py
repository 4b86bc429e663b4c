"""Where a quick training step's time goes, host against GPU, under one allocator.

    VMM_TORCH_LIBRARY=... taskset -c 0-7 python3 profile_step.py ALLOCATOR gpt2|llama|vit

Builds the workload as bench/torch_allocators.py does, runs 5 steps, then times 12 (wall,
until the step's Python returned, the main thread's CPU time, CUDA events, /proc/stat's
jiffies), then profiles 4 with torch.profiler (the tables by host and by GPU time).
scaled_dot_product_attention runs off cuDNN unless CUDNN_SDP=1 (the profiles of gpt2 and
llama in profiles/ without "-flash" ran with cuDNN on, torch's choice, before this switch).
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import torch_allocators as ta  # noqa: E402

allocator, workload = sys.argv[1], sys.argv[2]
child = ta.Child(allocator)
torch = child.torch
torch.backends.cuda.enable_cudnn_sdp(os.environ.get("CUDNN_SDP") == "1")
print(f"== {allocator} {workload} threads={torch.get_num_threads()} affinity={sorted(os.sched_getaffinity(0))}")
if workload == "gpt2":
    model, opt, config = ta.gpt2_model(child)
    seq = ta.lengths(1234, 20, 128, 2048)
elif workload == "vit":
    import random

    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(image_size=224, patch_size=16, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                       intermediate_size=3072, num_labels=1000)
    torch.manual_seed(2468)
    model = ViTForImageClassification(config).to(device=child.device, dtype=torch.bfloat16)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    choices = random.Random(2468)
    seq = [choices.choice((160, 192, 224, 256, 288, 320, 384)) for _ in range(24)]
    generator = torch.Generator(device=child.device)
    generator.manual_seed(97)

    def vmaker(resolution):
        def make():
            batch = max(1, round(64 * (224 / resolution) ** 2))
            pixels = torch.randn(batch, 3, resolution, resolution, device=child.device, generator=generator,
                                 dtype=torch.bfloat16)
            labels = torch.randint(0, 1000, (batch,), device=child.device, generator=generator)
            return {"pixel_values": pixels, "labels": labels, "interpolate_pos_encoding": True}

        return make
else:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                         num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=4096,
                         tie_word_embeddings=False)
    torch.manual_seed(4321)
    model = LlamaForCausalLM(config).to(device=child.device, dtype=torch.bfloat16)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    seq = ta.lengths(4321, 20, 256, 4096)
if workload == "vit":
    batches = [vmaker(r) for r in seq]
else:
    batches = ta.token_batches(child, config.vocab_size, seq, 16384, 99)


def steal():
    with open("/proc/stat") as f:
        v = f.readline().split()[1:]
    return [int(x) for x in v]


for make in batches[:5]:
    child.timed(lambda: ta._step(model, opt, make()))
for i, make in enumerate(batches[5:17]):
    inputs = make()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s0 = steal()
    c0, t0 = time.thread_time(), time.perf_counter()
    e0.record()
    ta._step(model, opt, inputs)
    e1.record()
    t1, c1 = time.perf_counter(), time.thread_time()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    s1 = steal()
    d = [b - a for a, b in zip(s0, s1)]
    print(f"len {seq[5 + i]:5d} wall {1e3 * (t2 - t0):7.1f} issued {1e3 * (t1 - t0):7.1f} cpu {1e3 * (c1 - c0):7.1f} "
          f"gpu-events {e0.elapsed_time(e1):7.1f}  stat user/sys/idle/iowait/steal {d[0]}/{d[2]}/{d[3]}/{d[4]}/{d[7]}",
          flush=True)
from torch.profiler import ProfilerActivity, profile  # noqa: E402

with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for make in batches[17:21]:
        inputs = make()
        ta._step(model, opt, inputs)
        torch.cuda.synchronize()
ka = prof.key_averages()
print(ka.table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=60))
kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
busy = sum(e.device_time for e in kernels) / 1e3
span = (max(e.time_range.end for e in kernels) - min(e.time_range.start for e in kernels)) / 1e3
print(f"profiled 4 steps: kernels {len(kernels)} busy {busy:.1f} ms, first-to-last kernel span {span:.1f} ms")
print(ka.table(sort_by="self_device_time_total", row_limit=12, max_name_column_width=60))
