"""Reads of an authenticated stream handed straight to a handler (an asyncio shell).

Theory of operation. ``asyncio.start_server`` gives a connection a ``StreamReader``; the
authentication (``rocketray.auth``) runs on it. After that the data path of a connection whose
every read is handled at once (the master's slave connections: acks; the client port: puts and
pulls) does not need the reader: each ``await reader.read()`` costs a second loop pass per read,
one for the transport's callback that buffers the bytes and wakes the task, one for the task.
``DirectReads`` becomes the transport's protocol and calls ``on_data(bytes)`` from the
transport's own read event. It is a ``BufferedProtocol``: the transport reads into one buffer the
connection keeps (a plain socket's ``recv_into``, a TLS object's ``read`` into it) instead of
allocating its maximum read size (256 KiB) for every read, which costs more than the read itself
for a small request. Flow control (``pause_writing``/``resume_writing``) and the
connection's loss still reach the stream protocol the ``StreamWriter`` drains on, so
``writer.drain()`` and ``writer.close()`` keep working.

``closed`` is done when the connection ends: its result is None after the peer's end of stream or
a close, or the exception ``on_data`` raised (the transport is then closed at once; nothing
further is delivered). Bytes read past the handshake (``first``, then whatever the reader still
buffers) are handled before any new read, in order.
"""

from __future__ import annotations

import asyncio
from typing import Callable

__all__ = ["DirectReads"]


READ_BUFFER_BYTES = 256 << 10    # one read's most (asyncio's own maximum read size)


class DirectReads(asyncio.BufferedProtocol):
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 on_data: Callable[[bytes], object], first: bytes = b"") -> None:
        transport = writer.transport
        self._stream = transport.get_protocol()
        self._transport = transport
        self._on_data = on_data
        self._buffer = memoryview(bytearray(READ_BUFFER_BYTES))
        self.closed: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
        buffered = first + bytes(reader._buffer)   # noqa: SLF001 - what the stream read past the handshake
        reader._buffer.clear()                      # noqa: SLF001
        if transport.is_closing():
            self._finish(None)
            return
        transport.set_protocol(self)
        if not transport.is_reading():             # the stream paused it (its buffer was full)
            transport.resume_reading()
        if buffered:
            self.data_received(buffered)

    def _finish(self, result: BaseException | None) -> None:
        if not self.closed.done():
            self.closed.set_result(result)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(bytes(self._buffer[:nbytes]))

    def data_received(self, data: bytes) -> None:
        if self.closed.done():
            return
        try:
            self._on_data(data)
        except Exception as exc:  # noqa: BLE001 - handed to the connection's owner through ``closed``
            self._finish(exc)
            self._transport.close()

    def eof_received(self) -> bool:
        self._finish(None)
        return False                # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._stream.connection_lost(exc)   # wakes a writer waiting in drain()
        self._finish(exc)

    def pause_writing(self) -> None:
        self._stream.pause_writing()

    def resume_writing(self) -> None:
        self._stream.resume_writing()
