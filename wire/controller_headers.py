"""Response headers of the controller API: one frozen dataclass per request kind, and their codec.

A ``Response`` (``rocketray.wire.controller_api``) carries a code, one of these headers, an optional body
and a remark. The header classes follow RocketMQ's (reference 6.1): ``ElectMasterResponseHeader``,
``GetReplicaInfoResponseHeader``, ``RegisterBrokerToControllerResponseHeader`` and so on, with
snake_case fields; topics, consumer groups, users and ACL rules, the controller's config and the
NOT_LEADER hint are rocketray's own. An answer with nothing in its header carries ``NO_HEADER``.

Which header an answer carries depends on the request and, for some, on the code:

==========================  ==============================================================
request                     header
==========================  ==============================================================
GetNextBrokerId             ``GetNextBrokerIdResponseHeader``
ApplyBrokerId               ``ApplyBrokerIdResponseHeader`` (also on 2014)
RegisterBroker              ``RegisterBrokerToControllerResponseHeader`` (master fields None
                            unless the master is alive); ``NO_HEADER`` on errors
ElectMaster                 ``ElectMasterResponseHeader`` (also on 2004, 2011, 2012)
ElectMasters                ``ElectMastersResponseHeader``; the per-group answers are rows of
                            the body (``rocketray.controller.decide.election_answers``)
AlterSyncStateSet           ``AlterSyncStateSetResponseHeader`` on success
GetReplicaInfo              ``GetReplicaInfoResponseHeader``
CreateTopic                 ``CreateTopicResponseHeader``
GetTopicRoute               ``TopicRouteResponseHeader``
DeleteTopic                 ``DeleteTopicResponseHeader``
ListTopics                  ``ListTopicsResponseHeader``
ConsumerHeartbeat           ``ConsumerHeartbeatResponseHeader``
Create/Update/DeleteUser    ``UserResponseHeader``
ListUsers                   ``ListUsersResponseHeader``
Create/Update/Delete/Get    ``AclRulesResponseHeader`` (the user's rules after the request; every
Acl, ListAcls               matching rule for ListAcls)
GetAuthTable                ``AuthTableResponseHeader`` (the table itself is in the body)
config get / update         ``ControllerConfigResponseHeader``
any, code 2007              ``NotLeaderResponseHeader`` (the leader this node knows of)
==========================  ==============================================================

Across Ray a header travels as the dataclass itself. Where a map must carry it (the chaos runner's
msgpack wire, the admin CLI's JSON), ``header_fields`` gives its fields as plain values (sets and
tuples as lists, topic counts as a map) and ``header_from_fields`` rebuilds it, strictly: an unknown
header name, a missing or extra field or a value of the wrong type raises ``HeaderCodecError``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping, Union

from rocketray.wire.controller_codes import ResponseCode

__all__ = [
    "AclRulesResponseHeader", "AlterSyncStateSetResponseHeader", "ApplyBrokerIdResponseHeader",
    "AuthTableResponseHeader", "ConsumerHeartbeatResponseHeader", "ListUsersResponseHeader", "UserResponseHeader",
    "CreateTopicResponseHeader",
    "ControllerConfigResponseHeader", "DeleteTopicResponseHeader", "ElectMasterResponseHeader",
    "ElectMastersResponseHeader", "GetNextBrokerIdResponseHeader", "GetReplicaInfoResponseHeader",
    "HEADER_TYPES", "HeaderCodecError", "ListTopicsResponseHeader", "MasterHeader", "NO_HEADER", "NoHeader",
    "NotLeaderResponseHeader", "RegisterBrokerToControllerResponseHeader", "ResponseHeader",
    "TopicRouteResponseHeader", "header_fields", "header_from_fields",
]


class HeaderCodecError(ValueError):
    """A map that is not a valid response header; nothing is built from it."""

    code = ResponseCode.SYSTEM_ERROR
    retriable = False


@dataclass(frozen=True, slots=True)
class NoHeader:
    """An answer with nothing in its header (heartbeats, cleaning broker data, most refusals)."""


NO_HEADER = NoHeader()


@dataclass(frozen=True, slots=True)
class GetNextBrokerIdResponseHeader:
    cluster_name: str
    broker_name: str
    next_broker_id: int


@dataclass(frozen=True, slots=True)
class ApplyBrokerIdResponseHeader:
    cluster_name: str
    broker_name: str


@dataclass(frozen=True, slots=True)
class RegisterBrokerToControllerResponseHeader:
    """The group's master as the controller knows it, only if that master is alive (else None)."""

    cluster_name: str
    broker_name: str
    master_broker_id: int | None = None
    master_address: str | None = None
    master_epoch: int | None = None
    sync_state_set_epoch: int | None = None


