"""Controller events (reference section 3.4) and their one versioned msgpack codec.

The leader decides, producing events; only events travel through Raft and only events change
state (``ControllerState.apply``). Each event is a frozen dataclass with a fixed type id (the
RocketMQ short type ids 1..6; rocketray's topic events 7 and 8, its user and ACL events 9..11). On
the wire:

- one event:   msgpack ``[CODEC_VERSION, type_id, field, field, ...]``
- a batch:     msgpack ``[CODEC_VERSION, [[type_id, field, ...], ...]]``

Fields are encoded positionally in dataclass order; sets travel as sorted lists of ints, tuples of
strings as lists in their order, a SCRAM credential as ``[salt, iterations, stored_key,
server_key]`` (msgpack bin for the bytes) and ACL rules as ``[[resource text, [action, ...],
decision], ...]`` (``rocketray.acl``'s texts). No user event carries a secret: a user's record is
what ``rocketray.scram`` derives from it, and the admin tool derives it before it asks. The
decoder trusts nothing: any input that is not exactly a well-typed frame of a known version and
type raises ``EventCodecError`` (a ``ValueError``) and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

import msgpack

from rocketray.acl import AclParseError, AclRule, parse_actions, parse_decision, parse_resource
from rocketray.scram import ScramCredential

CODEC_VERSION = 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
MAX_BATCH_EVENTS = 1 << 16


class EventCodecError(ValueError):
    """Bytes that are not a valid encoded event or batch."""


@dataclass(frozen=True, slots=True)
class AlterSyncStateSetEvent:
    broker_name: str
    new_sync_state_set: frozenset[int]


@dataclass(frozen=True, slots=True)
class ApplyBrokerIdEvent:
    cluster_name: str
    broker_name: str
    broker_address: str
    register_check_code: str
    new_broker_id: int


@dataclass(frozen=True, slots=True)
class ElectMasterEvent:
    new_master_elected: bool
    broker_name: str
    new_master_broker_id: int | None = None


@dataclass(frozen=True, slots=True)
class ReadEvent:
    """Never produced by the core; kept so the type id space matches the reference (no-op)."""


@dataclass(frozen=True, slots=True)
class CleanBrokerDataEvent:
    broker_name: str
    broker_id_set_to_clean: frozenset[int] | None = None


@dataclass(frozen=True, slots=True)
class UpdateBrokerAddressEvent:
    cluster_name: str
    broker_name: str
    broker_address: str
    broker_id: int


@dataclass(frozen=True, slots=True)
class CreateTopicEvent:
    """Set ``topic``'s whole queue assignment: queue ``i`` lives in broker group ``broker_names[i]``.
    Used both to create a topic and to extend it (the list then starts with the old one)."""

    topic: str
    broker_names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DeleteTopicEvent:
    topic: str


@dataclass(frozen=True, slots=True)
class PutUserEvent:
    """Create ``name`` or replace its record and superuser flag (``rocketray.controller.auth_table``)."""

    name: str
    credential: ScramCredential
    superuser: bool


@dataclass(frozen=True, slots=True)
class DeleteUserEvent:
    """Forget ``name`` and its ACL rules."""

    name: str


@dataclass(frozen=True, slots=True)
class SetAclEvent:
    """Set ``user``'s whole rule list (empty: no rules). Ignored if the user does not exist."""

    user: str
    rules: tuple[AclRule, ...]


Event = Union[AlterSyncStateSetEvent, ApplyBrokerIdEvent, ElectMasterEvent, ReadEvent,
              CleanBrokerDataEvent, UpdateBrokerAddressEvent, CreateTopicEvent, DeleteTopicEvent,
              PutUserEvent, DeleteUserEvent, SetAclEvent]
#: The events that change the users and ACL table (``AuthTable``), not a group's rows.
AUTH_EVENTS = (PutUserEvent, DeleteUserEvent, SetAclEvent)

# type id -> (class, field kinds). Kinds: s=str, i=int64, b=bool, I=int64 or None,
# S=set of int64, N=set of int64 or None, T=tuple of str (order kept), C=SCRAM credential,
# R=tuple of ACL rules.
_SCHEMA: dict[int, tuple[type, str]] = {
    1: (AlterSyncStateSetEvent, "sS"),
    2: (ApplyBrokerIdEvent, "ssssi"),
    3: (ElectMasterEvent, "bsI"),
    4: (ReadEvent, ""),
    5: (CleanBrokerDataEvent, "sN"),
    6: (UpdateBrokerAddressEvent, "sssi"),
    7: (CreateTopicEvent, "sT"),
    8: (DeleteTopicEvent, "s"),
    9: (PutUserEvent, "sCb"),
    10: (DeleteUserEvent, "s"),
    11: (SetAclEvent, "sR"),
}
_TYPE_ID: dict[type, int] = {cls: tid for tid, (cls, _) in _SCHEMA.items()}


def broker_name_of(event: Event) -> str | None:
    """The broker group an event is about, or None (``ReadEvent``, the topic and the auth events)."""
    if isinstance(event, (ReadEvent, CreateTopicEvent, DeleteTopicEvent, *AUTH_EVENTS)):
        return None
    return event.broker_name


def _to_wire(value: Any, kind: str) -> Any:
    if kind in "SN":
        return None if value is None else sorted(value)
    if kind == "T":
        return list(value)
    if kind == "C":
        return encode_credential(value)
    if kind == "R":
        return encode_rules(value)
    return value


def encode_credential(credential: ScramCredential) -> list[Any]:
    """``[salt, iterations, stored_key, server_key]``."""
    return [credential.salt, credential.iterations, credential.stored_key, credential.server_key]


