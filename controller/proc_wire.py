"""The chaos runner's wire to a controller node process (``rocketray.controller.proc``), and its client.

A connection opens with the server's 32-byte nonce; then one frame per request and per response::

    u32 big-endian length of the rest | 32-byte tag | u64 big-endian sequence | msgpack body

The tag is HMAC-SHA256(secret, label | nonce | sequence | body), label ``b"req"`` or ``b"resp"``,
so a response cannot be replayed as a request, a frame of another connection (another nonce)
is worthless here, and the requests of one connection carry the sequence numbers 1, 2, 3, ... in
order (a replayed or reordered frame is refused); a response repeats its request's number. The
length is checked before anything is buffered (``MAX_REQUEST_BYTES`` for a request: requests are
small), the tag before the body is decoded. A node gives a connection ``PREAUTH_TIMEOUT_S`` for
its first frame and ``IDLE_TIMEOUT_S`` between frames, and holds at most ``MAX_CONNECTIONS``. A bad
frame closes its connection and nothing else. Nothing is pickled.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import os
import socket
import struct
from typing import Any, Callable

import msgpack

__all__ = ["FRAME_HEADER", "Lost", "MAX_CONNECTIONS", "MAX_FRAME_BYTES", "MAX_REQUEST_BYTES", "NONCE_BYTES",
           "NOT_LEADER", "NodeClient", "NotSent", "ProtocolError", "REQ", "RESP", "Sealer", "TAG_BYTES",
           "serve_connection"]

FRAME_HEADER = struct.Struct(">I")
SEQ = struct.Struct(">Q")
TAG_BYTES = 32
NONCE_BYTES = 32
MAX_FRAME_BYTES = 4 * 1024 * 1024        # a response (read by the runner)
MAX_REQUEST_BYTES = 64 * 1024            # a request (read by a node, before its tag is checked)
PREAUTH_TIMEOUT_S = 5.0
IDLE_TIMEOUT_S = 300.0
MAX_CONNECTIONS = 64
REQ, RESP = b"req", b"resp"
NOT_LEADER = 2007


class ProtocolError(Exception):
    """A malformed, unauthenticated, replayed or reordered frame: close the connection."""


def _plain(value: Any) -> Any:
    """msgpack ``default``: sets as sorted lists, dataclasses as maps, anything else as str."""
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)


class Sealer:
    """One connection's frames (pure): seals and opens them under its nonce and sequence numbers."""

    def __init__(self, secret: bytes, nonce: bytes) -> None:
        if not secret:
            raise ValueError("the node port needs a secret")
        if len(nonce) != NONCE_BYTES:
            raise ValueError("a nonce is 32 bytes")
        self._secret, self._nonce = secret, nonce

    def _tag(self, label: bytes, seq: bytes, payload: bytes) -> bytes:
        return hmac.new(self._secret, label + self._nonce + seq + payload, hashlib.sha256).digest()

    def seal(self, label: bytes, seq: int, body: dict[str, Any]) -> bytes:
        payload = msgpack.packb(body, default=_plain, use_bin_type=True)
        packed = SEQ.pack(seq)
        return FRAME_HEADER.pack(TAG_BYTES + SEQ.size + len(payload)) + self._tag(label, packed, payload) + packed + payload

    def open(self, label: bytes, expected_seq: int, data: bytes) -> dict[str, Any]:
        """The body of a frame's rest (after its length); ProtocolError unless its tag is good and
        its sequence number is ``expected_seq``."""
        if len(data) < TAG_BYTES + SEQ.size:
            raise ProtocolError("frame too short")
        tag, packed, payload = data[:TAG_BYTES], data[TAG_BYTES:TAG_BYTES + SEQ.size], data[TAG_BYTES + SEQ.size:]
        if not hmac.compare_digest(tag, self._tag(label, packed, payload)):
            raise ProtocolError("bad frame tag")
        (seq,) = SEQ.unpack(packed)
        if seq != expected_seq:
            raise ProtocolError(f"sequence {seq}, expected {expected_seq} (a replayed or reordered frame)")
        try:
            body = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        except Exception as exc:  # noqa: BLE001 - any decode failure is the peer's fault
            raise ProtocolError(f"undecodable body: {exc}") from exc
        if not isinstance(body, dict):
            raise ProtocolError("body is not a map")
        return body


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 16))
        if not chunk:
            raise ConnectionError("peer closed the connection")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _read_rest(sock: socket.socket, max_bytes: int) -> bytes:
    (length,) = FRAME_HEADER.unpack(_recv_exactly(sock, FRAME_HEADER.size))
    if length < TAG_BYTES + SEQ.size or length > max_bytes:
        raise ProtocolError(f"frame length {length} out of range")
    return _recv_exactly(sock, length)


