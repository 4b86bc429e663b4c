"""vmm.store on OS host memory: tensor sets put by one process and got zero-copy by others,
through a vmm-store daemon on a thread of the test's process (vmm.store.Daemon)."""

import os
import signal
import subprocess
import sys
import textwrap

import numpy
import pytest

import vmm
import vmm.store

torch = pytest.importorskip("torch")

# A child that gets the set and prints each tensor's sum, then holds it until stdin closes.
CHILD = textwrap.dedent(
    """
    import sys, vmm.store
    weights = vmm.store.Client(sys.argv[1]).get(sys.argv[2])
    print(" ".join(f"{name}={float(t.double().sum())}" for name, t in weights.items()), flush=True)
    sys.stdin.read()
    print("done", flush=True)
    """
)


@pytest.fixture
def daemon(tmp_path):
    with vmm.store.Daemon(str(tmp_path / "socket")) as running:
        yield running


def state_dict():
    return {
        "embed.weight": torch.arange(24, dtype=torch.bfloat16).reshape(6, 4),
        "norm.weight": torch.linspace(0, 1, 7),
        "steps": torch.tensor([3, 1, 4], dtype=torch.int64),
    }


def start_child(daemon, name):
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, daemon.path, name],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def holders(client, name):
    return next(row["holders"] for row in client.list() if row["name"] == name)


def test_put_then_get_in_other_processes_zero_copy(daemon):
    client = vmm.store.Client(daemon.path)
    source = state_dict()
    put = client.put("model", source)
    assert list(put) == list(source)
    for name, tensor in source.items():
        assert put[name].dtype == tensor.dtype and torch.equal(put[name], tensor)
    row = client.list()[0]
    assert (row["tensors"], row["named_bytes"], row["sealed"]) == (3, 48 + 28 + 24, True)

    # Zero-copy: a second get maps nothing new, the tensors lie in the set's one mapping.
    again = client.get("model")
    assert again["norm.weight"].data_ptr() == put["norm.weight"].data_ptr()
    assert again["embed.weight"].data_ptr() % 256 == 0

    children = [start_child(daemon, "model") for _ in range(2)]
    expected = " ".join(f"{name}={float(t.double().sum())}" for name, t in source.items())
    for child in children:
        assert child.stdout.readline().strip() == expected, child.stderr.read()
    assert holders(client, "model") == 4  # put's and get's here, one per child

    # A child killed while it holds the set drops its hold; the other still reads it.
    children[0].send_signal(signal.SIGKILL)
    children[0].wait()
    children[0].stdout.close()
    children[0].stdin.close()
    children[0].stderr.close()
    out, err = children[1].communicate("")
    assert out.strip() == "done", err
    assert holders(client, "model") == 2


def test_numpy_views_are_read_only_and_outlive_the_client(daemon):
    client = vmm.store.Client(daemon.path)
    client.put("arrays", {"a": numpy.arange(10, dtype="float32"), "b": numpy.ones((2, 3), dtype="int16")})
    arrays = vmm.store.Client(daemon.path).get("arrays", as_="numpy")
    del client
    assert arrays["b"].shape == (2, 3) and arrays["b"].dtype == numpy.int16
    numpy.testing.assert_array_equal(arrays["a"], numpy.arange(10, dtype="float32"))
    assert not arrays["a"].flags.writeable
    with pytest.raises(ValueError):
        arrays["a"][0] = 1


def test_refused_puts_leave_nothing(daemon):
    client = vmm.store.Client(daemon.path)
    with pytest.raises(vmm.InvalidArgumentError, match="not contiguous"):
        client.put("model", {"t": torch.ones(4, 4).t()})
    with pytest.raises(vmm.InvalidArgumentError, match="invalid"):
        client.put("model", {"bad\x01name": torch.ones(2)})
    with pytest.raises(vmm.InvalidArgumentError, match="no safetensors name"):
        client.put("model", {"t": numpy.ones(2, dtype="float128")})
    assert client.list() == []
    client.put("model", state_dict())
    with pytest.raises(vmm.Error, match="taken"):
        client.put("model", state_dict())
    with pytest.raises(vmm.Error, match="no buffer named"):
        client.get("absent")
    client.remove("model")
    assert client.list() == []


def test_a_daemon_that_stops_leaves_mappings_readable(tmp_path):
    daemon = vmm.store.Daemon(str(tmp_path / "socket"))
    weights = vmm.store.Client(daemon.path).put("model", state_dict())
    daemon.stop()
    assert torch.equal(weights["steps"], torch.tensor([3, 1, 4]))
    with pytest.raises(vmm.Error):
        vmm.store.Client(daemon.path)


