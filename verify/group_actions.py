"""Consumer-group rows of what the workload did besides polling: nacks, seeks, delayed sends, a topic's extension.

Theory of operation. The broker chaos run's consumer-group workload (``chaos/group_workload.py``)
appends these rows to ``history.jsonl`` next to the rows of ``rocketray.verify.group_history``,
told apart by ``f``; each is a frozen dataclass with a strict ``from_json`` (the field validators of
``rocketray.verify.fields``) and a ``to_json`` that gives back exactly the contract's keys:

- ``nack``: one ``Consumer.nack`` call on a delivered message: ``process``, ``consumer_group``,
  ``topic``, ``queue_id``, ``queue_offset`` (where the nacked message was read), ``payload_id``,
  ``msg_id`` (the nacked message's own), ``origin_msg_id`` (the first message's id when the nacked
  one is a retry copy, else null), ``delivery_count`` (of the nacked delivery), ``outcome`` (``ok``:
  the copy was acknowledged; ``failed``/``unknown``: ``nack`` raised ``SendFailed``/anything else),
  ``copy_topic``, ``copy_queue_id``, ``copy_msg_id`` (where the copy went: the retry or the
  dead-letter topic; null unless ok), ``time_ms``.
- ``seek``: a member moved an owned queue: ``process``, ``consumer_group``, ``topic``, ``queue_id``,
  ``offset`` (read next from here), ``from_offset`` (the position before, null if unknown), ``poll``
  (the number of the poll after which it sought: the next poll reads from ``offset``), ``time_ms``.
- ``delayed``: one acknowledged send asked to be delivered later: ``process``, ``payload_id``,
  ``msg_id`` (its ``SendResult``'s; the scheduler keeps it), ``deliver_at_ms`` (the producer's
  wall clock), ``time_ms``. Its ``send`` row has a null ``queue_offset`` (the ``SendResult``'s is -1:
  the place is taken when it falls due).
- ``extend``: the workload extended the topic: ``topic``, ``queues_before``, ``queues``, ``time_ms``
  (when ``Admin.create_topic`` returned).

No clock, no Ray: decoded objects in, records out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rocketray.verify.fields import FieldError, Ident, Number, get_ident, get_int, get_number, get_str
from rocketray.verify.outcome import Outcome

__all__ = ["NACK_OUTCOMES", "NackRecord", "SeekRecord", "DelayedSend", "TopicExtended"]

NACK_OUTCOMES = tuple(o.value for o in Outcome)


@dataclass(frozen=True, slots=True)
class NackRecord:
    """One nack of one delivered message, and where its copy went."""

    process: Ident
    consumer_group: str
    topic: str
    queue_id: int
    queue_offset: int
    payload_id: Ident | None
    msg_id: str
    origin_msg_id: str | None
    delivery_count: int
    outcome: Outcome
    copy_topic: str | None
    copy_queue_id: int | None
    copy_msg_id: str | None
    time_ms: Number

    def __post_init__(self) -> None:
        object.__setattr__(self, "outcome", Outcome(self.outcome))
        if (self.outcome is Outcome.OK) != (self.copy_topic is not None and self.copy_msg_id is not None):
            raise FieldError("a nack names its copy's copy_topic and copy_msg_id exactly when its outcome is ok")

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK

    @property
    def dead(self) -> bool:
        """The copy went to a dead-letter topic."""
        return self.copy_topic is not None and self.copy_topic.startswith("%DLQ%")

    @property
    def first_msg_id(self) -> str:
        """The id of the message first sent (what every copy's ``origin_msg_id`` names)."""
        return self.origin_msg_id or self.msg_id

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "NackRecord":
        return cls(process=get_ident(obj, "process"),  # type: ignore[arg-type]
                   consumer_group=get_str(obj, "consumer_group"),  # type: ignore[arg-type]
                   topic=get_str(obj, "topic"),  # type: ignore[arg-type]
                   queue_id=get_int(obj, "queue_id", minimum=0),  # type: ignore[arg-type]
                   queue_offset=get_int(obj, "queue_offset", minimum=0),  # type: ignore[arg-type]
                   payload_id=get_ident(obj, "payload_id", nullable=True),
                   msg_id=get_str(obj, "msg_id"),  # type: ignore[arg-type]
                   origin_msg_id=get_str(obj, "origin_msg_id", nullable=True),
                   delivery_count=get_int(obj, "delivery_count", minimum=1),  # type: ignore[arg-type]
                   outcome=Outcome(get_str(obj, "outcome", choices=NACK_OUTCOMES)),
                   copy_topic=get_str(obj, "copy_topic", nullable=True),
                   copy_queue_id=get_int(obj, "copy_queue_id", nullable=True, minimum=0),
                   copy_msg_id=get_str(obj, "copy_msg_id", nullable=True),
                   time_ms=get_number(obj, "time_ms"))

    def to_json(self) -> dict[str, Any]:
        return {"f": "nack", "process": self.process, "consumer_group": self.consumer_group, "topic": self.topic,
                "queue_id": self.queue_id, "queue_offset": self.queue_offset, "payload_id": self.payload_id,
                "msg_id": self.msg_id, "origin_msg_id": self.origin_msg_id, "delivery_count": self.delivery_count,
                "outcome": self.outcome.value, "copy_topic": self.copy_topic, "copy_queue_id": self.copy_queue_id,
                "copy_msg_id": self.copy_msg_id, "time_ms": self.time_ms}


@dataclass(frozen=True, slots=True)
class SeekRecord:
    """A member sought an owned queue to ``offset`` after its poll number ``poll``."""

    process: Ident
    consumer_group: str
    topic: str
    queue_id: int
    offset: int
    from_offset: int | None
    poll: int
    time_ms: Number

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "SeekRecord":
        return cls(process=get_ident(obj, "process"),  # type: ignore[arg-type]
                   consumer_group=get_str(obj, "consumer_group"),  # type: ignore[arg-type]
                   topic=get_str(obj, "topic"),  # type: ignore[arg-type]
                   queue_id=get_int(obj, "queue_id", minimum=0),  # type: ignore[arg-type]
                   offset=get_int(obj, "offset", minimum=0),  # type: ignore[arg-type]
                   from_offset=get_int(obj, "from_offset", nullable=True, minimum=0),
                   poll=get_int(obj, "poll", minimum=1),  # type: ignore[arg-type]
                   time_ms=get_number(obj, "time_ms"))

    def to_json(self) -> dict[str, Any]:
        return {"f": "seek", "process": self.process, "consumer_group": self.consumer_group, "topic": self.topic,
                "queue_id": self.queue_id, "offset": self.offset, "from_offset": self.from_offset, "poll": self.poll,
                "time_ms": self.time_ms}


@dataclass(frozen=True, slots=True)
class DelayedSend:
    """An acknowledged send that asked to be delivered at ``deliver_at_ms``."""

    process: Ident
    payload_id: Ident
    msg_id: str
    deliver_at_ms: Number
    time_ms: Number

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "DelayedSend":
        return cls(process=get_ident(obj, "process"),  # type: ignore[arg-type]
                   payload_id=get_ident(obj, "payload_id"),  # type: ignore[arg-type]
                   msg_id=get_str(obj, "msg_id"),  # type: ignore[arg-type]
                   deliver_at_ms=get_number(obj, "deliver_at_ms"), time_ms=get_number(obj, "time_ms"))

    def to_json(self) -> dict[str, Any]:
        return {"f": "delayed", "process": self.process, "payload_id": self.payload_id, "msg_id": self.msg_id,
                "deliver_at_ms": self.deliver_at_ms, "time_ms": self.time_ms}


@dataclass(frozen=True, slots=True)
class TopicExtended:
    """The workload extended ``topic`` from ``queues_before`` to ``queues`` queues at ``time_ms``."""

    topic: str
    queues_before: int
    queues: int
    time_ms: Number

    def __post_init__(self) -> None:
        if self.queues <= self.queues_before:
            raise FieldError(f"an extension adds queues: {self.queues_before} -> {self.queues}")

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "TopicExtended":
        return cls(topic=get_str(obj, "topic"),  # type: ignore[arg-type]
                   queues_before=get_int(obj, "queues_before", minimum=1),  # type: ignore[arg-type]
                   queues=get_int(obj, "queues", minimum=1),  # type: ignore[arg-type]
                   time_ms=get_number(obj, "time_ms"))

    def to_json(self) -> dict[str, Any]:
        return {"f": "extend", "topic": self.topic, "queues_before": self.queues_before, "queues": self.queues,
                "time_ms": self.time_ms}
