"""Broker sessions: one TCP connection per broker to the controller, so a dead broker is noticed at once.

Theory of operation. RocketMQ's controller does not wait for heartbeats to expire when a broker's
process dies: the broker's channel goes inactive and the controller runs the broker-inactive path
at once (``BrokerHousekeepingService.onChannelDestroy`` -> ``onBrokerChannelClose``), electing a new
master if the dead broker was one. Here each broker holds one *session* connection to the controller
it believes is the leader. When its process dies the kernel closes the socket, the controller reads
EOF, and the node drops the broker's heartbeat row and, as leader, re-elects its group if it was the
master (``ControllerNode.on_broker_session_closed``). A partition closes nothing: that case still
goes through heartbeat expiry, as does a frozen (SIGSTOP) process.

A broker that moves its session to another controller (the leader moved) says ``bye`` first, so the
old node does not take the close for a death. Only the newest session of a broker counts: a close of
an older one (a restarted broker's previous process) is ignored by :class:`SessionTable`.

The connection is authenticated as a member before anything else (``rocketray.links``: TLS with
the member's certificate, then the members' secret under ``SESSION_LABEL``), and its hello is
admitted only for the broker that member is (:func:`hello_problem`): a close can trigger an
election and a heartbeat keeps a broker alive, so nobody may open a session in another broker's
name. After the exchange::

    frame     = length u32 big-endian | msgpack map (version "v" = 1, type "t")
    hello     {"v": 1, "t": "hello", "cluster": str, "group": str, "broker_id": int >= 1, "address": str}
    heartbeat {"v": 1, "t": "hb", "seq": int >= 0, "timeout_ms": int >= 1, "epoch": int, "max_offset": int,
               "confirm_offset": int, "priority": int}
    bye       {"v": 1, "t": "bye"}
    ack       {"v": 1, "t": "ack", "seq": int >= 0}        (controller -> broker, one per heartbeat)
    role      {"v": 1, "t": "role", "master_broker_id": int >= 1 | None, "master_address": str | None,
               "master_epoch": int >= 0, "sss_epoch": int >= 0, "sss": [int >= 1, ...] (sorted, distinct)}
                                                            (controller -> broker, after an election)

The broker sends a hello, then heartbeats (the first one with the hello, then one every
``broker_heartbeat_interval_ms``), and at most a bye. A heartbeat carries the broker's progress; who
it is comes from the hello, so a heartbeat can only speak for the broker that opened the session
(:func:`heartbeat_request` builds the controller's ``BrokerHeartbeatRequest`` from both). The
controller records it in its heartbeat table and answers an ack with the same ``seq``. As in
RocketMQ, where the broker heartbeats on its channel, liveness travels only to the controller that
holds the session (the leader), not to every controller: a node's heartbeat rows are the brokers
that hold a session with it (a bye or a close drops the row), so a node that becomes leader knows
exactly the brokers that reopened their sessions with it, with the progress they reported then.
The broker decodes the controller's side with :class:`ControllerFrameDecoder`.

After an election the leader pushes the group's new master and SyncStateSet to its live members
(reference 5.5, NOTIFY_BROKER_ROLE_CHANGED; ``rocketray.controller.notify``). A member holding its
session with that leader gets it as a ``role`` frame on the session (a write to a connection already
open, where a Ray call costs milliseconds to submit); a member whose session is elsewhere or not
open yet gets a Ray call. The frame decodes to the :class:`MasterInfo` the broker's role machine
takes; it is a hint like the Ray call: a lost one costs time (the broker also polls), and a
duplicate or older one is ignored by the role machine.

The first frame must be a hello; a frame over ``MAX_FRAME_BYTES`` or of any other shape is a
:class:`SessionProtocolError` (with a :class:`SessionErrorCode`) that closes that connection and
changes nothing else.

A new leader has no sessions: they were held by its predecessor. Brokers follow leadership (the
controller clients' ``watch_leader``) and reopen theirs to it at once; :class:`LeaderSessionGrace`
gives them ``grace_ms`` from the moment this node became the ready leader, and then, once per
leadership, names each master without a session here whose group has another replica with one
(``masters_without_session``): the node treats it as a closed session (its heartbeat row goes, its
group is re-elected). So a master lost together with the leader (one node held both) is replaced a
grace window after the election instead of a heartbeat timeout later. A live master that was slow to
reopen is deposed as a dead one would be; the new master's higher epoch fences it (the simulator's
``leader-lost-with-master`` scenarios). Until that window has passed in a leadership, the node's
dead-master scan waits too: its heartbeat table fills as the brokers reopen their sessions, and a
master that had not yet would look dead to it. This module holds the codec and the session table
(pure); the listener that runs them is ``SessionServer`` in ``rocketray.controller.session_server``, the
broker's side ``rocketray.actors.controller_session``.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Callable, Collection, Iterator, Mapping

import msgpack

from rocketray.wire.controller_api import BrokerHeartbeatRequest, MasterInfo
from rocketray.identity import Identity, member_of_check_code

__all__ = ["Ack", "Bye", "ControllerFrameDecoder", "Heartbeat", "Hello", "LeaderSessionGrace", "MAX_FRAME_BYTES",
           "SessionDecoder", "SessionErrorCode", "SessionProtocolError", "SessionTable", "encode_ack",
           "encode_bye", "encode_heartbeat", "encode_hello", "encode_role", "heartbeat_of", "heartbeat_problem",
           "heartbeat_request", "hello_problem", "masters_without_session"]

VERSION = 1
MAX_FRAME_BYTES = 4096
MAX_HEARTBEAT_TIMEOUT_MS = 600_000
INT32_LIMIT = 1 << 31
_LEN = struct.Struct(">I")
_INT64 = (-(1 << 63), (1 << 63) - 1)


class SessionErrorCode(enum.Enum):
    """Why a peer's bytes are not a session frame."""

    FRAME_TOO_LARGE = "frame_too_large"     # a length over MAX_FRAME_BYTES
    UNDECODABLE = "undecodable"             # not msgpack
    BAD_VERSION = "bad_version"             # not a map with "v" = 1
    BAD_FRAME = "bad_frame"                 # a known type with missing, extra or ill-typed fields, or an unknown type
    OUT_OF_ORDER = "out_of_order"           # not hello first, a second hello, anything after a bye
    NOT_ALLOWED = "not_allowed"             # a hello the authenticated member may not send (hello_problem)


