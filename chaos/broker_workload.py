"""The broker chaos workload: producers, tailing consumers, a status sampler, final reads, snapshots.

Theory of operation. Everything here runs in threads of the chaos driver against a live cluster and
appends records in the shapes of ``docs/contracts.md`` ("chaos run directory") to a thread-safe
:class:`RunLog`. Producers (one thread each, a distinct ``process`` name) send batches of unique
payloads to every group in turn; a payload's body is a pure function of its id
(:func:`payload_body`), so a reader can tell a corrupted or misplaced message from a good one (a
mismatch is recorded under the id ``corrupt:<id>``, which the checker reports as an inconsistent
offset and, for the real id, as lost). Tailing consumers read every queue of a group from a
changing replica, one monotonic pass per process; the sampler polls every replica's status. After
heal, :func:`final_reads` sweeps every queue of every replica from offset 0 under a new process name
per pass, and :func:`replica_snapshots` records each replica's epochs, offsets and the SHA-256 of
its commit log up to the group's minimum confirm offset.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any

import ray

from rocketray.verify.history import NemesisEvent, ReplicaSnapshot, Sample
from rocketray.actors.client import Consumer, Producer, now_ms
from rocketray.actors.cluster import Cluster

log = logging.getLogger("rocketray.chaos.brokers")

QUEUES = 4
STATUS_TIMEOUT_S = 2.0


def payload_body(payload_id: str) -> bytes:
    """The body every message with this payload id carries (verifiable by any reader)."""
    return f"rocketray-chaos {payload_id};".encode() * 4


class RunLog:
    """Thread-safe accumulation of history records, nemesis events and samples."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.history: list[dict] = []
        self.nemesis: list[NemesisEvent] = []
        self.samples: list[Sample] = []

    def record(self, rec: dict) -> None:
        with self._lock:
            self.history.append(rec)

    def event(self, kind: str, phase: str, target: str | None, group: str | None = None,
              time_ms: float | None = None) -> NemesisEvent:
        e = NemesisEvent(now_ms() if time_ms is None else time_ms, kind, phase, target, group)
        with self._lock:
            self.nemesis.append(e)
        return e

    def sample(self, s: Sample) -> None:
        with self._lock:
            self.samples.append(s)


class VerifyingConsumer(Consumer):
    """A consumer whose records flag a message whose body does not match its payload id."""

    def _record(self, group: str, queue_id: int, m: dict, start: float, end: float) -> None:
        pid = (m.get("properties") or {}).get("pid")
        if pid is None or bytes(m["body"]) != payload_body(str(pid)):
            m = {**m, "properties": {**(m.get("properties") or {}), "pid": f"corrupt:{pid}"}}
        super()._record(group, queue_id, m, start, end)


class ProducerLoop(threading.Thread):
    """Sends batches of unique payloads to every group in turn until ``stop`` is set."""

    def __init__(self, cluster: Cluster, index: int, runlog: RunLog, stop: threading.Event, seed: int,
                 batch: int = 10, rate_per_s: float = 100.0, call_timeout_s: float = 5.0,
                 retry_deadline_s: float = 8.0) -> None:
        super().__init__(name=f"producer-{index}", daemon=True)
        self.process = f"producer-{index}"
        self.producer = Producer(cluster, process=self.process, recorder=runlog.record,
                                 call_timeout_s=call_timeout_s, retry_deadline_s=retry_deadline_s)
        self.groups = list(cluster.spec.groups)
        self.stop = stop
        self.batch = batch
        self.rate_per_s = rate_per_s  # payloads per second (0: as fast as the cluster acknowledges)
        self.rng = random.Random(seed * 7919 + index)
        self.seq = 0
        self.outcomes: dict[str, int] = {"ok": 0, "unknown": 0, "failed": 0}

    def run(self) -> None:
        turn = self.rng.randrange(len(self.groups))
        next_at = time.monotonic()
        while not self.stop.is_set():
            if self.rate_per_s > 0:
                next_at = max(next_at + self.batch / self.rate_per_s, time.monotonic() - 1.0)
                if self.stop.wait(max(0.0, next_at - time.monotonic())):
                    break
            group = self.groups[turn % len(self.groups)]
            turn += 1
            payloads = []
            for _ in range(self.batch):
                self.seq += 1
                pid = f"{self.process}-{self.seq:08d}"
                payloads.append((pid, payload_body(pid)))
            try:
                result = self.producer.send(group, self.rng.randrange(QUEUES), payloads)
                self.outcomes[result.outcome] += len(payloads)
            except Exception:  # noqa: BLE001 - a workload thread never dies mid-run
                log.exception("producer %s: send failed", self.process)
                self.stop.wait(0.2)


