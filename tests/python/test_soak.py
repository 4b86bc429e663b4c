"""A soak of tensors' memory shared between processes, on OS host memory.

Cycles of allocate / fill / share / open in another process / check / let go, over several
receiving processes, a random share of them SIGKILLed in the middle of a request (after
the handle was sent, before the answer) and replaced. The frees are done while receivers
may still map the memory, so most go through the leases (held, then done). Afterwards the
resource holds nothing (no allocation, no held free), the sender has the descriptors it
started with, and every answer that came back said the receiver read the bytes it
expected. $VMM_SOAK_CYCLES sets the cycles (default 10,000; the longer mode is e.g.
VMM_SOAK_CYCLES=200000).
"""

import os

SOAK = """
import ctypes, os, random, signal, socket
from vmm import _vmm, _sharing

CYCLES = int(os.environ.get("VMM_SOAK_CYCLES", "10000"))
RECEIVERS = 4
KEPT = 3            # a receiver keeps its last KEPT mappings, so frees are held and done later
KILL_SHARE = 0.01   # of the requests, those whose receiver is killed mid-request

def receiver(sock):
    kept = []
    while True:
        try:
            handle = _sharing.SharedHandle.receive(sock)
        except vmm.InvalidArgumentError:   # the sender closed: done
            os._exit(0)
        shared = vmm.open(handle)
        handle.close()
        value = sock.recv(1)[0]
        data, size = shared.data, len(shared)
        good = ctypes.string_at(data, 1)[0] == value and ctypes.string_at(data + size - 1, 1)[0] == value
        kept.append(shared)
        if len(kept) > KEPT:
            kept.pop(0)
        sock.sendall(b"y" if good else b"n")

def start():
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        ours.close()
        for _, other in receivers:   # the other receivers' sockets: their ends must be theirs only
            other.close()
        try:
            receiver(theirs)
        except BaseException as error:
            print("receiver:", repr(error), flush=True)
            os._exit(1)
    theirs.close()
    return pid, ours

def descriptors():
    return len(os.listdir("/proc/self/fd"))

def resident():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

random.seed(7)
fds_before, resident_before = descriptors(), resident()
receivers = []
for _ in range(RECEIVERS):
    receivers.append(start())
answers = kills = bad = 0
for cycle in range(CYCLES):
    index = random.randrange(RECEIVERS)
    pid, sock = receivers[index]
    size = random.choice((4096, 65536, 1 << 20, 3 << 20)) + random.randrange(4096)
    value = cycle % 251
    ptr = _vmm.allocate(size, 0)
    ctypes.memset(ptr, value, size)
    handle = _sharing._share_allocation(ptr, size, 0)
    handle.send(sock)
    handle.close()
    _vmm.deallocate(ptr, size, 0)       # held while the receiver maps it
    if random.random() < KILL_SHARE:
        os.kill(pid, signal.SIGKILL)    # in the middle of the request
        os.waitpid(pid, 0)
        sock.close()
        receivers[index] = start()
        kills += 1
        continue
    sock.sendall(bytes([value]))
    answer = sock.recv(1)
    assert answer in (b"y", b"n"), answer
    answers += 1
    bad += answer == b"n"

for pid, sock in receivers:
    sock.close()                        # the receiver sees the end and exits
    _, status = os.waitpid(pid, 0)
    assert status == 0, status
_vmm.trim(0, 0)                         # the pages go, and the exporter's descriptors of them
held = _vmm.held_for_receivers(0)
stats = _vmm.statistics(0)
print(f"soak: {CYCLES} cycles, {answers} answered, {kills} receivers killed, {bad} bad reads; "
      f"held {held}, {stats.allocations} allocations, {stats.used_current} bytes used, "
      f"{stats.reserved_current} reserved; descriptors {fds_before} -> {descriptors()}, "
      f"resident {resident_before >> 20} -> {resident() >> 20} MiB")
assert bad == 0, f"{bad} receivers read other bytes than were shared"
assert held == (0, 0), held
assert stats.allocations == 0 and stats.used_current == 0, (stats.allocations, stats.used_current)
assert descriptors() == fds_before, (descriptors(), fds_before)
assert stats.reserved_current == 0, stats.reserved_current
# What is left resident is the interpreter's own heap, not the shared memory (up to 3 MiB a cycle).
assert resident() - resident_before < 32 << 20, (resident_before, resident())
assert kills > 0 or CYCLES < 1000
"""


def test_shared_tensors_survive_a_soak_with_killed_receivers_and_leave_nothing(scenario):
    done = scenario(SOAK, timeout=1800)
    print(done.stdout)