class SessionProtocolError(ValueError):
    """The peer sent bytes that are not a session frame: close that connection (``code`` says why)."""

    def __init__(self, code: SessionErrorCode, message: str) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code


@dataclass(frozen=True, slots=True)
class Hello:
    """A broker opens its session: who it is."""

    cluster: str
    group: str
    broker_id: int
    address: str

    @property
    def key(self) -> tuple[str, int]:
        return self.group, self.broker_id


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A broker's heartbeat on its session: its progress now (who it is: the session's hello).
    ``seq`` numbers the heartbeats of one session; the controller's ack repeats it."""

    seq: int
    timeout_ms: int
    epoch: int
    max_offset: int
    confirm_offset: int
    priority: int


@dataclass(frozen=True, slots=True)
class Bye:
    """The broker closes this session on purpose (it moves to another controller)."""


@dataclass(frozen=True, slots=True)
class Ack:
    """The controller recorded heartbeat ``seq`` of this session."""

    seq: int


def _frame(body: dict) -> bytes:
    data = msgpack.packb(body, use_bin_type=True)
    assert len(data) <= MAX_FRAME_BYTES, len(data)
    return _LEN.pack(len(data)) + data


def encode_hello(hello: Hello) -> bytes:
    return _frame({"v": VERSION, "t": "hello", "cluster": hello.cluster, "group": hello.group,
                   "broker_id": hello.broker_id, "address": hello.address})


def encode_heartbeat(hb: Heartbeat) -> bytes:
    return _frame({"v": VERSION, "t": "hb", "seq": hb.seq, "timeout_ms": hb.timeout_ms, "epoch": hb.epoch,
                   "max_offset": hb.max_offset, "confirm_offset": hb.confirm_offset, "priority": hb.priority})


def encode_bye() -> bytes:
    return _frame({"v": VERSION, "t": "bye"})


def encode_ack(seq: int) -> bytes:
    return _frame({"v": VERSION, "t": "ack", "seq": seq})


def encode_role(info: MasterInfo) -> bytes:
    """The ``role`` frame of a role-change notification (``RoleChangeNotice.notification()``)."""
    assert info.master_broker_id is None or _int(info.master_broker_id, 1), info.master_broker_id
    assert info.master_address is None or isinstance(info.master_address, str), info.master_address
    assert _int(info.master_epoch, 0) and _int(info.sync_state_set_epoch, 0), info
    assert all(_int(b, 1) for b in info.sync_state_set), info.sync_state_set
    return _frame({"v": VERSION, "t": "role", "master_broker_id": info.master_broker_id,
                   "master_address": info.master_address, "master_epoch": info.master_epoch,
                   "sss_epoch": info.sync_state_set_epoch, "sss": sorted(info.sync_state_set)})


