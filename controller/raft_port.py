"""The controller's Raft port: a listener and a pysyncobj transport only controllers get through (shell).

Theory of operation. ``GuardedTransport`` is pysyncobj's ``TCPTransport`` with its connections
replaced by ``GuardedConnection`` (TLS, bounded frames, no pickle: ``controller/raft_conn.py``) and
its first-message handling replaced by the admission rules of ``controller/raft_admission.py``:

- the listener (``GuardedServer``) binds the configured Raft address only (pysyncobj binds the
  wildcard address when it is given none), counts connections in total and per peer host and
  closes those over a limit at once, and on an accept failure (EMFILE and the like) rests for
  ``accept_pause_s`` and logs once per interval, then serves again;
- an incoming connection must complete the TLS handshake with a certificate of another controller
  of this cluster, then claim, as pysyncobj's first message, that controller's Raft address; an
  outgoing one must reach the controller it dialed. pysyncobj's ``readonly`` nodes and utility
  commands are refused;
- every message of an admitted peer must have a shape pysyncobj sends (``raft_wire.SCHEMA``) and
  an entry too large for one message, which pysyncobj pickles and sends in chunks, is reassembled
  here and decoded by the restricted unpickler (``raft_pickle.decode_entry``): pysyncobj itself
  never unpickles it (its own chunk bookkeeping may also mark a chunk before the last as the
  ``finish``; an incomplete entry waits for the rest);
- connections not admitted by their deadline are closed on the tick (a silent peer raises no event).

Every refusal closes that connection alone, is counted by kind (``stats()``, in the node's
``metadata()["raft_port"]``) and logged with its reason, at most once per interval per kind.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import ssl
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

from pysyncobj.dns_resolver import globalDnsResolver
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import _getAddrType
from pysyncobj.transport import TCPTransport

from rocketray.controller.raft_admission import (ConnectionCounts, LogThrottle, PortLimits, Refusal, claim_problem,
                                                 identity_problem)
from rocketray.controller.raft_conn import GuardedConnection
from rocketray.controller.raft_pickle import UnsafePickle, decode_entry
from rocketray.controller.raft_wire import message_problem
from rocketray.tls import IdentityError, MemberCredentials

log = logging.getLogger("rocketray.controller.raft")

__all__ = ["GuardedServer", "GuardedTransport", "RaftPortSettings"]

LISTEN_BACKLOG = 128
ACCEPTS_PER_EVENT = 32
RAND_KEY_BYTES = 32            # pysyncobj's per-connection key in password mode


@dataclass(frozen=True)
class RaftPortSettings:
    """What the transport needs, built and checked by ``raft_members.port_settings``."""

    cluster: str
    self_index: int
    controllers: Mapping[int, str]     # index -> the Raft address that controller binds and announces
    peer_index: Mapping[str, int]      # this node's address for a peer (maybe a proxy) -> its index
    bind_address: str
    limits: PortLimits
    credentials: MemberCredentials
    server_context: ssl.SSLContext | None   # None: development mode (pysyncobj's password)
    client_context: ssl.SSLContext | None


class GuardedServer:
    """The Raft listener on pysyncobj's poller (module docstring)."""

    def __init__(self, poller: Any, host: str, port: int, on_socket: Callable[[socket.socket, str], None],
                 limits: PortLimits, refused: Callable[[str, str, str], None]) -> None:
        self._poller = poller
        self.host, self.port = host, port
        self._on_socket = on_socket
        self._limits = limits
        self._refused = refused
        self.counts = ConnectionCounts(limits.max_connections, limits.max_connections_per_address)
        self._sock: socket.socket | None = None
        self._paused_until: float | None = None
        self._accept_log = LogThrottle(limits.log_interval_s)
        self.accept_failures = 0

    def bind(self) -> None:
        sock = socket.socket(_getAddrType(self.host), socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setblocking(False)
            sock.bind((self.host, self.port))
            sock.listen(LISTEN_BACKLOG)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self._subscribe()

    def unbind(self) -> None:
        if self._sock is not None:
            self._poller.unsubscribe(self._sock.fileno())
            self._sock.close()
            self._sock = None

    def sockname(self) -> tuple[str, int] | None:
        return None if self._sock is None else self._sock.getsockname()[:2]

    def release(self, host: str) -> None:
        self.counts.close(host)

    def maybe_resume(self, now: float) -> None:
        if self._paused_until is not None and now >= self._paused_until and self._sock is not None:
            self._paused_until = None
            self._subscribe()

    def _subscribe(self) -> None:
        assert self._sock is not None
        self._poller.subscribe(self._sock.fileno(), self._on_event, POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR)

    def _on_event(self, descr: int, event: int) -> None:
        if self._sock is None or descr != self._sock.fileno():
            self._poller.unsubscribe(descr)
            return
        for _ in range(ACCEPTS_PER_EVENT):
            try:
                sock, addr = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:  # EMFILE, ENFILE, ENOBUFS, ENOMEM: rest, then serve again
                self._accept_failed(exc)
                return
            host = str(addr[0])
            problem = self.counts.open(host)
            if problem is not None:
                sock.close()
                self._refused(host, Refusal.LIMIT, problem)
                continue
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                sock.close()
                self.counts.close(host)
                continue
            self._on_socket(sock, host)

    def _accept_failed(self, exc: OSError) -> None:
        self.accept_failures += 1
        now = time.monotonic()
        self._paused_until = now + self._limits.accept_pause_s
        assert self._sock is not None
        self._poller.unsubscribe(self._sock.fileno())
        suppressed = self._accept_log.admit(now)
        if suppressed is not None:
            log.error("raft listener %s:%d cannot accept: %s; resting %g ms and serving on (%d similar "
                      "failures not logged)", self.host, self.port, exc, self._limits.accept_pause_s * 1000,
                      suppressed)


class GuardedTransport(TCPTransport):
    """pysyncobj's TCP transport behind the admission rules (module docstring). The host sets
    ``raft_port_settings`` (a ``RaftPortSettings``) on itself before pysyncobj builds this."""

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:
        self._settings: RaftPortSettings = syncObj.raft_port_settings
        self.refusals: Counter[str] = Counter()
        self.accepted = 0
        self.admitted = 0
        self.chunked_entries = 0
        self._refusal_logs: dict[str, LogThrottle] = {}
        self._transmissions: dict[Any, bytearray] = {}
        super().__init__(syncObj, selfNode, otherNodes)

    # -- the listener ------------------------------------------------------------------------------
    def _createServer(self) -> None:
        host, port = self._settings.bind_address.rsplit(":", 1)
        resolved = globalDnsResolver().resolve(host)
        if resolved is None:
            raise RuntimeError(f"cannot resolve the Raft bind host {host!r}")
        self._server = GuardedServer(self._syncObj._poller, resolved, int(port), self._on_accepted,
                                     self._settings.limits, self._refused_host)

    def _on_accepted(self, sock: socket.socket, host: str) -> None:
        self.accepted += 1
        conn = self._connection(self._settings.server_context, True, self._verify_incoming, sock=sock,
                                peer_host=host)
        self._onNewIncomingConnection(conn)

    def _connection(self, context: ssl.SSLContext | None, server_side: bool,
                    verify: Callable[[GuardedConnection], str | None], **kwargs: Any) -> GuardedConnection:
        conf = self._syncObj.conf
        return GuardedConnection(self._syncObj._poller, self._settings.limits, self, context=context,
                                 server_side=server_side, timeout=conf.connectionTimeout,
                                 send_buffer=conf.sendBufferSize, recv_buffer=conf.recvBufferSize,
                                 verify_peer=verify if context is not None else None, **kwargs)

    def _onTick(self) -> None:
        super()._onTick()
        now = time.monotonic()
        if self._server is not None:
            self._server.maybe_resume(now)
        for conn in list(self._unknownConnections) + list(self._connections.values()):
            conn.expire(now)

    # -- ConnectionHooks -----------------------------------------------------------------------------
    def refused(self, conn: GuardedConnection, kind: str, reason: str) -> None:
        who = f"{conn.peer_host}" + (f" ({conn.identity})" if conn.identity is not None else "")
        self._refused_host(who, kind, reason)

    def closed(self, conn: GuardedConnection) -> None:
        if self._server is not None and conn.peer_host is not None:
            self._server.release(conn.peer_host)

    def _refused_host(self, who: str, kind: str, reason: str) -> None:
        self.refusals[kind] += 1
        throttle = self._refusal_logs.setdefault(kind, LogThrottle(self._settings.limits.log_interval_s))
        suppressed = throttle.admit(time.monotonic())
        if suppressed is not None:
            log.warning("raft port %s closed a connection from %s [%s]: %s (%d similar not logged)",
                        self._settings.bind_address, who, kind, reason, suppressed)

    def stats(self) -> dict[str, Any]:
        server = self._server
        return {"accepted": self.accepted, "admitted": self.admitted, "refused": dict(self.refusals),
                "chunked_entries": self.chunked_entries,
                "connections": server.counts.total if server is not None else 0,
                "accept_failures": server.accept_failures if server is not None else 0,
                "bound": list(server.sockname() or ()) if server is not None else []}

    # -- admission -----------------------------------------------------------------------------------
    def _peer_identity_problem(self, conn: GuardedConnection, expected_index: int | None) -> str | None:
        s = self._settings
        try:
            identity = s.credentials.peer_member(conn.tls_object)
        except IdentityError as exc:
            return str(exc)
        problem = identity_problem(identity, s.cluster, s.controllers, s.self_index, expected_index)
        if problem is None:
            conn.identity = identity
        return problem

    def _verify_incoming(self, conn: GuardedConnection) -> str | None:
        return self._peer_identity_problem(conn, None)

    def addNode(self, node: Any) -> None:
        self._nodes.add(node)
        self._nodeAddrToNode[node.address] = node
        if self._shouldConnect(node):
            expected = self._settings.peer_index.get(node.address)
            conn = self._connection(self._settings.client_context, False,
                                    lambda c: self._peer_identity_problem(c, -1 if expected is None else expected),
                                    keepalive=self._syncObj.conf.tcp_keepalive)
            conn.encryptor = self._syncObj.encryptor
            conn.setOnConnectedCallback(functools.partial(self._onOutgoingConnected, conn))
            conn.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, node))
            conn.setOnDisconnectedCallback(functools.partial(self._onDisconnected, conn))
            self._connections[node] = conn

    def _onIncomingMessageReceived(self, conn: GuardedConnection, message: Any) -> None:
        if self._syncObj.encryptor and not conn.sendRandKey:
            if not (type(message) is bytes and len(message) == RAND_KEY_BYTES):
                self._unknownConnections.discard(conn)
                conn.refuse(Refusal.CLAIM, "the first message in development mode is a connection key")
                return
            conn.sendRandKey = message
            conn.recvRandKey = os.urandom(RAND_KEY_BYTES)
            conn.send(conn.recvRandKey)
            return
        problem = claim_problem(conn.identity, message, self._settings.controllers, self._nodeAddrToNode)
        if problem is not None:
            self._unknownConnections.discard(conn)
            conn.refuse(Refusal.CLAIM, problem)
            return
        node = self._nodeAddrToNode[message]
        conn.admit()
        self.admitted += 1
        self._unknownConnections.discard(conn)
        old = self._connections.get(node)
        self._connections[node] = conn
        conn.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, node))
        if old is not None and old is not conn:
            old.disconnect()  # the peer reconnected: its previous connection is stale
        self._onNodeConnected(node)

    def _onOutgoingConnected(self, conn: GuardedConnection) -> None:
        if not self._syncObj.encryptor:
            conn.admit()  # TLS: the handshake verified the controller this node dialed
            self.admitted += 1
        super()._onOutgoingConnected(conn)

    def _onOutgoingMessageReceived(self, conn: GuardedConnection, message: Any) -> None:
        if not (type(message) is bytes and len(message) == RAND_KEY_BYTES):
            conn.refuse(Refusal.CLAIM, "the peer's first message in development mode is a connection key")
            return
        conn.admit()
        self.admitted += 1
        super()._onOutgoingMessageReceived(conn, message)

    # -- admitted peers --------------------------------------------------------------------------------
    def _onMessageReceived(self, node: Any, message: Any) -> None:
        problem = message_problem(message)
        if problem is None and message["type"] == "append_entries" and "transmission" in message:
            message, problem = self._reassemble(node, message)
        if problem is not None:
            conn = self._connections.get(node)
            if conn is not None:
                conn.refuse(Refusal.MESSAGE, problem)
            return
        super()._onMessageReceived(node, message)

    def _reassemble(self, node: Any, message: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        """A chunk of a pickled entry: pysyncobj gets a plain ``append_entries`` with the decoded
        entry once it is whole, and an empty ``start`` chunk (it acknowledges without success)
        before."""
        buf = self._transmissions.get(node)
        if message["transmission"] == "start" or buf is None:
            buf = self._transmissions[node] = bytearray()
        buf += message["data"]
        if len(buf) > self._settings.limits.max_frame_bytes:
            del self._transmissions[node]
            return message, f"a chunked entry over {self._settings.limits.max_frame_bytes} bytes"
        waiting = {**message, "transmission": "start", "data": b""}
        if message["transmission"] != "finish":
            return waiting, None
        try:
            entry = decode_entry(bytes(buf))
        except UnsafePickle as exc:
            del self._transmissions[node]
            return message, f"a chunked entry refused: {exc}"
        except Exception:
            return waiting, None  # not whole yet: pysyncobj marked an earlier chunk as the finish
        del self._transmissions[node]
        self.chunked_entries += 1
        whole = {k: v for k, v in message.items() if k not in ("transmission", "data")}
        whole["entries"] = (entry,)
        return whole, message_problem(whole)

    def _onDisconnected(self, conn: GuardedConnection) -> None:
        node = self._connToNode(conn)
        if node is not None:
            self._transmissions.pop(node, None)
        super()._onDisconnected(conn)
