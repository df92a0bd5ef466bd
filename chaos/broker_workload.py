"""The broker chaos workload: producers, tailing replica readers, a status sampler, final reads, snapshots.

Theory of operation. Everything here runs in threads of the chaos driver against a live cluster and
appends records in the shapes of ``docs/contracts.md`` ("chaos run directory") to a thread-safe
:class:`RunLog`. The run writes to one topic, created with ``Admin`` at the start with
``QUEUES_PER_GROUP`` queues per broker group (:func:`create_topic`; the controller spreads them
round robin over the groups). Producers (one thread and one ``rocketray.client.Producer`` each, a
distinct ``process`` name) send batches of unique payloads: a batch's messages share a key, so they
go to one queue (``key_queue``) as one put; the payload id travels in the ``pid`` property and a
payload's body is a pure function of its id (:func:`payload_body`), so a reader can tell a
corrupted or misplaced message from a good one (a mismatch is recorded under the id
``corrupt:<id>``, which the checker reports as an inconsistent offset and, for the real id, as
lost). Every payload ends as one ``send`` row: ``ok`` (acknowledged, with its broker group, queue
and queue offset), ``unknown`` (``SendUnknown``: maybe written) or ``failed`` (``SendFailed`` or
refused before sending: not written). With a seed, each payload carries the tag
``rocketray.verify.group_action_rules.payload_tag`` gives it (a pure function of its id, so the
checker knows every send's tag), and a seeded share of batches is delayed by ``DELAYS_MS``: the
whole batch is sent with one ``deliver_at_ms``; its acknowledged sends get a ``delayed`` row and a
``send`` row without a queue offset (``SendResult.queue_offset`` is -1 until the message falls due).
:func:`extend_topic` adds queues to the topic mid-run (an ``extend`` row). Tailing readers read every queue of a broker group from a
changing replica, one monotonic pass per process (``chaos/replica_reader.py``: verification reads
straight from the broker actors); the sampler polls every replica's status. After heal,
:func:`final_reads` sweeps every queue of every replica from offset 0 under a new process name per
pass, and :func:`replica_snapshots` records each replica's epochs, offsets and the SHA-256 of its
commit log up to the group's minimum confirm offset. The consumer groups are
``chaos/group_workload.py``.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Any

import ray

from rocketray.actors.cluster import Cluster
from rocketray.actors.views import BrokerStatus, to_json
from rocketray.chaos.replica_reader import ReplicaReader, now_ms, payload_body
from rocketray.client import (Admin, ClientClosed, ClientError, InvalidMessage, Producer, SendFailed,
                              SendResult)
from rocketray.client.core import key_queue
from rocketray.verify.group_action_rules import payload_tag
from rocketray.verify.history import NemesisEvent, ReplicaSnapshot, Sample
from rocketray.verify.outcome import Outcome

log = logging.getLogger("rocketray.chaos.brokers")

TOPIC = "chaos"
QUEUES_PER_GROUP = 4
STATUS_TIMEOUT_S = 2.0
#: a delayed batch waits one of these (the broker's first delay levels)
DELAYS_MS = (1000, 2000)

__all__ = ["TOPIC", "QUEUES_PER_GROUP", "TopicLayout", "create_topic", "RunLog", "ProducerLoop", "ConsumerLoop",
           "Sampler", "poll_statuses", "final_reads", "replica_snapshots", "payload_body", "now_ms", "extend_topic",
           "DELAYS_MS"]


@dataclass(frozen=True, slots=True)
class TopicLayout:
    """The run's topic and the broker group holding each of its queues."""

    topic: str
    groups: tuple[str, ...]  #: ``groups[queue_id]``: the broker group of that queue

    @property
    def queues(self) -> int:
        return len(self.groups)

    def queues_of(self, group: str) -> list[int]:
        return [q for q, g in enumerate(self.groups) if g == group]


def create_topic(cluster: str, broker_groups: int, topic: str = TOPIC) -> TopicLayout:
    """Create ``topic`` with ``QUEUES_PER_GROUP`` queues per broker group; its layout from the route."""
    admin = Admin(cluster)
    admin.create_topic(topic, queues=QUEUES_PER_GROUP * broker_groups)
    route = admin.topic_route(topic)
    return TopicLayout(topic, tuple(route.group_of(q) for q in range(len(route.queues))))


def extend_topic(admin: Admin, layout: TopicLayout, queues: int, runlog: RunLog, stop: threading.Event,
                 retry_s: float = 1.0) -> TopicLayout | None:
    """Extend the run's topic to ``queues`` queues (``Admin.create_topic``), tried again while the
    controller does not answer, until ``stop``; an ``extend`` row, and the new layout (None if stopped)."""
    while not stop.is_set():
        try:
            admin.create_topic(layout.topic, queues=queues)
            route = admin.topic_route(layout.topic)
        except ClientError as exc:
            log.info("extending %s to %d queues: %s; trying again", layout.topic, queues, exc)
            stop.wait(retry_s)
            continue
        runlog.record({"f": "extend", "topic": layout.topic, "queues_before": layout.queues, "queues": queues,
                       "time_ms": now_ms()})
        return TopicLayout(layout.topic, tuple(route.group_of(q) for q in range(len(route.queues))))
    return None


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


