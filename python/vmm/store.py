"""vmm.store: one copy of a model's weights for every process of a node, in a vmm-store daemon.

    import vmm.store
    client = vmm.store.Client()                      # the default socket (vmm-store serve)
    client.put("llama-7b", model.state_dict())       # copied once into the daemon's memory
    # in any other process:
    weights = vmm.store.Client().get("llama-7b")     # {name: torch tensor}, zero-copy
    model.load_state_dict(weights, assign=True)      # (torch >= 2.1: no copy)

A set is a vmm-store tensor set (docs/store.md): every tensor one contiguous, aligned range of
one sealed buffer, mapped read-only by each process that gets it; the daemon keeps it while a
name or a process holds it. The tensors got are views of that mapping, zero-copy (torch through
DLPack; numpy through the buffer protocol, read-only arrays); each holds the set mapped while it
lives, also after the dict and the client are gone.

Read-only is the hardware's: torch has no read-only tensors, so a write to a got tensor is a
fault (SIGSEGV on host memory, an illegal-address error on a GPU), not an exception. Copy a
tensor (``tensor.clone()``) to change it, or get it private: ``get(name, private=[...])``
maps writable copies of the tensors named, in this process only, and the rest stays shared.

Locations: "os_host" (memfd pages, any process of the user) or "cuda:N". dtypes: those of the
safetensors format (torch's and numpy's of fixed size; numpy has no bfloat16 or float8, so
numpy gets those as uint16 / uint8 of the same bits).

Errors: vmm.Error (the daemon refused, or is gone; the message says which), vmm.InvalidArgumentError
(a bad name, dtype, or a tensor that is not contiguous); a put that fails leaves nothing in the
store.
"""

from . import _vmm

__all__ = ["Client", "Daemon", "Tensors"]

# torch dtype name -> safetensors name.
_TORCH_DTYPES = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64",
    "float16": "F16", "bfloat16": "BF16", "float32": "F32", "float64": "F64", "complex64": "C64",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "uint16": "U16", "uint32": "U32", "uint64": "U64",
}
# safetensors name -> (DLPack type code, bits): kDLInt 0, kDLUInt 1, kDLFloat 2, kDLComplex 5,
# kDLBfloat 4, kDLBool 6. float8 has no DLPack code torch 1.x reads: it comes as uint8.
_DLPACK = {
    "BOOL": (6, 8), "U8": (1, 8), "I8": (0, 8), "I16": (0, 16), "U16": (1, 16), "I32": (0, 32), "U32": (1, 32),
    "I64": (0, 64), "U64": (1, 64), "F16": (2, 16), "BF16": (4, 16), "F32": (2, 32), "F64": (2, 64),
    "C64": (5, 64), "F8_E4M3": (1, 8), "F8_E5M2": (1, 8), "F8_E8M0": (1, 8),
}
# safetensors name -> numpy dtype (the same bits where numpy lacks the type).
_NUMPY = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16", "I32": "int32", "U32": "uint32",
    "I64": "int64", "U64": "uint64", "F16": "float16", "BF16": "uint16", "F32": "float32", "F64": "float64",
    "C64": "complex64", "F8_E4M3": "uint8", "F8_E5M2": "uint8", "F8_E8M0": "uint8",
}


def _row(name, tensor):
    """(name, dtype, shape, address) of a contiguous torch tensor or numpy array."""
    if type(tensor).__module__.startswith("torch"):
        kind = str(tensor.dtype).replace("torch.", "")
        if kind not in _TORCH_DTYPES:
            raise _vmm.InvalidArgumentError(f"tensor {name!r}: torch dtype {kind} has no safetensors name")
        if not tensor.is_contiguous():
            raise _vmm.InvalidArgumentError(f"tensor {name!r} is not contiguous: put tensor.contiguous()")
        return (name, _TORCH_DTYPES[kind], list(tensor.shape), tensor.data_ptr())
    import numpy

    array = numpy.asarray(tensor)
    if not array.flags["C_CONTIGUOUS"]:
        raise _vmm.InvalidArgumentError(f"array {name!r} is not C-contiguous: put numpy.ascontiguousarray(it)")
    kinds = {v: k for k, v in _NUMPY.items() if k not in ("BF16",) and not k.startswith("F8")}
    if array.dtype.byteorder == ">" or array.dtype.name not in kinds:
        raise _vmm.InvalidArgumentError(f"array {name!r}: numpy dtype {array.dtype} has no safetensors name")
    return (name, kinds[array.dtype.name], list(array.shape), array.ctypes.data)


