"""Power loss on every controller at once (issue 16, problem 2).

Three real pysyncobj nodes in this process, each with its own simulated disk
(``rocketray.sim.disk.SimDisk``) under its Raft journal, term/vote meta and snapshots. Writes
stream in; then every disk loses power (all bytes not yet fsynced are dropped, the seed choosing
torn prefixes of what was pending), the nodes die and restart over what survived. Every write the
group acknowledged must still be there, and every node must start and converge.

With pysyncobj's own journal (mmap, never synced) there is nothing on these disks at all; with the
DurableJournal but ``journal_fsync=False`` acknowledged writes are lost (checked by hand when this
test was written)."""

from __future__ import annotations

import random
import threading
import time

import pytest

from rocketray.fs import Disk, DiskFile
from rocketray.wire.controller_api import ApplyBrokerIdRequest, GetReplicaInfoRequest
from rocketray.controller.config import ControllerConfig
from rocketray.controller.node import ControllerNode
from rocketray.controller.proc import member_credentials
from rocketray.sim.disk import CrashMode, SimCrash, SimDisk

CLUSTER = "c"


class LockedFile:
    """A SimFile used from several threads (tick, snapshot writer): one lock per disk."""

    def __init__(self, inner: DiskFile, lock: threading.RLock) -> None:
        self._inner, self._lock = inner, lock

    def pread(self, offset, length):
        with self._lock:
            return self._inner.pread(offset, length)

    def pwrite(self, data, offset):
        with self._lock:
            self._inner.pwrite(data, offset)

    def truncate(self, size):
        with self._lock:
            self._inner.truncate(size)

    def size(self):
        with self._lock:
            return self._inner.size()

    def fsync(self):
        with self._lock:
            self._inner.fsync()

    def dup(self):
        with self._lock:
            return LockedFile(self._inner.dup(), self._lock)

    def mtime_ns(self):
        with self._lock:
            return self._inner.mtime_ns()

    def prefetch(self, offset, length):
        with self._lock:
            self._inner.prefetch(offset, length)

    def data_end(self, start, end):
        with self._lock:
            return self._inner.data_end(start, end)

    def close(self):
        with self._lock:
            self._inner.close()


class LockedDisk:
    def __init__(self, inner: SimDisk) -> None:
        self.inner, self.lock = inner, threading.RLock()

    def open(self, path, create=False, truncate=False, map_reads=False):
        with self.lock:
            return LockedFile(self.inner.open(path, create, truncate, map_reads), self.lock)

    def _call(self, name, *args):
        with self.lock:
            return getattr(self.inner, name)(*args)

    def mkdir(self, path):
        self._call("mkdir", path)

    def rmdir(self, path):
        self._call("rmdir", path)

    def listdir(self, path):
        return self._call("listdir", path)

    def exists(self, path):
        return self._call("exists", path)

    def is_dir(self, path):
        return self._call("is_dir", path)

    def unlink(self, path):
        self._call("unlink", path)

    def rename(self, src, dst):
        self._call("rename", src, dst)

    def fsync_dir(self, path):
        self._call("fsync_dir", path)

    def lose_power(self):
        with self.lock:
            self.inner.crash(CrashMode.POWER_LOSS)


def everyone_alive(name, broker_id):
    return True


def wait(predicate, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except (IndexError, KeyError, RuntimeError):
            pass
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


CREDENTIALS = member_credentials(3)


def start(addresses, i, tmp_path, disks, config):
    node = ControllerNode(dict(enumerate(addresses)), tmp_path / f"n{i}", config, credentials=CREDENTIALS[i],
                          alive=everyone_alive, disk=disks[i])
    assert isinstance(disks[i], Disk)
    return node


def leader_of(nodes):
    ready = [n for n in nodes if n.is_leader()]
    return ready[0] if len(ready) == 1 else None


def die(node):
    """The process is gone: no flush, no sync (its disk already lost power, so any IO raises)."""
    try:
        node.close()
    except SimCrash:
        pass


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_power_loss_on_every_node_loses_no_acknowledged_write(tmp_path, port_factory, seed):
    config = ControllerConfig.for_tests(snapshot_threshold=12)
    addresses = [f"127.0.0.1:{port_factory()}" for _ in range(3)]
    disks = [LockedDisk(SimDisk(random.Random(seed * 10 + i))) for i in range(3)]
    nodes = [start(addresses, i, tmp_path, disks, config) for i in range(3)]
    acked: list[str] = []
    stop = threading.Event()

    def writer():
        seq = 0
        while not stop.is_set():
            leader = leader_of(nodes)
            if leader is None:
                time.sleep(0.01)
                continue
            name = f"b{seq}"
            seq += 1
            try:
                resp = leader.handle(ApplyBrokerIdRequest(CLUSTER, name, 1, f"{name}:1;1"), 1000)
            except BaseException:  # noqa: BLE001 - the node died under us (SimCrash): outcome unknown
                continue
            if resp.ok and not stop.is_set():
                acked.append(name)

    wait(lambda: leader_of(nodes) is not None, 10, "a first leader")
    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    wait(lambda: len(acked) >= 40, 30, "40 acknowledged writes")
    acked_at_crash = list(acked)      # every ack before this point is owed after the power loss
    for disk in disks:
        disk.lose_power()
    stop.set()
    for node in nodes:
        die(node)
    thread.join(10)
    assert any(n.metadata for n in nodes)

    nodes = [start(addresses, i, tmp_path, disks, config) for i in range(3)]   # every node starts
    try:
        wait(lambda: leader_of(nodes) is not None, 15, "a leader after the power loss")
        leader = leader_of(nodes)
        assert leader.handle(GetReplicaInfoRequest("b0")).ok    # also a barrier: everything applied
        names = {row[0] for row in leader.snapshot_state()["replica_info"]}
        missing = [n for n in acked_at_crash if n not in names]
        assert not missing, f"acknowledged writes lost: {missing}"
        wait(lambda: all(n.snapshot_state() == leader.snapshot_state() for n in nodes), 15,
             "every node to converge")
        assert any(n.metadata()["snapshot_loaded_index"] > 0 for n in nodes)   # snapshots were in play
    finally:
        for node in nodes:
            node.close()
