"""The client's results: frozen data with enum statuses, nothing of Ray or of the broker's internals."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Mapping, NamedTuple, Protocol, Sequence

__all__ = ["SendStatus", "SendResult", "ReceivedMessage", "QueueRoute", "TopicRoute", "QueueProgress", "TopicQueue",
           "RebalanceListener", "OffsetChange", "RetryStats"]


class TopicQueue(NamedTuple):
    """One queue of a topic: the key of assignments, positions and commits (Kafka's
    ``TopicPartition``, RocketMQ's ``MessageQueue`` without the broker). Immutable and hashable;
    ``topic, queue_id = tq`` unpacks it."""

    topic: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic}/{self.queue_id}"


class RebalanceListener(Protocol):
    """What a consumer calls when its queues change (Kafka's ``ConsumerRebalanceListener``). Both run
    inside ``Consumer.poll``, on the thread that called it, so they may call the consumer
    (``commit``, ``seek``, ``pause``)."""

    def on_revoked(self, queues: Sequence[TopicQueue]) -> None:
        """These queues are about to leave this member: commit what was handled of them now (a
        commit after this call is still accepted, but another member may already read them)."""

    def on_assigned(self, queues: Sequence[TopicQueue]) -> None:
        """These queues are now this member's; reading starts at the group's committed offset
        unless the listener seeks them."""


class SendStatus(enum.Enum):
    """RocketMQ's send statuses. ``Producer.send`` returns only ``SEND_OK`` (acknowledged: every
    in-sync replica has the message); the others travel inside :class:`~rocketray.client.SendUnknown`
    so that a message not known to be safe is never mistaken for a sent one."""

    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"   # written on the master, the replicas did not ack in time
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


@dataclass(frozen=True, slots=True)
class SendResult:
    """An acknowledged send: where the message is (``queue_id``, ``queue_offset``) and its id."""

    status: SendStatus
    msg_id: str
    topic: str
    queue_id: int
    queue_offset: int


_new_object = object.__new__
_set_status, _set_msg_id, _set_topic, _set_queue_id, _set_queue_offset = (
    SendResult.__dict__[name].__set__ for name in ("status", "msg_id", "topic", "queue_id", "queue_offset"))


def send_ok(msg_id: str, topic: str, queue_id: int, queue_offset: int) -> SendResult:
    """``SendResult(SendStatus.SEND_OK, msg_id, topic, queue_id, queue_offset)``, equal to it in
    every way, made in about half the time: the producer makes one per acknowledged message, and a
    frozen dataclass's ``__init__`` goes through ``object.__setattr__`` per field; this sets the
    slots directly."""
    result = _new_object(SendResult)
    _set_status(result, SendStatus.SEND_OK)
    _set_msg_id(result, msg_id)
    _set_topic(result, topic)
    _set_queue_id(result, queue_id)
    _set_queue_offset(result, queue_offset)
    return result


@dataclass(frozen=True, slots=True)
class ReceivedMessage:
    """One consumed message. ``queue_offset`` is its position in its queue (consecutive per queue).

    ``delivery_count``: how many times the message was delivered to this consumer group, this time
    included (1 the first time; a copy ``Consumer.nack`` put in the group's retry topic counts on).
    A copy (read from ``%RETRY%<group>`` or ``%DLQ%<group>``) names where the message was first
    sent: ``origin_topic``, ``origin_queue_id``, ``origin_queue_offset``, ``origin_msg_id`` (None
    otherwise), and a retry copy the time it was due (``not_before_ms``, ms since the epoch).
    ``deliver_at_ms``: a delayed message's delivery time (ms since the epoch; 0 for one sent
    without a delay); its ``store_timestamp_ms`` is when it was put into its queue, at or after that.
    ``topic``, ``queue_id`` and ``queue_offset`` are always where this copy was read (what commit
    counts)."""

    topic: str
    queue_id: int
    queue_offset: int
    msg_id: str
    key: str | None
    tags: str | None
    properties: Mapping[str, str]
    body: bytes
    born_timestamp_ms: int
    store_timestamp_ms: int = 0
    delivery_count: int = 1
    origin_topic: str | None = None
    origin_queue_id: int | None = None
    origin_queue_offset: int | None = None
    origin_msg_id: str | None = None
    not_before_ms: int = 0
    deliver_at_ms: int = 0

    @property
    def queue(self) -> TopicQueue:
        return TopicQueue(self.topic, self.queue_id)


@dataclass(frozen=True, slots=True)
class QueueRoute:
    queue_id: int
    broker_group: str


@dataclass(frozen=True, slots=True)
class TopicRoute:
    """A topic's queues and the broker group that stores each."""

    topic: str
    queues: tuple[QueueRoute, ...] = field(default_factory=tuple)

    def group_of(self, queue_id: int) -> str:
        return self.queues[queue_id].broker_group


@dataclass(frozen=True, slots=True)
class QueueProgress:
    """A consumer group's position in one queue: ``lag = max_offset - committed_offset``."""

    topic: str
    queue_id: int
    broker_group: str
    committed_offset: int
    max_offset: int

    @property
    def lag(self) -> int:
        return max(0, self.max_offset - self.committed_offset)

    @property
    def queue(self) -> TopicQueue:
        return TopicQueue(self.topic, self.queue_id)


@dataclass(frozen=True, slots=True)
class RetryStats:
    """A consumer group's retry and dead-letter topics (``Admin.retry_stats``): copies stored in
    each, and how many of the retry topic's the group has not consumed (committed past) yet. A topic
    not created yet (nothing nacked, nothing dead-lettered) counts 0 and is not ``*_exists``."""

    group: str
    retry_topic: str
    retry_exists: bool
    retried: int
    retry_pending: int
    dlq_topic: str
    dlq_exists: bool
    dead_letters: int


@dataclass(frozen=True, slots=True)
class OffsetChange:
    """One queue of an offset reset (``Admin.reset_offsets``): the group's committed offset before
    and after (None: never committed); ``after`` is the target, lower or higher than ``before``."""

    queue: TopicQueue
    before: int | None
    after: int | None

    @property
    def moved(self) -> bool:
        return self.after != self.before