@dataclass(frozen=True, slots=True)
class ElectMasterResponseHeader:
    """The elected (or still sitting) master; all None when nobody was elected, except
    ``master_epoch`` when a controller-triggered election demoted a dead master (2004)."""

    master_broker_id: int | None = None
    master_address: str | None = None
    master_epoch: int | None = None
    sync_state_set_epoch: int | None = None


@dataclass(frozen=True, slots=True)
class ElectMastersResponseHeader:
    """How many groups the batch decided (one body row each)."""

    elections: int


@dataclass(frozen=True, slots=True)
class AlterSyncStateSetResponseHeader:
    new_sync_state_set_epoch: int


@dataclass(frozen=True, slots=True)
class GetReplicaInfoResponseHeader:
    master_broker_id: int | None
    master_address: str | None
    master_epoch: int


@dataclass(frozen=True, slots=True)
class TopicRouteResponseHeader:
    """A topic's queues as ``(queue_id, broker_name)`` in queue order."""

    topic: str
    queues: tuple[tuple[int, str], ...]


@dataclass(frozen=True, slots=True)
class CreateTopicResponseHeader:
    """The topic's route after the request; ``created`` says whether it changed anything."""

    topic: str
    queues: tuple[tuple[int, str], ...]
    created: bool


@dataclass(frozen=True, slots=True)
class DeleteTopicResponseHeader:
    topic: str


@dataclass(frozen=True, slots=True)
class ListTopicsResponseHeader:
    """Every topic and its queue count, as ``(topic, queues)`` sorted by name."""

    topics: tuple[tuple[str, int], ...]

    def counts(self) -> dict[str, int]:
        return dict(self.topics)


@dataclass(frozen=True, slots=True)
class ConsumerHeartbeatResponseHeader:
    """The group's live members (client ids, sorted)."""

    group: str
    members: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class UserResponseHeader:
    """A user after a create, update or delete; ``changed`` says whether anything was replicated."""

    name: str
    superuser: bool
    changed: bool


@dataclass(frozen=True, slots=True)
class ListUsersResponseHeader:
    """Every user as ``(name, superuser)`` sorted by name (never a key)."""

    users: tuple[tuple[str, bool], ...]


@dataclass(frozen=True, slots=True)
class AclRulesResponseHeader:
    """ACL rules as ``(user, resource, actions, decision)`` rows (``rocketray.acl`` texts), sorted by
    user then resource."""

    rules: tuple[tuple[str, str, tuple[str, ...], str], ...]


@dataclass(frozen=True, slots=True)
class AuthTableResponseHeader:
    """The users and ACL table's version on the node that answered; ``changed``: it is above the
    version asked about, and the table is in the body."""

    version: int
    changed: bool


@dataclass(frozen=True, slots=True)
class ControllerConfigResponseHeader:
    """Which controller answered a config get or update (its Raft address)."""

    address: str


@dataclass(frozen=True, slots=True)
class NotLeaderResponseHeader:
    """CONTROLLER_NOT_LEADER: the Raft leader this node knows of (None: none known) and its id."""

    leader_address: str | None = None
    leader_id: str | None = None


ResponseHeader = Union[
    NoHeader, GetNextBrokerIdResponseHeader, ApplyBrokerIdResponseHeader, RegisterBrokerToControllerResponseHeader,
    ElectMasterResponseHeader, ElectMastersResponseHeader, AlterSyncStateSetResponseHeader,
    GetReplicaInfoResponseHeader, TopicRouteResponseHeader, CreateTopicResponseHeader, DeleteTopicResponseHeader,
    ListTopicsResponseHeader,
    ConsumerHeartbeatResponseHeader, ControllerConfigResponseHeader, NotLeaderResponseHeader,
    UserResponseHeader, ListUsersResponseHeader, AclRulesResponseHeader, AuthTableResponseHeader,
]
#: The headers that name a group's master (what ``MasterInfo.from_response`` reads).
MasterHeader = Union[RegisterBrokerToControllerResponseHeader, ElectMasterResponseHeader,
                     GetReplicaInfoResponseHeader]