def heartbeat_problem(hb: Heartbeat) -> str | None:
    """Why a heartbeat's fields are out of range, or None. A heartbeat keeps its broker alive for
    ``timeout_ms``: beyond ``MAX_HEARTBEAT_TIMEOUT_MS`` one frame could keep a dead master
    "alive" for as long as its sender liked."""
    if hb.seq < 0:
        return f"seq {hb.seq} < 0"
    if not 1 <= hb.timeout_ms <= MAX_HEARTBEAT_TIMEOUT_MS:
        return f"timeout_ms {hb.timeout_ms} outside 1..{MAX_HEARTBEAT_TIMEOUT_MS}"
    if min(hb.epoch, hb.max_offset, hb.confirm_offset) < -1:
        return "epoch and offsets are -1 (unknown) or more"
    if not -INT32_LIMIT <= hb.priority < INT32_LIMIT:
        return f"priority {hb.priority} is not a 32-bit int"
    return None


def hello_problem(hello: Hello, peer: Identity | None, cluster_name: str,
                  registration: Callable[[str, int], tuple[str, str] | None]) -> str | None:
    """Why ``peer`` may not open a session with ``hello``, or None (pure).

    A session speaks for one broker: its close can trigger an election of that broker's group, its
    heartbeats keep that broker alive. The hello must name this cluster; the broker id must be
    registered in the controller's state (``registration``: address and check code) at the address
    the hello gives; and, with TLS, the peer's certificate must name the member that registered
    that broker id (its check code records the member: ``rocketray.identity.check_code``), so a
    member speaks only for its own broker id, wherever it moved. Without TLS the members' secret
    proves only that the peer is a member."""
    if hello.cluster != cluster_name:
        return f"hello for cluster {hello.cluster!r}, this is {cluster_name!r}"
    if peer is not None and (peer.role != "broker" or peer.group != hello.group):
        return f"{peer} may not speak for group {hello.group!r}"
    registered = registration(hello.group, hello.broker_id)
    if registered is None:
        return f"broker {hello.group}/{hello.broker_id} is not registered"
    address, code = registered
    if address != hello.address:
        return f"broker {hello.group}/{hello.broker_id} is registered at {address}, not {hello.address}"
    if peer is not None and member_of_check_code(code) != peer:
        return f"broker {hello.group}/{hello.broker_id} was registered by {member_of_check_code(code)}, not {peer}"
    return None


def heartbeat_of(request: BrokerHeartbeatRequest, seq: int) -> Heartbeat:
    """The frame a broker sends for its ``BrokerHeartbeatRequest`` (identity left to the hello)."""
    return Heartbeat(seq, request.heartbeat_timeout_ms, request.epoch, request.max_offset, request.confirm_offset,
                     request.election_priority)


def heartbeat_request(hello: Hello, hb: Heartbeat) -> BrokerHeartbeatRequest:
    """The controller's heartbeat request for a heartbeat received on ``hello``'s session."""
    return BrokerHeartbeatRequest(hello.cluster, hello.group, hello.address, hello.broker_id, epoch=hb.epoch,
                                  max_offset=hb.max_offset, confirm_offset=hb.confirm_offset,
                                  heartbeat_timeout_ms=hb.timeout_ms, election_priority=hb.priority)


def _int(value: object, low: int = _INT64[0]) -> bool:
    return type(value) is int and low <= value <= _INT64[1]


_HEARTBEAT_KEYS = ("seq", "timeout_ms", "epoch", "max_offset", "confirm_offset", "priority")
_ROLE_KEYS = ("master_broker_id", "master_address", "master_epoch", "sss_epoch", "sss")

Frame = Hello | Heartbeat | Bye | Ack | MasterInfo


def _role(body: dict) -> MasterInfo | None:
    """The notification in a ``role`` frame's fields, or None if one is missing or ill-typed."""
    if len(body) != 2 + len(_ROLE_KEYS) or any(k not in body for k in _ROLE_KEYS):
        return None
    master, address, epoch, sss_epoch, sss = (body[k] for k in _ROLE_KEYS)
    if not (master is None or _int(master, 1)) or not (address is None or isinstance(address, str)):
        return None
    if not (_int(epoch, 0) and _int(sss_epoch, 0) and isinstance(sss, list) and all(_int(b, 1) for b in sss)):
        return None
    if sss != sorted(set(sss)):
        return None  # the encoder writes the set sorted: anything else is not ours
    return MasterInfo(master, address, epoch, sss_epoch, frozenset(sss))


