"""An in-memory cluster behind the client's ``Transport`` protocol, for unit tests of one layer
(``rocketray.client``): no Ray, no sockets.

``FakeCluster`` keeps what the real cluster keeps for a client: topics (queue -> broker group), the
stored records of every queue (real commit-log records, positions filled in as a master does),
committed offsets folded to the maximum, and consumer-group membership with a heartbeat timeout.
``FakeTransport`` implements every method of :class:`rocketray.client.transport.Transport` over it.
Pulls are held like a broker's: answered at once when a record lies at the offset, else when a put
reaches that queue or the hold ends. A pull with a tag expression keeps only the records whose tag
code (``rocketray.wire.message.tag_hash``) the expression names, and its answer's ``next_offset``
passes every record looked at, as ``MessageStore.read_queue_filtered`` does; ``search_offsets``
answers the first offset stored at or after a time, as ``MessageStore.search_offset``. Delayed
messages (records of ``%SCHEDULE%<topic>``) are delivered by a scheduler thread every
``SCHEDULE_STEP_S`` with the broker's rules (``rocketray.broker.schedule.plan_queue`` and
``delivered``): the due prefix of each schedule queue is appended to its real queue, then the
scheduler group's offset is committed. Tests steer failures through the cluster's hooks (``put_hook``,
``pull_hook``, ``commit_hook``, ``heartbeat_hook``): each, when set, may answer instead of the
cluster or block to model a slow call.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from rocketray.wire.batch import EncodedBatch, encode_batch
from rocketray.wire.delayed import SCHEDULE_PREFIX, SCHEDULER_GROUP, deliver_at_of
from rocketray.broker.schedule import delivered, plan_queue
from rocketray.wire.message import decode_record, encode_record, tag_hash
from rocketray.broker.tag_filter import TagExpressionError, parse_expression
from rocketray.wire.pull_result import (MAX_PULL_COUNT, OffsetsResult, OffsetsStatus, PullResult, PullStatus,
                                        check_pull)
from rocketray.client.transport import Unanswered
from rocketray.wire.controller_api import (ConsumerHeartbeatRequest, CreateTopicRequest, DeleteTopicRequest,
                                           GetTopicRouteRequest, ListTopicsRequest, Response)
from rocketray.wire.controller_codes import ResponseCode
from rocketray.wire.controller_headers import (ConsumerHeartbeatResponseHeader, CreateTopicResponseHeader,
                                               DeleteTopicResponseHeader, ListTopicsResponseHeader,
                                               TopicRouteResponseHeader)
from rocketray.wire.put_result import PutResult, PutStatus
from rocketray.ha.ack import after_write, refused

GROUPS = ("broker-a", "broker-b")
SCHEDULE_STEP_S = 0.05


@dataclass
class _Held:
    topic: str
    queue_id: int
    offset: int
    max_count: int
    future: concurrent.futures.Future
    timer: threading.Timer | None = None
    codes: frozenset[int] | None = None


@dataclass
class FakeCluster:
    groups: tuple[str, ...] = GROUPS
    member_timeout_s: float = 2.0
    topics: dict[str, list[str]] = field(default_factory=dict)
    records: dict[tuple[str, int], list[bytes]] = field(default_factory=dict)
    committed: dict[tuple[str, str, int], int] = field(default_factory=dict)
    members: dict[str, dict[str, float]] = field(default_factory=dict)
    heartbeats: list[ConsumerHeartbeatRequest] = field(default_factory=list)
    commits: list[tuple[str, str, list[tuple[str, int, int]]]] = field(default_factory=list)
    resets: list[tuple[str, list[tuple[str, int, int]]]] = field(default_factory=list)   # reset records
    puts: int = 0
    #: hooks: return None to let the cluster answer, anything else is the answer
    put_hook: Callable[[str, EncodedBatch], Any] | None = None
    pull_hook: Callable[[str, str, int, int, int], Any] | None = None
    commit_hook: Callable[[str, str, list], Any] | None = None
    heartbeat_hook: Callable[[ConsumerHeartbeatRequest], Any] | None = None

    def __post_init__(self) -> None:
        self.lock = threading.RLock()
        self._held: list[_Held] = []
        self._closed = threading.Event()
        self._scheduler: threading.Thread | None = None

    # --- controller ---------------------------------------------------------------------------
    def create_topic(self, topic: str, queues: int) -> None:
        with self.lock:
            current = self.topics.setdefault(topic, [])
            for q in range(len(current), queues):
                current.append(self.groups[q % len(self.groups)])
                self.records[(topic, q)] = []

    def route_header(self, topic: str) -> tuple[tuple[int, str], ...]:
        return tuple(enumerate(self.topics[topic]))

    def live_members(self, group: str) -> tuple[str, ...]:
        now = time.monotonic()
        rows = self.members.get(group, {})
        for cid in [c for c, at in rows.items() if now - at > self.member_timeout_s]:
            del rows[cid]
        return tuple(sorted(rows))

    def heartbeat(self, req: ConsumerHeartbeatRequest) -> Response:
        with self.lock:
            self.heartbeats.append(req)
            rows = self.members.setdefault(req.group, {})
            if req.leaving:
                rows.pop(req.client_id, None)
            else:
                rows[req.client_id] = time.monotonic()
            return Response(ResponseCode.SUCCESS, ConsumerHeartbeatResponseHeader(req.group,
                                                                                  self.live_members(req.group)))

    def call_controller(self, request: Any) -> Response:
        if isinstance(request, ConsumerHeartbeatRequest):
            if self.heartbeat_hook is not None and (answer := self.heartbeat_hook(request)) is not None:
                return answer
            return self.heartbeat(request)
        with self.lock:
            if isinstance(request, CreateTopicRequest):
                if request.queues < len(self.topics.get(request.topic, ())):
                    return Response.error(ResponseCode.CONTROLLER_INVALID_REQUEST, "a topic never shrinks")
                self.create_topic(request.topic, request.queues)
                return Response(ResponseCode.SUCCESS, CreateTopicResponseHeader(
                    request.topic, self.route_header(request.topic), True))
            if isinstance(request, ListTopicsRequest):
                return Response(ResponseCode.SUCCESS, ListTopicsResponseHeader(
                    tuple(sorted((t, len(q)) for t, q in self.topics.items()))))
            if request.topic not in self.topics:
                return Response.error(ResponseCode.TOPIC_NOT_EXIST, f"topic {request.topic!r} does not exist")
            if isinstance(request, GetTopicRouteRequest):
                return Response(ResponseCode.SUCCESS, TopicRouteResponseHeader(request.topic,
                                                                              self.route_header(request.topic)))
            if isinstance(request, DeleteTopicRequest):
                del self.topics[request.topic]
                return Response(ResponseCode.SUCCESS, DeleteTopicResponseHeader(request.topic))
        raise AssertionError(f"the fake controller does not serve {request!r}")

    # --- brokers ------------------------------------------------------------------------------
    def append(self, batch: EncodedBatch) -> PutResult:
        """Store a producer's batch as a master does: positions filled in, one offset pair per record."""
        offsets, pos, now_ms = [], 0, int(time.time() * 1000)
        with self.lock:
            self.puts += 1
            touched = set()
            for _ in range(batch.count):
                msg, size = decode_record(batch.data, pos)
                pos += size
                if msg.topic.startswith(SCHEDULE_PREFIX):
                    self.records.setdefault((msg.topic, msg.queue_id), [])
                    self._start_scheduler()
                stored = self.records[(msg.topic, msg.queue_id)]
                stored.append(encode_record(msg.with_position(len(stored), 0, now_ms)))
                offsets.append((len(stored) - 1, 0))
                touched.add((msg.topic, msg.queue_id))
            self._wake(touched)
        return after_write(True, True, tuple(offsets), 0)

    def _start_scheduler(self) -> None:
        if self._scheduler is None:
            self._scheduler = threading.Thread(target=self._schedule_forever, name="fake-scheduler", daemon=True)
            self._scheduler.start()

    def _schedule_forever(self) -> None:
        while not self._closed.wait(SCHEDULE_STEP_S):
            self.schedule_step(int(time.time() * 1000))

    def schedule_step(self, now_ms: int) -> None:
        """The brokers' scheduler step (``actors/delay_scheduler.py``) over the fake's records."""
        with self.lock:
            for (topic, queue_id), stored in list(self.records.items()):
                if not topic.startswith(SCHEDULE_PREFIX):
                    continue
                start = self.committed.get((SCHEDULER_GROUP, topic, queue_id), 0)
                msgs = [decode_record(r)[0] for r in stored[start:]]
                plan = plan_queue(start, [(m.queue_offset, deliver_at_of(m.properties)) for m in msgs], now_ms)
                real = [r for r in (delivered(m) for m in msgs[:len(plan.due)]) if r is not None]
                if real:
                    self.append(encode_batch(real))
                if plan.commit_to > start:
                    self.committed[(SCHEDULER_GROUP, topic, queue_id)] = plan.commit_to

    def max_offset(self, topic: str, queue_id: int) -> int:
        return len(self.records.get((topic, queue_id), ()))

    def read(self, topic: str, queue_id: int, offset: int, max_count: int,
             codes: frozenset[int] | None = None) -> PullResult:
        stored = self.records.get((topic, queue_id), [])
        if offset >= len(stored):
            return PullResult(PullStatus.NO_NEW_MSG, offset=offset, next_offset=offset, max_offset=len(stored))
        if codes is None:
            chunk = stored[offset:offset + max_count]
            return PullResult(PullStatus.FOUND, b"".join(chunk), len(chunk), offset, offset + len(chunk), len(stored))
        kept, position = [], offset
        for record in stored[offset:]:
            if tag_hash(decode_record(record)[0].properties) in codes:
                kept.append(record)
            position += 1
            if len(kept) == max_count:
                break
        status = PullStatus.FOUND if kept else PullStatus.NO_NEW_MSG
        return PullResult(status, b"".join(kept), len(kept), offset, position, len(stored))

    def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        stored = self.records.get((topic, queue_id), [])
        return next((i for i, r in enumerate(stored) if decode_record(r)[0].store_timestamp_ms >= timestamp_ms),
                    len(stored))

    def pull(self, group: str, topic: str, queue_id: int, offset: int, max_count: int, max_bytes: int,
             hold_ms: int, consumer_group: str | None, tag_filter: str | None = None) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        if self.pull_hook is not None and (answer := self.pull_hook(group, topic, queue_id, offset,
                                                                    max_count)) is not None:
            fut.set_result(answer)
            return fut
        problem = check_pull(offset, max_count, max_bytes, hold_ms)
        codes = None
        try:
            wanted = None if tag_filter is None else parse_expression(tag_filter)
            codes = None if wanted is None else wanted.codes
        except TagExpressionError as exc:
            problem = problem or f"tag_filter: {exc}"
        if problem is not None:
            fut.set_result(PullResult(PullStatus.ILLEGAL, remark=problem))
            return fut
        with self.lock:
            if consumer_group is not None:
                offset = max(offset, self.committed.get((consumer_group, topic, queue_id), 0))
            result = self.read(topic, queue_id, offset, max_count, codes)
            if result.status is PullStatus.FOUND or hold_ms <= 0:
                fut.set_result(result)
                return fut
            held = _Held(topic, queue_id, result.next_offset, max_count, fut, codes=codes)
            self._held.append(held)
        held.timer = threading.Timer(hold_ms / 1000, self._expire, args=(held,))
        held.timer.daemon = True
        held.timer.start()
        return fut

    def _expire(self, held: _Held) -> None:
        with self.lock:
            if held in self._held:
                self._held.remove(held)
                held.future.set_result(self.read(held.topic, held.queue_id, held.offset, held.max_count,
                                                 held.codes))

    def _wake(self, touched: set[tuple[str, int]]) -> None:
        for held in [h for h in self._held if (h.topic, h.queue_id) in touched]:
            result = self.read(held.topic, held.queue_id, held.offset, held.max_count, held.codes)
            if result.status is not PullStatus.FOUND:
                held.offset = result.next_offset     # only unwanted records arrived: keep holding past them
                continue
            self._held.remove(held)
            if held.timer is not None:
                held.timer.cancel()
            held.future.set_result(result)

    def commit(self, consumer_group: str, entries: list[tuple[str, int, int]], reset: bool = False) -> PutResult:
        with self.lock:
            for topic, queue_id, offset in entries:
                if offset > self.max_offset(topic, queue_id):
                    return refused(PutStatus.MESSAGE_ILLEGAL)
            self.commits.append((consumer_group, threading.current_thread().name, list(entries)))
            if reset:
                self.resets.append((consumer_group, list(entries)))
            for topic, queue_id, offset in entries:
                key = (consumer_group, topic, queue_id)
                self.committed[key] = offset if reset else max(offset, self.committed.get(key, -1))
        return after_write(True, True, (), 0)

    def committed_of(self, broker_group: str, consumer_group: str, topics: list[str] | None) -> OffsetsResult:
        """What ``broker_group``'s master answers: the offsets of the queues it holds."""
        with self.lock:
            rows = tuple(sorted((t, q, o) for (g, t, q), o in self.committed.items()
                                if g == consumer_group and (topics is None or t in topics)
                                and self.topics.get(t, [None] * (q + 1))[q] == broker_group))
            return OffsetsResult(OffsetsStatus.OK, rows, tuple((t, q, self.max_offset(t, q)) for t, q, _ in rows))

    def close(self) -> None:
        self._closed.set()
        with self.lock:
            for held in self._held:
                if held.timer is not None:
                    held.timer.cancel()
            self._held.clear()


