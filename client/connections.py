"""Authenticated connections to brokers' client ports (the client side; no Ray).

:class:`Dialer` opens one: TCP, TLS verifying that the server is a broker of the expected cluster
(``rocketray.tls.ClientTrust``), then the user's authentication. :class:`Connection` is shared by
every thread of a client: requests carry ids and a reader thread matches answers, so many sends and
held pulls are in flight on one socket at once; a connection that breaks fails every request in
flight with :class:`ConnectionLost` (it may have run). :class:`DirectConnection` is one thread's:
it sends one request and reads its answer itself (a synchronous send wakes no other thread).
"""

from __future__ import annotations

import concurrent.futures
import functools
import itertools
import logging
import os
import socket
import ssl
import threading
from dataclasses import dataclass
from typing import Callable

from rocketray.wire.client_frames import Frame, FrameDecoder, FrameType, WireError, encode_frame, unpack
from rocketray.client.errors import AuthenticationFailed
from rocketray.client.tls_stream import PlainStream, TlsStream
from rocketray.scram import NONCE_SIZE as SCRAM_NONCE_SIZE
from rocketray.scram import ClientState, ScramAuthError, ScramClient, ScramError, derive_keys
from rocketray.tls import ClientTrust

__all__ = ["AuthenticationFailed", "CONNECT_TIMEOUT_S", "Connection", "ConnectionLost", "Dialer", "DirectConnection",
           "user_login"]

log = logging.getLogger("rocketray.client")

CONNECT_TIMEOUT_S = 3.0
RECV_BYTES = 1 << 20


class ConnectionLost(Exception):
    pass


@dataclass(frozen=True)
class Dialer:
    """Opens an authenticated connection to a broker's client port: TCP, then TLS verifying the
    server is a broker of the cluster (``trust``; None: plain TCP, development mode), then the
    user's authentication. Returns the stream and the bytes that came after the exchange."""

    trust: ClientTrust | None
    authenticate: Callable[[PlainStream], bytes]
    timeout_s: float = CONNECT_TIMEOUT_S

    def dial(self, address: tuple[str, int]) -> tuple[PlainStream, bytes]:
        sock = socket.create_connection(address, timeout=self.timeout_s)
        stream: PlainStream | None = None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.trust is None:
                stream = PlainStream(sock)
            else:
                tls = TlsStream(sock, self.trust.context(), server_hostname=address[0])
                self.trust.check_broker(tls.ssl_object)
                stream = tls
            leftover = self.authenticate(stream)
            stream.settimeout(None)
            return stream, leftover
        except BaseException:
            (stream or PlainStream(sock)).close()
            raise



def user_login(user: str, secret: str) -> Callable[[PlainStream], bytes]:
    """The client side of the client port's SCRAM-SHA-256 login (``rocketray.scram``) as ``user``;
    the keys are derived once per salt and iteration count (PBKDF2 costs about 20 ms), not per
    connection. Raises :class:`AuthenticationFailed` when refused."""
    derive = functools.lru_cache(maxsize=8)(derive_keys)

    def run(stream: PlainStream) -> bytes:
        client = ScramClient(user, secret, os.urandom(SCRAM_NONCE_SIZE), derive=derive)
        try:
            while client.state not in (ClientState.DONE, ClientState.FAILED):
                out = client.data_to_send()
                if out:
                    stream.sendall(out)
                data = stream.recv(4096)
                if not data:    # the broker went away (a dying process): a lost connection, retried like one
                    raise ConnectionResetError("the broker closed the connection during authentication")
                client.receive_data(data)
        except ScramAuthError as exc:
            raise AuthenticationFailed(f"user {user!r}: {exc}") from None
        except ScramError as exc:
            raise ConnectionResetError(f"authentication failed: {exc}") from None
        out = client.data_to_send()
        if out:
            stream.sendall(out)
        return client.trailing_data

    return run


