"""An asyncio listener that is a border: counted connections, TLS before any byte is read, a deadline.

``start_listener(handler, host, port, border=..., ssl_context=...)`` is ``asyncio.start_server``
with three differences. Each accepted connection is first counted by its listener's
:class:`~rocketray.border.Border` (refused at once, before any read, when the listener or the
peer's address is full), and released when the handler returns. With a TLS context the handshake
runs on the raw connection before the handler sees it (``loop.start_tls`` from the first byte: a
``StreamReader`` that read the peer's hello first would leave it where TLS never finds it), and
must finish within ``handshake_timeout_s``. The handler then gets a ``StreamReader``/``StreamWriter``
pair over the (TLS) transport, exactly as ``start_server`` gives one.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Awaitable, Callable

from rocketray.border import Border

__all__ = ["start_listener"]

log = logging.getLogger(__name__)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class _Gate(asyncio.Protocol):
    """The raw connection's first protocol: count it, stop reading, hand it to ``_run``."""

    def __init__(self, run: Callable[[asyncio.Transport, str], Awaitable[None]], border: Border) -> None:
        self._run = run
        self._border = border

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        ip = self._border.admit(transport.get_extra_info("peername"))
        if ip is None:
            transport.abort()
            return
        transport.pause_reading()      # nothing is read until TLS (or the stream) takes the transport
        asyncio.get_running_loop().create_task(self._run(transport, ip))

    def data_received(self, data: bytes) -> None:   # reading is paused from connection_made on
        raise AssertionError("the gate never reads")


async def start_listener(handler: Handler, host: str, port: int, *, border: Border,
                         ssl_context: ssl.SSLContext | None, handshake_timeout_s: float,
                         limit: int = 1 << 16, reuse_address: bool = True) -> asyncio.AbstractServer:
    """Listen on ``host:port`` (module docstring); returns the server."""
    loop = asyncio.get_running_loop()

    async def run(transport: asyncio.Transport, ip: str) -> None:
        reader = asyncio.StreamReader(limit=limit)
        protocol = asyncio.StreamReaderProtocol(reader)
        try:
            if ssl_context is not None:
                try:
                    tls = await asyncio.wait_for(
                        loop.start_tls(transport, protocol, ssl_context, server_side=True,
                                       ssl_handshake_timeout=handshake_timeout_s), handshake_timeout_s)
                except (ssl.SSLError, OSError, ConnectionError, asyncio.TimeoutError) as exc:
                    border.handshake_failures += 1
                    border.log.log(logging.WARNING, "tls", "%s: TLS handshake with %s failed: %s", border.name,
                                   transport.get_extra_info("peername"), exc or type(exc).__name__)
                    transport.abort()
                    return
                if tls is None:         # the peer went away during the handshake
                    border.handshake_failures += 1
                    transport.abort()
                    return
                transport = tls
                protocol.connection_made(transport)
            else:
                transport.set_protocol(protocol)
                protocol.connection_made(transport)
                transport.resume_reading()
            writer = asyncio.StreamWriter(transport, protocol, reader, loop)
            try:
                await handler(reader, writer)
            finally:
                if not transport.is_closing():
                    transport.close()
        except Exception:  # noqa: BLE001 - one connection's failure; the listener keeps serving
            log.exception("%s: connection handler failed", border.name)
            transport.abort()
        finally:
            border.release(ip)

    return await loop.create_server(lambda: _Gate(run, border), host, port, reuse_address=reuse_address)
