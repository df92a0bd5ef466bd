"""Consumer-group rows of ``history.jsonl``: deliveries, commits, progress samples, consumer lifecycle.

Theory of operation. The broker chaos run's consumer-group workload (``chaos/group_workload.py``)
appends these rows to the same ``history.jsonl`` as the sends and replica reads, told apart by
``f``. Each kind is a frozen dataclass with a strict ``from_json`` (the same field validators as
every other run-directory record, ``rocketray.verify.fields``) and a ``to_json`` that gives back
exactly the contract's keys:

- ``deliver``: one message ``Consumer.poll`` returned: ``process``, ``consumer_group``, ``topic``,
  ``queue_id``, ``queue_offset``, ``payload_id`` (the ``pid`` property; ``corrupt:<pid>`` if the body
  did not match it), ``msg_id``, ``poll_start_ms`` (when the poll that returned it began),
  ``time_ms`` (when it returned), ``poll`` (that poll's number in its process, from 1; null in runs
  recorded before it existed), ``tags`` (the message's tag, null if untagged), ``delivery_count``
  (1 the first time), ``origin_topic``, ``origin_queue_id``, ``origin_queue_offset``,
  ``origin_msg_id`` (a retry copy's first message, else null), ``deliver_at_ms`` (a delayed
  message's time, else 0); runs recorded before these keys existed read as an untagged first
  delivery.
- ``commit``: one queue entry of one ``Consumer.commit`` call: ``process``, ``consumer_group``,
  ``topic``, ``queue_id``, ``offset`` (the next offset to read), ``outcome`` (``ok``: acknowledged,
  i.e. every in-sync replica has it; ``failed``: not known to be), ``start_ms``, ``end_ms``.
- ``progress``: one queue of one progress sample of one broker group (every row of one sample shares
  ``consumer_group``, ``broker_group``, ``start_ms`` and ``end_ms``, which is how a reader regroups
  them): ``consumer_group``, ``broker_group`` (null in older runs, whose samples covered every
  broker group at once), ``topic``, ``queue_id``, ``committed``, ``max_offset``, ``start_ms``, ``end_ms``.
- ``sample``: one progress sample of one broker group was asked for: ``consumer_group``,
  ``broker_group``, ``outcome`` (``ok``: its ``progress`` rows are the whole answer, none if the
  group committed nothing there; ``failed``: the master did not answer), ``start_ms``, ``end_ms``.
- ``consumer``: ``process``, ``consumer_group``, ``event`` (``start``, ``crash``: abandoned without
  leaving the group, ``close``: left cleanly), ``time_ms``.
- ``assign``: the member's rebalance listener heard it: ``process``, ``consumer_group``, ``topic``,
  ``queue_id``, ``event`` (``assigned``, ``revoked``), ``poll`` (the number of the poll it happened
  in: a rebalance runs at a poll's start, before that poll reads), ``time_ms``.
- ``group``: the workload runs this consumer group (so a group whose members recorded nothing still
  gets a verdict): ``consumer_group``, ``topic``, ``members``, ``time_ms``, ``tags`` (the group's
  subscription expression, ``*`` or tags joined by ``||``; null or absent in older runs, whose
  payloads are untagged),
  ``max_deliveries`` (its members' setting; null if the workload does not nack).
- ``nack``, ``seek``, ``delayed``, ``extend``: ``rocketray.verify.group_actions``.
- ``drain``: the end of the run's drain for this group: ``consumer_group``, ``outcome`` (``ok``:
  every queue that acknowledged a send was committed to its end; ``failed``: the deadline came
  first), ``lag`` (what was left, null if unknown), ``time_ms``.

No clock, no Ray: decoded objects in, records out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Union

from rocketray.verify.group_actions import DelayedSend, NackRecord, SeekRecord, TopicExtended
from rocketray.verify.outcome import Outcome
from rocketray.verify.fields import FieldError, Ident, Number, get_ident, get_int, get_number, get_str

__all__ = ["GROUP_FUNCTIONS", "CONSUMER_EVENTS", "ASSIGN_EVENTS", "COMMIT_OUTCOMES", "Delivery", "CommitRecord",
           "ProgressRow", "SampleRecord", "ConsumerEvent", "Assignment", "GroupDeclared", "DrainRecord", "GroupRecord",
           "GroupHistory", "parse_group_row"]

GROUP_FUNCTIONS = ("deliver", "commit", "progress", "sample", "consumer", "assign", "group", "drain", "nack", "seek",
                   "delayed", "extend")
CONSUMER_EVENTS = ("start", "crash", "close")
ASSIGN_EVENTS = ("assigned", "revoked")
COMMIT_OUTCOMES = (Outcome.OK.value, Outcome.FAILED.value)  # a commit (a sample, a drain) is never left unknown


def _span(obj: dict[str, Any], start_key: str, end_key: str) -> tuple[Number, Number]:
    start, end = get_number(obj, start_key), get_number(obj, end_key)
    if end < start:
        raise FieldError(f"{end_key} {end} is before {start_key} {start}")
    return start, end


class _Outcomed:
    """A row with an ``outcome``: a bad spelling raises ValueError at construction; ``ok`` says OK."""

    __slots__ = ()
    outcome: Outcome

    def __post_init__(self) -> None:
        object.__setattr__(self, "outcome", Outcome(self.outcome))

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message a consumer's poll returned."""

    process: Ident
    consumer_group: str
    topic: str
    queue_id: int
    queue_offset: int
    payload_id: Ident | None
    msg_id: str
    poll_start_ms: Number
    time_ms: Number
    poll: int | None = None
    tags: str | None = None
    delivery_count: int = 1
    origin_topic: str | None = None
    origin_queue_id: int | None = None
    origin_queue_offset: int | None = None
    origin_msg_id: str | None = None
    deliver_at_ms: Number = 0

    @property
    def is_copy(self) -> bool:
        """A retry copy (or a dead letter) of a message first sent elsewhere."""
        return self.origin_topic is not None

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "Delivery":
        poll_start_ms, time_ms = _span(obj, "poll_start_ms", "time_ms")
        count = get_int(obj, "delivery_count", nullable=True, minimum=1, absent_is_null=True)
        return cls(process=get_ident(obj, "process"),  # type: ignore[arg-type]
                   consumer_group=get_str(obj, "consumer_group"),  # type: ignore[arg-type]
                   topic=get_str(obj, "topic"),  # type: ignore[arg-type]
                   queue_id=get_int(obj, "queue_id", minimum=0),  # type: ignore[arg-type]
                   queue_offset=get_int(obj, "queue_offset", minimum=0),  # type: ignore[arg-type]
                   payload_id=get_ident(obj, "payload_id", nullable=True),
                   msg_id=get_str(obj, "msg_id"),  # type: ignore[arg-type]
                   poll_start_ms=poll_start_ms, time_ms=time_ms,
                   poll=get_int(obj, "poll", nullable=True, minimum=1, absent_is_null=True),
                   tags=get_str(obj, "tags", nullable=True, absent_is_null=True),
                   delivery_count=1 if count is None else count,
                   origin_topic=get_str(obj, "origin_topic", nullable=True, absent_is_null=True),
                   origin_queue_id=get_int(obj, "origin_queue_id", nullable=True, minimum=0, absent_is_null=True),
                   origin_queue_offset=get_int(obj, "origin_queue_offset", nullable=True, minimum=0,
                                               absent_is_null=True),
                   origin_msg_id=get_str(obj, "origin_msg_id", nullable=True, absent_is_null=True),
                   deliver_at_ms=get_number(obj, "deliver_at_ms") if "deliver_at_ms" in obj else 0)

    def to_json(self) -> dict[str, Any]:
        return {"f": "deliver", "process": self.process, "consumer_group": self.consumer_group, "topic": self.topic,
                "queue_id": self.queue_id, "queue_offset": self.queue_offset, "payload_id": self.payload_id,
                "msg_id": self.msg_id, "poll_start_ms": self.poll_start_ms, "time_ms": self.time_ms, "poll": self.poll,
                "tags": self.tags, "delivery_count": self.delivery_count, "origin_topic": self.origin_topic,
                "origin_queue_id": self.origin_queue_id, "origin_queue_offset": self.origin_queue_offset,
                "origin_msg_id": self.origin_msg_id, "deliver_at_ms": self.deliver_at_ms}