def test_private_tensors_are_writable_here_only(daemon):
    client = vmm.store.Client(daemon.path)
    source = state_dict()
    shared = client.put("model", source)  # held: get(private=...) maps the set anew
    weights = client.get("model", private=["norm.weight"])
    # One chunk (put's layout): every tensor shares norm.weight's, so all are private copies.
    assert weights.private == tuple(source)
    assert shared.private == ()
    norm = weights["norm.weight"]
    address = norm.data_ptr()
    assert address != shared["norm.weight"].data_ptr()
    assert torch.equal(norm, source["norm.weight"])  # a copy of the shared bytes first
    norm.fill_(5.0)
    assert norm.data_ptr() == address and torch.equal(weights["norm.weight"], torch.full((7,), 5.0))
    # The shared memory is untouched: here, in a later get, and in another process.
    assert torch.equal(shared["norm.weight"], source["norm.weight"])
    later = client.get("model")
    assert later.private == () and later["norm.weight"].data_ptr() == shared["norm.weight"].data_ptr()
    child = start_child(daemon, "model")
    expected = " ".join(f"{name}={float(t.double().sum())}" for name, t in source.items())
    assert child.stdout.readline().strip() == expected, child.stderr.read()
    out, err = child.communicate("")
    assert out.strip() == "done", err

    # numpy: the private arrays are writable, the shared ones are not.
    arrays = client.get("model", as_="numpy", private=["steps"])
    assert arrays["steps"].flags.writeable
    arrays["steps"][0] = 9
    assert arrays["steps"].tolist() == [9, 1, 4]
    assert client.get("model", as_="numpy")["steps"].tolist() == [3, 1, 4]
    assert not client.get("model", as_="numpy")["steps"].flags.writeable

    # The copies go with the tensors: the daemon's holds are what they were.
    before = holders(client, "model")
    del weights, norm, arrays
    assert holders(client, "model") == before - 2


def test_bad_private_names_are_refused_and_change_nothing(daemon):
    client = vmm.store.Client(daemon.path)
    client.put("model", state_dict())
    before = holders(client, "model")
    for private, message in [
        (["absent"], 'holds no tensor "absent"'),
        (["steps", "steps"], "'steps' is named twice"),
        ([3], "3 is not a tensor name"),
        ("steps", "not one string"),
        (5, "expected a list of tensor names"),
    ]:
        with pytest.raises(vmm.InvalidArgumentError, match=message):
            client.get("model", private=private)
        assert holders(client, "model") == before
    assert client.get("model", private=[]).private == ()


def test_a_restarted_daemon_gets_the_set_back_from_a_client_that_reconnects(tmp_path):
    path = str(tmp_path / "socket")
    first = vmm.store.Daemon(path)
    client = vmm.store.Client(path)
    source = state_dict()
    held = client.put("weights", source)
    address = held["norm.weight"].data_ptr()
    first.stop()
    del first  # the daemon's state goes with it: what clients map stays
    with vmm.store.Daemon(path) as second:
        assert client.reconnect() == []
        assert [row["name"] for row in vmm.store.Client(second.path).list()] == ["weights"]
        again = vmm.store.Client(second.path).get("weights")
        for name, tensor in source.items():
            assert torch.equal(again[name], tensor)
        assert held["norm.weight"].data_ptr() == address


def test_dedup_puts_store_shared_tensors_once(daemon):
    client = vmm.store.Client(daemon.path)
    granule = 2 << 20  # the OS provider's: a tensor of a granule has a chunk of its own
    count = granule // 4
    embed = numpy.arange(count, dtype="float32")
    base = {"embed": embed, "layer": numpy.full(count, 1.5, dtype="float32")}
    tuned = {"embed": embed.copy(), "layer": numpy.full(count, 2.5, dtype="float32")}
    client.put("base", base, dedup=True)
    capacity = client.stat("base")["capacity"]
    assert client.stats()["bytes"] == capacity
    client.put("tuned", tuned, dedup=True)
    # Only the changed layer is stored again (the embedding and the table's chunk are shared).
    row = client.stat("tuned")
    assert (row["capacity"], row["stored_bytes"], row["shared_bytes"]) == (capacity, granule, capacity - granule)
    counters = client.stats()
    assert (counters["bytes"], counters["capacity"]) == (capacity + granule, 2 * capacity)
    got = vmm.store.Client(daemon.path).get("tuned", as_="numpy")
    numpy.testing.assert_array_equal(got["embed"], embed)
    numpy.testing.assert_array_equal(got["layer"], tuned["layer"])
    # Without dedup nothing is shared.
    client.put("copy", tuned)
    assert client.stat("copy")["shared_bytes"] == 0
    assert client.stats()["bytes"] == capacity + granule + client.stat("copy")["capacity"]
