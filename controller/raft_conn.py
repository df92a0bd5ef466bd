"""GuardedConnection: one Raft peer connection, TLS inside pysyncobj's poller loop (shell).

Theory of operation. pysyncobj's ``TCPTransport`` drives connections through a small interface
(``connect``, ``send``, ``disconnect``, ``state``, three callbacks, and the ``encryptor`` /
``sendRandKey`` / ``recvRandKey`` attributes of its password mode). This class implements it over
a non-blocking socket on pysyncobj's poller, like its ``TcpConnection``, with three differences:

- **TLS over memory BIOs.** With a context (the member's TLS contexts, ``rocketray.tls``) the bytes
  of the socket go through an ``ssl.SSLObject``: the handshake advances as records arrive, never
  blocking the tick thread. An outgoing connection is ``CONNECTING`` until its handshake completed
  and ``verify_peer`` accepted the certificate's identity; only then does pysyncobj learn it is
  connected and send its first message (its address). An incoming one delivers nothing before its
  handshake and ``verify_peer`` completed.
- **Admission.** Until the transport calls ``admit()`` (its address claim checked,
  ``controller/raft_admission.py``) the connection may take ``handshake_timeout_s``, and never longer
  than pysyncobj's ``connectionTimeout`` (enforced by the transport's tick, since a silent peer
  produces no event) and ``handshake_max_bytes`` of raw input,
  in frames of at most ``handshake_max_frame``; past either it is closed. After admission frames
  may reach ``max_frame_bytes``.
- **The codec** of ``controller/raft_wire.py``: unsigned length checked at the prefix, msgpack
  bodies (Fernet tokens in development mode), nothing unpickled; output over ``max_unsent_bytes``
  (a peer that stopped reading) closes the connection.

A refused connection is reported to ``hooks.refused(conn, kind, reason)`` (the transport logs and
counts it) and closed; ``hooks.closed(conn)`` runs once per socket (the listener's counts).
"""

from __future__ import annotations

import hmac
import logging
import socket
import ssl
import time
from typing import Any, Callable, Protocol

from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import CONNECTION_STATE, _getAddrType, set_keepalive

from rocketray.controller.raft_admission import PortLimits, Refusal
from rocketray.controller.raft_wire import FrameReader, WireError, decode_message, encode_frame, encode_message
from rocketray.tls import Identity

log = logging.getLogger("rocketray.controller.raft")

__all__ = ["ConnectionHooks", "GuardedConnection"]

READ_PER_EVENT = 1 << 20          # raw bytes read per poll event; the rest waits for the next poll
_TLS_READ = 1 << 16


class ConnectionHooks(Protocol):
    def refused(self, conn: "GuardedConnection", kind: str, reason: str) -> None: ...

    def closed(self, conn: "GuardedConnection") -> None: ...