@dataclass(frozen=True, slots=True)
class CommitRecord(_Outcomed):
    """One queue entry of one commit call and whether it was acknowledged; ``reset``: an entry of
    an admin's offset reset of the stopped group (a reset record: it sets the offset, lower too)."""

    process: Ident
    consumer_group: str
    topic: str
    queue_id: int
    offset: int
    outcome: Outcome
    start_ms: Number
    end_ms: Number
    reset: bool = False

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "CommitRecord":
        start_ms, end_ms = _span(obj, "start_ms", "end_ms")
        return cls(process=get_ident(obj, "process"),  # type: ignore[arg-type]
                   consumer_group=get_str(obj, "consumer_group"),  # type: ignore[arg-type]
                   topic=get_str(obj, "topic"),  # type: ignore[arg-type]
                   queue_id=get_int(obj, "queue_id", minimum=0),  # type: ignore[arg-type]
                   offset=get_int(obj, "offset", minimum=0),  # type: ignore[arg-type]
                   outcome=Outcome(get_str(obj, "outcome", choices=COMMIT_OUTCOMES)),
                   start_ms=start_ms, end_ms=end_ms, reset=_get_flag(obj, "reset"))

    def to_json(self) -> dict[str, Any]:
        return {"f": "commit", "process": self.process, "consumer_group": self.consumer_group, "topic": self.topic,
                "queue_id": self.queue_id, "offset": self.offset, "outcome": self.outcome.value,
                "start_ms": self.start_ms, "end_ms": self.end_ms, **({"reset": True} if self.reset else {})}


