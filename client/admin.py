"""``Admin``: topics, consumer-group progress and offsets, as mqadmin offers them.

    >>> from rocketray.client import Admin
    >>> admin = Admin("demo")                                            # doctest: +SKIP
    >>> admin.create_topic("orders", queues=8)                           # idempotent
    >>> admin.topic_route("orders").queues[0].broker_group
    'broker-a'
    >>> [p.lag for p in admin.consumer_progress("billing")]

Topics live in the controller's replicated state (no nameserver): creating one is a Raft write
that every controller keeps through failovers and restarts, and no broker holds a private copy.
"""

from __future__ import annotations

import datetime
import time
import uuid
from typing import Any, Callable, Iterable

from rocketray.wire.pull_result import OffsetsResult, OffsetsStatus
from rocketray.client.committer import commit_offsets
from rocketray.client.errors import AdminError, CommitFailed, InvalidRequest, TopicNotFound
from rocketray.client.retry import dlq_topic, retry_topic
from rocketray.client.routes import raise_for, route_from_header
from rocketray.client.transport import Transport, Unanswered, connect_transport
from rocketray.client.types import OffsetChange, QueueProgress, RetryStats, TopicQueue, TopicRoute
from rocketray.wire.controller_api import (ConsumerHeartbeatRequest, CreateTopicRequest, DeleteTopicRequest,
                                           GetTopicRouteRequest, ListTopicsRequest)

