"""A blocking TLS stream that one thread may read while others write (the client's broker connections).

``ssl.SSLSocket`` must not be read on one thread while another writes it (one OpenSSL object, no
lock of its own). :class:`TlsStream` drives an ``ssl.SSLObject`` over memory BIOs on a plain
blocking socket instead: encryption and decryption each take the object's lock for the
microseconds they last, never across a blocking socket call; everything the object produced
leaves through :meth:`sendall`'s lock in the order it was produced (a record the reading side
produced, such as a key-update answer, waits in the outgoing BIO for the next sender, which sends it
before its own). :class:`PlainStream` is the same interface without TLS (development mode).
"""

from __future__ import annotations

import socket
import ssl
import threading

__all__ = ["TlsStream", "PlainStream", "Stream"]

RECV_BYTES = 1 << 20
CIPHER_CHUNK = 256 << 10    # ciphertext taken from the socket per receive


class PlainStream:
    """A plain TCP connection behind the stream interface."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._send_lock = threading.Lock()

    def sendall(self, *buffers: bytes | memoryview) -> None:
        with self._send_lock:
            for b in buffers:
                self.sock.sendall(b)

    def recv(self, max_bytes: int = RECV_BYTES) -> bytes:
        """Up to ``max_bytes`` bytes; b"" at the end of the stream."""
        return self.sock.recv(max_bytes)

    def settimeout(self, timeout_s: float | None) -> None:
        self.sock.settimeout(timeout_s)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class TlsStream(PlainStream):
    """A client-side TLS stream over ``sock`` (module docstring); the handshake runs in the
    constructor (bounded by the socket's timeout)."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext, server_hostname: str | None = None) -> None:
        super().__init__(sock)
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._obj = context.wrap_bio(self._in, self._out, server_side=False, server_hostname=server_hostname)
        self._lock = threading.Lock()
        # Preallocated: ``SSLObject.read(n)`` and ``socket.recv(n)`` allocate ``n`` bytes per call, and
        # a receive here asks for up to a MiB (9 us a call on the reference VM, four calls a request).
        self._cipher = bytearray(CIPHER_CHUNK)     # ciphertext from the socket (reading thread only)
        self._clear = bytearray(RECV_BYTES)        # plaintext out of the TLS object (under the lock)
        while True:
            try:
                self._obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush()
                data = sock.recv(RECV_BYTES)
                if not data:
                    raise ConnectionResetError("the server closed the connection during the TLS handshake")
                self._in.write(data)
        self._flush()

    @property
    def ssl_object(self) -> ssl.SSLObject:
        return self._obj

    def _flush(self) -> None:
        """Send whatever the TLS object produced (call with the send lock, or before others run)."""
        data = self._out.read()
        if data:
            self.sock.sendall(data)

    def sendall(self, *buffers: bytes | memoryview) -> None:
        with self._send_lock:
            with self._lock:
                for b in buffers:
                    view = memoryview(b)
                    while view:
                        n = self._obj.write(view)
                        view = view[n:]
                data = self._out.read()
            self.sock.sendall(data)

    def recv(self, max_bytes: int = RECV_BYTES) -> bytes:
        cipher = memoryview(self._cipher)
        while True:
            with self._lock:
                chunk = self._decrypt(max_bytes)
                produced = self._out.pending > 0
            if produced:
                with self._send_lock:
                    with self._lock:
                        data = self._out.read()
                    if data:
                        self.sock.sendall(data)
            if chunk is not None:
                return chunk
            n = self.sock.recv_into(cipher)
            if not n:
                return b""
            with self._lock:
                self._in.write(cipher[:n])

    def _decrypt(self, max_bytes: int) -> bytes | None:
        """Plaintext now available (None: more ciphertext is needed); b"" at the peer's close_notify
        (``SSLObject.read`` returns 0 there). Reads only while the TLS object holds ciphertext or
        plaintext (a read with neither only raises ``SSLWantReadError``)."""
        obj, clear = self._obj, memoryview(self._clear)
        limit = min(max_bytes, len(clear))
        got, closed = 0, False
        try:
            while got < limit and (self._in.pending or obj.pending()):
                n = obj.read(limit - got, clear[got:])
                if not n:
                    closed = True
                    break
                got += n
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLZeroReturnError:
            closed = True
        if not got:
            return b"" if closed else None
        return bytes(clear[:got])


Stream = PlainStream
