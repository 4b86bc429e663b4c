"""VMM_CONF: the settings of vmm.torch.use() and vmm.cupy.use() from the environment.

The form is PYTORCH_CUDA_ALLOC_CONF's: comma-separated ``key:value`` pairs, e.g.

    VMM_CONF=max_size:40G,headroom:0.0078,release_threshold:8GiB

Keys (every option of vmm.torch.use()):
  max_size           bytes (4096, 512MiB, 40G, ...): the most each device's resource reserves
  release_threshold  bytes, or "none" (keep idle pages until trim())
  headroom           a share from 0 to 1
  large_page_size    bytes: a power of two up to 1GiB (32MiB by default; 2MiB turns large pages off)

Parsing is strict: an unknown key, a repeated key, a missing value or a bad one raises
vmm.InvalidArgumentError naming it, and nothing is applied. The parser is the native
module's (python/native/conf.hpp), which is fuzzed.
"""

import os

from . import _vmm

VARIABLE = "VMM_CONF"

KEYS = ("max_size", "release_threshold", "headroom", "large_page_size")


def parse(text):
    """The settings of a VMM_CONF string, as a dict of use()'s keyword arguments.

    Raises:
        vmm.InvalidArgumentError: an unknown, repeated or empty key, or a bad value.
    """
    return {} if text is None else _vmm.parse_conf(text)


def from_environment():
    """parse() of $VMM_CONF (an empty dict when it is not set)."""
    return parse(os.environ.get(VARIABLE))