class ConsumerLoop(threading.Thread):
    """Tails every queue of one group, each pass from a randomly chosen replica."""

    def __init__(self, cluster: Cluster, group: str, runlog: RunLog, stop: threading.Event, seed: int,
                 period_s: float = 0.3) -> None:
        super().__init__(name=f"tail-{group}", daemon=True)
        self.cluster = cluster
        self.group = group
        self.consumer = VerifyingConsumer(cluster, process=f"tail-{group}", recorder=runlog.record,
                                          call_timeout_s=3.0)
        self.replicas = [b.replica for b in cluster.spec.brokers_of(group)]
        self.stop = stop
        self.period_s = period_s
        self.rng = random.Random(seed * 104729 + len(group))
        self.next_offset = {q: 0 for q in range(QUEUES)}

    def run(self) -> None:
        while not self.stop.is_set():
            replica = self.rng.choice(self.replicas)
            for q in range(QUEUES):
                try:
                    msgs = self.consumer.read_queue(self.group, replica, q, self.next_offset[q])
                except Exception:  # noqa: BLE001 - dead or paused replica: try another next pass
                    break
                if msgs:
                    self.next_offset[q] = msgs[-1]["queue_offset"] + 1
            self.stop.wait(self.period_s)


def poll_statuses(cluster: Cluster, timeout_s: float = STATUS_TIMEOUT_S) -> dict[tuple[str, int], dict]:
    """Status of every replica that answers within ``timeout_s`` (paused or dead ones are absent)."""
    keys, refs = [], []
    for b in cluster.spec.brokers:
        try:
            refs.append(cluster.broker(b.group, b.replica).status.remote())
            keys.append((b.group, b.replica))
        except Exception:  # noqa: BLE001 - actor handle not available right now
            continue
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    ready_set = set(ready)
    out: dict[tuple[str, int], dict] = {}
    for key, ref in zip(keys, refs):
        if ref in ready_set:
            try:
                out[key] = ray.get(ref, timeout=0.5)
            except Exception:  # noqa: BLE001 - the actor died while answering
                pass
    return out


class Sampler(threading.Thread):
    """Records a :class:`Sample` per answering replica every ``period_s``; keeps the latest statuses."""

    def __init__(self, cluster: Cluster, runlog: RunLog, stop: threading.Event, period_s: float = 0.5) -> None:
        super().__init__(name="sampler", daemon=True)
        self.cluster = cluster
        self.runlog = runlog
        self.stop = stop
        self.period_s = period_s
        self.latest: dict[tuple[str, int], dict] = {}

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                statuses = poll_statuses(self.cluster)
            except Exception:  # noqa: BLE001
                statuses = {}
            t = now_ms()
            for key, st in statuses.items():
                self.latest[key] = st
                if st.get("broker_id") is None:
                    continue
                self.runlog.sample(Sample(t, st["group"], int(st["broker_id"]), st["role"],
                                          int(st.get("master_epoch") or 0), int(st["max_offset"]),
                                          int(st["confirm_offset"])))
            self.stop.wait(max(0.0, self.period_s - (time.monotonic() - started)))


def final_reads(cluster: Cluster, runlog: RunLog, attempts: int = 3) -> dict[str, int]:
    """Sweep every queue of every replica from offset 0 (one process name per pass); messages per group."""
    counts: dict[str, int] = {}
    for group in cluster.spec.groups:
        counts[group] = 0
        for b in cluster.spec.brokers_of(group):
            for attempt in range(attempts):
                consumer = VerifyingConsumer(cluster, process=f"final-{group}-{b.replica}-{attempt}",
                                             recorder=runlog.record, call_timeout_s=10.0)
                try:
                    counts[group] += sum(len(consumer.read_queue(group, b.replica, q)) for q in range(QUEUES))
                    break
                except Exception as exc:  # noqa: BLE001 - retried under a new process name
                    log.warning("final read of %s/%d failed (attempt %d): %s", group, b.replica, attempt, exc)
    return counts


def replica_snapshots(cluster: Cluster) -> list[ReplicaSnapshot]:
    """Each answering replica's state with ``digest_to_confirm`` over ``[0, min confirm of its group)``."""
    out: list[ReplicaSnapshot] = []
    statuses = poll_statuses(cluster, timeout_s=10.0)
    for group in cluster.spec.groups:
        members = [(b, statuses.get((group, b.replica))) for b in cluster.spec.brokers_of(group)]
        members = [(b, st) for b, st in members if st is not None and st.get("broker_id") is not None]
        if not members:
            continue
        upto = max(0, min(int(st["confirm_offset"]) for _b, st in members))
        refs = [cluster.broker(group, b.replica).digest.remote(0, upto, True) for b, _st in members]
        digests: list[Any] = []
        for ref in refs:
            try:
                digests.append(ray.get(ref, timeout=60))
            except Exception:  # noqa: BLE001
                digests.append(None)
        if any(d is None for d in digests):
            digests = [None] * len(digests)  # all or none of a group carry a digest (contract)
        for (b, st), digest in zip(members, digests):
            out.append(ReplicaSnapshot(
                group=group, broker_id=int(st["broker_id"]), role=st["role"],
                master_epoch=int(st.get("master_epoch") or 0),
                epoch_entries=tuple(tuple(e) for e in st["epoch_entries"]),  # type: ignore[misc]
                min_offset=int(st["min_offset"]), max_offset=int(st["max_offset"]),
                confirm_offset=int(st["confirm_offset"]), digest_to_confirm=digest,
                queues=tuple(st.get("queues") or ())))
    return out
