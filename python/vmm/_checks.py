"""Argument checks shared by the package's Python functions (each names the argument)."""

import operator

from . import _vmm


def count(value, name):
    """`value` as an int of 0 or more.

    Raises:
        vmm.InvalidArgumentError: not an int (bool excepted) or negative, naming `name`.
    """
    if isinstance(value, bool):
        raise _vmm.InvalidArgumentError(f"{name} must be an int, not bool")
    try:
        result = operator.index(value)
    except TypeError:
        raise _vmm.InvalidArgumentError(f"{name} must be an int, not {type(value).__name__}") from None
    if result < 0:
        raise _vmm.InvalidArgumentError(f"{name} is {result}: it must be 0 or more")
    return result
