"""The pipeline's workload, written and read back through ``rocketray.client`` (one client, not two).

A :class:`Workload` opens the client's default transport to the cluster (as ``Producer(name)``
does), creates one topic whose queues the controller spreads over every broker group, sends unique
payloads with a :class:`~rocketray.client.Producer` and remembers, per broker group, the ``msg_id``
of every acknowledged message. To aim at one group (its master is about to be
killed) it sends with a key whose queue lives on that group (``queue_keys``: for each queue id a key
that ``key_queue`` maps to it). :meth:`Workload.consume_all` reads the whole topic back with a fresh
consumer group, which is how the pipeline checks that every acknowledged message is delivered.

Outcomes follow the client's errors: a ``SendResult`` is acknowledged; ``SendUnknown`` may have been
stored (never counted as acknowledged, and not resent); ``SendFailed`` wrote nothing.
"""

from __future__ import annotations

import concurrent.futures
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from rocketray.client import Admin, Consumer, Producer, SendResult, SendStatus, SendUnknown, TopicRoute
from rocketray.client.core import key_queue
from rocketray.client.errors import ClientError
from rocketray.client.transport import connect_transport
from rocketray.verify.outcome import Outcome

TOPIC = "rocketray-pipeline"
QUEUES_PER_GROUP = 4
BATCH = 50
#: The workload's producer waits for ``flush`` rather than a short linger, so that a batch of one
#: group's messages is one put (as far as the client's batch bounds allow).
PRODUCER_DEFAULTS = {"linger_ms": 1000}
#: The most keys tried per queue id: ``key_queue`` is a CRC-32 modulo, so a queue of N is hit in
#: about N tries.
MAX_KEY_TRIES = 100_000


def queue_keys(queues: int, prefix: str = "k") -> list[str]:
    """For each queue id ``0..queues-1`` the first key ``{prefix}{i}`` that ``key_queue`` sends there."""
    assert queues > 0
    keys: dict[int, str] = {}
    for i in range(MAX_KEY_TRIES):
        keys.setdefault(key_queue(f"{prefix}{i}", queues), f"{prefix}{i}")
        if len(keys) == queues:
            return [keys[q] for q in range(queues)]
    raise AssertionError(f"no key found for some of {queues} queues in {MAX_KEY_TRIES} tries")


def group_queues(route: TopicRoute) -> dict[str, list[int]]:
    """Queue ids of ``route`` per broker group."""
    out: dict[str, list[int]] = {}
    for q in route.queues:
        out.setdefault(q.broker_group, []).append(q.queue_id)
    return out


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """What a batch of sends came to: OK (every message acknowledged), UNKNOWN (some may be
    stored, none refused), or FAILED; ``error`` is the first error's status or code."""

    outcome: Outcome
    acked: int
    unknown: int
    failed: int
    error: str | None = None


def error_name(exc: ClientError) -> str:
    """The broker's status for a SendUnknown that carries one (FLUSH_SLAVE_TIMEOUT), else the code."""
    if isinstance(exc, SendUnknown) and isinstance(exc.status, SendStatus):
        return exc.status.name
    return exc.code


def _outcome(future: concurrent.futures.Future) -> SendResult | ClientError:
    """A finished send's result, or the client error it raised."""
    try:
        return future.result()
    except ClientError as exc:
        return exc


