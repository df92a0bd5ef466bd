"""The chaos runner's wire to a controller node process (``rocketray.controller.proc``), and its client.

One frame per request and per response, both directions alike::

    u32 big-endian length of the rest | 32-byte HMAC-SHA256 tag | msgpack body

The tag is HMAC-SHA256(secret, label + body) with label ``b"req"`` or ``b"resp"`` so a response
cannot be replayed as a request. A frame with a bad tag, an oversize length or an undecodable body
closes the connection and nothing else. Nothing is pickled.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import socket
import struct
from typing import Any

import msgpack

__all__ = ["FRAME_HEADER", "Lost", "MAX_FRAME_BYTES", "NOT_LEADER", "NodeClient", "NotSent", "ProtocolError",
           "REQ", "RESP", "TAG_BYTES", "encode_frame", "read_frame"]

FRAME_HEADER = struct.Struct(">I")
TAG_BYTES = 32
MAX_FRAME_BYTES = 4 * 1024 * 1024
REQ, RESP = b"req", b"resp"
NOT_LEADER = 2007


class ProtocolError(Exception):
    """A malformed or unauthenticated frame: close the connection."""


def _plain(value: Any) -> Any:
    """msgpack ``default``: sets as sorted lists, dataclasses as maps, anything else as str."""
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)


def encode_frame(secret: bytes, label: bytes, body: dict[str, Any]) -> bytes:
    payload = msgpack.packb(body, default=_plain, use_bin_type=True)
    tag = hmac.new(secret, label + payload, hashlib.sha256).digest()
    return FRAME_HEADER.pack(TAG_BYTES + len(payload)) + tag + payload


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(n - got)
        if not chunk:
            raise ConnectionError("peer closed the connection")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_frame(sock: socket.socket, secret: bytes, label: bytes) -> dict[str, Any]:
    """Read one frame; ``ProtocolError`` on a bad one, ``ConnectionError``/``OSError`` on IO."""
    (length,) = FRAME_HEADER.unpack(_recv_exactly(sock, FRAME_HEADER.size))
    if length < TAG_BYTES or length > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame length {length} out of range")
    data = _recv_exactly(sock, length)
    tag, payload = data[:TAG_BYTES], data[TAG_BYTES:]
    if not hmac.compare_digest(tag, hmac.new(secret, label + payload, hashlib.sha256).digest()):
        raise ProtocolError("bad frame tag")
    try:
        body = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # noqa: BLE001 - any decode failure is the peer's fault
        raise ProtocolError(f"undecodable body: {exc}") from exc
    if not isinstance(body, dict):
        raise ProtocolError("body is not a map")
    return body


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
        self._next_id = 0

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None

    def call(self, op: str, args: dict[str, Any] | None = None, timeout_s: float = 5.0) -> Any:
        self._next_id += 1
        frame = encode_frame(self.secret, REQ, {"id": self._next_id, "op": op, "args": args or {}})
        try:
            if self._sock is None:
                self._sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout_s)
            self._sock.settimeout(timeout_s)
            self._sock.sendall(frame)
        except OSError as exc:
            self.close()
            raise NotSent(str(exc)) from exc
        try:
            reply = read_frame(self._sock, self.secret, RESP)
        except (OSError, ConnectionError, ProtocolError, struct.error) as exc:
            self.close()
            raise Lost(f"{type(exc).__name__}: {exc}") from exc
        if reply.get("id") != self._next_id:
            self.close()
            raise Lost(f"reply id {reply.get('id')} != {self._next_id}")
        if reply.get("error"):
            raise RuntimeError(f"node error on {op}: {reply['error']}")
        return reply.get("result")