class Client:
    """A connection to a vmm-store daemon at ``path`` (default: vmm-store's default socket)."""

    def __init__(self, path=None):
        self._native = _vmm.StoreClient(path or "")

    def put(self, name, state_dict, *, location="os_host", dedup=False):
        """Copies every tensor of ``state_dict`` ({name: torch tensor or numpy array, each
        contiguous}) into the new sealed set ``name`` at ``location``; returns it as get() does.

        ``dedup=True``: the set is laid out per tensor and de-duplicated (docs/store.md,
        "De-duplication"): every tensor whose bytes another set put with ``dedup=True`` holds
        shares that set's memory, stored and counted once (``stat(name)["stored_bytes"]``).
        The daemon reads every byte once more to find them.

        Raises:
            vmm.InvalidArgumentError: a tensor is not contiguous, a dtype or name is refused.
            vmm.Error: the daemon refused (the name is taken, a cap); nothing is left.
        """
        keep = dict(state_dict)  # the sources stay alive during the copy
        rows = [_row(str(key), value) for key, value in keep.items()]
        return _tensors_of(self._native.put(str(name), rows, location, bool(dedup)), "torch")

    def get(self, name, *, as_="torch", private=()):
        """The set ``name`` as {tensor name: torch tensor} (``as_="numpy"``: read-only numpy
        arrays, host memory only), in the set's order, zero-copy.

        ``private``: names of tensors to make private to this process (a private overlay,
        docs/store.md): their memory is a copy of the shared bytes, writable here and nowhere
        else, while every other tensor stays shared and read-only. The set gets addresses of
        its own, which never change (CUDA graphs captured over it stay valid). The unit copied
        is a chunk of the set's buffer: tensors sharing one with a named tensor become private
        too (the result's ``private`` lists them all). The copies live as long as the tensors.

        Raises:
            vmm.InvalidArgumentError: ``private`` is not a list of distinct tensor names of the
                set (nothing is made private, nothing is held).
            vmm.Error: no such set (or a plain buffer), or the daemon is gone; out of memory
                for the copies (nothing changed).
        """
        names = _private_names(private)
        return _tensors_of(self._native.get(str(name), names), as_)

    def reconnect(self):
        """Connects to the socket again. After a daemon restart (SIGKILL included), offers the
        new daemon every sealed set this client maps, so that other processes get them again,
        and takes this client's holds again; the tensors keep their addresses
        (docs/store.md, "Lifetimes"). Returns the offers refused, as "name: why" strings.

        Raises:
            vmm.Error: no daemon listens at the socket, or it refused this client.
        """
        return self._native.reconnect()

    def remove(self, name):
        """Frees the name; the set lives on while a process holds it."""
        self._native.remove(str(name))

    def list(self):
        """Every named buffer and set: dicts of name, location, size, capacity, holders,
        sealed, tensors, named_bytes, stored_bytes, shared_bytes."""
        return self._native.list()

    def stat(self, name):
        """One buffer or set, as a dict of list()'s fields: ``capacity`` is the memory behind
        it, ``stored_bytes`` what the daemon counts to it (less where it shares chunks with
        another de-duplicated set), ``shared_bytes`` the part another live set maps too.

        Raises:
            vmm.Error: no such name, or the daemon is gone.
        """
        return self._native.stat(str(name))

    def stats(self):
        """The daemon's counters (``vmm-store stats --json``): ``bytes`` is what it stores
        (each shared chunk once), ``capacity`` what its buffers name together."""
        return self._native.statistics()


def _private_names(private):
    """``private`` checked: a list of distinct strings (a lone string is refused)."""
    if isinstance(private, (str, bytes)):
        raise _vmm.InvalidArgumentError(f"private={private!r}: expected a list of tensor names, not one string")
    try:
        names = list(private)
    except TypeError:
        raise _vmm.InvalidArgumentError(f"private={private!r}: expected a list of tensor names") from None
    for value in names:
        if not isinstance(value, str):
            raise _vmm.InvalidArgumentError(f"private: {value!r} is not a tensor name (a str)")
    if len(set(names)) != len(names):
        twice = next(value for value in names if names.count(value) > 1)
        raise _vmm.InvalidArgumentError(f"private: tensor {twice!r} is named twice")
    return names


class Tensors(dict):
    """{tensor name: tensor} of a set, in the set's order (what Client.get and put return).
    ``private``: the names of the tensors private to this process (writable), in the set's
    order: those asked for, and those sharing a chunk with them."""

    private = ()


def _tensors_of(tensor_set, as_):
    if as_ == "numpy":
        import numpy

        memory = memoryview(tensor_set)  # read-only; holds the set
        private = set(tensor_set.private_names())
        out = Tensors()
        for name, dtype, shape, offset in tensor_set.tensors():
            kind = numpy.dtype(_NUMPY[dtype])
            count = 1
            for extent in shape:
                count *= extent
            if name in private:  # writable bytes of their own, holding the set
                out[name] = numpy.frombuffer(tensor_set.private_bytes(name), kind, count).reshape(shape)
            else:
                out[name] = numpy.frombuffer(memory, kind, count, offset).reshape(shape)
        out.private = tuple(tensor_set.private_names())
        return out
    if as_ != "torch":
        raise _vmm.InvalidArgumentError(f'as_={as_!r}: expected "torch" or "numpy"')
    import torch.utils.dlpack

    device_type, device_id = tensor_set.__dlpack_device__()
    out = Tensors()
    for name, dtype, shape, offset in tensor_set.tensors():
        code, bits = _DLPACK[dtype]
        capsule = _vmm.dlpack_capsule(tensor_set, tensor_set.data + offset, shape, code, bits, device_type, device_id)
        out[name] = torch.utils.dlpack.from_dlpack(capsule)
    out.private = tuple(tensor_set.private_names())
    return out


class Daemon:
    """A vmm-store daemon on a thread of this process, listening at ``path`` (for tests and
    single-host setups; ``vmm-store serve`` is the same daemon as a program). ``cap``: the most
    bytes every set together may hold (0: no cap). A context manager: leaving it stops it."""

    def __init__(self, path, *, cap=0):
        self._native = _vmm.StoreDaemon(str(path), int(cap) if cap else (1 << 64) - 1)
        self.path = self._native.path

    def stop(self):
        """Stops serving: the daemon's sets go, mappings made of them stay valid."""
        self._native.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False