def send_outcome(result: SendResult | BaseException) -> tuple[Outcome, str | None]:
    """(outcome, error code) of one payload: OK; FAILED when the client says it was not written
    (SendFailed, InvalidMessage, ClientClosed: refused or never sent); UNKNOWN otherwise
    (SendUnknown: maybe written, or an error the client did not classify)."""
    if isinstance(result, SendResult):
        return Outcome.OK, None
    code = result.code if isinstance(result, ClientError) else type(result).__name__
    if isinstance(result, (SendFailed, InvalidMessage, ClientClosed)):
        return Outcome.FAILED, code
    return Outcome.UNKNOWN, code


class ProducerLoop(threading.Thread):
    """Sends batches of unique payloads to the run's topic until ``stop`` is set."""

    def __init__(self, cluster: str, layout: TopicLayout, index: int, runlog: RunLog, stop: threading.Event,
                 batch: int = 10, rate_per_s: float = 100.0, request_timeout_ms: int = 5000,
                 send_timeout_ms: int = 8000, seed: int | None = None, delay_chance: float = 0.05) -> None:
        super().__init__(name=f"producer-{index}", daemon=True)
        self.process = f"producer-{index}"
        self.cluster = cluster
        self.producer = Producer(cluster, request_timeout_ms=request_timeout_ms, send_timeout_ms=send_timeout_ms)
        self.layout = layout
        self.runlog = runlog
        self.stop = stop
        self.batch = batch
        self.rate_per_s = rate_per_s  # payloads per second (0: as fast as the cluster acknowledges)
        self.result_timeout_s = send_timeout_ms / 1000 + 30
        self.seq = 0
        self.op_ids = itertools.count(1)
        self.outcomes: dict[Outcome, int] = {o: 0 for o in Outcome}
        self.acked_queues: set[tuple[str, int]] = set()
        self.tagged = seed is not None
        self.rng = random.Random(f"{seed}/{self.process}")
        self.delay_chance = delay_chance if seed is not None else 0.0
        self.latest_due_ms = 0.0  #: the latest time a delayed send asked for

    def run(self) -> None:
        next_at = time.monotonic()
        try:
            while not self.stop.is_set():
                if self.rate_per_s > 0:
                    next_at = max(next_at + self.batch / self.rate_per_s, time.monotonic() - 1.0)
                    if self.stop.wait(max(0.0, next_at - time.monotonic())):
                        break
                try:
                    self.send_batch()
                except Exception:  # noqa: BLE001 - a workload thread never dies mid-run
                    log.exception("producer %s: send failed", self.process)
                    self.stop.wait(0.2)
        finally:
            self.producer.close(timeout_s=self.result_timeout_s)

    def send_batch(self) -> None:
        """One batch: ``batch`` payloads with one key (one queue, one put); one ``send`` row each."""
        key = f"{self.process}-b{self.seq:08d}"
        layout = self.layout
        queue_id = key_queue(key, layout.queues)
        start = now_ms()
        due = int(start) + self.rng.choice(DELAYS_MS) if self.rng.random() < self.delay_chance else None
        if due is not None:
            self.latest_due_ms = max(self.latest_due_ms, due)
        pending: list[tuple[str, concurrent.futures.Future | None]] = []
        for _ in range(self.batch):
            self.seq += 1
            pid = f"{self.process}-{self.seq:08d}"
            try:
                pending.append((pid, self.producer.send_async(layout.topic, payload_body(pid), key=key,
                                                              tags=payload_tag(pid) if self.tagged else None,
                                                              properties={"pid": pid}, deliver_at_ms=due)))
            except Exception as exc:  # noqa: BLE001 - refused before anything was sent: not written
                log.warning("producer %s: %s refused before sending: %s", self.process, pid, exc)
                pending.append((pid, None))
        for pid, fut in pending:
            result: SendResult | BaseException
            if fut is None:
                result = SendFailed("refused before sending")
            else:
                try:
                    result = fut.result(timeout=self.result_timeout_s)
                except Exception as exc:  # noqa: BLE001 - the client's typed error (or a timeout)
                    result = exc
            self._record(pid, queue_id, result, start, now_ms(), due)

    def _record(self, pid: str, queue_id: int, result: SendResult | BaseException, start: float, end: float,
                due: int | None) -> None:
        outcome, error = send_outcome(result)
        self.outcomes[outcome] += 1
        offset = None
        layout = self.layout
        if isinstance(result, SendResult):  # where it was stored, as acknowledged (the key's queue)
            queue_id, offset = result.queue_id, (None if due is not None else result.queue_offset)
            self.acked_queues.add((layout.topic, queue_id))
            if queue_id >= layout.queues:  # the client saw the topic extended before the runner's layout did
                route = Admin(self.cluster).topic_route(layout.topic)
                layout = TopicLayout(layout.topic, tuple(route.group_of(q) for q in range(len(route.queues))))
            if due is not None:            # its place is taken when it falls due (queue_offset -1)
                self.runlog.record({"f": "delayed", "process": self.process, "payload_id": pid,
                                    "msg_id": result.msg_id, "deliver_at_ms": due, "time_ms": end})
        self.runlog.record({"op_id": f"{self.process}-{next(self.op_ids)}", "process": self.process, "f": "send",
                            "group": layout.groups[queue_id], "queue_id": queue_id, "payload_id": pid,
                            "queue_offset": offset, "physical_offset": None, "start_ms": start, "end_ms": end,
                            "outcome": outcome, "broker_id": None, "error": error})


