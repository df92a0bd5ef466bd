"""Retries and the dead-letter queue: the pure rules behind ``Consumer.nack`` (RocketMQ's
``reconsumeLater``), done client-side over normal topics.

Theory of operation. A message the application nacks is published again, as a copy, to its consumer
group's **retry topic** ``%RETRY%<group>``, which every member of the group also reads; after
``max_deliveries`` deliveries it goes to the group's **dead-letter topic** ``%DLQ%<group>`` instead,
which nobody reads by itself (an operator reads and replays it like any topic). Nothing here does
IO or reads a clock: the consumer passes ``now_ms`` (wall clock: a retry's time must mean the same
in another process after a restart) and acts on what :func:`plan_nack` returns.

- **Delays** (``client.retry_delays``, RocketMQ's ``messageDelayLevel`` format): a schedule of
  levels; the delivery that failed the n-th time waits level ``min(n, len) - 1``. The default is the
  part of RocketMQ's levels its consumers retry with (reconsume 1 -> level 3): 10s 30s 1m 2m 3m 4m 5m
  6m 7m 8m 9m 10m 20m 30m 1h 2h. ``nack(delay_s=...)`` asks for its own delay instead.
- **One retry queue per level.** Queue ``i`` of the retry topic holds the copies that wait level
  ``i``, so within a queue the copies are due in the order they were stored (a later copy of the
  same level is never due earlier, up to clock skew between members), and a consumer can hold a
  queue at its first copy not yet due without holding back any copy due sooner (those are in
  queues of shorter levels): RocketMQ's ``SCHEDULE_TOPIC_XXXX`` has one queue per level for the
  same reason. A delay given to ``nack`` goes to the shortest level at least as long (so a copy is
  delivered no earlier than asked and, behind longer copies of its queue, no later than that level).
- **Retry or dead letter**: a message delivered ``max_deliveries`` times (``delivery_count`` counts
  the first delivery) goes to the dead-letter topic (one queue, as RocketMQ's), with no delay.
- **What a copy carries**: the body, key, tags and user properties, plus RocketMQ's ``RETRY_TOPIC``,
  ``ORIGIN_MESSAGE_ID`` and ``RECONSUME_TIME`` (deliveries that failed so far) and rocketray's
  ``ORIGIN_QUEUE_ID``, ``ORIGIN_QUEUE_OFFSET`` and ``RETRY_NOT_BEFORE_MS``. The origin is where the
  message was first sent: a copy of a copy keeps it. :func:`redelivery_fields` reads them back into
  the fields of :class:`~rocketray.client.types.ReceivedMessage`.
- **Holding** (:class:`RetryHold`): the copies a retry queue's pull returned wait, in queue order,
  until the first one is due; a held queue is not pulled further, and nothing of it is handed to
  the application (so nothing of it is committed) before its time.
"""

from __future__ import annotations

import collections
import re
from dataclasses import dataclass
from typing import Collection, Mapping, Sequence

from rocketray.client.types import ReceivedMessage, TopicQueue

__all__ = ["RETRY_PREFIX", "DLQ_PREFIX", "DLQ_QUEUES", "DEFAULT_RETRY_DELAYS", "FAST_RETRY_DELAYS",
           "RETRY_PROPERTIES", "MAX_TOPIC_CHARS", "RetryPlan", "RetryHold", "retry_topic", "dlq_topic",
           "is_retry_topic", "parse_delays", "delays_problem", "level_of", "plan_nack", "redelivery_fields"]

RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
DLQ_QUEUES = 1
MAX_TOPIC_CHARS = 127                 # RocketMQ's topic length (controller/topics.py)
DEFAULT_RETRY_DELAYS = "10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
FAST_RETRY_DELAYS = "100ms 200ms 500ms 1s 2s 5s"
MAX_LEVELS = 64

