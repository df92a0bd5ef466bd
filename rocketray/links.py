"""Connections between members (broker sessions to a controller, HA replication): TLS, identity, secret.

Theory of operation. Members reach each other on the controller's session port and the brokers'
HA ports. Both ends run, within one pre-authentication deadline:

1. TLS (unless development mode turned it off): mutual, with the member certificates of
   ``rocketray.tls``; the peer's chain must end at a trusted CA and its certificate must name a
   member of this cluster (:class:`~rocketray.tls.Identity`), which the listener then checks
   against what the peer says (its session hello, its slave id);
2. the members' secret exchange of ``rocketray.auth`` (under the port's label), which proves
   membership again inside the channel and is what authenticates members when TLS is off.

Nothing of the port's own protocol is read before both succeed. Applications never hold
:class:`~rocketray.tls.MemberCredentials`, so they cannot open these ports.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from dataclasses import dataclass, field

from rocketray.auth import AuthError, authenticate, authenticate_blocking
from rocketray.tls import Identity, IdentityError, MemberCredentials

__all__ = ["MemberLinks", "Peer", "LinkRefused"]

log = logging.getLogger(__name__)


class LinkRefused(Exception):
    """The peer is not a member of this cluster (TLS, identity or secret failed); the message says which."""


@dataclass(frozen=True, slots=True)
class Peer:
    """An authenticated member on the other end: its identity (None without TLS: the secret
    proves membership, not which member) and the bytes that arrived after the exchange."""

    identity: Identity | None
    leftover: bytes


@dataclass(frozen=True)
class MemberLinks:
    """How this member accepts and opens member connections (module docstring)."""

    credentials: MemberCredentials
    tls: bool = True
    preauth_timeout_ms: int = 5000
    _server_ctx: ssl.SSLContext | None = field(default=None, init=False, repr=False, compare=False)
    _client_ctx: ssl.SSLContext | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.tls:
            object.__setattr__(self, "_server_ctx", self.credentials.server_context())
            object.__setattr__(self, "_client_ctx", self.credentials.client_context())

    @property
    def identity(self) -> Identity:
        return self.credentials.identity

    @property
    def secret(self) -> str:
        return self.credentials.secret

    @property
    def server_context(self) -> ssl.SSLContext | None:
        """The listener's TLS context (``rocketray.listener.start_listener``); None without TLS."""
        return self._server_ctx

    async def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, label: bytes) -> Peer:
        """Server side of a new connection whose TLS handshake (with ``server_context``) is done:
        the peer's identity, then the members' secret; raises LinkRefused (the caller closes it)."""
        identity = None
        if self._server_ctx is not None:
            try:
                identity = self.credentials.peer_member(writer.get_extra_info("ssl_object"))
            except IdentityError as exc:
                raise LinkRefused(f"TLS: {exc}") from None
        try:
            leftover = await authenticate(reader, writer, "server", self.secret, self.preauth_timeout_ms, label)
        except (AuthError, ConnectionError, OSError, asyncio.IncompleteReadError) as exc:
            raise LinkRefused(f"members' secret: {exc}") from None
        return Peer(identity, leftover)

    def connect_blocking(self, host: str, port: int, label: bytes) -> tuple[socket.socket, Peer]:
        """:meth:`connect` on a blocking socket (for a thread that then owns it: the HA slave's
        receive thread). The socket is returned with no timeout set."""
        timeout_s = self.preauth_timeout_ms / 1000
        sock: socket.socket = socket.create_connection((host, port), timeout=timeout_s)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            identity = None
            if self._client_ctx is not None:
                try:
                    sock = self._client_ctx.wrap_socket(sock, server_hostname=host)
                    identity = self.credentials.peer_member(sock)
                except (ssl.SSLError, IdentityError) as exc:
                    raise LinkRefused(f"TLS: {exc}") from None
            try:
                leftover = authenticate_blocking(sock, "client", self.secret, label)
            except AuthError as exc:
                raise LinkRefused(f"members' secret: {exc}") from None
            sock.settimeout(None)
            return sock, Peer(identity, leftover)
        except BaseException:
            sock.close()
            raise

    async def connect(self, host: str, port: int, label: bytes, *,
                      limit: int = 1 << 16) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, Peer]:
        """Open a member connection to ``host:port``; raises LinkRefused or OSError/TimeoutError."""
        timeout_s = self.preauth_timeout_ms / 1000
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, limit=limit, ssl=self._client_ctx,
                                    server_hostname=host if self._client_ctx is not None else None,
                                    ssl_handshake_timeout=timeout_s if self._client_ctx is not None else None),
            timeout_s)
        try:
            identity = None
            if self._client_ctx is not None:
                try:
                    identity = self.credentials.peer_member(writer.get_extra_info("ssl_object"))
                except IdentityError as exc:
                    raise LinkRefused(f"TLS: {exc}") from None
            try:
                leftover = await authenticate(reader, writer, "client", self.secret, self.preauth_timeout_ms, label)
            except AuthError as exc:
                raise LinkRefused(f"members' secret: {exc}") from None
            return reader, writer, Peer(identity, leftover)
        except BaseException:
            writer.close()
            raise
