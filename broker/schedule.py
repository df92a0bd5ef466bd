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

The names a delayed message carries (the schedule topic, its properties, the levels) and where a
producer stores one (:func:`~rocketray.wire.delayed.plan_delay`) are :mod:`rocketray.wire.delayed`'s;
this module holds the scheduler's rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from rocketray.wire.delayed import P_REAL_QID, real_topic
from rocketray.wire.message import Message

__all__ = ["QueuePlan", "plan_queue", "delivered"]


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
