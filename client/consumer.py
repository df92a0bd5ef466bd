"""``Consumer``: a member of a consumer group reading topics, with offsets committed in the cluster.

    >>> from rocketray.client import Consumer
    >>> with Consumer("demo", group="billing", topics=["orders"]) as c:   # doctest: +SKIP
    ...     for m in c.poll(timeout_s=1.0):
    ...         handle(m.body)
    ...     c.commit()

Group membership. Every consumer heartbeats its group to the controller leader
(``consumer_heartbeat_interval_ms``), which answers with the group's live members; each member
computes the same split of every topic's queues (RocketMQ's allocate-averagely,
``rocketray.client.core.allocate_averagely``), so each queue is read by one live member. A member
that closes leaves at once; one that dies leaves when the controller stops hearing from it
(``controller.consumer_heartbeat_timeout_ms``). Different groups read independently.

Reading. A newly owned queue starts at the group's committed offset, asked of the queue's master
(or ``auto_offset_reset``: ``earliest`` or ``latest`` when the group never committed it). ``poll``
keeps one pull in flight per owned queue; a broker holds a pull until a message is confirmed or the
hold ends (RocketMQ's pull hold), so ``poll`` returns as soon as any queue has messages, and never a
message beyond the confirm offset (one that a failover could take back).

Committing. ``commit`` stores, for every queue ``poll`` returned messages of, one past the last one
returned, as a record replicated like a message: acknowledged only when every in-sync replica has
it, so it survives any failover. A group's offset never moves backwards (the brokers keep the
maximum), so a late commit after a rebalance is harmless and a failed commit can simply be retried.
Delivery is at-least-once: what was polled but not committed is delivered again after a crash or a
rebalance.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any, Iterable

from rocketray.broker.message import decode_record
from rocketray.broker.pull import OffsetsResult, OffsetsStatus, PullResult, PullStatus
from rocketray.client.config import ClientConfig
from rocketray.client.core import Positions, allocate_averagely
from rocketray.client.errors import ClientClosed, CommitFailed, InvalidRequest
from rocketray.client.producer import RESERVED_PROPERTIES, _client_config
from rocketray.client.routes import Routes
from rocketray.client.transport import Transport, Unanswered, connect_transport
from rocketray.client.types import ReceivedMessage
from rocketray.controller.api import ConsumerHeartbeatRequest
from rocketray.ha.ack import PutResult, PutStatus

__all__ = ["Consumer"]

log = logging.getLogger("rocketray.client")

RETRY_AFTER_S = 0.05
MAX_HOLD_MS = 30_000

QueueKey = tuple[str, int]


@dataclass(slots=True)
class _Queue:
    group: str                       # the broker group holding it
    next_offset: int | None = None   # None until the committed offset is known
    pull: concurrent.futures.Future | None = None
    pull_offset: int = -1
    retry_at: float = 0.0


class Consumer:
    """One member of consumer group ``group`` reading ``topics`` (see the module docstring)."""

    def __init__(self, cluster: str = "default", *, group: str, topics: Iterable[str],
                 transport: Transport | None = None, client_id: str | None = None,
                 auto_offset_reset: str = "earliest", **settings: Any) -> None:
        topics = [topics] if isinstance(topics, str) else list(topics)
        if not isinstance(group, str) or not group or not topics:
            raise InvalidRequest("a consumer needs a group name and at least one topic")
        if auto_offset_reset not in ("earliest", "latest"):
            raise InvalidRequest(f"auto_offset_reset must be 'earliest' or 'latest', not {auto_offset_reset!r}")
        self.group = group
        self.topics = sorted(set(topics))
        self.auto_offset_reset = auto_offset_reset
        self.client_id = client_id or f"{socket.gethostname()}@{os.getpid()}@{uuid.uuid4().hex[:8]}"
        self._owns_transport = transport is None
        self._transport = transport if transport is not None else connect_transport(cluster)
        self.config: ClientConfig = _client_config(self._transport, settings)
        self._routes = Routes(self._transport)
        for topic in self.topics:
            self._routes.get(topic)                      # TopicNotFound now, not in the first poll
        self._lock = threading.Lock()
        self._members: tuple[str, ...] = ()
        self._membership_changed = threading.Event()
        self._queues: dict[QueueKey, _Queue] = {}
        self._positions = Positions()
        self._closed = False
        self._stop = threading.Event()
        self._heartbeat_once()
        self._heartbeats = threading.Thread(target=self._heartbeat_loop, name="rocketray-consumer-heartbeat",
                                            daemon=True)
        self._heartbeats.start()

    # --- public API -------------------------------------------------------------------------------
    def poll(self, timeout_s: float = 1.0) -> list[ReceivedMessage]:
        """Messages of the queues this member owns, waiting up to ``timeout_s`` for the first."""
        if self._closed:
            raise ClientClosed("consumer is closed")
        deadline = time.monotonic() + max(0.0, timeout_s)
        if self._membership_changed.is_set():
            self._rebalance()
        out: list[ReceivedMessage] = []
        while True:
            self._start_positions()
            self._issue_pulls(deadline)
            pending = {q.pull: key for key, q in self._queues.items() if q.pull is not None}
            left = deadline - time.monotonic()
            if pending:
                done, _ = concurrent.futures.wait(list(pending), timeout=max(0.0, left),
                                                  return_when=concurrent.futures.FIRST_COMPLETED)
                for fut in done:
                    out.extend(self._take(pending[fut], fut))
            elif left > 0:
                time.sleep(min(left, RETRY_AFTER_S))
            if out or time.monotonic() >= deadline:
                return out

    def commit(self, timeout_s: float | None = None) -> dict[QueueKey, int]:
        """Commit, for every queue ``poll`` returned messages of, the offset after the last one
        returned; returns ``{(topic, queue_id): offset}`` of what this call committed once each is
        acknowledged, else raises :class:`CommitFailed` (retriable: committing again is always safe;
        the queues that were acknowledged stay committed)."""
        todo = self._positions.to_commit()
        if not todo:
            return {}
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else self.config.send_timeout_ms / 1000)
        by_group: dict[str, list[tuple[str, int, int]]] = {}
        for (topic, queue_id), offset in sorted(todo.items()):
            by_group.setdefault(self._routes.get(topic).group_of(queue_id), []).append((topic, queue_id, offset))
        failed, done = [], {}
        for broker_group, entries in by_group.items():
            if self._commit_group(broker_group, entries, deadline):
                for topic, queue_id, offset in entries:
                    self._positions.acknowledged((topic, queue_id), offset)
                    done[(topic, queue_id)] = offset
            else:
                failed.append(broker_group)
        if failed:
            raise CommitFailed(f"offsets of group {self.group!r} on {', '.join(failed)} not acknowledged "
                               f"before the timeout; commit again", committed=done)
        return todo

    def pending_commits(self) -> dict[QueueKey, int]:
        """What ``commit()`` would commit now: per queue ``poll`` returned messages of and whose
        position is past what was acknowledged, one past the last message returned."""
        return self._positions.to_commit()

    def _commit_group(self, broker_group: str, entries: list[tuple[str, int, int]], deadline: float) -> bool:
        """Commit ``entries`` on ``broker_group`` until acknowledged or ``deadline`` (True if acked)."""
        backoff_s = 0.02
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            reply = self._transport.commit(broker_group, self.group, entries,
                                           min(left, self.config.request_timeout_ms / 1000))
            outcome = _commit_outcome(reply)
            if outcome == "ok":
                return True
            if outcome == "illegal":
                raise CommitFailed(f"the broker refused the commit {entries} of group {self.group!r} as invalid",
                                   retriable=False)
            if not (isinstance(reply, Unanswered) and reply.master_moved):
                self._transport.forget_master(broker_group)
                if not self._transport.await_new_master(broker_group,
                                                        min(backoff_s, max(0.0, deadline - time.monotonic()))):
                    backoff_s = min(backoff_s * 2, 1.0)

    def assignment(self) -> list[QueueKey]:
        """The ``(topic, queue_id)`` queues this member owns now."""
        return sorted(self._queues)

    def close(self) -> None:
        """Leave the group (its queues go to the other members at once). Does not commit."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        try:
            self._transport.call_controller(ConsumerHeartbeatRequest(self.group, self.client_id, tuple(self.topics),
                                                                     leaving=True), timeout_s=3.0)
        except Exception as exc:  # noqa: BLE001 - the controller expires it later
            log.info("consumer %s: leave not confirmed (%s); it expires by timeout", self.client_id, exc)
        if self._owns_transport:
            self._transport.close()

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- membership -------------------------------------------------------------------------------
    def _heartbeat_once(self) -> None:
        try:
            resp = self._transport.call_controller(
                ConsumerHeartbeatRequest(self.group, self.client_id, tuple(self.topics)), timeout_s=5.0)
        except Exception as exc:  # noqa: BLE001 - keep the last membership; try again next beat
            log.info("consumer %s: heartbeat failed: %s", self.client_id, exc)
            return
        if not resp.ok:
            log.info("consumer %s: heartbeat refused: %s %s", self.client_id, resp.code.name, resp.remark)
            return
        members = tuple(sorted(resp.header.members))
        with self._lock:
            if members != self._members:
                self._members = members
                self._membership_changed.set()

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.config.consumer_heartbeat_interval_ms / 1000):
            self._heartbeat_once()

    def _rebalance(self) -> None:
        self._membership_changed.clear()
        with self._lock:
            members = self._members
        wanted: dict[QueueKey, str] = {}
        for topic in self.topics:
            route = self._routes.get(topic)
            for queue_id in allocate_averagely([q.queue_id for q in route.queues], members, self.client_id):
                wanted[(topic, queue_id)] = route.group_of(queue_id)
        for key in list(self._queues):
            if key not in wanted:
                del self._queues[key]          # an in-flight pull's answer is dropped
        for key, broker_group in wanted.items():
            if key not in self._queues:
                self._queues[key] = _Queue(broker_group)
        log.info("consumer %s group=%s members=%d owns=%s", self.client_id, self.group, len(members),
                 sorted(self._queues))

    # --- positions and pulls ------------------------------------------------------------------------
    def _start_positions(self) -> None:
        """Ask the masters for the committed offsets of owned queues whose position is unknown."""
        unknown: dict[str, list[QueueKey]] = {}
        now = time.monotonic()
        for key, q in self._queues.items():
            if q.next_offset is None and q.retry_at <= now:
                unknown.setdefault(q.group, []).append(key)
        for broker_group, keys in unknown.items():
            reply = self._transport.committed(broker_group, self.group, sorted({t for t, _ in keys}),
                                              self.config.request_timeout_ms / 1000)
            if not (isinstance(reply, OffsetsResult) and reply.status is OffsetsStatus.OK):
                self._transport.forget_master(broker_group)
                for key in keys:
                    self._queues[key].retry_at = now + RETRY_AFTER_S
                continue
            committed = reply.committed_map()
            latest = None
            if self.auto_offset_reset == "latest" and any(k not in committed for k in keys):
                maxes = self._transport.queue_max_offsets(broker_group, keys, self.config.request_timeout_ms / 1000)
                latest = {(t, q): o for t, q, o in maxes} if not isinstance(maxes, Unanswered) else None
                if latest is None:
                    continue
            for key in keys:
                start = committed.get(key)
                if start is None:
                    start = latest.get(key, 0) if latest is not None else 0
                self._queues[key].next_offset = start
                if key in committed:
                    self._positions.acknowledged(key, start)

    def _issue_pulls(self, deadline: float) -> None:
        hold_ms = int(min(MAX_HOLD_MS, max(0.0, deadline - time.monotonic()) * 1000))
        now = time.monotonic()
        for (topic, queue_id), q in self._queues.items():
            if q.pull is None and q.next_offset is not None and q.retry_at <= now:
                q.pull_offset = q.next_offset
                q.pull = self._transport.pull(q.group, topic, queue_id, q.next_offset, self.config.poll_max_messages,
                                              self.config.poll_max_bytes, hold_ms, self.group)

    def _take(self, key: QueueKey, fut: concurrent.futures.Future) -> list[ReceivedMessage]:
        q = self._queues.get(key)
        if q is None or q.pull is not fut:
            return []                          # the queue moved to another member meanwhile
        q.pull = None
        result = fut.result()
        if not isinstance(result, PullResult) or result.status is PullStatus.NOT_MASTER:
            self._transport.forget_master(q.group)
            q.retry_at = time.monotonic() + RETRY_AFTER_S
            return []
        if result.status is PullStatus.ILLEGAL:
            raise InvalidRequest(f"pull of {key} refused: {result.remark}")
        if q.pull_offset != q.next_offset:
            return []
        q.next_offset = result.next_offset     # past the group's committed offset if the broker moved it up
        if result.status is not PullStatus.FOUND:
            return []
        messages = _decode(key[0], result.records, result.count)
        self._positions.returned(key[0], key[1], result.next_offset)
        return messages


def _decode(topic: str, records: bytes, count: int) -> list[ReceivedMessage]:
    out, pos = [], 0
    for _ in range(count):
        msg, size = decode_record(records, pos)
        pos += size
        props = msg.properties
        out.append(ReceivedMessage(
            topic=topic, queue_id=msg.queue_id, queue_offset=msg.queue_offset, msg_id=props.get("UNIQ_KEY", ""),
            key=props.get("KEYS"), tags=props.get("TAGS"),
            properties={k: v for k, v in props.items() if k not in RESERVED_PROPERTIES},
            body=bytes(msg.body), born_timestamp_ms=msg.born_timestamp_ms, store_timestamp_ms=msg.store_timestamp_ms))
    return out


def _commit_outcome(reply: PutResult | Unanswered) -> str:
    """'ok', 'illegal', or 'retry' (commits are idempotent: anything else is simply sent again)."""
    if isinstance(reply, PutResult) and reply.ok:
        return "ok"
    if isinstance(reply, PutResult) and reply.status is PutStatus.MESSAGE_ILLEGAL:
        return "illegal"
    return "retry"

