"""Abrupt stops: controller nodes in child processes, SIGKILLed under a stream of writes.

Property: every write the leader acknowledged is in the final state of every node, after
repeatedly killing a minority, and again after killing all three and restarting them.
"""

from __future__ import annotations

import random
import time

import pytest

from rocketray.controller.event_log import merge_logs, read_whole_log
from rocketray.controller.proc import NodeProcess, member_credentials

CONFIG = {"snapshot_threshold": 25}


class Group:
    def __init__(self, tmp_path, ports):
        self.addresses = [f"127.0.0.1:{p}" for p in ports]
        self.stores = [tmp_path / f"n{i}" for i in range(len(ports))]
        credentials = member_credentials(len(ports))
        self.handles = [NodeProcess(i, dict(enumerate(self.addresses)), self.stores[i], tmp_path / f"n{i}.log",
                                    credentials[i], CONFIG) for i in range(len(ports))]
        self.procs = [None] * len(ports)
        for i in range(len(ports)):
            self.start(i)

    def start(self, i):
        self.handles[i].start()
        self.procs[i] = self.handles[i]

    def kill(self, i):
        self.procs[i].kill()
        self.procs[i] = None

    def leader(self):
        for i, proc in enumerate(self.procs):
            if proc is None:
                continue
            meta = proc.call("status", timeout_s=2)
            if meta and meta["is_leader"]:
                return i
        return None

    def write(self, name):
        """One write through whoever is leader; True only if acknowledged with SUCCESS."""
        i = self.leader()
        if i is None:
            return False
        resp = self.procs[i].call("request", {"type": "apply", "broker_name": name, "broker_id": 1,
                                              "check_code": f"{name};1"}, timeout_s=5)
        return bool(resp) and resp.get("code") == 0

    def names(self, i):
        resp = self.procs[i].call("state", timeout_s=5)
        return {row[0] for row in resp["state"]["replica_info"]} if resp else set()

    def close(self):
        for i, proc in enumerate(self.procs):
            if proc is not None:
                proc.kill()
                self.procs[i] = None


@pytest.fixture
def group(tmp_path, port_factory):
    g = Group(tmp_path, [port_factory() for _ in range(3)])
    yield g
    g.close()


def wait_all_have(group, acked, wait, timeout_s=20.0):
    seen = {}

    def ok():
        for i in range(3):
            missing = acked - group.names(i)
            seen[i] = (len(missing), sorted(missing)[:5])
        return all(n == 0 for n, _ in seen.values())

    try:
        wait(ok, timeout_s=timeout_s, interval_s=0.1, what=f"every node to hold all {len(acked)} acked writes")
    except BaseException:
        metas = [p.call("status") if p else None for p in group.procs]
        print("missing per node:", seen, "\nmeta:", metas)
        raise


@pytest.mark.slow
def test_sigkill_minority_and_then_everyone_keeps_acknowledged_writes(group, wait):
    """Kill one node at a time (leader included) under writes; then kill all and restart."""
    rng = random.Random(7)
    acked: set[str] = set()
    seq = 0

    def write_for(seconds):
        nonlocal seq
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            seq += 1
            name = f"w{seq}"
            if group.write(name):
                acked.add(name)

    wait(lambda: group.leader() is not None, timeout_s=15, what="first leader")
    write_for(0.5)
    for round_no in range(4):
        victim = group.leader() if round_no % 2 == 0 else rng.randrange(3)
        victim = victim if victim is not None else rng.randrange(3)
        group.kill(victim)
        write_for(0.8)
        group.start(victim)
        write_for(0.5)
    assert len(acked) > 50, f"too few acknowledged writes ({len(acked)}) for a meaningful test"
    wait_all_have(group, acked, wait)
    for i in range(3):
        group.kill(i)
    for i in range(3):
        group.start(i)
    wait(lambda: group.leader() is not None, timeout_s=15, what="leader after restarting everyone")
    wait_all_have(group, acked, wait)
    metas = [group.procs[i].call("status") for i in range(3)]
    assert any(m["snapshots_loaded"] >= 1 for m in metas), metas
    # The event logs came through the SIGKILLs: each holds every entry at most once, and merged
    # they name every acknowledged registration with nothing left uncovered.
    logs = [read_whole_log(lambda after, limit, p=group.procs[i]: p.call("events", {"after": after, "limit": limit}))
            for i in range(3)]
    for one in logs:
        keys = [(e["index"], e["seq"]) for e in one["events"]]
        assert keys == sorted(set(keys))
    events, uncovered = merge_logs(logs)
    assert uncovered == [] and acked <= {e["broker_name"] for e in events if e["type"] == "ApplyBrokerIdEvent"}
