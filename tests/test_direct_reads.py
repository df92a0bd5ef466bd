"""rocketray.direct_reads on real loopback sockets: bytes read past the handshake come first and in
order, a handler's exception closes only that connection and is handed over, the peer's end of
stream ends it, and the writer's flow control (drain) still works after the switch."""

from __future__ import annotations

import asyncio

from rocketray.direct_reads import DirectReads


async def _pair(on_data, handshake: bytes = b"HELLO\n"):
    """A server that reads one handshake line through the stream, then switches to direct reads."""
    accepted: asyncio.Future = asyncio.get_running_loop().create_future()

    async def on_accept(reader, writer):
        await reader.readuntil(b"\n")
        reads = DirectReads(reader, writer, on_data, first=b"")
        accepted.set_result((reads, writer))
        await reads.closed

    server = await asyncio.start_server(on_accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(handshake)
    return server, accepted, reader, writer


def test_bytes_behind_the_handshake_come_first_and_in_order():
    async def body():
        got: list[bytes] = []
        server, accepted, _reader, writer = await _pair(got.append)
        writer.write(b"one|")          # may reach the server before the switch: buffered, then handed over
        await writer.drain()
        reads, _server_writer = await asyncio.wait_for(accepted, 5)
        for part in (b"two|", b"three|"):
            writer.write(part)
            await writer.drain()
        deadline = asyncio.get_running_loop().time() + 5
        while b"".join(got) != b"one|two|three|":
            assert asyncio.get_running_loop().time() < deadline, got
            await asyncio.sleep(0.01)
        writer.close()
        assert await asyncio.wait_for(reads.closed, 5) is None     # the peer's end of stream
        server.close()
        await server.wait_closed()
    asyncio.run(body())


def test_leftover_from_the_handshake_is_handled_before_the_buffer():
    async def body():
        got: list[bytes] = []
        accepted: asyncio.Future = asyncio.get_running_loop().create_future()

        async def on_accept(reader, writer):
            line = await reader.readuntil(b"\n")
            assert line == b"HELLO\n"
            await asyncio.sleep(0.2)                  # let the rest arrive in the stream's buffer
            reads = DirectReads(reader, writer, got.append, first=b"leftover|")
            accepted.set_result(reads)
            await reads.closed

        server = await asyncio.start_server(on_accept, "127.0.0.1", 0)
        _reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        writer.write(b"HELLO\nbuffered|")
        await writer.drain()
        reads = await asyncio.wait_for(accepted, 5)
        assert b"".join(got) == b"leftover|buffered|"
        writer.close()
        await asyncio.wait_for(reads.closed, 5)
        server.close()
        await server.wait_closed()
    asyncio.run(body())


def test_a_handler_exception_closes_that_connection_and_is_handed_over():
    class Bad(Exception):
        pass

    def on_data(data: bytes) -> None:
        if b"bad" in data:
            raise Bad("refused")

    async def body():
        server, accepted, reader, writer = await _pair(on_data)
        await writer.drain()
        reads, _server_writer = await asyncio.wait_for(accepted, 5)
        writer.write(b"bad")
        await writer.drain()
        error = await asyncio.wait_for(reads.closed, 5)
        assert isinstance(error, Bad)
        assert await asyncio.wait_for(reader.read(), 5) == b""      # the server closed it
        writer.close()
        server.close()
        await server.wait_closed()
    asyncio.run(body())


def test_drain_still_waits_for_a_slow_reader_after_the_switch():
    async def body():
        server, accepted, reader, writer = await _pair(lambda data: None)
        await writer.drain()
        _reads, server_writer = await asyncio.wait_for(accepted, 5)
        server_writer.transport.set_write_buffer_limits(high=64 * 1024)
        chunk = b"x" * (1 << 20)
        drained = False

        async def flood():
            nonlocal drained
            for _ in range(16):                         # 16 MiB: more than the socket buffers hold
                server_writer.write(chunk)
                await server_writer.drain()
            drained = True

        task = asyncio.ensure_future(flood())
        await asyncio.sleep(0.3)
        assert not drained                              # nobody reads: drain() waits
        total = 0
        while total < 16 << 20:
            total += len(await asyncio.wait_for(reader.read(1 << 20), 5))
        await asyncio.wait_for(task, 5)
        assert drained
        writer.close()
        server_writer.close()
        server.close()
        await server.wait_closed()
    asyncio.run(body())


def test_a_transport_already_closing_ends_at_once():
    async def body():
        accepted: asyncio.Future = asyncio.get_running_loop().create_future()

        async def on_accept(reader, writer):
            await reader.readuntil(b"\n")
            writer.close()
            reads = DirectReads(reader, writer, lambda data: None)
            accepted.set_result(await asyncio.wait_for(reads.closed, 5))

        server = await asyncio.start_server(on_accept, "127.0.0.1", 0)
        _reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        writer.write(b"HELLO\n")
        assert await asyncio.wait_for(accepted, 5) is None
        writer.close()
        server.close()
        await server.wait_closed()
    asyncio.run(body())
