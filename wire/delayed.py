"""Delayed messages as they are stored: the schedule topics, the properties a delayed message
carries, its levels, and where a producer stores one (pure).

A message sent with a delivery time is stored in the system topic ``%SCHEDULE%<topic>``
(:func:`schedule_topic`), queue = its delay level (:data:`LEVELS_MS`), with the properties
:data:`P_DELIVER_AT` (when it is due, wall-clock ms) and :data:`P_REAL_QID` (its queue in
``<topic>``): the producer writes them (:func:`plan_delay`) and the master's scheduler reads them.
The theory of operation (never lost, at least once, levels, limits) is in
``rocketray.broker.schedule``, with the scheduler's rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from rocketray.wire.message import MAX_TOPIC_BYTES

__all__ = ["SCHEDULE_PREFIX", "SCHEDULER_GROUP", "P_DELIVER_AT", "P_REAL_QID", "SCHEDULE_PROPERTIES", "LEVELS_MS",
           "MAX_DELAY_MS", "PAST_TOLERANCE_MS", "DelayPlan", "schedule_topic", "real_topic", "is_schedule_name",
           "level_of", "plan_delay", "deliver_at_of"]

SCHEDULE_PREFIX = "%SCHEDULE%"
#: The consumer group whose committed offsets are the scheduler's progress (reserved: no user may use it).
SCHEDULER_GROUP = "%SCHEDULE%"
P_DELIVER_AT, P_REAL_QID = "TIMER_DELIVER_MS", "REAL_QID"
#: Set by the client only: a user property may not use these names.
SCHEDULE_PROPERTIES = frozenset({P_DELIVER_AT, P_REAL_QID})

_S, _M, _H = 1000, 60_000, 3_600_000
LEVELS_MS: tuple[int, ...] = (1 * _S, 2 * _S, 4 * _S, 8 * _S, 15 * _S, 30 * _S, 1 * _M, 2 * _M, 4 * _M, 8 * _M,
                              15 * _M, 30 * _M, 1 * _H, 2 * _H, 4 * _H, 8 * _H, 16 * _H, 24 * _H)
MAX_DELAY_MS = LEVELS_MS[-1]
PAST_TOLERANCE_MS = 10_000
MAX_REAL_TOPIC_CHARS = MAX_TOPIC_BYTES - len(SCHEDULE_PREFIX)


def schedule_topic(topic: str) -> str:
    return SCHEDULE_PREFIX + topic


def is_schedule_name(name: str) -> bool:
    """Whether ``name`` (a topic or a consumer group) is the scheduler's: reserved."""
    return name.startswith(SCHEDULE_PREFIX)


def real_topic(topic: str) -> str | None:
    """The topic a schedule topic's messages are delivered to (None: not a schedule topic)."""
    if not topic.startswith(SCHEDULE_PREFIX) or len(topic) == len(SCHEDULE_PREFIX):
        return None
    return topic[len(SCHEDULE_PREFIX):]


def level_of(delay_ms: int) -> int:
    """The shortest level at least ``delay_ms`` long (``delay_ms`` at most :data:`MAX_DELAY_MS`)."""
    assert 0 < delay_ms <= MAX_DELAY_MS, delay_ms
    return next(level for level, level_ms in enumerate(LEVELS_MS) if delay_ms <= level_ms)


@dataclass(frozen=True, slots=True)
class DelayPlan:
    """Where a message sent at ``now_ms`` for ``deliver_at_ms`` is stored: ``topic``/``queue_id``
    (the schedule queue, or the real queue when it is due already) and the reserved properties it
    carries."""

    topic: str
    queue_id: int
    delayed: bool
    system_properties: Mapping[str, str]


def plan_delay(topic: str, queue_id: int, deliver_at_ms: int, now_ms: int) -> DelayPlan:
    """How to store a message for ``topic``/``queue_id`` due at ``deliver_at_ms``; ValueError for a
    time more than :data:`PAST_TOLERANCE_MS` past, over :data:`MAX_DELAY_MS` ahead, or a topic too
    long to have a schedule topic."""
    if isinstance(deliver_at_ms, bool) or not isinstance(deliver_at_ms, int):
        raise ValueError(f"a delivery time must be an int of ms since the epoch, not {deliver_at_ms!r}")
    delay_ms = deliver_at_ms - now_ms
    if delay_ms < -PAST_TOLERANCE_MS:
        raise ValueError(f"delivery time {deliver_at_ms} is {-delay_ms} ms in the past (at most "
                         f"{PAST_TOLERANCE_MS} ms is sent at once)")
    if delay_ms > MAX_DELAY_MS:
        raise ValueError(f"delivery time {deliver_at_ms} is {delay_ms} ms ahead, over the maximum delay "
                         f"of {MAX_DELAY_MS} ms (24 h)")
    props = {P_DELIVER_AT: str(deliver_at_ms)}
    if delay_ms <= 0:
        return DelayPlan(topic, queue_id, False, props)
    if len(topic) > MAX_REAL_TOPIC_CHARS:
        raise ValueError(f"topic {topic!r} is too long for delayed messages ({SCHEDULE_PREFIX}<topic> is at most "
                         f"{MAX_TOPIC_BYTES} characters)")
    return DelayPlan(schedule_topic(topic), level_of(delay_ms), True, {**props, P_REAL_QID: str(queue_id)})


def deliver_at_of(properties: Mapping[str, str]) -> int:
    """A stored message's delivery time; 0 (due now) when it has none or a malformed one (never
    raises: the bytes may have come from any client)."""
    text = properties.get(P_DELIVER_AT)
    return int(text) if text is not None and text.isdigit() and len(text) < 19 else 0