def _decode(data: bytes) -> Frame:
    try:
        body = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # noqa: BLE001 - any msgpack failure is the peer's protocol error
        raise SessionProtocolError(SessionErrorCode.UNDECODABLE, f"undecodable frame: {exc}") from None
    if not isinstance(body, dict) or body.get("v") != VERSION:
        raise SessionProtocolError(SessionErrorCode.BAD_VERSION, "not a version-1 session frame")
    kind = body.get("t")
    if kind == "bye" and len(body) == 2:
        return Bye()
    if kind == "hb" and len(body) == 2 + len(_HEARTBEAT_KEYS):
        raw = [body.get(k) for k in _HEARTBEAT_KEYS]
        if all(_int(v) for v in raw):
            hb = Heartbeat(*(int(v) for v in raw if isinstance(v, int)))
            if heartbeat_problem(hb) is None:
                return hb
    if kind == "ack" and len(body) == 3 and _int(body.get("seq"), 0):
        return Ack(body["seq"])
    if kind == "role" and (info := _role(body)) is not None:
        return info
    if kind == "hello" and len(body) == 6:
        cluster, group, broker_id, address = (body.get(k) for k in ("cluster", "group", "broker_id", "address"))
        if (isinstance(cluster, str) and isinstance(group, str) and group and isinstance(address, str)
                and isinstance(broker_id, int) and _int(broker_id, 1)):
            return Hello(cluster, group, broker_id, address)
    raise SessionProtocolError(SessionErrorCode.BAD_FRAME, f"not a well-formed session frame: type {kind!r}")


class _Frames:
    """Splits a byte stream into decoded frames (bounded: a length over MAX_FRAME_BYTES is refused
    before its body arrives)."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> Iterator[Frame]:
        """Yields each whole frame as it is decoded, so the frames before a malformed one are
        taken whether or not they arrived in the same read (a stream has no segment boundaries)."""
        self._buf += data
        while len(self._buf) >= _LEN.size:
            (size,) = _LEN.unpack_from(self._buf)
            if size > MAX_FRAME_BYTES:
                raise SessionProtocolError(SessionErrorCode.FRAME_TOO_LARGE,
                                           f"frame of {size} bytes, over {MAX_FRAME_BYTES}")
            if len(self._buf) < _LEN.size + size:
                break
            frame = _decode(bytes(self._buf[_LEN.size:_LEN.size + size]))
            del self._buf[:_LEN.size + size]
            yield frame


class SessionDecoder:
    """The controller's side: feed received bytes, take whole frames. A session is one hello, then
    heartbeats, then at most a bye (nothing after it); anything else is a protocol error."""

    __slots__ = ("_frames", "_greeted", "_ended")

    def __init__(self) -> None:
        self._frames = _Frames()
        self._greeted = False
        self._ended = False

    def receive_data(self, data: bytes) -> list[Hello | Heartbeat | Bye]:
        """The whole frames in ``data`` (with what was buffered); raises on the first bad one."""
        return list(self.frames(data))

    def frames(self, data: bytes) -> Iterator[Hello | Heartbeat | Bye]:
        """Like ``receive_data`` but one frame at a time: a caller acts on every good frame before
        the error of a bad one that follows it in the same read."""
        for frame in self._frames.feed(data):
            if isinstance(frame, (Ack, MasterInfo)):
                kind = "an ack" if isinstance(frame, Ack) else "a role notification"
                raise SessionProtocolError(SessionErrorCode.BAD_FRAME, f"{kind} is the controller's frame")
            if self._ended or isinstance(frame, Hello) == self._greeted:
                raise SessionProtocolError(SessionErrorCode.OUT_OF_ORDER,
                                           "a session is one hello, then heartbeats, then at most a bye")
            self._greeted = True
            self._ended = isinstance(frame, Bye)
            yield frame


class ControllerFrameDecoder:
    """The broker's side: the controller sends acks and role notifications (as ``MasterInfo``)."""

    __slots__ = ("_frames",)

    def __init__(self) -> None:
        self._frames = _Frames()

    def receive_data(self, data: bytes) -> list[Ack | MasterInfo]:
        """The whole frames in ``data`` (with what was buffered); raises on the first bad one."""
        return list(self.frames(data))

    def frames(self, data: bytes) -> Iterator[Ack | MasterInfo]:
        """Like ``receive_data`` but one frame at a time: the frames before a bad one are acted on."""
        for frame in self._frames.feed(data):
            if not isinstance(frame, (Ack, MasterInfo)):
                raise SessionProtocolError(SessionErrorCode.BAD_FRAME, f"the controller sent a {type(frame).__name__}")
            yield frame


