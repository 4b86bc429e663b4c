"""vmm.GrowableBuffer and vmm.Vector on OS host memory as numpy (and CPU torch) arrays."""

import gc
import sys

import pytest

import vmm

numpy = pytest.importorskip("numpy", reason="numpy is not installed")

MIB = 1 << 20


def test_a_buffer_grows_at_a_stable_address_and_numpy_sees_it_without_a_copy():
    buffer = vmm.GrowableBuffer("os_host", max_size=64 * MIB)
    address = buffer.data
    buffer.resize(4096)
    view = numpy.asarray(buffer)
    assert view.dtype == numpy.uint8 and view.shape == (4096,)
    assert view.__array_interface__["data"][0] == address
    view[:4] = [1, 2, 3, 4]
    buffer.resize(32 * MIB)  # grows: maps memory at the end, moves nothing
    assert buffer.data == address and buffer.size == 32 * MIB and buffer.capacity >= 32 * MIB
    assert bytes(memoryview(buffer)[:4]) == b"\x01\x02\x03\x04"
    assert view[3] == 4
    again = numpy.from_dlpack(buffer)
    assert again.__array_interface__["data"][0] == address and again.shape == (32 * MIB,)
    assert buffer.__dlpack_device__() == (1, 0)  # kDLCPU


def test_a_view_keeps_the_buffer_alive():
    buffer = vmm.GrowableBuffer("os_host", max_size=16 * MIB)
    buffer.resize(MIB)
    buffer.write(0, b"vmm!")
    by_protocol = numpy.asarray(buffer)
    by_dlpack = numpy.from_dlpack(buffer)
    del buffer
    gc.collect()
    assert bytes(by_protocol[:4]) == b"vmm!" and bytes(by_dlpack[:4]) == b"vmm!"
    by_protocol[0] = ord("V")
    assert bytes(by_dlpack[:4]) == b"Vmm!"


def test_an_unused_dlpack_capsule_gives_its_reference_back():
    buffer = vmm.GrowableBuffer("os_host", max_size=MIB)
    before = sys.getrefcount(buffer)
    capsule = buffer.__dlpack__()
    assert sys.getrefcount(buffer) == before + 1
    del capsule
    assert sys.getrefcount(buffer) == before


def test_bad_buffer_arguments_are_refused_naming_them():
    with pytest.raises(vmm.InvalidArgumentError, match='location "gpu0"'):
        vmm.GrowableBuffer("gpu0")
    with pytest.raises(vmm.InvalidArgumentError, match="not a device or node number"):
        vmm.GrowableBuffer("cuda:x")
    buffer = vmm.GrowableBuffer("os_host", max_size=4 * MIB)
    with pytest.raises(vmm.OutOfMemoryError):
        buffer.resize(8 * MIB)  # past max_size
    assert buffer.size == 0  # as it was
    buffer.resize(16)
    with pytest.raises(vmm.InvalidArgumentError, match="past the size"):
        buffer.write(10, b"0123456789")
    assert not hasattr(buffer, "__cuda_array_interface__")  # host memory


def test_a_vector_appends_at_a_stable_address_and_is_an_array():
    vector = vmm.Vector("float64", max_size=64 * MIB)
    address = vector.data
    vector.extend([1.0, 2.0])
    vector.append(3)
    early = numpy.asarray(vector)
    vector.extend(numpy.arange(100_000, dtype=numpy.float64))
    assert vector.data == address and len(vector) == 100_003
    assert early.tolist() == [1.0, 2.0, 3.0]  # still valid: nothing moved or was unmapped
    now = numpy.asarray(vector)
    assert now.dtype == numpy.float64 and now.__array_interface__["data"][0] == address
    assert now[3:6].tolist() == [0.0, 1.0, 2.0] and now[-1] == 99_999.0
    now[0] = -1.0
    assert early[0] == -1.0  # the same memory
    shared = numpy.from_dlpack(vector)
    assert shared.__array_interface__["data"][0] == address and shared.shape == (100_003,)
    vector.resize(2)
    assert numpy.asarray(vector).tolist() == [-1.0, 2.0]
    assert repr(vector).startswith("vmm.Vector(float64")


@pytest.mark.parametrize("dtype", ["int8", "uint16", "int32", "int64", "float32", "bool", "complex64"])
def test_every_number_dtype_round_trips_through_numpy_and_dlpack(dtype):
    vector = vmm.Vector(dtype, max_size=MIB)
    values = numpy.arange(10).astype(dtype)
    vector.extend(values)
    assert numpy.array_equal(numpy.asarray(vector), values)
    if dtype != "bool":  # numpy before 1.25 reads no DLPack bool (kDLBool)
        assert numpy.array_equal(numpy.from_dlpack(vector), values)


def test_bad_vector_arguments_are_refused_naming_them():
    with pytest.raises(vmm.InvalidArgumentError, match="dtype"):
        vmm.Vector("not a dtype")
    with pytest.raises(vmm.InvalidArgumentError, match="dtype"):
        vmm.Vector(object)
    with pytest.raises(vmm.InvalidArgumentError, match="max_size"):
        vmm.Vector("int8", max_size=-1)
    vector = vmm.Vector("int32", max_size=MIB)
    vector.extend([1, 2])
    with pytest.raises(vmm.InvalidArgumentError, match="count"):
        vector.resize(-1)
    with pytest.raises(vmm.InvalidArgumentError, match="values"):
        vector.extend(["one"])
    with pytest.raises(vmm.OutOfMemoryError):
        vector.extend(numpy.zeros(MIB, dtype=numpy.int32))  # 4 MiB past max_size
    assert numpy.asarray(vector).tolist() == [1, 2]  # nothing changed


def test_cpu_torch_sees_a_vector_without_a_copy():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    vector = vmm.Vector("float32", max_size=MIB)
    vector.extend([1.5, 2.5, 3.5])
    tensor = torch.from_dlpack(vector)
    assert tensor.dtype == torch.float32 and tensor.data_ptr() == vector.data
    tensor[0] = 7.0
    assert numpy.asarray(vector)[0] == 7.0
    del vector
    gc.collect()
    assert tensor.tolist() == [7.0, 2.5, 3.5]  # the tensor holds the memory