# the properties a copy carries (RocketMQ's names where RocketMQ has one)
P_TOPIC, P_MSG_ID, P_RECONSUME = "RETRY_TOPIC", "ORIGIN_MESSAGE_ID", "RECONSUME_TIME"
P_QUEUE_ID, P_QUEUE_OFFSET, P_NOT_BEFORE = "ORIGIN_QUEUE_ID", "ORIGIN_QUEUE_OFFSET", "RETRY_NOT_BEFORE_MS"
#: Set by the client only: a user property may not use these names.
RETRY_PROPERTIES = frozenset({P_TOPIC, P_MSG_ID, P_RECONSUME, P_QUEUE_ID, P_QUEUE_OFFSET, P_NOT_BEFORE})

_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DELAY = re.compile(r"^([0-9]{1,9})(ms|s|m|h|d)$")


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group


def is_retry_topic(topic: str) -> bool:
    return topic.startswith(RETRY_PREFIX)


def parse_delays(text: str) -> tuple[int, ...]:
    """``"10s 30s 1m"`` as milliseconds; ValueError naming what is wrong. Levels must not get shorter."""
    if not isinstance(text, str):
        raise ValueError(f"client setting retry_delays must be a str like {DEFAULT_RETRY_DELAYS!r}, not {text!r}")
    out = []
    for word in text.split():
        match = _DELAY.match(word)
        if match is None:
            raise ValueError(f"client setting retry_delays: {word!r} is not a delay (a number and ms, s, m, h or d)")
        out.append(int(match.group(1)) * _UNIT_MS[match.group(2)])
    if not 1 <= len(out) <= MAX_LEVELS:
        raise ValueError(f"client setting retry_delays needs 1..{MAX_LEVELS} delays, not {len(out)}")
    if any(b < a for a, b in zip(out, out[1:])):
        raise ValueError(f"client setting retry_delays must not get shorter: {text!r}")
    return tuple(out)


def delays_problem(text: str) -> str | None:
    try:
        parse_delays(text)
    except ValueError as exc:
        return str(exc)
    return None


def level_of(delays_ms: Sequence[int], delay_ms: int) -> int:
    """The shortest level at least ``delay_ms`` long; ValueError when ``delay_ms`` is over the longest."""
    for level, level_ms in enumerate(delays_ms):
        if delay_ms <= level_ms:
            return level
    raise ValueError(f"a nack delay of {delay_ms} ms is over the longest retry delay ({delays_ms[-1]} ms, "
                     "client setting retry_delays)")


@dataclass(frozen=True, slots=True)
class RetryPlan:
    """Where the copy of a nacked message goes and what it carries. ``dead``: the dead-letter topic.
    ``queues``: how many queues its topic needs (one per delay level; one for the dead-letter topic)."""

    topic: str
    queue_id: int
    queues: int
    dead: bool
    not_before_ms: int
    system_properties: Mapping[str, str]


def plan_nack(message: ReceivedMessage, group: str, delays_ms: Sequence[int], max_deliveries: int,
              delay_ms: int | None, now_ms: int) -> RetryPlan:
    """The copy to publish for ``message``, nacked by ``group`` at ``now_ms`` after its
    ``message.delivery_count``-th delivery; ``delay_ms`` None: the schedule's. ValueError for a
    delay out of range or a group whose retry topic name would be too long."""
    assert delays_ms and max_deliveries >= 1 and message.delivery_count >= 1
    if delay_ms is not None and (isinstance(delay_ms, bool) or not isinstance(delay_ms, int) or delay_ms < 0):
        raise ValueError(f"a nack delay must be >= 0, not {delay_ms!r}")
    if len(retry_topic(group)) > MAX_TOPIC_CHARS:
        raise ValueError(f"group name {group!r} is too long for a retry topic ({RETRY_PREFIX}<group> is at most "
                         f"{MAX_TOPIC_CHARS} characters)")
    dead = message.delivery_count >= max_deliveries
    if dead:
        topic, queue_id, queues, not_before = dlq_topic(group), 0, DLQ_QUEUES, now_ms
    else:
        level = (min(message.delivery_count, len(delays_ms)) - 1 if delay_ms is None
                 else level_of(delays_ms, delay_ms))
        wait_ms = delays_ms[level] if delay_ms is None else delay_ms
        topic, queue_id, queues, not_before = retry_topic(group), level, len(delays_ms), now_ms + wait_ms
    origin = _origin(message)
    props = {P_TOPIC: origin[0], P_QUEUE_ID: str(origin[1]), P_QUEUE_OFFSET: str(origin[2]), P_MSG_ID: origin[3],
             P_RECONSUME: str(message.delivery_count), P_NOT_BEFORE: str(not_before)}
    return RetryPlan(topic, queue_id, queues, dead, not_before, props)