class FakeTransport:
    """:class:`rocketray.client.transport.Transport` over a :class:`FakeCluster` (module docstring)."""

    def __init__(self, cluster: FakeCluster, config: Any = None) -> None:
        self.cluster = cluster
        self._config = config
        self.forgotten: list[str] = []
        self.closed = False
        self._elections = threading.Event()

    def groups(self) -> list[str]:
        return list(self.cluster.groups)

    def call_controller(self, request: Any, timeout_s: float = 10.0) -> Response:
        return self.cluster.call_controller(request)

    def master(self, group: str) -> int | None:
        return 0

    def forget_master(self, group: str) -> None:
        self.forgotten.append(group)

    def await_new_master(self, group: str, timeout_s: float) -> bool:
        self._elections.wait(timeout_s)      # no election in the fake: the wait runs out
        return False

    def named_at(self, group: str) -> float:
        return float("-inf")                 # no election in the fake

    def put_start(self, group: str, batch: EncodedBatch, timeout_s: float,
                  caller_waits: bool = False) -> Callable[[], PutResult | Unanswered]:
        return lambda: self.put(group, batch, timeout_s)

    def put(self, group: str, batch: EncodedBatch, timeout_s: float) -> PutResult | Unanswered:
        if self.cluster.put_hook is not None and (answer := self.cluster.put_hook(group, batch)) is not None:
            return answer
        return self.cluster.append(batch)

    def commit(self, group: str, consumer_group: str, entries: list[tuple[str, int, int]],
               timeout_s: float, reset: bool = False) -> PutResult | Unanswered:
        if self.cluster.commit_hook is not None and (answer := self.cluster.commit_hook(
                group, consumer_group, entries)) is not None:
            return answer
        return self.cluster.commit(consumer_group, entries, reset)

    def committed(self, group: str, consumer_group: str, topics: list[str] | None,
                  timeout_s: float) -> OffsetsResult | Unanswered:
        return self.cluster.committed_of(group, consumer_group, topics)

    def queue_max_offsets(self, group: str, queues: list[tuple[str, int]],
                          timeout_s: float) -> tuple[tuple[str, int, int], ...] | Unanswered:
        with self.cluster.lock:
            return tuple((t, q, self.cluster.max_offset(t, q)) for t, q in queues)

    def search_offsets(self, group: str, queues: list[tuple[str, int]], timestamp_ms: int,
                       timeout_s: float) -> tuple[tuple[str, int, int], ...] | Unanswered:
        with self.cluster.lock:
            return tuple((t, q, self.cluster.search_offset(t, q, timestamp_ms)) for t, q in queues)

    def pull(self, group: str, topic: str, queue_id: int, offset: int, max_count: int, max_bytes: int,
             hold_ms: int, consumer_group: str | None = None,
             tag_filter: str | None = None) -> concurrent.futures.Future:
        return self.cluster.pull(group, topic, queue_id, offset, max_count, max_bytes, hold_ms, consumer_group,
                                 tag_filter)

    def config(self) -> Any:
        if self._config is None:
            raise LookupError("no cluster config: the client's defaults")
        return self._config

    def close(self) -> None:
        self.closed = True


__all__ = ["FakeCluster", "FakeTransport", "GROUPS", "MAX_PULL_COUNT"]
