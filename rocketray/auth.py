"""Mutual challenge/response authentication with the members' secret (sans-IO core + asyncio helper).

Theory of operation. The HA port streams a replica's whole commit log and accepts data that will be
written into a store, and the controller's broker-session port can trigger elections, so on both
both ends prove they know the members' secret before any protocol byte flows. Each side sends a hello with a fresh 32-byte nonce; the client (slave) then proves itself
with ``HMAC-SHA256(secret, label | "C" | client_nonce | server_nonce)``; only after checking it does
the server (master) answer with its own proof over ``"S" | server_nonce | client_nonce``, which the
client checks. The role letter stops a peer from reflecting one side's proof back at it, the fresh
nonces stop replays, and the server reveals nothing keyed before the client has proved itself.

    client -> server  hello   "RRHA" version(1) role(1)='C' nonce(32)       38 bytes
    server -> client  hello   "RRHA" version(1) role(1)='S' nonce(32)       38 bytes
    client -> server  proof   HMAC(client)                                  32 bytes
    server -> client  proof   HMAC(server)                                  32 bytes

Each protocol proves over its own ``label`` (``HA_LABEL``, ``SESSION_LABEL``), so a proof made for one port is
worthless on the other. This is the members' exchange (inside TLS: ``rocketray.links``); applications
authenticate as users with ``rocketray.scram`` instead. After the exchange the HA connection carries exactly the
layouts of reference section 11, the session connection ``rocketray.controller.session`` frames.
Nonces are injected (``authenticate`` passes ``os.urandom(32)``); comparisons are constant-time.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import socket

__all__ = ["AuthError", "Authenticator", "HA_LABEL", "NONCE_SIZE", "HELLO_SIZE", "PROOF_SIZE", "SESSION_LABEL",
           "authenticate", "authenticate_blocking"]

MAGIC = b"RRHA"
VERSION = 1
NONCE_SIZE = 32
HELLO_SIZE = len(MAGIC) + 2 + NONCE_SIZE
PROOF_SIZE = 32
HA_LABEL = b"rocketray-ha-auth-v1|"
SESSION_LABEL = b"rocketray-controller-session-v1|"


class AuthError(Exception):
    """The peer failed authentication (wrong secret, wrong role, garbage)."""


def _proof(secret: bytes, label: bytes, role: bytes, own_nonce: bytes, peer_nonce: bytes) -> bytes:
    return hmac.new(secret, label + role + own_nonce + peer_nonce, hashlib.sha256).digest()


class Authenticator:
    """One side of the exchange. Feed received bytes, send what ``data_to_send()`` returns,
    until ``done`` (or AuthError). Bytes received beyond the exchange are kept in ``leftover``."""

    def __init__(self, role: str, secret: bytes | str, nonce: bytes, label: bytes = HA_LABEL) -> None:
        assert role in ("client", "server")
        assert label in (HA_LABEL, SESSION_LABEL)
        if isinstance(secret, str):
            secret = secret.encode()
        if not secret:
            raise ValueError("the HA secret must not be empty")
        assert len(nonce) == NONCE_SIZE
        self._secret = secret
        self._label = label
        self._is_client = role == "client"
        self._role = b"C" if self._is_client else b"S"
        self._peer_role = b"S" if self._is_client else b"C"
        self._nonce = nonce
        self._peer_nonce: bytes | None = None
        self._buf = bytearray()
        self._out = bytearray(MAGIC + bytes([VERSION]) + self._role + nonce)
        self._peer_proved = False
        self._sent_proof = False
        self.done = False

    def data_to_send(self) -> bytes:
        out = bytes(self._out)
        self._out.clear()
        return out

    @property
    def leftover(self) -> bytes:
        """Bytes that arrived after the exchange finished (the first HA packets)."""
        return bytes(self._buf) if self.done else b""

    def receive_data(self, data: bytes) -> None:
        if self.done:
            self._buf += data
            return
        self._buf += data
        self._advance()

    def _advance(self) -> None:
        if self._peer_nonce is None:
            if len(self._buf) < HELLO_SIZE:
                if not MAGIC.startswith(bytes(self._buf[:len(MAGIC)])):
                    raise AuthError("peer did not open with the rocketray HA hello")
                return
            hello = bytes(self._buf[:HELLO_SIZE])
            del self._buf[:HELLO_SIZE]
            if hello[:4] != MAGIC:
                raise AuthError("peer did not open with the rocketray HA hello")
            if hello[4] != VERSION:
                raise AuthError(f"unsupported auth version {hello[4]}")
            if hello[5:6] != self._peer_role:
                raise AuthError(f"peer claims role {hello[5:6]!r}, expected {self._peer_role!r}")
            self._peer_nonce = hello[6:]
            if self._peer_nonce == self._nonce:
                raise AuthError("peer echoed our nonce")
            if self._is_client:
                self._send_proof()
        if len(self._buf) < PROOF_SIZE:
            return
        proof = bytes(self._buf[:PROOF_SIZE])
        del self._buf[:PROOF_SIZE]
        expected = _proof(self._secret, self._label, self._peer_role, self._peer_nonce, self._nonce)
        if not hmac.compare_digest(proof, expected):
            raise AuthError("peer's proof does not match the members' secret")
        self._peer_proved = True
        if not self._is_client:
            self._send_proof()
        self.done = True

    def _send_proof(self) -> None:
        assert self._peer_nonce is not None and not self._sent_proof
        self._sent_proof = True
        self._out += _proof(self._secret, self._label, self._role, self._nonce, self._peer_nonce)


def authenticate_blocking(sock: socket.socket, role: str, secret: bytes | str, label: bytes = HA_LABEL) -> bytes:
    """The exchange on a blocking socket (its timeout bounds each step); returns bytes that arrived
    after it. A peer that closes midway is a ConnectionResetError (a dying process), not AuthError."""
    auth = Authenticator(role, secret, os.urandom(NONCE_SIZE), label)
    while True:
        out = auth.data_to_send()
        if out:
            sock.sendall(out)
        if auth.done:
            return auth.leftover
        data = sock.recv(4096)
        if not data:
            raise ConnectionResetError("the peer closed the connection during authentication")
        auth.receive_data(data)


async def authenticate(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, role: str,
                       secret: bytes | str, timeout_ms: int, label: bytes = HA_LABEL) -> bytes:
    """Run the mutual challenge/response on a stream; returns bytes that arrived after it."""
    auth = Authenticator(role, secret, os.urandom(NONCE_SIZE), label)

    async def exchange() -> bytes:
        while True:
            out = auth.data_to_send()
            if out:
                writer.write(out)
                await writer.drain()
            if auth.done:
                return auth.leftover
            data = await reader.read(4096)
            if not data:
                raise AuthError("peer closed during authentication")
            auth.receive_data(data)

    try:
        return await asyncio.wait_for(exchange(), timeout_ms / 1000)
    except asyncio.TimeoutError:
        raise AuthError(f"authentication did not finish within {timeout_ms} ms") from None