class SessionTable:
    """Which connection is each broker's current session. ``opened`` returns a token for the
    connection; ``closed(token, said_bye)`` returns the broker whose *current* session ended without
    a bye (the one the node must treat as dead), or None (a bye, or an older session)."""

    __slots__ = ("_current", "_next")

    def __init__(self) -> None:
        self._current: dict[tuple[str, int], int] = {}
        self._next = 0

    def __len__(self) -> int:
        return len(self._current)

    def keys(self) -> frozenset[tuple[str, int]]:
        """The ``(group, broker_id)`` of every current session."""
        return frozenset(self._current)

    def is_current(self, hello: Hello, token: int) -> bool:
        """Is ``token`` (from ``opened``) still the current session of ``hello``'s broker?"""
        return self._current.get(hello.key) == token

    def opened(self, hello: Hello) -> int:
        self._next += 1
        self._current[hello.key] = self._next
        return self._next

    def closed(self, hello: Hello, token: int, said_bye: bool) -> tuple[str, int] | None:
        if self._current.get(hello.key) != token:
            return None  # a newer session of this broker replaced it
        del self._current[hello.key]
        return None if said_bye else hello.key


class LeaderSessionGrace:
    """The leader-change rule (pure, ``now_ms`` in). Call ``due(now_ms, leader_term)`` on every tick,
    ``leader_term`` being the term in which this node is the ready leader (None when it is not). It
    is True exactly once per leadership: at the first tick ``grace_ms`` or more after the first tick
    of that leadership (a new term restarts the window). The node then treats every master in
    :func:`masters_without_session` as dead. A node younger than ``warm_up_ms`` (counted from
    ``started_ms``) when the window ends acts on none: its heartbeat table may not know the live
    replicas yet, so an election could only depose the master (brokers heartbeat every node, so a few
    heartbeat intervals suffice); heartbeat expiry still covers that leadership."""

    __slots__ = ("grace_ms", "warm_up_ms", "started_ms", "_term", "_since_ms", "_done")

    def __init__(self, grace_ms: int, *, started_ms: int, warm_up_ms: int = 0) -> None:
        if type(grace_ms) is not int or grace_ms < 0:
            raise ValueError(f"grace_ms must be an int >= 0, not {grace_ms!r}")
        if type(warm_up_ms) is not int or warm_up_ms < 0:
            raise ValueError(f"warm_up_ms must be an int >= 0, not {warm_up_ms!r}")
        self.grace_ms = grace_ms
        self.warm_up_ms = warm_up_ms
        self.started_ms = started_ms
        self._term: int | None = None
        self._since_ms = 0
        self._done = False

    def deadline_ms(self) -> int | None:
        """When the current window ends (None: not leading, or it already ended)."""
        return None if self._term is None or self._done else self._since_ms + self.grace_ms

    def due(self, now_ms: int, leader_term: int | None) -> bool:
        if leader_term is None:
            self._term = None
            return False
        if leader_term != self._term:
            self._term, self._since_ms, self._done = leader_term, now_ms, False
        if self._done or now_ms < self._since_ms + self.grace_ms:
            return False
        self._done = True
        return now_ms - self.started_ms >= self.warm_up_ms


def masters_without_session(masters: Mapping[str, int | None],
                            open_sessions: Collection[tuple[str, int]]) -> list[tuple[str, int]]:
    """``(group, master_id)`` of each group whose master holds no session here while another replica
    of its group does, sorted. That replica is the evidence that the group's brokers hold sessions
    and reach this leader: a group none of whose brokers reopened (brokers without sessions, a
    leader cut off from all of them, a single-replica group) is left to heartbeat expiry, since
    deposing its master could elect no one reachable."""
    reopened = {group for group, _broker_id in open_sessions}
    return sorted((group, master) for group, master in masters.items()
                  if master is not None and group in reopened and (group, master) not in open_sessions)