def _origin(message: ReceivedMessage) -> tuple[str, int, int, str]:
    """Where ``message`` was first sent: its own place, or the origin a copy carries."""
    if message.origin_topic is None:
        return message.topic, message.queue_id, message.queue_offset, message.msg_id
    assert message.origin_queue_id is not None and message.origin_queue_offset is not None
    return message.origin_topic, message.origin_queue_id, message.origin_queue_offset, message.origin_msg_id or ""


def redelivery_fields(topic: str, props: Mapping[str, str]) -> dict[str, object]:
    """The :class:`ReceivedMessage` fields a stored copy's properties give (none for a message that
    is not a copy). ``delivery_count`` counts deliveries to the group reading ``topic``: a copy read
    from a retry topic is delivery ``RECONSUME_TIME + 1``; anything else (a dead-letter copy read by
    an operator's group) is that group's first. A malformed number reads as 0 (never raises: the
    bytes came from the wire)."""
    if P_TOPIC not in props:
        return {}
    retry = is_retry_topic(topic)
    return {"delivery_count": _int(props.get(P_RECONSUME)) + 1 if retry else 1, "origin_topic": props[P_TOPIC],
            "origin_queue_id": _int(props.get(P_QUEUE_ID)), "origin_queue_offset": _int(props.get(P_QUEUE_OFFSET)),
            "origin_msg_id": props.get(P_MSG_ID, ""), "not_before_ms": _int(props.get(P_NOT_BEFORE)) if retry else 0}


def _int(text: str | None) -> int:
    return int(text) if text is not None and text.isdigit() and len(text) < 19 else 0


class RetryHold:
    """Copies read from retry queues, held per queue in queue order until due (module docstring).
    Changed by the polling thread only (its length may be read from any)."""

    def __init__(self) -> None:
        self._held: dict[TopicQueue, collections.deque[ReceivedMessage]] = {}
        self._count = 0

    def add(self, messages: Sequence[ReceivedMessage]) -> None:
        for m in messages:
            self._held.setdefault(m.queue, collections.deque()).append(m)
        self._count += len(messages)

    def release(self, now_ms: int, skip: Collection[TopicQueue] = ()) -> list[ReceivedMessage]:
        """Every copy due at ``now_ms`` from the head of its queue (not of queues in ``skip``: paused)."""
        out = []
        for key, queue in list(self._held.items()):
            if key in skip:
                continue
            while queue and queue[0].not_before_ms <= now_ms:
                out.append(queue.popleft())
            if not queue:
                del self._held[key]
        self._count -= len(out)
        return out

    def queues(self) -> set[TopicQueue]:
        """Queues holding a copy not yet due: not pulled further until it is released."""
        return set(self._held)

    def next_due_ms(self, skip: Collection[TopicQueue] = ()) -> int | None:
        """When the first held copy (of a queue not in ``skip``) is due; None: nothing held."""
        return min((q[0].not_before_ms for key, q in self._held.items() if key not in skip), default=None)

    def drop(self, key: TopicQueue) -> None:
        """Forget ``key``'s held copies (the queue left this member, or was sought): its next reader
        reads them again from the committed offset."""
        self._count -= len(self._held.pop(key, ()))

    def __len__(self) -> int:
        return self._count
