"""Deprecated: the module vmm_torch is now vmm.torch (and vmm.cupy for CuPy).

This alias stays for one version: ``import vmm_torch`` warns (DeprecationWarning) and gives
vmm.torch's functions under their old names (``VmmError`` is vmm.Error, ``use_cupy`` is
vmm.cupy.use). Migrate: ``import vmm.torch as vmm_torch``.
"""

import warnings

from vmm import Error as VmmError
from vmm.cupy import use as use_cupy
from vmm.torch import *  # noqa: F401,F403
from vmm.torch import __all__ as _torch_names

warnings.warn(
    "vmm_torch is deprecated and will be removed in the next version: use vmm.torch (and vmm.cupy.use "
    "for use_cupy)",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = list(_torch_names) + ["VmmError", "use_cupy"]
