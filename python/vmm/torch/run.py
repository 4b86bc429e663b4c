"""Runs an unmodified program with vmm as PyTorch's CUDA allocator.

    python -m vmm.torch.run script.py [args...]
    python -m vmm.torch.run -m package.module [args...]
    VMM_CONF=max_size:40G,headroom:0.0078 python -m vmm.torch.run train.py --epochs 3

vmm.torch.use() runs first (with $VMM_CONF's settings), before the program can initialize
CUDA; the program then runs as __main__ (runpy) with sys.argv as it would have seen it, and
its exit status is this process's.
"""

import os
import runpy
import sys

USAGE = "usage: python -m vmm.torch.run (script.py | -m module) [args...]"


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr if not argv else sys.stdout)
        return 2 if not argv else 0
    as_module = argv[0] == "-m"
    if as_module and len(argv) < 2:
        print(f"{USAGE}\n-m needs a module name", file=sys.stderr)
        return 2
    target = argv[1] if as_module else argv[0]

    import vmm.torch

    vmm.torch.use()
    sys.argv = argv[1:] if as_module else argv
    try:
        if as_module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path[0] = os.path.dirname(os.path.abspath(target))  # as `python script.py` sets it
            runpy.run_path(target, run_name="__main__")
    except SystemExit as done:
        return done.code
    return 0


if __name__ == "__main__":
    sys.exit(main())