class Workload:
    """Unique payloads to one topic spread over every group; remembers what was acknowledged.

    ``producer_settings`` are the Producer's keyword settings (``send_timeout_ms``, ...)."""

    def __init__(self, cluster: Any, topic: str = TOPIC, queues_per_group: int = QUEUES_PER_GROUP,
                 **producer_settings: Any) -> None:
        self.cluster = cluster
        self.topic = topic
        # the client's default transport to this cluster (what Producer(name) would open), shared by
        # the producer, the admin and the verifying consumer
        self.transport = connect_transport(cluster.spec.name)
        groups = list(cluster.spec.groups)
        self.admin = Admin(transport=self.transport)
        self.route = self.admin.create_topic(topic, queues=queues_per_group * len(groups))
        by_group = group_queues(self.route)
        missing = [g for g in groups if g not in by_group]
        assert not missing, f"topic {topic} has no queue on {missing}: {self.route}"
        keys = queue_keys(len(self.route.queues))
        self.keys: dict[str, list[str]] = {g: [keys[q] for q in by_group[g]] for g in groups}
        self.producer = Producer(transport=self.transport, **{**PRODUCER_DEFAULTS, **producer_settings})
        self.acked: dict[str, set[str]] = {g: set() for g in groups}   # msg ids per broker group
        self.sent = 0
        self.failed = 0
        self.unknown = 0
        self._seq = 0
        self._batches = 0

    # --- producing ------------------------------------------------------------------------
    def use_settings(self, **producer_settings: Any) -> None:
        """Replace the producer by one with these settings (the defaults when none are given)."""
        self.producer.close()
        self.producer = Producer(transport=self.transport, **{**PRODUCER_DEFAULTS, **producer_settings})

    def forget_master(self, group: str) -> None:
        """Drop the client's cached master of ``group`` (the next send looks it up again)."""
        self.transport.forget_master(group)

    def _payload(self, group: str) -> tuple[bytes, dict[str, str]]:
        self._seq += 1
        pid = f"{group}-{self._seq:09d}"
        return f"payload {pid} ".encode() * 8, {"pid": pid}

    def _record(self, group: str, outcome: SendResult | ClientError) -> str | None:
        """Count one finished send; returns its error name, None if acknowledged."""
        self.sent += 1
        if isinstance(outcome, SendUnknown):
            self.unknown += 1
            return error_name(outcome)
        if isinstance(outcome, ClientError):
            self.failed += 1
            return error_name(outcome)
        assert self.route.group_of(outcome.queue_id) == group, (outcome, group)
        self.acked[group].add(outcome.msg_id)
        return None

    def _send_wave(self, groups: list[str], count: int) -> list[BatchOutcome]:
        """``count`` messages to one queue of each of ``groups`` (send_async, then one flush)."""
        futures: list[list[concurrent.futures.Future]] = []
        for group in groups:
            keys = self.keys[group]
            key = keys[self._batches % len(keys)]
            self._batches += 1
            batch = []
            for _ in range(count):
                body, props = self._payload(group)
                batch.append(self.producer.send_async(self.topic, body, key=key, properties=props))
            futures.append(batch)
        self.producer.flush()
        outcomes = []
        for group, batch in zip(groups, futures):
            results = [_outcome(f) for f in batch]
            failed = [e for e in (self._record(group, r) for r in results) if e is not None]
            unknown = sum(1 for r in results if isinstance(r, SendUnknown))
            outcome = Outcome.OK if not failed else (Outcome.UNKNOWN if unknown else Outcome.FAILED)
            outcomes.append(BatchOutcome(outcome, len(batch) - len(failed), unknown, len(failed) - unknown,
                                         failed[0] if failed else None))
        return outcomes

    def send_batch(self, group: str, count: int = BATCH) -> BatchOutcome:
        """``count`` messages to one queue of ``group`` (the group's queues in turn)."""
        return self._send_wave([group], count)[0]

    def produce(self, count: int, progress: Any = None) -> None:
        """About ``count`` messages in batches of ``BATCH``, the groups in turn, one batch per group in
        flight at a time."""
        groups = list(self.cluster.spec.groups)
        batches = max(1, count // BATCH)
        for start in range(0, batches, len(groups)):
            wave = [groups[(start + j) % len(groups)] for j in range(min(len(groups), batches - start))]
            self._send_wave(wave, BATCH)
            if progress is not None:
                progress.update(BATCH * len(wave))

    def send_until_acked(self, group: str, timeout_s: float = 120) -> int | None:
        """Send single messages to ``group`` until one is acknowledged (the client fails over on its
        own: it waits for the controller to name the next master); returns the replica that
        acknowledged it. ClusterError after ``timeout_s``."""
        from rocketray.actors.cluster import ClusterError

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            body, props = self._payload(group)
            key = self.keys[group][self._batches % len(self.keys[group])]
            outcome: SendResult | ClientError
            try:
                outcome = self.producer.send(self.topic, body, key=key, properties=props)
            except ClientError as exc:
                if not (exc.retriable or isinstance(exc, SendUnknown)):
                    raise   # the message itself is refused: sending more cannot help
                outcome = exc
            if self._record(group, outcome) is None:
                return self.transport.master(group)  # the replica the acknowledged put went to
        raise ClusterError(f"no write to {group} was acknowledged within {timeout_s:g} s")

    @property
    def acked_count(self) -> int:
        return sum(len(s) for s in self.acked.values())

    def close(self) -> None:
        """Flush and close the producer, then the transport."""
        try:
            self.producer.close()
        finally:
            self.transport.close()

    # --- reading back ---------------------------------------------------------------------
    def consume_all(self, idle_s: float = 10.0, timeout_s: float = 180.0,
                    on_message: Callable[[Any], None] | None = None) -> dict[str, int]:
        """Read the topic from the start with a new consumer group until every acknowledged message
        was delivered, or nothing new came for ``idle_s`` (or ``timeout_s`` passed); commits what it
        read. Returns ``{msg_id: times delivered}``."""
        wanted = set().union(*self.acked.values()) if self.acked else set()
        delivered: dict[str, int] = {}
        group = f"pipeline-verify-{uuid.uuid4().hex[:8]}"
        with Consumer(transport=self.transport, group=group, topics=[self.topic],
                      auto_offset_reset="earliest") as consumer:
            deadline = time.monotonic() + timeout_s
            last_new = time.monotonic()
            while not wanted <= delivered.keys():
                now = time.monotonic()
                if now >= deadline or now - last_new >= idle_s:
                    break
                for m in consumer.poll(timeout_s=1.0):
                    if m.msg_id not in delivered:
                        last_new = time.monotonic()
                    delivered[m.msg_id] = delivered.get(m.msg_id, 0) + 1
                    if on_message is not None:
                        on_message(m)
            try:
                consumer.commit(timeout_s=10)
            except ClientError:
                pass  # the group is thrown away: its offsets are not part of the check
        return delivered
