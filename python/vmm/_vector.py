"""vmm.Vector: a typed array that grows at a stable address, over a vmm.GrowableBuffer."""

from . import _vmm
from ._checks import count as _count

# numpy's dtype kinds and DLPack's type codes (DLDataTypeCode).
_DLPACK_CODES = {"b": 6, "i": 0, "u": 1, "f": 2, "c": 5}


def _numpy():
    try:
        import numpy
    except ImportError as missing:
        raise _vmm.Error("vmm.Vector needs numpy for its dtype (pip install numpy)") from missing
    return numpy


class Vector:
    """A 1-D array of ``dtype`` whose elements never move: growing maps memory at its end.

        v = vmm.Vector("int64", location="os_host", max_size=1 << 30)
        v.extend(range(10)); v.append(10)
        a = numpy.asarray(v)            # zero-copy view of the first len(v) elements

    ``location`` as for vmm.GrowableBuffer; ``max_size`` is the most bytes it may ever hold
    (0: the location's memory). Views (numpy.asarray, torch.from_dlpack, cupy.from_dlpack,
    memoryview) hold the vector alive and see its first len(v) elements at the time they
    were made; append and resize never invalidate them (the memory is never unmapped until
    shrink_to_fit()). append and extend copy from the host: on GPU memory, write through
    torch or CuPy views instead.

    Raises:
        vmm.InvalidArgumentError: a dtype that is not a number or bool, a bad location.
    """

    def __init__(self, dtype, location="os_host", *, max_size=0):
        numpy = _numpy()
        try:
            self._dtype = numpy.dtype(dtype)
        except TypeError as error:
            raise _vmm.InvalidArgumentError(f"dtype {dtype!r} is not a numpy dtype: {error}") from None
        if self._dtype.kind not in _DLPACK_CODES or self._dtype.byteorder == ">":
            raise _vmm.InvalidArgumentError(
                f"dtype {self._dtype} is not a native number or bool (kinds b, i, u, f, c)"
            )
        self._buffer = _vmm.GrowableBuffer(location, _count(max_size, "max_size"))
        self._length = 0

    @property
    def dtype(self):
        return self._dtype

    @property
    def buffer(self):
        """The vmm.GrowableBuffer underneath (its size is what is mapped, >= len * itemsize)."""
        return self._buffer

    @property
    def location(self):
        return self._buffer.location

    @property
    def data(self):
        """The address of the first element; never changes."""
        return self._buffer.data

    def __len__(self):
        return self._length

    @property
    def capacity(self):
        """Elements that fit before the next resize maps memory."""
        return self._buffer.capacity // self._dtype.itemsize

    def reserve(self, count):
        """Maps memory for at least ``count`` elements without changing len()."""
        self._buffer.reserve(_count(count, "count") * self._dtype.itemsize)

    def resize(self, count):
        """Sets len() to ``count``; new elements are uninitialized. Nothing is unmapped."""
        count = _count(count, "count")
        needed = count * self._dtype.itemsize
        if needed > self._buffer.size:
            self._buffer.resize(needed)
        self._length = count

    def append(self, value):
        """Adds one element at the end (converted to the dtype as numpy does)."""
        self.extend((value,))

    def extend(self, values):
        """Adds the elements of ``values`` (an iterable or array) at the end."""
        numpy = _numpy()
        try:
            source = numpy.ascontiguousarray(values, dtype=self._dtype).reshape(-1)
        except (TypeError, ValueError) as error:
            raise _vmm.InvalidArgumentError(f"values cannot be {self._dtype}: {error}") from None
        start = self._length
        self.resize(start + source.size)
        try:
            self._buffer.write(start * self._dtype.itemsize, source.view(numpy.uint8))
        except BaseException:
            self._length = start
            raise

    def shrink_to_fit(self):
        """Unmaps the memory past len(): no view may read past len() afterwards."""
        self._buffer.resize(self._length * self._dtype.itemsize)
        self._buffer.shrink_to_fit()

    def _on_host(self):
        return self._buffer.location != "cuda" and not self._buffer.location.startswith("cuda:")

    @property
    def __array_interface__(self):
        if not self._on_host():
            raise AttributeError(f"{self.location} memory has no __array_interface__ (use __cuda_array_interface__)")
        return {"shape": (self._length,), "typestr": self._dtype.str, "data": (self.data, False), "version": 3}

    @property
    def __cuda_array_interface__(self):
        if self._on_host():
            raise AttributeError(f"{self.location} memory has no __cuda_array_interface__")
        return {"shape": (self._length,), "typestr": self._dtype.str, "data": (self.data, False), "version": 3}

    def __dlpack__(self, stream=None):
        """A DLPack capsule of the first len() elements; it holds the vector alive."""
        device_type, device_id = self._buffer.__dlpack_device__()
        return _vmm.dlpack_capsule(
            self,
            self.data,
            [self._length],
            _DLPACK_CODES[self._dtype.kind],
            self._dtype.itemsize * 8,
            device_type,
            device_id,
        )

    def __dlpack_device__(self):
        return self._buffer.__dlpack_device__()

    def __repr__(self):
        return f"vmm.Vector({self._dtype}, location={self.location!r}, len={self._length})"
