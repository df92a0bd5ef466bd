"""The client port's control frames: what a client outside Ray needs besides puts and pulls (pure).

A client that is not a Ray driver reaches the cluster only through brokers' client ports, so a
broker answers three more requests (frame types in ``rocketray.wire.client_frames``):

``METADATA``  the cluster as a client sees it: its name, each broker group's replicas (replica index
              and client address) and current master (replica and master epoch, from what the
              controllers applied), and the ``client`` configuration section (the defaults the
              cluster's operator set for producers and consumers). Answer::

                  {"cluster": str, "client": {key: value},
                   "groups": [[group, master_replica | nil, epoch, [[replica, host, port], ...]], ...]}

``WATCH``     ``[group, known_epoch, wait_ms]``: answered ``[epoch, master_replica | nil]`` as soon as
              the controllers applied a master epoch above ``known_epoch``, else at ``wait_ms`` with
              the current one (a long poll: the client learns of an election at once).

``CONTROL``   ``[request type, {field: value}]``: one of the client's controller requests
              (``CLIENT_REQUESTS``: topics and consumer-group membership; no member request), which
              the broker checks against the user's ACL and sends to the controller leader. Answer:
              ``[code, header type, {field: value}, body | nil, remark]`` (``wire/controller_headers.py``).

Decoders raise ``WireError`` for anything malformed (the connection is then closed), never
anything else; a request type outside ``CLIENT_REQUESTS`` is malformed too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from rocketray.wire.client_frames import WireError, pack, unpack
from rocketray.wire.controller_api import (ConsumerHeartbeatRequest, CreateTopicRequest, DeleteTopicRequest,
                                           GetTopicRouteRequest, ListTopicsRequest, Response)
from rocketray.wire.controller_codes import ResponseCode
from rocketray.wire.controller_headers import HeaderCodecError, header_fields, header_from_fields

__all__ = ["CLIENT_REQUESTS", "GroupView", "Metadata", "decode_control", "decode_control_answer",
           "decode_metadata", "decode_watch", "decode_watch_answer", "encode_control", "encode_control_answer",
           "encode_metadata", "encode_watch", "encode_watch_answer"]

#: The controller requests a client may send through a broker (by class name).
CLIENT_REQUESTS: dict[str, type] = {cls.__name__: cls for cls in (
    CreateTopicRequest, DeleteTopicRequest, GetTopicRouteRequest, ListTopicsRequest, ConsumerHeartbeatRequest)}
_MAX_NAME = 255
_MAX_WAIT_MS = 60_000


@dataclass(frozen=True, slots=True)
class GroupView:
    """One broker group as a client sees it."""

    group: str
    master: int | None                           # replica index of the master, None if none known
    epoch: int                                   # the master epoch the controllers applied (-1: none)
    brokers: tuple[tuple[int, str, int], ...]    # (replica, host, client port)

    def address_of(self, replica: int) -> tuple[str, int] | None:
        return next(((h, p) for r, h, p in self.brokers if r == replica), None)


@dataclass(frozen=True, slots=True)
class Metadata:
    cluster: str
    groups: tuple[GroupView, ...]
    client: dict[str, Any]

    def group(self, name: str) -> GroupView | None:
        return next((g for g in self.groups if g.group == name), None)


def _str(value: object, what: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= _MAX_NAME:
        raise WireError(f"{what}: expected a name")
    return value


def _int(value: object, what: str, low: int = -1, high: int = (1 << 63) - 1) -> int:
    if type(value) is not int or not low <= value <= high:
        raise WireError(f"{what}: expected an integer in {low}..{high}")
    return value


def encode_metadata(md: Metadata) -> bytes:
    return pack({"cluster": md.cluster, "client": md.client,
                 "groups": [[g.group, g.master, g.epoch, [list(b) for b in g.brokers]] for g in md.groups]})


def decode_metadata(body: bytes | memoryview) -> Metadata:
    raw = unpack(body, "metadata")
    if not (isinstance(raw, dict) and set(raw) == {"cluster", "client", "groups"} and isinstance(raw["groups"], list)
            and isinstance(raw["client"], dict)):
        raise WireError("metadata: expected {cluster, client, groups}")
    groups = []
    for item in raw["groups"]:
        if not (isinstance(item, list) and len(item) == 4 and isinstance(item[3], list)):
            raise WireError("metadata: expected [group, master, epoch, brokers]")
        master = None if item[1] is None else _int(item[1], "metadata master", 0)
        brokers = []
        for b in item[3]:
            if not (isinstance(b, list) and len(b) == 3):
                raise WireError("metadata: expected [replica, host, port]")
            brokers.append((_int(b[0], "replica", 0), _str(b[1], "host"), _int(b[2], "port", 1, 65535)))
        groups.append(GroupView(_str(item[0], "group"), master, _int(item[2], "epoch"), tuple(brokers)))
    return Metadata(_str(raw["cluster"], "cluster"), tuple(groups), raw["client"])


def encode_watch(group: str, known_epoch: int, wait_ms: int) -> bytes:
    return pack([group, known_epoch, wait_ms])


def decode_watch(body: bytes | memoryview) -> tuple[str, int, int]:
    raw = unpack(body, "watch")
    if not (isinstance(raw, list) and len(raw) == 3):
        raise WireError("watch: expected [group, known_epoch, wait_ms]")
    return _str(raw[0], "watch group"), _int(raw[1], "watch epoch"), _int(raw[2], "watch wait", 0, _MAX_WAIT_MS)


def encode_watch_answer(epoch: int, master: int | None) -> bytes:
    return pack([epoch, master])


def decode_watch_answer(body: bytes | memoryview) -> tuple[int, int | None]:
    raw = unpack(body, "watch answer")
    if not (isinstance(raw, list) and len(raw) == 2):
        raise WireError("watch answer: expected [epoch, master]")
    return _int(raw[0], "watch answer epoch"), None if raw[1] is None else _int(raw[1], "watch answer master", 0)


def encode_control(request: Any) -> bytes:
    name = type(request).__name__
    assert name in CLIENT_REQUESTS, name
    return pack([name, {f.name: list(v) if isinstance(v := getattr(request, f.name), tuple) else v
                        for f in dataclasses.fields(request)}])


_FIELD_TYPES = {"topic": str, "queues": int, "group": str, "client_id": str, "topics": tuple, "leaving": bool}


def decode_control(body: bytes | memoryview) -> Any:
    """The client request a CONTROL frame carries (only ``CLIENT_REQUESTS``, every field typed)."""
    raw = unpack(body, "control")
    if not (isinstance(raw, list) and len(raw) == 2 and isinstance(raw[1], dict)):
        raise WireError("control: expected [request type, fields]")
    cls = CLIENT_REQUESTS.get(raw[0]) if isinstance(raw[0], str) else None
    if cls is None:
        raise WireError(f"control: {str(raw[0])[:40]!r} is not a client request")
    names = {f.name for f in dataclasses.fields(cls)}
    if not set(raw[1]) <= names:
        raise WireError(f"control: {raw[0]} takes {sorted(names)}")
    values: dict[str, Any] = {}
    for name, value in raw[1].items():
        kind = _FIELD_TYPES[name]
        if kind is tuple:
            if not (isinstance(value, list) and len(value) <= 1024):
                raise WireError(f"control: {name} must be a list of names")
            value = tuple(_str(v, name) for v in value)
        elif kind is str:
            value = _str(value, name)
        elif kind is bool:
            if type(value) is not bool:
                raise WireError(f"control: {name} must be true or false")
        else:
            value = _int(value, name, 0, 1 << 31)
        values[name] = value
    try:
        return cls(**values)
    except TypeError as exc:
        raise WireError(f"control: {raw[0]}: {exc}") from None


def encode_control_answer(response: Response) -> bytes:
    return pack([int(response.code), type(response.header).__name__, header_fields(response.header),
                 response.body, response.remark])


def decode_control_answer(body: bytes | memoryview) -> Response:
    raw = unpack(body, "control answer")
    if not (isinstance(raw, list) and len(raw) == 5):
        raise WireError("control answer: expected [code, header type, header, body, remark]")
    code, kind, fields, extra, remark = raw
    try:
        return Response(ResponseCode(code), header_from_fields(kind, fields),
                        extra if isinstance(extra, dict) else None, str(remark))
    except (ValueError, HeaderCodecError) as exc:
        raise WireError(f"control answer: {exc}") from None
