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

The connection is authenticated with the cluster secret before anything else
(``rocketray.auth``, under ``SESSION_LABEL``): a close can trigger an election, so an anonymous
peer must not be able to open a session in a broker's name. After the exchange::

    frame = length u32 big-endian | msgpack map (version "v" = 1, type "t")
    hello  {"v": 1, "t": "hello", "cluster": str, "group": str, "broker_id": int >= 1, "address": str}
    bye    {"v": 1, "t": "bye"}

The first frame must be a hello; a frame over ``MAX_FRAME_BYTES`` or of any other shape is a
protocol error that closes the connection.

A new leader has no sessions: they were held by its predecessor. Brokers follow leadership (the
controller clients' ``watch_leader``) and reopen theirs to it at once; :class:`LeaderSessionGrace`
gives them ``grace_ms`` from the moment this node became the ready leader, and then, once per
leadership, names each master without a session here whose group has another replica with one
(``masters_without_session``): the node treats it as a closed session (its heartbeat row goes, its
group is re-elected). So a master lost together with the leader (one node
held both) is replaced a grace window after the election instead of a heartbeat timeout later. A
live master that was slow to reopen is deposed as a dead one would be; the new master's higher epoch
fences it (the simulator's ``leader-lost-with-master`` scenarios). This module holds the codec and the session table (pure);
the listener that runs them is ``SessionServer`` in ``rocketray.controller.session_server``, the
broker's side ``rocketray.actors.controller_session``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Collection, Mapping

import msgpack

__all__ = ["Bye", "Hello", "LeaderSessionGrace", "MAX_FRAME_BYTES", "SessionDecoder", "SessionProtocolError",
           "SessionTable", "encode_bye", "encode_hello", "masters_without_session"]

VERSION = 1
MAX_FRAME_BYTES = 4096
_LEN = struct.Struct(">I")


class SessionProtocolError(ValueError):
    """The peer sent bytes that are not a session frame: close the connection."""


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
class Bye:
    """The broker closes this session on purpose (it moves to another controller)."""


def _frame(body: dict) -> bytes:
    data = msgpack.packb(body, use_bin_type=True)
    assert len(data) <= MAX_FRAME_BYTES, len(data)
    return _LEN.pack(len(data)) + data


def encode_hello(hello: Hello) -> bytes:
    return _frame({"v": VERSION, "t": "hello", "cluster": hello.cluster, "group": hello.group,
                   "broker_id": hello.broker_id, "address": hello.address})


def encode_bye() -> bytes:
    return _frame({"v": VERSION, "t": "bye"})


def _decode(data: bytes) -> Hello | Bye:
    try:
        body = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # noqa: BLE001 - any msgpack failure is the peer's protocol error
        raise SessionProtocolError(f"undecodable frame: {exc}") from None
    if not isinstance(body, dict) or body.get("v") != VERSION:
        raise SessionProtocolError("not a version-1 session frame")
    kind = body.get("t")
    if kind == "bye" and len(body) == 2:
        return Bye()
    if kind == "hello" and len(body) == 6:
        cluster, group, broker_id, address = (body.get(k) for k in ("cluster", "group", "broker_id", "address"))
        if (isinstance(cluster, str) and isinstance(group, str) and group and isinstance(address, str)
                and type(broker_id) is int and broker_id >= 1):
            return Hello(cluster, group, broker_id, address)
    raise SessionProtocolError(f"not a hello or bye frame: type {kind!r}")


class SessionDecoder:
    """Feed received bytes, take whole frames; the first must be a hello."""

    __slots__ = ("_buf", "_greeted")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._greeted = False

    def receive_data(self, data: bytes) -> list[Hello | Bye]:
        self._buf += data
        frames: list[Hello | Bye] = []
        while len(self._buf) >= _LEN.size:
            (size,) = _LEN.unpack_from(self._buf)
            if size > MAX_FRAME_BYTES:
                raise SessionProtocolError(f"frame of {size} bytes, over {MAX_FRAME_BYTES}")
            if len(self._buf) < _LEN.size + size:
                break
            frame = _decode(bytes(self._buf[_LEN.size:_LEN.size + size]))
            del self._buf[:_LEN.size + size]
            if isinstance(frame, Hello) == self._greeted:
                raise SessionProtocolError("a session opens with one hello and carries no other")
            self._greeted = True
            frames.append(frame)
        return frames


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