__all__ = ["Admin", "epoch_ms"]

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def epoch_ms(moment: datetime.datetime) -> int:
    """``moment`` (timezone-aware) in milliseconds since the epoch; InvalidRequest for a naive one."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise InvalidRequest(f"a time to reset to needs a timezone (e.g. tzinfo=timezone.utc), not {moment!r}")
    ms = (moment - _EPOCH) // datetime.timedelta(milliseconds=1)
    if ms < 0:
        raise InvalidRequest(f"a time to reset to is after 1970-01-01, not {moment.isoformat()}")
    return ms


class Admin:
    """Administration of the cluster named ``cluster``."""

    def __init__(self, cluster: str = "default", *, transport: Transport | None = None,
                 timeout_s: float = 10.0) -> None:
        self._owns_transport = transport is None
        self._transport = transport if transport is not None else connect_transport(cluster)
        self._timeout_s = timeout_s

    def close(self) -> None:
        """Close the connections ``consumer_progress`` opened. Idempotent."""
        if self._owns_transport:
            self._transport.close()

    def __enter__(self) -> "Admin":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, request: Any, what: str, topic: str | None = None) -> Any:
        """The answer's typed header (``rocketray.wire.controller_headers``), or the matching error."""
        try:
            response = self._transport.call_controller(request, timeout_s=self._timeout_s)
        except Exception as exc:  # noqa: BLE001 - no controller answered in time
            raise AdminError(f"{what}: no controller leader answered ({exc})", retriable=True,
                             code="CONTROLLER_UNAVAILABLE") from None
        return raise_for(response, what, topic).header

    def create_topic(self, topic: str, queues: int = 8) -> TopicRoute:
        """Create ``topic`` with ``queues`` queues spread over the broker groups, or extend it to that
        many (idempotent; a topic never shrinks: asking for fewer queues is an error). Running
        consumer groups read the new queues within about ``client.route_refresh_ms``."""
        return route_from_header(self._call(CreateTopicRequest(topic, queues), f"create topic {topic!r}", topic))

    def delete_topic(self, topic: str) -> None:
        """Forget ``topic`` (TopicNotFound if it does not exist). Stored messages stay until retention."""
        self._call(DeleteTopicRequest(topic), f"delete topic {topic!r}", topic)

    def topic_route(self, topic: str) -> TopicRoute:
        """Which broker group holds each queue of ``topic`` (TopicNotFound if it does not exist)."""
        return route_from_header(self._call(GetTopicRouteRequest(topic), f"route of {topic!r}", topic))

    def list_topics(self) -> dict[str, int]:
        """Every topic and its number of queues."""
        return dict(sorted(self._call(ListTopicsRequest(), "list topics").counts().items()))

    def group_members(self, group: str) -> list[str]:
        """The client ids of ``group``'s live members, as the controller leader knows them (a leader
        elected less than one heartbeat interval ago may not know them all yet)."""
        probe = f"rocketray-admin@{uuid.uuid4().hex[:12]}"     # leaving as a non-member: adds nothing
        header = self._call(ConsumerHeartbeatRequest(group, probe, (), leaving=True), f"members of {group!r}")
        return sorted(header.members)

    def consumer_progress(self, group: str, broker_groups: Iterable[str] | None = None) -> list[QueueProgress]:
        """Per queue ``group`` has committed: committed offset, max offset and lag, asked of each
        broker group's master (of ``broker_groups`` only, if given; AdminError if one does not answer)."""
        rows: list[QueueProgress] = []
        for broker_group in (self._transport.groups() if broker_groups is None else broker_groups):
            reply = self._committed(broker_group, group, None)
            maxes = reply.max_map()
            for topic, queue_id, offset in reply.committed:
                rows.append(QueueProgress(topic, queue_id, broker_group, offset, maxes.get((topic, queue_id), offset)))
        return sorted(rows, key=lambda r: (r.topic, r.queue_id))

    def retry_stats(self, group: str) -> RetryStats:
        """``group``'s retry topic (copies stored, copies not consumed yet) and dead-letter topic
        (copies stored): docs/client.md, "Retries and the dead-letter queue"."""
        retry, dlq = retry_topic(group), dlq_topic(group)
        retry_ends, dlq_ends = self._topic_ends(retry), self._topic_ends(dlq)
        pending = 0
        if retry_ends:
            committed: dict[TopicQueue, int] = {}
            for broker_group in sorted({b for b, _ in retry_ends.values()}):
                committed.update({TopicQueue(t, q): o for t, q, o in self._committed(broker_group, group, [retry]).committed})
            pending = sum(max(0, end - committed.get(key, 0)) for key, (_, end) in retry_ends.items())
        return RetryStats(group, retry, bool(retry_ends), sum(e for _, e in retry_ends.values()), pending, dlq,
                          bool(dlq_ends), sum(e for _, e in dlq_ends.values()))

    def _topic_ends(self, topic: str) -> dict[TopicQueue, tuple[str, int]]:
        """Per queue of ``topic``: its broker group and end offset; empty if the topic does not exist."""
        try:
            route = self.topic_route(topic)
        except TopicNotFound:
            return {}
        out: dict[TopicQueue, tuple[str, int]] = {}
        for broker_group in sorted({q.broker_group for q in route.queues}):
            keys = [TopicQueue(topic, q.queue_id) for q in route.queues if q.broker_group == broker_group]
            out.update({key: (broker_group, end) for key, end in self._ends(broker_group, keys).items()})
        return out

    def _committed(self, broker_group: str, group: str, topics: list[str] | None) -> OffsetsResult:
        reply = self._transport.committed(broker_group, group, topics, self._timeout_s)
        if not isinstance(reply, OffsetsResult) or reply.status is not OffsetsStatus.OK:
            self._transport.forget_master(broker_group)
            reply = self._transport.committed(broker_group, group, topics, self._timeout_s)
        if not isinstance(reply, OffsetsResult) or reply.status is not OffsetsStatus.OK:
            detail = reply.error if isinstance(reply, Unanswered) else f"{reply.status.name} {reply.remark}"
            raise AdminError(f"committed offsets of {group!r}: {broker_group} did not answer ({detail})",
                             retriable=True, code="BROKER_UNAVAILABLE")
        return reply

    def reset_offsets(self, group: str, topic: str, to: str | int | datetime.datetime) -> list[OffsetChange]:
        """Move stopped group ``group``'s committed offset of every queue of ``topic`` to ``to``:
        ``"earliest"`` (0: the first stored message), ``"latest"`` (the queue's end: skip the
        backlog), an offset (capped at each queue's end) or a time (an aware ``datetime``: each
        queue's first message stored at or after it, its end when all are older; RocketMQ's
        resetOffsetByTime). Returns each queue's change, backwards or forwards.

        Each broker group's queues get one reset record, replicated and acknowledged like a commit,
        which the brokers apply as an assignment (a commit only ever raises an offset:
        ``rocketray.broker.offsets``). AdminError (code ``GROUP_ACTIVE``) while the group has live
        members: they would commit over the reset. The offsets are read back after the reset; a
        queue a late commit moved past its target raises AdminError (code ``RESET_OVERTAKEN``: a
        member the controller no longer counted was still committing; stop it and reset again)."""
        at_ms = epoch_ms(to) if isinstance(to, datetime.datetime) else None
        if at_ms is None and not (to in ("earliest", "latest")
                                  or (isinstance(to, int) and not isinstance(to, bool) and to >= 0)):
            raise InvalidRequest(f"reset to 'earliest', 'latest', an offset >= 0 or a datetime, not {to!r}")
        members = self.group_members(group)
        if members:
            raise AdminError(f"consumer group {group!r} has {len(members)} live member(s) ({', '.join(members)}): "
                             "stop them first", code="GROUP_ACTIVE")
        route = self.topic_route(topic)
        before: dict[TopicQueue, int | None] = {}
        targets: dict[str, dict[TopicQueue, int]] = {}
        for broker_group in sorted({q.broker_group for q in route.queues}):
            reply = self._committed(broker_group, group, [topic])
            committed = {TopicQueue(t, q): o for t, q, o in reply.committed}
            keys = [TopicQueue(topic, q.queue_id) for q in route.queues if q.broker_group == broker_group]
            ends = self._ends(broker_group, keys) if at_ms is None else self._at_time(broker_group, keys, at_ms)
            for key in keys:
                before[key] = committed.get(key)
                target = 0 if to == "earliest" else ends[key] if to == "latest" or at_ms is not None \
                    else min(int(to), ends[key])   # type: ignore[arg-type]
                if target != before[key]:
                    targets.setdefault(broker_group, {})[key] = target
        outcome = commit_offsets(self._transport, group, targets, time.monotonic() + self._timeout_s,
                                 self._timeout_s, None, reset=True)
        if outcome.failed:
            failed = ", ".join(outcome.failed_groups + outcome.refused_groups + outcome.denied_groups)
            raise CommitFailed(f"reset of {group!r} not acknowledged by {failed}", committed=outcome.done,
                               failed=outcome.failed)
        self._check_reset(group, topic, targets)
        return [OffsetChange(key, before[key], outcome.done.get(key, before[key])) for key in sorted(before)]

    def _check_reset(self, group: str, topic: str, targets: dict[str, dict[TopicQueue, int]]) -> None:
        """Read the reset queues back: AdminError (RESET_OVERTAKEN) naming each one a commit moved
        past its target after the reset record (the fold's race, ``rocketray.broker.offsets``)."""
        overtaken = []
        for broker_group, wanted in sorted(targets.items()):
            now = {TopicQueue(t, q): o for t, q, o in self._committed(broker_group, group, [topic]).committed}
            overtaken += [f"{k.topic}/{k.queue_id} at {now.get(k)} (reset to {o})" for k, o in sorted(wanted.items())
                          if now.get(k) != o]
        if overtaken:
            raise AdminError(f"reset of {group!r}: a member committed past it: {', '.join(overtaken)}; stop every "
                             "member of the group and reset again", code="RESET_OVERTAKEN")

    def _at_time(self, broker_group: str, keys: list[TopicQueue], timestamp_ms: int) -> dict[TopicQueue, int]:
        return self._per_queue(broker_group, keys, "the offsets by time", lambda queues: self._transport.search_offsets(
            broker_group, queues, timestamp_ms, self._timeout_s))

    def _ends(self, broker_group: str, keys: list[TopicQueue]) -> dict[TopicQueue, int]:
        return self._per_queue(broker_group, keys, "the queues' ends", lambda queues: self._transport.queue_max_offsets(
            broker_group, queues, self._timeout_s))

    @staticmethod
    def _per_queue(broker_group: str, keys: list[TopicQueue], what: str,
                   ask: Callable[[list[tuple[str, int]]], Any]) -> dict[TopicQueue, int]:
        reply = ask([(k.topic, k.queue_id) for k in keys])
        if isinstance(reply, Unanswered):
            raise AdminError(f"{broker_group} did not answer {what} ({reply.error})", retriable=True,
                             code="BROKER_UNAVAILABLE")
        return {TopicQueue(t, q): o for t, q, o in reply}
