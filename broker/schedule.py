"""Delayed delivery (RocketMQ's timer messages): the pure rules of where a delayed message waits,
when it is due, and what the master's scheduler puts and commits.

Theory of operation. A message sent with a delivery time (``Producer.send(..., delay_s=...)``) is
stored by the broker group of the queue it was meant for, but in the system topic
``%SCHEDULE%<topic>`` (:func:`schedule_topic`), queue = its **delay level**, with the properties
``TIMER_DELIVER_MS`` (when it is due, wall-clock ms) and ``REAL_QID`` (its queue in ``<topic>``).
Consumers never read a schedule topic (the client port refuses it). The master of that broker
group runs a scheduler (``actors/delay_scheduler.py``) which reads each schedule queue from its own
consumer group's committed offset (:data:`SCHEDULER_GROUP`, a commit record in the replicated log
like any group's), puts every due message into its real topic and queue through the ordinary put
path, and commits past them only once that put is acknowledged. So:

- **Never lost**: a delayed message is stored and acknowledged like any message; the scheduler's
  offset moves past it only after its real copy is acknowledged (on every in-sync replica), and both
  survive any failover a message survives. A new master's scheduler starts from the committed offset.
- **At least once**: a master that fails between the real put and the commit leaves the message to
  be put again by the next master, with the same ``UNIQ_KEY`` (``msg_id``): consumers de-duplicate
  by ``msg_id`` as for any redelivery.
- **Levels** (:data:`LEVELS_MS`, 1 s to 24 h, each about twice the previous): a message whose delay
  is ``d`` waits in the queue of the shortest level at least ``d`` long, so within a queue the
  messages fall due nearly in store order. The scheduler holds a queue at its first message not yet
  due (:func:`plan_queue`), so a message is delivered **at or after** its time and, when a longer
  wait of the same level was stored just before it, at most its level's delay after it was sent.
- **Limits**: a delivery time at most :data:`MAX_DELAY_MS` (24 h) ahead, well inside the commit
  log's retention (72 h by default; a pending message is kept only as long as its segment);
  a time up to :data:`PAST_TOLERANCE_MS` in the past is sent at once; earlier is an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from rocketray.broker.message import MAX_TOPIC_BYTES, Message

__all__ = ["SCHEDULE_PREFIX", "SCHEDULER_GROUP", "P_DELIVER_AT", "P_REAL_QID", "SCHEDULE_PROPERTIES", "LEVELS_MS",
           "MAX_DELAY_MS", "PAST_TOLERANCE_MS", "DelayPlan", "QueuePlan", "schedule_topic", "real_topic",
           "is_schedule_name", "level_of", "plan_delay", "deliver_at_of", "plan_queue", "delivered"]

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


@dataclass(frozen=True, slots=True)
class QueuePlan:
    """One scheduler step for one schedule queue: put ``due`` (queue offsets, in order) into their
    real queues, then, once that put is acknowledged, commit ``commit_to``; ``next_due_ms`` is when
    the queue's first message not due yet falls due (None: none read)."""

    due: tuple[int, ...]
    commit_to: int
    next_due_ms: int | None


def plan_queue(committed: int, entries: Sequence[tuple[int, int]], now_ms: int) -> QueuePlan:
    """What to deliver of a schedule queue whose scheduler has committed ``committed``, given its
    stored ``(queue_offset, deliver_at_ms)`` entries from there on, in queue order (the first may be
    past ``committed`` where retention deleted older ones), at ``now_ms``: the due prefix, held at
    the first entry not due. Re-planned from the same committed offset (a failover between put and
    commit), the same entries come out again: they are put once more, never skipped."""
    due: list[int] = []
    for queue_offset, deliver_at_ms in entries:
        assert queue_offset >= committed and (not due or queue_offset > due[-1]), (committed, queue_offset)
        if deliver_at_ms > now_ms:
            return QueuePlan(tuple(due), due[-1] + 1 if due else committed, deliver_at_ms)
        due.append(queue_offset)
    return QueuePlan(tuple(due), due[-1] + 1 if due else committed, None)


def delivered(scheduled: Message) -> Message | None:
    """The message to put into the real topic for a stored schedule-topic message: same body,
    properties (``UNIQ_KEY`` included) and born time; None when it names no real topic or queue
    (a record no client made: nothing to deliver)."""
    topic = real_topic(scheduled.topic)
    qid = scheduled.properties.get(P_REAL_QID, "")
    if topic is None or not qid.isdigit() or len(qid) > 9:
        return None
    return Message(topic, int(qid), bytes(scheduled.body), dict(scheduled.properties),
                   born_timestamp_ms=scheduled.born_timestamp_ms)