def _get_flag(obj: dict[str, Any], key: str) -> bool:
    """An optional boolean field (absent: False)."""
    value = obj.get(key, False)
    if not isinstance(value, bool):
        raise FieldError(f"{key} must be true or false, not {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class ProgressRow:
    """One queue of one progress sample (of one broker group, or of all in older runs)."""

    consumer_group: str
    topic: str
    queue_id: int
    committed: int
    max_offset: int
    start_ms: Number
    end_ms: Number
    broker_group: str | None = None

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "ProgressRow":
        start_ms, end_ms = _span(obj, "start_ms", "end_ms")
        return cls(consumer_group=get_str(obj, "consumer_group"),  # type: ignore[arg-type]
                   topic=get_str(obj, "topic"),  # type: ignore[arg-type]
                   queue_id=get_int(obj, "queue_id", minimum=0),  # type: ignore[arg-type]
                   committed=get_int(obj, "committed", minimum=0),  # type: ignore[arg-type]
                   max_offset=get_int(obj, "max_offset", minimum=0),  # type: ignore[arg-type]
                   start_ms=start_ms, end_ms=end_ms,
                   broker_group=get_str(obj, "broker_group", nullable=True, absent_is_null=True))

    def to_json(self) -> dict[str, Any]:
        return {"f": "progress", "consumer_group": self.consumer_group, "broker_group": self.broker_group,
                "topic": self.topic, "queue_id": self.queue_id, "committed": self.committed,
                "max_offset": self.max_offset, "start_ms": self.start_ms, "end_ms": self.end_ms}


@dataclass(frozen=True, slots=True)
class SampleRecord(_Outcomed):
    """One progress sample of one broker group was asked for, and whether its master answered."""

    consumer_group: str
    broker_group: str
    outcome: Outcome
    start_ms: Number
    end_ms: Number

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "SampleRecord":
        start_ms, end_ms = _span(obj, "start_ms", "end_ms")
        return cls(consumer_group=get_str(obj, "consumer_group"),  # type: ignore[arg-type]
                   broker_group=get_str(obj, "broker_group"),  # type: ignore[arg-type]
                   outcome=Outcome(get_str(obj, "outcome", choices=COMMIT_OUTCOMES)),
                   start_ms=start_ms, end_ms=end_ms)

    def to_json(self) -> dict[str, Any]:
        return {"f": "sample", "consumer_group": self.consumer_group, "broker_group": self.broker_group,
                "outcome": self.outcome.value, "start_ms": self.start_ms, "end_ms": self.end_ms}


@dataclass(frozen=True, slots=True)
class ConsumerEvent:
    """A consumer started, crashed (abandoned without leaving) or closed (left the group)."""

    process: Ident
    consumer_group: str
    event: str
    time_ms: Number

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "ConsumerEvent":
        return cls(process=get_ident(obj, "process"),  # type: ignore[arg-type]
                   consumer_group=get_str(obj, "consumer_group"),  # type: ignore[arg-type]
                   event=get_str(obj, "event", choices=CONSUMER_EVENTS),  # type: ignore[arg-type]
                   time_ms=get_number(obj, "time_ms"))

    def to_json(self) -> dict[str, Any]:
        return {"f": "consumer", "process": self.process, "consumer_group": self.consumer_group,
                "event": self.event, "time_ms": self.time_ms}


@dataclass(frozen=True, slots=True)
class Assignment:
    """A member's rebalance listener heard a queue assigned or revoked, in poll number ``poll``."""

    process: Ident
    consumer_group: str
    topic: str
    queue_id: int
    event: str
    poll: int
    time_ms: Number

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "Assignment":
        return cls(process=get_ident(obj, "process"),  # type: ignore[arg-type]
                   consumer_group=get_str(obj, "consumer_group"),  # type: ignore[arg-type]
                   topic=get_str(obj, "topic"),  # type: ignore[arg-type]
                   queue_id=get_int(obj, "queue_id", minimum=0),  # type: ignore[arg-type]
                   event=get_str(obj, "event", choices=ASSIGN_EVENTS),  # type: ignore[arg-type]
                   poll=get_int(obj, "poll", minimum=0),  # type: ignore[arg-type]
                   time_ms=get_number(obj, "time_ms"))

    def to_json(self) -> dict[str, Any]:
        return {"f": "assign", "process": self.process, "consumer_group": self.consumer_group, "topic": self.topic,
                "queue_id": self.queue_id, "event": self.event, "poll": self.poll, "time_ms": self.time_ms}


@dataclass(frozen=True, slots=True)
class GroupDeclared:
    """The workload runs ``consumer_group`` (``members`` slots) on ``topic``."""

    consumer_group: str
    topic: str
    members: int
    time_ms: Number
    tags: str | None = None     #: None: an older run, whose payloads are untagged (every group reads ``*``)
    max_deliveries: int | None = None

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "GroupDeclared":
        return cls(consumer_group=get_str(obj, "consumer_group"),  # type: ignore[arg-type]
                   topic=get_str(obj, "topic"),  # type: ignore[arg-type]
                   members=get_int(obj, "members", minimum=1),  # type: ignore[arg-type]
                   time_ms=get_number(obj, "time_ms"),
                   tags=get_str(obj, "tags", nullable=True, absent_is_null=True),
                   max_deliveries=get_int(obj, "max_deliveries", nullable=True, minimum=1, absent_is_null=True))

    def to_json(self) -> dict[str, Any]:
        return {"f": "group", "consumer_group": self.consumer_group, "topic": self.topic, "members": self.members,
                "time_ms": self.time_ms, "tags": self.tags, "max_deliveries": self.max_deliveries}


@dataclass(frozen=True, slots=True)
class DrainRecord(_Outcomed):
    """How the end of the run's drain went for one group."""

    consumer_group: str
    outcome: Outcome
    lag: int | None
    time_ms: Number

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "DrainRecord":
        return cls(consumer_group=get_str(obj, "consumer_group"),  # type: ignore[arg-type]
                   outcome=Outcome(get_str(obj, "outcome", choices=COMMIT_OUTCOMES)),
                   lag=get_int(obj, "lag", nullable=True, minimum=0), time_ms=get_number(obj, "time_ms"))

    def to_json(self) -> dict[str, Any]:
        return {"f": "drain", "consumer_group": self.consumer_group, "outcome": self.outcome.value, "lag": self.lag,
                "time_ms": self.time_ms}


GroupRecord = Union[Delivery, CommitRecord, ProgressRow, SampleRecord, ConsumerEvent, Assignment, GroupDeclared,
                    DrainRecord, NackRecord, SeekRecord, DelayedSend, TopicExtended]
_PARSERS: dict[str, Callable[[dict[str, Any]], GroupRecord]] = {
    "deliver": Delivery.from_json, "commit": CommitRecord.from_json, "progress": ProgressRow.from_json,
    "sample": SampleRecord.from_json, "consumer": ConsumerEvent.from_json, "assign": Assignment.from_json,
    "group": GroupDeclared.from_json, "drain": DrainRecord.from_json, "nack": NackRecord.from_json,
    "seek": SeekRecord.from_json, "delayed": DelayedSend.from_json, "extend": TopicExtended.from_json}


def parse_group_row(obj: dict[str, Any]) -> GroupRecord:
    """The record of one consumer-group line (``f`` in :data:`GROUP_FUNCTIONS`); FieldError if malformed."""
    f = get_str(obj, "f", choices=GROUP_FUNCTIONS)
    assert f is not None
    return _PARSERS[f](obj)


@dataclass(frozen=True, slots=True)
class GroupHistory:
    """Every consumer-group row of a run, by kind, each in file order."""

    deliveries: tuple[Delivery, ...] = ()
    commits: tuple[CommitRecord, ...] = ()
    progress: tuple[ProgressRow, ...] = ()
    consumer_events: tuple[ConsumerEvent, ...] = ()
    samples: tuple[SampleRecord, ...] = ()
    assignments: tuple[Assignment, ...] = ()
    declared: tuple[GroupDeclared, ...] = ()
    drains: tuple[DrainRecord, ...] = ()
    nacks: tuple[NackRecord, ...] = ()
    seeks: tuple[SeekRecord, ...] = ()
    delayed: tuple[DelayedSend, ...] = ()      #: the run's, shared by every group
    extensions: tuple[TopicExtended, ...] = ()  #: the run's, shared by every group

    @classmethod
    def of(cls, records: list[GroupRecord]) -> "GroupHistory":
        return cls(deliveries=tuple(r for r in records if isinstance(r, Delivery)),
                   commits=tuple(r for r in records if isinstance(r, CommitRecord)),
                   progress=tuple(r for r in records if isinstance(r, ProgressRow)),
                   consumer_events=tuple(r for r in records if isinstance(r, ConsumerEvent)),
                   samples=tuple(r for r in records if isinstance(r, SampleRecord)),
                   assignments=tuple(r for r in records if isinstance(r, Assignment)),
                   declared=tuple(r for r in records if isinstance(r, GroupDeclared)),
                   drains=tuple(r for r in records if isinstance(r, DrainRecord)),
                   nacks=tuple(r for r in records if isinstance(r, NackRecord)),
                   seeks=tuple(r for r in records if isinstance(r, SeekRecord)),
                   delayed=tuple(r for r in records if isinstance(r, DelayedSend)),
                   extensions=tuple(r for r in records if isinstance(r, TopicExtended)))

    def records(self) -> Iterator[GroupRecord]:
        yield from self.declared
        yield from self.consumer_events
        yield from self.assignments
        yield from self.deliveries
        yield from self.commits
        yield from self.samples
        yield from self.progress
        yield from self.drains
        yield from self.nacks
        yield from self.seeks
        yield from self.delayed
        yield from self.extensions

    def consumer_groups(self) -> list[str]:
        """Every consumer group any row names (a declared one too), sorted."""
        return sorted({r.consumer_group for r in self.records() if not isinstance(r, (DelayedSend, TopicExtended))})

    def of_group(self, group: str) -> "GroupHistory":
        """The rows of one consumer group, with the run's delayed sends and extensions."""
        return GroupHistory.of([r for r in self.records()
                                if isinstance(r, (DelayedSend, TopicExtended)) or r.consumer_group == group])

    def __bool__(self) -> bool:
        return any(bool(rows) for rows in (self.deliveries, self.commits, self.progress, self.consumer_events,
                                           self.samples, self.assignments, self.declared, self.drains, self.nacks,
                                           self.seeks, self.delayed, self.extensions))