class ConsumerLoop(threading.Thread):
    """Tails every queue of one broker group, each pass from a randomly chosen replica."""

    def __init__(self, cluster: Cluster, layout: TopicLayout, group: str, runlog: RunLog, stop: threading.Event,
                 seed: int, period_s: float = 0.3) -> None:
        super().__init__(name=f"tail-{group}", daemon=True)
        self.group = group
        self.reader = ReplicaReader(cluster, layout.topic, f"tail-{group}", runlog.record, call_timeout_s=3.0)
        self.replicas = [b.replica for b in cluster.spec.brokers_of(group)]
        self.queue_ids = layout.queues_of(group)
        self.stop = stop
        self.period_s = period_s
        self.rng = random.Random(seed * 104729 + len(group))
        self.next_offset = {q: 0 for q in self.queue_ids}

    def run(self) -> None:
        while not self.stop.is_set():
            replica = self.rng.choice(self.replicas)
            for q in self.queue_ids:
                try:
                    self.reader.read_queue(self.group, replica, q, self.next_offset[q])
                except Exception:  # noqa: BLE001 - dead or paused replica: try another next pass
                    break
                finally:   # what a pass recorded before a call failed counts: the tail never steps back
                    self.next_offset[q] = max(self.next_offset[q],
                                              self.reader.recorded_up_to.get((self.group, q), 0))
            self.stop.wait(self.period_s)


def poll_statuses(cluster: Cluster, timeout_s: float = STATUS_TIMEOUT_S) -> dict[tuple[str, int], BrokerStatus]:
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
    out: dict[tuple[str, int], BrokerStatus] = {}
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
        self.latest: dict[tuple[str, int], BrokerStatus] = {}

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
                if st.broker_id is None:
                    continue
                self.runlog.sample(Sample(t, st.group, st.broker_id, st.role.value, st.master_epoch, st.max_offset,
                                          st.confirm_offset))
            self.stop.wait(max(0.0, self.period_s - (time.monotonic() - started)))


def final_reads(cluster: Cluster, layout: TopicLayout, runlog: RunLog, attempts: int = 3) -> dict[str, int]:
    """Sweep every queue of every replica from offset 0 (one process name per pass); messages per group."""
    counts: dict[str, int] = {}
    for group in cluster.spec.groups:
        counts[group] = 0
        for b in cluster.spec.brokers_of(group):
            for attempt in range(attempts):
                reader = ReplicaReader(cluster, layout.topic, f"final-{group}-{b.replica}-{attempt}", runlog.record)
                try:
                    counts[group] += sum(len(reader.read_queue(group, b.replica, q)) for q in layout.queues_of(group))
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
        present = [(b, st) for b, st in members if st is not None and st.broker_id is not None]
        if not present:
            continue
        upto = max(0, min(st.confirm_offset for _b, st in present))
        refs = [cluster.broker(group, b.replica).digest.remote(0, upto, True) for b, _st in present]
        digests: list[Any] = []
        for ref in refs:
            try:
                digests.append(ray.get(ref, timeout=60))
            except Exception:  # noqa: BLE001
                digests.append(None)
        if any(d is None for d in digests):
            digests = [None] * len(digests)  # all or none of a group carry a digest (contract)
        for (b, st), digest in zip(present, digests):
            assert st.broker_id is not None
            out.append(ReplicaSnapshot(
                group=group, broker_id=st.broker_id, role=st.role.value, master_epoch=st.master_epoch,
                epoch_entries=tuple((e.epoch, e.start_offset, e.end_offset) for e in st.epoch_entries),
                min_offset=st.min_offset, max_offset=st.max_offset,
                confirm_offset=st.confirm_offset, digest_to_confirm=digest,
                queues=tuple(to_json(q) for q in st.queues)))
    return out