class Connection:
    """One authenticated connection to a broker's client port (thread-safe)."""

    def __init__(self, address: tuple[str, int], dialer: Dialer) -> None:
        self.address = address
        self._stream, leftover = dialer.dial(address)
        self._pending: dict[int, concurrent.futures.Future] = {}
        self._pending_lock = threading.Lock()
        self._ids = itertools.count(1)
        self.closed: str | None = None
        self._decoder = FrameDecoder()
        self._reader = threading.Thread(target=self._read_loop, args=(leftover,), name=f"rocketray-conn-{address[1]}",
                                        daemon=True)
        self._reader.start()

    def request(self, frame_type: FrameType, *body: bytes) -> concurrent.futures.Future:
        """Send one request; the future gives the answer :class:`Frame` or raises ConnectionLost."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        request_id = next(self._ids)
        with self._pending_lock:
            if self.closed is not None:
                fut.set_exception(ConnectionLost(self.closed))
                return fut
            self._pending[request_id] = fut
        try:
            buffers = encode_frame(frame_type, request_id, *body)
            if sum(len(b) for b in buffers) < 65536:
                self._stream.sendall(b"".join(buffers))
            else:
                self._stream.sendall(*buffers)
        except (OSError, ssl.SSLError, WireError) as exc:
            self.close(f"send failed: {exc!r}")
        return fut

    def _read_loop(self, leftover: bytes) -> None:
        data: bytes = leftover
        try:
            while True:
                for frame in self._decoder.feed(data):
                    self._deliver(frame)
                data = self._stream.recv(RECV_BYTES)
                if not data:
                    raise ConnectionLost("closed by the broker")
        except (OSError, ssl.SSLError, WireError, ConnectionLost) as exc:
            self.close(repr(exc))

    def _deliver(self, frame: Frame) -> None:
        if frame.type is FrameType.ERROR:
            reason = unpack(frame.body, "error")
            log.warning("client port %s refused a request: %s", self.address, reason)
        with self._pending_lock:
            fut = self._pending.pop(frame.request_id, None)
        if fut is not None and not fut.done():
            fut.set_result(frame)

    def close(self, reason: str) -> None:
        with self._pending_lock:
            if self.closed is not None:
                return
            self.closed = reason
            pending, self._pending = self._pending, {}
        self._stream.close()
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(ConnectionLost(reason))


class DirectConnection:
    """An authenticated connection that one thread at a time uses for one request and reads itself:
    no reader thread, so the answer to a synchronous send wakes the sending thread directly (the
    shared :class:`Connection` hands it over from its reader thread, one more thread wake-up)."""

    def __init__(self, address: tuple[str, int], dialer: Dialer) -> None:
        self.address = address
        self._stream, leftover = dialer.dial(address)
        self._decoder = FrameDecoder()
        self._frames = self._decoder.feed(leftover) if leftover else []
        self._ids = itertools.count(1)
        self._waiting: int | None = None
        self.closed: str | None = None

    def send(self, frame_type: FrameType, *body: bytes) -> None:
        """Send one request (the previous one was answered); raises ConnectionLost."""
        assert self._waiting is None, "one request at a time"
        self._waiting = next(self._ids)
        try:
            self._stream.settimeout(None)
            self._stream.sendall(b"".join(encode_frame(frame_type, self._waiting, *body)))
        except (OSError, ssl.SSLError, WireError) as exc:
            self.close(f"send failed: {exc!r}")
            raise ConnectionLost(self.closed) from None

    def receive(self, timeout_s: float) -> Frame | None:
        """The answer to the request sent, or None if it did not come within ``timeout_s``;
        raises ConnectionLost (the connection is then closed)."""
        try:
            while not self._frames:
                self._stream.settimeout(max(timeout_s, 1e-4))
                try:
                    data = self._stream.recv(RECV_BYTES)
                except TimeoutError:
                    return None
                if not data:
                    raise ConnectionLost("closed by the broker")
                self._frames = self._decoder.feed(data)
        except (OSError, ssl.SSLError, WireError, ConnectionLost) as exc:
            self.close(repr(exc))
            raise ConnectionLost(self.closed) from None
        frame = self._frames.pop(0)
        if frame.request_id != self._waiting or self._frames:
            self.close(f"answer {frame.request_id} to request {self._waiting}")
            raise ConnectionLost(self.closed)
        self._waiting = None
        return frame

    def close(self, reason: str) -> None:
        if self.closed is None:
            self.closed = reason
            self._stream.close()