class GuardedConnection:
    """A drop-in for pysyncobj's ``TcpConnection`` (module docstring)."""

    def __init__(self, poller: Any, limits: PortLimits, hooks: ConnectionHooks, *,
                 context: ssl.SSLContext | None, server_side: bool, timeout: float,
                 send_buffer: int, recv_buffer: int, keepalive: tuple[int, int, int] | None = None,
                 verify_peer: Callable[["GuardedConnection"], str | None] | None = None,
                 sock: socket.socket | None = None, peer_host: str | None = None) -> None:
        self._poller = poller
        self._limits = limits
        self._hooks = hooks
        self._context = context
        self._server_side = server_side
        self._timeout = timeout
        self._send_buffer, self._recv_buffer = send_buffer, recv_buffer
        self._keepalive = keepalive
        self._verify_peer = verify_peer
        self.peer_host = peer_host
        self.encryptor: Any = None
        self._on_connected: Callable[[], Any] | None = None
        self._on_message: Callable[[Any], Any] | None = None
        self._on_disconnected: Callable[[], Any] | None = None
        self._sock: socket.socket | None = None
        self._fileno: int | None = None
        self._mask = 0
        self._counted = False
        self.state = CONNECTION_STATE.DISCONNECTED
        self._reset()
        if sock is not None:
            self._sock, self._fileno, self._counted = sock, sock.fileno(), True
            self.state = CONNECTION_STATE.CONNECTED
            self._start_tls()
            self._subscribe()

    def _reset(self) -> None:
        self.sendRandKey: bytes | None = None
        self.recvRandKey: bytes | None = None
        self.recvLastTimestamp = 0
        self.identity: Identity | None = None
        self.admitted = False
        self._reader = FrameReader(self._limits.handshake_max_frame)
        self._wbuf = bytearray()
        self._tls: ssl.SSLObject | None = None
        self._bio_in, self._bio_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls_ready = self._context is None
        now = time.monotonic()
        self._deadline = now + min(self._limits.handshake_timeout_s, self._timeout)
        self._seen = 0
        self._last_read = now

    # -- pysyncobj's TcpConnection interface ---------------------------------------------------------
    def setOnConnectedCallback(self, callback: Callable[[], Any] | None) -> None:
        self._on_connected = callback

    def setOnMessageReceivedCallback(self, callback: Callable[[Any], Any] | None) -> None:
        self._on_message = callback

    def setOnDisconnectedCallback(self, callback: Callable[[], Any] | None) -> None:
        self._on_disconnected = callback

    def fileno(self) -> int | None:
        return self._fileno

    @property
    def tls_object(self) -> ssl.SSLObject | None:
        return self._tls if self._tls_ready else None

    def connect(self, host: str | None, port: int) -> bool:
        if host is None:
            return False
        self.disconnect()
        self._reset()
        sock = socket.socket(_getAddrType(host), socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._send_buffer)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._recv_buffer)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._keepalive is not None:
            set_keepalive(sock, *self._keepalive)
        sock.setblocking(False)
        try:
            sock.connect((host, port))
        except BlockingIOError:
            pass
        except OSError:
            sock.close()
            return False
        self._sock, self._fileno, self.peer_host = sock, sock.fileno(), host
        self.state = CONNECTION_STATE.CONNECTING
        self._subscribe()
        return True

    def send(self, message: Any) -> None:
        if self.state != CONNECTION_STATE.CONNECTED or not self._tls_ready:
            return  # nothing may precede the handshake; pysyncobj sends only once connected
        if self.sendRandKey:
            message = (self.sendRandKey, message)
        body = encode_message(message)
        if self.encryptor is not None:
            body = self.encryptor.encrypt_at_time(body, int(time.monotonic()))
        if len(body) > self._limits.max_frame_bytes:
            log.error("raft message of %d bytes over raft_max_frame_bytes=%d not sent; closing the connection "
                      "to %s", len(body), self._limits.max_frame_bytes, self.peer_host)
            self.disconnect()
            return
        self._write(encode_frame(body))
        if len(self._wbuf) > self._limits.max_unsent_bytes:
            self.refuse(Refusal.SLOW, f"{len(self._wbuf)} bytes unsent: the peer stopped reading")
            return
        self._flush()

    def disconnect(self) -> None:
        notify = self._on_disconnected is not None and self.state != CONNECTION_STATE.DISCONNECTED
        if self._fileno is not None:
            self._poller.unsubscribe(self._fileno)
            self._fileno = None
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None
        if self._counted:
            self._counted = False
            self._hooks.closed(self)
        self._mask = 0
        self.state = CONNECTION_STATE.DISCONNECTED
        self._reset()
        if notify:
            assert self._on_disconnected is not None
            self._on_disconnected()

    # -- admission ---------------------------------------------------------------------------------
    def admit(self) -> None:
        """The transport accepted the peer: lift the handshake bounds."""
        self.admitted = True
        self._reader.max_frame = self._limits.max_frame_bytes

    def refuse(self, kind: str, reason: str) -> None:
        if self.state == CONNECTION_STATE.DISCONNECTED:
            return
        self._hooks.refused(self, kind, reason)
        self._flush_quietly()  # a TLS alert, if one is pending, tells the peer why
        self.disconnect()

    def expire(self, now: float) -> None:
        """Close a connection not admitted by its deadline (called on every tick)."""
        if not self.admitted and self.state != CONNECTION_STATE.DISCONNECTED and now > self._deadline:
            self.refuse(Refusal.TIMEOUT, "not admitted within "
                        f"{min(self._limits.handshake_timeout_s, self._timeout):g} s")

    # -- events ------------------------------------------------------------------------------------
    def _subscribe(self) -> None:
        mask = POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR
        if self._wbuf or self.state == CONNECTION_STATE.CONNECTING and self._tls is None:
            mask |= POLL_EVENT_TYPE.WRITE
        if mask != self._mask and self._fileno is not None:
            self._poller.subscribe(self._fileno, self._on_event, mask)
            self._mask = mask

    def _on_event(self, descr: int, event: int) -> None:
        if descr != self._fileno:
            self._poller.unsubscribe(descr)
            return
        if event & POLL_EVENT_TYPE.ERROR:
            self.disconnect()
            return
        now = time.monotonic()
        if now - self._last_read > self._timeout:
            self.disconnect()  # pysyncobj's connectionTimeout: nothing read for that long
            return
        self.expire(now)
        if self.state == CONNECTION_STATE.CONNECTING and self._tls is None:
            assert self._sock is not None
            if self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self.disconnect()
                return
            self._tcp_connected()
            return
        if event & POLL_EVENT_TYPE.WRITE:
            self._flush()
        if event & POLL_EVENT_TYPE.READ and self.state != CONNECTION_STATE.DISCONNECTED:
            self._read()

    def _tcp_connected(self) -> None:
        self._last_read = time.monotonic()
        if self._context is None:
            self._established()
        else:
            self._start_tls()
            self._advance_handshake()

    def _established(self) -> None:
        self.state = CONNECTION_STATE.CONNECTED
        self._subscribe()
        if self._on_connected is not None:
            self._on_connected()

    def _read(self) -> None:
        total = 0
        while total < READ_PER_EVENT and self._sock is not None:
            size = self._recv_buffer if self.admitted else \
                min(self._recv_buffer, self._limits.handshake_max_bytes - self._seen + 1)
            try:
                data = self._sock.recv(size)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.disconnect()
                return
            if not data:
                self.disconnect()
                return
            total += len(data)
            self._last_read = time.monotonic()
            if not self.admitted:
                self._seen += len(data)
            if not self._take(data):
                return
            if not self.admitted and self._seen > self._limits.handshake_max_bytes:
                self.refuse(Refusal.BUDGET, f"over {self._limits.handshake_max_bytes} bytes before admission")
                return

    def _take(self, data: bytes) -> bool:
        """Feed raw bytes; False once the connection closed."""
        if self._tls is not None:
            self._bio_in.write(data)
            if not self._tls_ready:
                self._advance_handshake()
                if self.state == CONNECTION_STATE.DISCONNECTED:
                    return False
                if not self._tls_ready:
                    return True
            plain = self._tls_read()
            if plain is None:
                return False
            data = plain
        self._reader.push(data)
        return self._deliver()

    def _deliver(self) -> bool:
        while self.state != CONNECTION_STATE.DISCONNECTED:
            try:
                body = self._reader.pop()
                if body is None:
                    return True
                message = self._decode(body)
            except WireError as exc:
                self.refuse(Refusal.FRAME, str(exc))
                return False
            if self._on_message is not None:
                self._on_message(message)
        return False

    def _decode(self, body: bytes) -> Any:
        if self.encryptor is not None:
            try:
                stamp = self.encryptor.extract_timestamp(body)  # verifies the token's HMAC
                body = self.encryptor.decrypt(body)
            except Exception:
                raise WireError("a frame not authenticated by the members' secret") from None
            if stamp < self.recvLastTimestamp:
                raise WireError("a frame older than the last one (replayed or reordered)")
            self.recvLastTimestamp = stamp
        message = decode_message(body)
        if self.recvRandKey:
            if not (type(message) is tuple and len(message) == 2 and type(message[0]) is bytes
                    and hmac.compare_digest(message[0], self.recvRandKey)):
                raise WireError("a frame without this connection's key (replayed from another)")
            message = message[1]
        return message

    # -- TLS -----------------------------------------------------------------------------------------
    def _start_tls(self) -> None:
        if self._context is None:
            return
        self._bio_in, self._bio_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = self._context.wrap_bio(self._bio_in, self._bio_out, server_side=self._server_side)
        self._tls_ready = False

    def _advance_handshake(self) -> None:
        assert self._tls is not None
        try:
            self._tls.do_handshake()
        except ssl.SSLWantReadError:
            self._pump_tls()
            self._flush()
            return
        except ssl.SSLError as exc:
            self._pump_tls()
            self.refuse(Refusal.TLS, f"TLS handshake failed: {exc.reason or exc}")
            return
        self._pump_tls()
        self._tls_ready = True
        problem = self._verify_peer(self) if self._verify_peer is not None else None
        if problem is not None:
            self.refuse(Refusal.IDENTITY, problem)
            return
        self._flush()
        if not self._server_side and self.state == CONNECTION_STATE.CONNECTING:
            self._established()

    def _tls_read(self) -> bytes | None:
        assert self._tls is not None
        chunks = []
        while True:
            try:
                chunk = self._tls.read(_TLS_READ)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                self.disconnect()
                return None
            except ssl.SSLError as exc:
                self.refuse(Refusal.TLS, f"TLS record refused: {exc.reason or exc}")
                return None
            if not chunk:
                break
            chunks.append(chunk)
        self._pump_tls()  # TLS 1.3 may answer (key updates, tickets)
        self._flush()
        return b"".join(chunks)

    def _pump_tls(self) -> None:
        if self._bio_out.pending:
            self._wbuf += self._bio_out.read()

    def _write(self, frame: bytes) -> None:
        if self._tls is None:
            self._wbuf += frame
        else:
            self._tls.write(frame)
            self._pump_tls()

    # -- output --------------------------------------------------------------------------------------
    def _flush(self) -> None:
        if time.monotonic() - self._last_read > self._timeout:
            self.disconnect()  # as pysyncobj: a send finds a connection silent for connectionTimeout
            return
        self._flush_quietly()
        if self.state != CONNECTION_STATE.DISCONNECTED:
            self._subscribe()

    def _flush_quietly(self) -> None:
        while self._wbuf and self._sock is not None:
            try:
                sent = self._sock.send(self._wbuf)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.disconnect()
                return
            if sent <= 0:
                return
            del self._wbuf[:sent]