# header class -> field kinds. s=str, S=str or None, i=int64, I=int64 or None, b=bool,
# Q=queues (list of [int64, str]), L=list of str, T=topic counts (map str -> int64),
# U=users (list of [str, bool]), A=ACL rows (list of [str, str, [str, ...], str]).
_KINDS: dict[type, dict[str, str]] = {
    NoHeader: {},
    GetNextBrokerIdResponseHeader: {"cluster_name": "s", "broker_name": "s", "next_broker_id": "i"},
    ApplyBrokerIdResponseHeader: {"cluster_name": "s", "broker_name": "s"},
    RegisterBrokerToControllerResponseHeader: {"cluster_name": "s", "broker_name": "s", "master_broker_id": "I",
                                               "master_address": "S", "master_epoch": "I",
                                               "sync_state_set_epoch": "I"},
    ElectMasterResponseHeader: {"master_broker_id": "I", "master_address": "S", "master_epoch": "I",
                                "sync_state_set_epoch": "I"},
    ElectMastersResponseHeader: {"elections": "i"},
    AlterSyncStateSetResponseHeader: {"new_sync_state_set_epoch": "i"},
    GetReplicaInfoResponseHeader: {"master_broker_id": "I", "master_address": "S", "master_epoch": "i"},
    TopicRouteResponseHeader: {"topic": "s", "queues": "Q"},
    CreateTopicResponseHeader: {"topic": "s", "queues": "Q", "created": "b"},
    DeleteTopicResponseHeader: {"topic": "s"},
    ListTopicsResponseHeader: {"topics": "T"},
    ConsumerHeartbeatResponseHeader: {"group": "s", "members": "L"},
    ControllerConfigResponseHeader: {"address": "s"},
    NotLeaderResponseHeader: {"leader_address": "S", "leader_id": "S"},
    UserResponseHeader: {"name": "s", "superuser": "b", "changed": "b"},
    ListUsersResponseHeader: {"users": "U"},
    AclRulesResponseHeader: {"rules": "A"},
    AuthTableResponseHeader: {"version": "i", "changed": "b"},
}
HEADER_TYPES: tuple[type, ...] = tuple(_KINDS)
_BY_NAME: dict[str, type] = {cls.__name__: cls for cls in _KINDS}
assert all(tuple(_KINDS[cls]) == tuple(f.name for f in fields(cls)) for cls in _KINDS), "codec table out of date"
_INT64_MIN, _INT64_MAX = -(2 ** 63), 2 ** 63 - 1


def header_fields(header: ResponseHeader) -> dict[str, Any]:
    """The header's fields as plain values (msgpack- and JSON-safe), keyed by field name."""
    kinds = _KINDS.get(type(header))
    if kinds is None:
        raise HeaderCodecError(f"not a response header: {type(header).__name__}")
    out: dict[str, Any] = {}
    for name, kind in kinds.items():
        value = getattr(header, name)
        if kind == "Q":
            value = [[queue_id, group] for queue_id, group in value]
        elif kind == "L":
            value = list(value)
        elif kind == "T":
            value = dict(value)
        elif kind == "U":
            value = [[user, superuser] for user, superuser in value]
        elif kind == "A":
            value = [[user, resource, list(actions), decision] for user, resource, actions, decision in value]
        out[name] = value
    return out


def _is_int64(value: Any) -> bool:
    return type(value) is int and _INT64_MIN <= value <= _INT64_MAX


def _field(name: str, kind: str, value: Any) -> Any:
    if kind == "s" and type(value) is str:
        return value
    if kind == "S" and (value is None or type(value) is str):
        return value
    if kind == "i" and _is_int64(value):
        return value
    if kind == "I" and (value is None or _is_int64(value)):
        return value
    if kind == "b" and type(value) is bool:
        return value
    if kind == "Q" and type(value) in (list, tuple) and all(
            type(q) in (list, tuple) and len(q) == 2 and _is_int64(q[0]) and type(q[1]) is str for q in value):
        return tuple((q[0], q[1]) for q in value)
    if kind == "L" and type(value) in (list, tuple) and all(type(v) is str for v in value):
        return tuple(value)
    if kind == "T" and isinstance(value, Mapping) and all(
            type(k) is str and _is_int64(v) for k, v in value.items()):
        return tuple(sorted(value.items()))
    if kind == "U" and _rows(value, 2) and all(type(u[0]) is str and type(u[1]) is bool for u in value):
        return tuple((u[0], u[1]) for u in value)
    if kind == "A" and _rows(value, 4) and all(
            type(r[0]) is str and type(r[1]) is str and type(r[3]) is str and type(r[2]) in (list, tuple)
            and all(type(a) is str for a in r[2]) for r in value):
        return tuple((r[0], r[1], tuple(r[2]), r[3]) for r in value)
    raise HeaderCodecError(f"header field {name!r} does not accept {value!r:.80}")


def _rows(value: Any, width: int) -> bool:
    return type(value) in (list, tuple) and all(type(row) in (list, tuple) and len(row) == width for row in value)


def header_from_fields(kind: object, values: object) -> ResponseHeader:
    """The header named ``kind`` (its class name) from ``header_fields``' map; ``HeaderCodecError``
    on an unknown name, a missing or extra field or a value of the wrong type."""
    cls = _BY_NAME.get(kind) if type(kind) is str else None
    if cls is None:
        raise HeaderCodecError(f"unknown response header {kind!r:.80}")
    if not isinstance(values, Mapping):
        raise HeaderCodecError(f"{kind} fields must be a map, got {type(values).__name__}")
    kinds = _KINDS[cls]
    if set(values) != set(kinds):
        raise HeaderCodecError(f"{kind} needs fields {sorted(kinds)}, got {sorted(map(str, values))}")
    header: ResponseHeader = cls(**{name: _field(name, k, values[name]) for name, k in kinds.items()})
    return header
