"""vmm for Python: growable GPU and host memory at a stable address, and vmm's memory
resource under PyTorch (``vmm.torch``) and CuPy (``vmm.cupy``).

    import vmm
    buffer = vmm.GrowableBuffer("os_host", max_size=1 << 30)
    buffer.resize(4096)                 # maps memory; buffer.data never moves
    numbers = vmm.Vector("float32")     # a typed, growable array over such a buffer
    numbers.extend([1.0, 2.0, 3.0])
    numpy.asarray(numbers)              # zero-copy (torch.from_dlpack(numbers) too)

Errors: ``vmm.Error`` (a RuntimeError) for every refused or failed call, with
``vmm.OutOfMemoryError`` (also a MemoryError) for memory and ``vmm.InvalidArgumentError``
(also a ValueError) for bad arguments and settings; the message names what was refused,
and nothing was changed. Sharing with another process: ``vmm.share(vector)`` gives a
handle (file descriptors + a manifest) for multiprocessing or a Unix socket, and
``vmm.open(handle)`` maps the same physical memory there. Configuration of ``vmm.torch.use()`` by environment variable:
``VMM_CONF`` (see ``vmm.torch``). See python/README.md.
"""

from . import _vmm
from ._vmm import Error, GrowableBuffer, InvalidArgumentError, OutOfMemoryError
from ._vector import Vector
from ._sharing import SharedArray, SharedHandle, open, share  # noqa: A004 (vmm.open)

__version__ = _vmm.__version__

__all__ = [
    "Error",
    "OutOfMemoryError",
    "InvalidArgumentError",
    "GrowableBuffer",
    "Vector",
    "SharedHandle",
    "SharedArray",
    "share",
    "__version__",
]
