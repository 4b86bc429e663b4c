"""PyTorch on vmm: the README's Python quick start, run as the test sample.torch_quick_start.

The region between "# [readme:torch]" and "# [/readme:torch]" is the README's code block
(tests/tools/readme_check.py compares them). It needs PyTorch with a GPU and the
package vmm (installed with pip, or built in the tree with `setup.py build_ext --inplace`);
without torch, a GPU or the package the sample says so and exits 77, which ctest reports as
skipped.
"""

import os
import subprocess
import sys



def skip_reason():
    """Why the quick start cannot run here ('' when it can), asked of a child interpreter
    so that this one has not touched CUDA when vmm.torch.use() runs."""
    probe = ("import sys\ntry:\n    import vmm\nexcept ImportError:\n    sys.exit(4)\n"
             "import torch\nsys.exit(0 if torch.cuda.is_available() else 3)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    if done.returncode == 3:
        return "no GPU visible to PyTorch"
    if done.returncode == 4:
        return "the package vmm is not installed (pip install --no-build-isolation .)"
    return "" if done.returncode == 0 else "PyTorch is not installed"


def main():
    reason = skip_reason()
    if reason:
        print(f"torch_quick_start: skipped: {reason}")
        return 77
    # [readme:torch]
    import vmm.torch

    vmm.torch.use()  # first thing: before anything initializes CUDA
    import torch

    x = torch.randn(4096, 4096, device="cuda")  # every CUDA tensor of the process is vmm's
    y = x @ x
    del x
    stats = vmm.torch.memory_stats()  # torch's key names, and vmm's own under "vmm."
    print(stats["allocated_bytes.all.current"], stats["reserved_bytes.all.current"])
    vmm.torch.trim()  # idle pages back to the GPU
    # [/readme:torch]
    torch.cuda.synchronize()
    ok = y.shape == (4096, 4096) and stats["allocated_bytes.all.current"] >= y.numel() * 4
    print("torch_quick_start:", "ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
