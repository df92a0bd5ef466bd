"""The consumer's reading of the queues it owns: start positions, held pulls, and their answers.

Theory of operation. Each owned queue has a :class:`QueueState`: its broker group, the next offset
to read (unknown until the group's committed offset was asked of the master), the pull in flight
and the queue's end as the last pull saw it (for lag). :meth:`Fetcher.start_positions` asks the
masters for the committed offsets of queues whose position is unknown; :meth:`Fetcher.issue_pulls`
keeps one held pull in flight per readable queue; :meth:`Fetcher.take` turns a finished pull into
messages and moves that queue's offset past them. A pull is sent with the group's name, so the
broker starts it no lower than the group's committed offset (a member that still reads a queue
another member committed past skips what was already handled), except after a ``seek``: then the
queue is read from exactly where the application asked.

A topic subscribed with a tag expression (``rocketray.client.filters``) is pulled with it: the
broker sends only the messages whose tag code matches and moves the answer's ``next_offset`` past
every entry it looked at; ``take`` drops what matched only by code, and notes how far each such
queue was passed (``take_passed``), so commits move past the unwanted messages too.

``take`` never raises: an answer that is an error comes back beside the messages, and the consumer
decides when to raise it, so messages a poll already took are always returned to the application.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from dataclasses import dataclass
from typing import Callable, Collection, Mapping

from rocketray.wire.pull_result import OffsetsResult, OffsetsStatus, PullResult, PullStatus
from rocketray.client.config import ClientConfig
from rocketray.client.errors import ClientError, InvalidRequest, access_denied
from rocketray.client.filters import Subscriptions, expression_of, keep_subscribed
from rocketray.client.messages import decode_messages
from rocketray.client.transport import Transport, Unanswered
from rocketray.client.types import ReceivedMessage, TopicQueue

__all__ = ["QueueState", "Fetcher", "RETRY_AFTER_S", "MAX_HOLD_MS"]

log = logging.getLogger("rocketray.client")

RETRY_AFTER_S = 0.05
MAX_HOLD_MS = 30_000


@dataclass(slots=True)
class QueueState:
    group: str                       # the broker group holding it
    next_offset: int | None = None   # None until the committed offset is known
    pull: concurrent.futures.Future | None = None
    pull_offset: int = -1
    retry_at: float = 0.0
    end_offset: int | None = None    # one past the queue's last confirmed message, as the last pull saw it
    from_committed: bool = True      # pull no lower than the group's committed offset (False after a seek)


class Fetcher:
    """The owned queues' states and pulls (module docstring). Used by one thread (the poller)."""

    def __init__(self, transport: Transport, consumer_group: str, config: ClientConfig,
                 auto_offset_reset: str, filters: Subscriptions | None = None) -> None:
        self._transport = transport
        self._group = consumer_group
        self._config = config
        self._auto_offset_reset = auto_offset_reset
        self._filters: Subscriptions = dict(filters or {})
        self._passed: dict[TopicQueue, int] = {}     # filtered queues: how far their last pulls looked
        self.queues: dict[TopicQueue, QueueState] = {}

    # --- ownership and positions ----------------------------------------------------------------
    def add(self, key: TopicQueue, broker_group: str) -> None:
        self.queues.setdefault(key, QueueState(broker_group))

    def drop(self, key: TopicQueue) -> None:
        self.queues.pop(key, None)           # an in-flight pull's answer is dropped

    def seek(self, key: TopicQueue, offset: int) -> None:
        """Read ``key`` from ``offset`` next (the pull in flight is abandoned)."""
        q = self.queues[key]
        q.next_offset, q.pull, q.retry_at, q.from_committed = offset, None, 0.0, False

    def end_offsets(self, keys: Collection[TopicQueue], timeout_s: float) -> dict[TopicQueue, int]:
        """The queues' ends (one past the last confirmed message), asked of their masters."""
        return self._ask_masters(keys, "the queues' ends",
                                 lambda group, queues: self._transport.queue_max_offsets(group, queues, timeout_s))

    def offsets_for_time(self, keys: Collection[TopicQueue], timestamp_ms: int,
                         timeout_s: float) -> dict[TopicQueue, int]:
        """Per queue, the first offset stored at or after ``timestamp_ms``, asked of their masters."""
        if isinstance(timestamp_ms, bool) or not isinstance(timestamp_ms, int) or not 0 <= timestamp_ms < 2**63:
            raise InvalidRequest(f"a time to seek to is epoch milliseconds, an int >= 0, not {timestamp_ms!r}")
        return self._ask_masters(keys, "the offsets by time", lambda group, queues: self._transport.search_offsets(
            group, queues, timestamp_ms, timeout_s))

    def _ask_masters(self, keys: Collection[TopicQueue], what: str,
                     ask: Callable[[str, list[tuple[str, int]]], tuple[tuple[str, int, int], ...] | Unanswered]
                     ) -> dict[TopicQueue, int]:
        by_group: dict[str, list[TopicQueue]] = {}
        for key in keys:
            by_group.setdefault(self.queues[key].group, []).append(key)
        out: dict[TopicQueue, int] = {}
        for broker_group, group_keys in by_group.items():
            reply = ask(broker_group, [(k.topic, k.queue_id) for k in group_keys])
            if isinstance(reply, Unanswered):
                self._transport.forget_master(broker_group)
                raise ClientError(f"{broker_group} did not answer {what} ({reply.error})", retriable=True,
                                  code="BROKER_UNAVAILABLE")
            out.update({TopicQueue(t, q): o for t, q, o in reply})
        return out

    def start_positions(self) -> dict[TopicQueue, int]:
        """Ask the masters for the committed offsets of owned queues whose position is unknown; sets
        their positions and returns the committed offsets found (to count as acknowledged)."""
        unknown: dict[str, list[TopicQueue]] = {}
        now = time.monotonic()
        for key, q in self.queues.items():
            if q.next_offset is None and q.retry_at <= now:
                unknown.setdefault(q.group, []).append(key)
        found: dict[TopicQueue, int] = {}
        timeout_s = self._config.request_timeout_ms / 1000
        for broker_group, keys in unknown.items():
            reply = self._transport.committed(broker_group, self._group, sorted({k.topic for k in keys}), timeout_s)
            if isinstance(reply, OffsetsResult) and reply.status is OffsetsStatus.ACCESS_DENIED:
                self._retry_later(broker_group, keys, now)
                raise access_denied(reply.remark, doing=f"reading group {self._group!r}'s committed offsets")
            if not (isinstance(reply, OffsetsResult) and reply.status is OffsetsStatus.OK):
                self._retry_later(broker_group, keys, now)
                continue
            committed = {TopicQueue(t, q): o for t, q, o in reply.committed}
            latest: dict[TopicQueue, int] = {}
            if self._auto_offset_reset == "latest" and any(k not in committed for k in keys):
                maxes = self._transport.queue_max_offsets(broker_group, [(k.topic, k.queue_id) for k in keys], timeout_s)
                if isinstance(maxes, Unanswered):
                    self._retry_later(broker_group, keys, now)
                    continue
                latest = {TopicQueue(t, q): o for t, q, o in maxes}
            for key in keys:
                start = committed.get(key)
                self.queues[key].next_offset = start if start is not None else latest.get(key, 0)
                if start is not None:
                    found[key] = start
        return found

    def _retry_later(self, broker_group: str, keys: list[TopicQueue], now: float) -> None:
        self._transport.forget_master(broker_group)
        for key in keys:
            self.queues[key].retry_at = now + RETRY_AFTER_S

    # --- pulls ----------------------------------------------------------------------------------
    def issue_pulls(self, deadline: float, paused: Collection[TopicQueue]) -> None:
        """A held pull for every owned, unpaused queue with a known position and none in flight."""
        hold_ms = int(min(MAX_HOLD_MS, max(0.0, deadline - time.monotonic()) * 1000))
        now = time.monotonic()
        for key, q in self.queues.items():
            if q.pull is None and q.next_offset is not None and q.retry_at <= now and key not in paused:
                q.pull_offset = q.next_offset
                q.pull = self._transport.pull(q.group, key.topic, key.queue_id, q.next_offset,
                                              self._config.poll_max_messages, self._config.poll_max_bytes, hold_ms,
                                              self._group if q.from_committed else None,
                                              tag_filter=expression_of(self._filters.get(key.topic)))

    def in_flight(self) -> dict[concurrent.futures.Future, TopicQueue]:
        return {q.pull: key for key, q in self.queues.items() if q.pull is not None}

    def take(self, key: TopicQueue, fut: concurrent.futures.Future,
             paused: Collection[TopicQueue]) -> tuple[list[ReceivedMessage], ClientError | None]:
        """The messages of ``key``'s finished pull ``fut`` (its position moved past them), and the
        error its answer means, if any. An answer for a queue that moved on (dropped, sought, or
        paused meanwhile) gives nothing and changes nothing."""
        q = self.queues.get(key)
        if q is None or q.pull is not fut:
            return [], None                    # the queue moved to another member or was sought meanwhile
        q.pull = None
        result = fut.result()
        if not isinstance(result, PullResult) or result.status is PullStatus.NOT_MASTER:
            self._transport.forget_master(q.group)
            q.retry_at = time.monotonic() + RETRY_AFTER_S
            return [], None
        if result.status is PullStatus.ACCESS_DENIED:
            q.retry_at = time.monotonic() + RETRY_AFTER_S
            return [], access_denied(result.remark, doing=f"pull of {key}")
        if result.status is PullStatus.ILLEGAL:
            q.retry_at = time.monotonic() + RETRY_AFTER_S
            return [], InvalidRequest(f"pull of {key} refused: {result.remark}")
        if key in paused or q.pull_offset != q.next_offset:
            return [], None                    # read again from the same offset once resumed
        q.next_offset = result.next_offset     # past the group's committed offset if the broker moved it up
        q.end_offset = result.max_offset
        tag_filter = self._filters.get(key.topic)
        if tag_filter is not None:
            self._passed[key] = max(self._passed.get(key, 0), result.next_offset)
        if result.status is not PullStatus.FOUND:
            return [], None
        return keep_subscribed(decode_messages(key.topic, result.records, result.count), tag_filter), None

    def take_passed(self) -> Mapping[TopicQueue, int]:
        """Per filtered queue, one past the last entry its taken pulls looked at (kept or skipped),
        since the last call: the consumer counts those as returned, so commits pass them."""
        passed, self._passed = self._passed, {}
        return passed

    def lag(self) -> dict[TopicQueue, int]:
        """Per owned queue whose end and position are known: messages not yet read."""
        return {key: max(0, q.end_offset - q.next_offset) for key, q in self.queues.items()
                if q.end_offset is not None and q.next_offset is not None}
