"""The failover pipeline shared by ``rocketray demo`` and ``driver.py``.

Produce, kill the master broker actor of the first group and time until a write
is acknowledged again, kill the controller leader and time until a new leader
serves, keep producing, let the cluster settle, then verify: every acknowledged
payload is readable, and all replicas of a group hold identical bytes up to
their common confirm offset. The result is a summary dict whose ``checks`` all
must be true for success; ``summary_json`` keys are the demo's JSON contract.
"""

from __future__ import annotations

import time
from typing import Callable

import ray

from rocketray.actors.client import Consumer, Producer, SendOutcome, now_ms
from rocketray.actors.cluster import Cluster, ClusterError, wait_for
from rocketray.controller.api import GetReplicaInfoRequest

BATCH = 50
QUEUES = 4


class Workload:
    """Unique payloads round-robin over groups and queues; remembers what was acknowledged."""

    def __init__(self, cluster: Cluster, recorder: Callable[[dict], None] | None = None, process: str = "driver"):
        self.cluster = cluster
        self.producer = Producer(cluster, process=process, recorder=recorder)
        self.acked: dict[str, set[str]] = {g: set() for g in cluster.spec.groups}
        self.sent = 0
        self.failed = 0
        self._seq = 0

    def send_batch(self, group: str) -> SendOutcome:
        queue_id = self._seq // BATCH % QUEUES
        payloads = []
        for _ in range(BATCH):
            self._seq += 1
            pid = f"{group}-{self._seq:09d}"
            payloads.append((pid, f"payload {pid} ".encode() * 8))
        result = self.producer.send(group, queue_id, payloads)
        self.sent += len(payloads)
        if result.outcome == "ok":
            self.acked[group].update(p for p, _ in payloads)
        else:
            self.failed += len(payloads)
        return result

    def produce(self, count: int, progress=None) -> None:
        groups = self.cluster.spec.groups
        for i in range(max(1, count // BATCH)):
            self.send_batch(groups[i % len(groups)])
            if progress is not None:
                progress.update(BATCH)

    @property
    def acked_count(self) -> int:
        return sum(len(s) for s in self.acked.values())


def kill_master_and_time(cluster: Cluster, workload: Workload, group: str) -> tuple[float, int, int | None]:
    """Kill the master broker actor of ``group``; returns (ms until a write is acknowledged again,
    the killed replica, the replica that acknowledged it)."""
    old = cluster.wait_for_master(group, 60)
    t0 = time.monotonic()
    cluster.kill_broker(group, old, wait_restart=False)
    workload.producer.forget_master(group)
    while True:
        result = workload.send_batch(group)
        if result.outcome == "ok":
            return (time.monotonic() - t0) * 1000.0, old, result.replica
        if time.monotonic() - t0 > 120:
            raise ClusterError(f"writes to {group} did not resume within 120 s after killing its master")


def kill_controller_leader_and_time(cluster: Cluster) -> float:
    """Kill the controller leader; ms until a (new) leader answers a read."""
    leader = cluster.wait_for_leader(60)
    t0 = time.monotonic()
    cluster.kill_controller(leader, wait_restart=False)
    group = cluster.spec.groups[0]

    def served():
        return cluster.call_controller(GetReplicaInfoRequest(broker_name=group), timeout_s=2.0).ok

    wait_for(served, 120, "a controller leader to serve again after killing the leader", interval_s=0.02)
    return (time.monotonic() - t0) * 1000.0


def settle(cluster: Cluster, timeout_s: float = 120) -> None:
    """Wait until every replica runs and each group's slaves confirmed the master's whole log."""

    def settled():
        for group in cluster.spec.groups:
            statuses = cluster.group_status(group)
            if any(s is None or not s.get("running") for s in statuses):
                return False
            masters = [s for s in statuses if s["role"] == "master"]
            if len(masters) != 1:
                return False
            end = masters[0]["max_offset"]
            if any(s["confirm_offset"] < end or s["max_offset"] < end for s in statuses):
                return False
        return True

    wait_for(settled, timeout_s, "every replica to run and confirm its master's log", interval_s=0.2)


def verify(cluster: Cluster, workload: Workload, recorder=None) -> dict:
    """Read every queue from every replica; count lost acknowledged payloads and compare bytes."""
    consumer = Consumer(cluster, process="verifier", recorder=recorder)
    lost = 0
    consistent = True
    digests: dict[str, list] = {}
    for group in cluster.spec.groups:
        master = cluster.master_of(group)
        seen: set[str] = set()
        for q in range(QUEUES):
            for m in consumer.read_queue(group, master, q):
                seen.add(m["properties"].get("pid"))
        lost += len(workload.acked[group] - seen)
        statuses = cluster.group_status(group)
        upto = min(s["confirm_offset"] for s in statuses)
        start = max(s["min_offset"] for s in statuses)
        refs = [cluster.broker(group, b.replica).digest.remote(start, upto) for b in cluster.spec.brokers_of(group)]
        group_digests = ray.get(refs, timeout=60)
        digests[group] = group_digests
        consistent = consistent and len(set(group_digests)) == 1
    return {"lost": lost, "consistent": consistent, "digests": digests}


def run(cluster: Cluster, messages: int, progress_factory=None, say: Callable[[str], None] = print) -> dict:
    """The whole pipeline against a running cluster; returns the summary (see module doc)."""
    started = now_ms()
    workload = Workload(cluster)
    group = cluster.spec.groups[0]
    third = max(BATCH, messages // 3)
    bar = progress_factory(total=messages) if progress_factory else None
    say(f"producing {messages} messages to {len(cluster.spec.groups)} group(s)")
    workload.produce(third, bar)
    say(f"killing the master broker of {group}")
    broker_failover_ms, old_master, new_master = kill_master_and_time(cluster, workload, group)
    say(f"writes resumed after {broker_failover_ms:.0f} ms")
    workload.produce(third, bar)
    say("killing the controller leader")
    controller_failover_ms = kill_controller_leader_and_time(cluster)
    say(f"a controller leader served again after {controller_failover_ms:.0f} ms")
    workload.produce(max(BATCH, messages - 2 * third), bar)
    if bar is not None:
        bar.close()
    say("waiting for the cluster to settle")
    settle(cluster)
    old_status = cluster.broker_status(group, old_master) or {}
    result = verify(cluster, workload)
    checks = {
        "writes_resumed_after_master_kill": broker_failover_ms > 0,
        "another_replica_became_master": new_master is not None and new_master != old_master,
        "controller_served_after_leader_kill": controller_failover_ms > 0,
        "old_master_rejoined_as_slave": old_status.get("role") == "slave" and bool(old_status.get("running")),
        "every_acked_message_readable": result["lost"] == 0,
        "replicas_consistent": result["consistent"],
        "some_messages_acked": workload.acked_count > 0,
    }
    return {
        "messages_sent": workload.sent,
        "messages_acked": workload.acked_count,
        "messages_lost": result["lost"],
        "replicas_consistent": result["consistent"],
        "broker_failover_ms": round(broker_failover_ms, 1),
        "controller_failover_ms": round(controller_failover_ms, 1),
        "groups": len(cluster.spec.groups),
        "replicas": len(cluster.spec.brokers_of(group)),
        "controllers": len(cluster.spec.controllers),
        "elapsed_ms": round(now_ms() - started, 1),
        "checks": checks,
        "ok": all(checks.values()),
    }