def encode_rules(rules: tuple[AclRule, ...]) -> list[Any]:
    """``[[resource text, [action, ...], decision], ...]`` in the given order."""
    return [[str(r.resource), sorted(a.value for a in r.actions), r.decision.value] for r in rules]


def _event_to_list(event: Event) -> list[Any]:
    tid = _TYPE_ID.get(type(event))
    if tid is None:
        raise TypeError(f"not a controller event: {event!r}")
    cls, kinds = _SCHEMA[tid]
    values = [getattr(event, name) for name in cls.__dataclass_fields__]  # type: ignore[attr-defined]
    return [tid] + [_to_wire(v, k) for v, k in zip(values, kinds)]


def encode_event(event: Event) -> bytes:
    """Encode one event as ``[version, type_id, *fields]``."""
    return msgpack.packb([CODEC_VERSION] + _event_to_list(event), use_bin_type=True)


def encode_events(events: list[Event]) -> bytes:
    """Encode a batch of events as ``[version, [[type_id, *fields], ...]]``."""
    return msgpack.packb([CODEC_VERSION, [_event_to_list(e) for e in events]], use_bin_type=True)


def _is_int64(value: Any) -> bool:
    return type(value) is int and _INT64_MIN <= value <= _INT64_MAX


def _int_set(value: Any) -> frozenset[int]:
    if type(value) is not list or not all(_is_int64(v) for v in value):
        raise EventCodecError(f"expected a list of int64, got {value!r:.80}")
    return frozenset(value)


def _str_tuple(value: Any) -> tuple[str, ...]:
    if type(value) is not list or not all(type(v) is str for v in value):
        raise EventCodecError(f"expected a list of str, got {value!r:.80}")
    return tuple(value)


def decode_credential(value: Any) -> ScramCredential:
    """Inverse of ``encode_credential``; ``EventCodecError`` unless well-typed and within bounds."""
    if type(value) is not list or len(value) != 4:
        raise EventCodecError(f"expected [salt, iterations, stored_key, server_key], got {value!r:.80}")
    credential = ScramCredential(*value)
    problem = credential.problem()
    if problem is not None:
        raise EventCodecError(f"invalid SCRAM credential: {problem}")
    return credential


def decode_rules(value: Any) -> tuple[AclRule, ...]:
    """Inverse of ``encode_rules``; ``EventCodecError`` unless every rule is valid."""
    if type(value) is not list:
        raise EventCodecError(f"expected a list of ACL rules, got {value!r:.80}")
    rules = []
    for item in value:
        if type(item) is not list or len(item) != 3 or type(item[0]) is not str or type(item[1]) is not list \
                or type(item[2]) is not str:
            raise EventCodecError(f"expected [resource, [actions], decision], got {item!r:.80}")
        try:
            rule = AclRule(parse_resource(item[0]), parse_actions(item[1]), parse_decision(item[2]))
        except AclParseError as exc:
            raise EventCodecError(f"invalid ACL rule: {exc}") from exc
        problem = rule.problem()
        if problem is not None:
            raise EventCodecError(f"invalid ACL rule: {problem}")
        rules.append(rule)
    return tuple(rules)


def _from_wire(value: Any, kind: str) -> Any:
    if kind == "s" and type(value) is str:
        return value
    if kind == "i" and _is_int64(value):
        return value
    if kind == "b" and type(value) is bool:
        return value
    if kind == "I" and (value is None or _is_int64(value)):
        return value
    if kind == "S":
        return _int_set(value)
    if kind == "N":
        return None if value is None else _int_set(value)
    if kind == "T":
        return _str_tuple(value)
    if kind == "C":
        return decode_credential(value)
    if kind == "R":
        return decode_rules(value)
    raise EventCodecError(f"field kind {kind!r} does not accept {value!r:.80}")


def _event_from_list(item: Any) -> Event:
    if type(item) is not list or not item or not _is_int64(item[0]):
        raise EventCodecError(f"expected [type_id, *fields], got {item!r:.80}")
    schema = _SCHEMA.get(item[0])
    if schema is None:
        raise EventCodecError(f"unknown event type id {item[0]}")
    cls, kinds = schema
    if len(item) != 1 + len(kinds):
        raise EventCodecError(f"event type {item[0]} needs {len(kinds)} fields, got {len(item) - 1}")
    event: Event = cls(*(_from_wire(v, k) for v, k in zip(item[1:], kinds)))
    return event


def _unpack(data: bytes) -> list[Any]:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise EventCodecError(f"expected bytes, got {type(data).__name__}")
    try:
        frame = msgpack.unpackb(bytes(data), raw=False, use_list=True, strict_map_key=True)
    except (ValueError, TypeError, OverflowError, RecursionError, msgpack.UnpackException) as exc:
        raise EventCodecError(f"not a msgpack frame: {exc}") from exc
    if type(frame) is not list or len(frame) < 2:
        raise EventCodecError(f"expected [version, ...], got {frame!r:.80}")
    if frame[0] != CODEC_VERSION or type(frame[0]) is not int:
        raise EventCodecError(f"unsupported codec version {frame[0]!r:.40}")
    return frame


def decode_event(data: bytes) -> Event:
    """Decode one event encoded by ``encode_event``; raises ``EventCodecError`` on anything else."""
    frame = _unpack(data)
    return _event_from_list(frame[1:])


def decode_events(data: bytes) -> list[Event]:
    """Decode a batch encoded by ``encode_events``; raises ``EventCodecError`` on anything else."""
    frame = _unpack(data)
    if len(frame) != 2 or type(frame[1]) is not list:
        raise EventCodecError("expected [version, [events...]]")
    if len(frame[1]) > MAX_BATCH_EVENTS:
        raise EventCodecError(f"batch of {len(frame[1])} events exceeds {MAX_BATCH_EVENTS}")
    return [_event_from_list(item) for item in frame[1]]
