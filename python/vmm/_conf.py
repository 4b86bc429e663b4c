"""VMM_CONF: the settings of vmm.torch.use() from the environment.

The form is PYTORCH_CUDA_ALLOC_CONF's: comma-separated ``key:value`` pairs, e.g.

    VMM_CONF=max_size:40G,headroom:0.0078,release_threshold:8GiB

Keys (every option of vmm.torch.use()):
  max_size           bytes (4096, 512MiB, 40G, ...): the most each device's resource reserves
  release_threshold  bytes, or "none" (keep idle pages until trim())
  headroom           a share from 0 to 1

Parsing is strict: an unknown key, a repeated key, a missing value or a bad one raises
vmm.InvalidArgumentError naming it, and nothing is applied.
"""

import math
import os

from . import _vmm

VARIABLE = "VMM_CONF"


def _byte_size(key, text):
    try:
        return _vmm.parse_byte_size(text)
    except _vmm.Error as error:
        raise _vmm.InvalidArgumentError(f"{VARIABLE}: {key}:{text}: {error}") from None


def _release_threshold(key, text):
    if text.lower() == "none":
        return None
    return _byte_size(key, text)


def _headroom(key, text):
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= 1.0:
        raise _vmm.InvalidArgumentError(f"{VARIABLE}: {key}:{text}: expected a share from 0 to 1, as 0.0078")
    return value


# key -> parser of its value (each raises vmm.InvalidArgumentError naming the key).
_KEYS = {"max_size": _byte_size, "release_threshold": _release_threshold, "headroom": _headroom}

KEYS = tuple(_KEYS)


def parse(text):
    """The settings of a VMM_CONF string, as a dict of use()'s keyword arguments.

    Raises:
        vmm.InvalidArgumentError: an unknown, repeated or empty key, or a bad value.
    """
    settings = {}
    if text is None or not text.strip():
        return settings
    for item in text.split(","):
        key, colon, value = (part.strip() for part in item.partition(":"))
        if not colon or not key or not value:
            raise _vmm.InvalidArgumentError(f"{VARIABLE}: {item.strip()!r} is not key:value (in {text!r})")
        if key not in _KEYS:
            raise _vmm.InvalidArgumentError(
                f"{VARIABLE}: unknown key {key!r} (known: {', '.join(KEYS)})"
            )
        if key in settings:
            raise _vmm.InvalidArgumentError(f"{VARIABLE}: {key} is given twice")
        settings[key] = _KEYS[key](key, value)
    return settings


def from_environment():
    """parse() of $VMM_CONF (an empty dict when it is not set)."""
    return parse(os.environ.get(VARIABLE))