def serve_connection(sock: socket.socket, secret: bytes, dispatch: Callable[[str, dict[str, Any]], Any],
                     log_error: Callable[[str], None] = lambda message: None) -> None:
    """A node's side of one connection, until it ends (module docstring); ``dispatch(op, args)``
    answers a request (its exception is the answer's ``error``)."""
    nonce = os.urandom(NONCE_BYTES)
    sealer = Sealer(secret, nonce)
    seq = 0
    try:
        sock.settimeout(PREAUTH_TIMEOUT_S)
        sock.sendall(nonce)
        while True:
            msg = sealer.open(REQ, seq + 1, _read_rest(sock, MAX_REQUEST_BYTES))
            seq += 1
            sock.settimeout(IDLE_TIMEOUT_S)
            reply: dict[str, Any] = {"id": msg.get("id")}
            try:
                reply["result"] = dispatch(str(msg.get("op")), msg.get("args") or {})
            except Exception as exc:  # noqa: BLE001 - reported to the caller, the server keeps going
                reply["error"] = f"{type(exc).__name__}: {exc}"
                log_error(f"op {msg.get('op')} failed: {reply['error']}")
            sock.sendall(sealer.seal(RESP, seq, reply))
    except ProtocolError as exc:
        log_error(f"closing a runner connection: {exc}")
    except (OSError, ConnectionError, struct.error):
        return


# -- client side ----------------------------------------------------------------------------------

class NotSent(Exception):
    """The request never fully left this process: it definitely had no effect."""


class Lost(Exception):
    """The request was sent but no answer came back: its outcome is unknown."""


class NodeClient:
    """A blocking connection to one node process; reconnects after any failure."""

    def __init__(self, host: str, port: int, secret: bytes, connect_timeout_s: float = 1.0) -> None:
        self.host, self.port, self.secret = host, port, secret
        self.connect_timeout_s = connect_timeout_s
        self._sock: socket.socket | None = None
        self._sealer: Sealer | None = None
        self._seq = 0
        self._next_id = 0

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None
                self._sealer = None

    def _connect(self) -> tuple[socket.socket, Sealer]:
        sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout_s)
        try:
            nonce = _recv_exactly(sock, NONCE_BYTES)
        except BaseException:
            sock.close()
            raise
        self._sock, self._sealer, self._seq = sock, Sealer(self.secret, nonce), 0
        return sock, self._sealer

    def call(self, op: str, args: dict[str, Any] | None = None, timeout_s: float = 5.0) -> Any:
        self._next_id += 1
        try:
            if self._sock is None or self._sealer is None:
                sock, sealer = self._connect()
            else:
                sock, sealer = self._sock, self._sealer
            self._seq += 1
            frame = sealer.seal(REQ, self._seq, {"id": self._next_id, "op": op, "args": args or {}})
            sock.settimeout(timeout_s)
            sock.sendall(frame)
        except OSError as exc:
            self.close()
            raise NotSent(str(exc)) from exc
        try:
            reply = sealer.open(RESP, self._seq, _read_rest(sock, MAX_FRAME_BYTES))
        except (OSError, ConnectionError, ProtocolError, struct.error) as exc:
            self.close()
            raise Lost(f"{type(exc).__name__}: {exc}") from exc
        if reply.get("id") != self._next_id:
            self.close()
            raise Lost(f"reply id {reply.get('id')} != {self._next_id}")
        if reply.get("error"):
            raise RuntimeError(f"node error on {op}: {reply['error']}")
        return reply.get("result")
