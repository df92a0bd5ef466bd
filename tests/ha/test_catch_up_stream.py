"""A long catch-up on real sockets: transfers of alternating sizes, one connection, the log copied
byte for byte."""

from __future__ import annotations

import asyncio
import socket

from ha_helpers import (node_links, commitlog_bytes, fast_config, messages, put_all, run, start_node,
                        stop_node, wait_caught_up)

from rocketray.auth import HA_LABEL
from rocketray.wire.ha_protocol import (SLAVE_ACK_SIZE, SLAVE_HANDSHAKE_SIZE, EpochPoint,
                                        encode_master_handshake, encode_master_transfer_header)


def test_catch_up_with_large_and_small_transfers_copies_the_log_on_one_connection(tmp_path):
    """Segments of 1.2 MiB with 1 MiB batches make the master alternate 1 MiB transfers with
    ~200 KiB ones (each packet whole in the slave's receive buffers, some moving to the next
    buffer): the slave copies 48 MiB byte for byte without a reconnection."""
    segment = 1_200 * 1024

    async def body():
        cfg = fast_config()
        master = await start_node(tmp_path, 1, cfg, segment_size=segment)
        assert await master.ha.change_to_master(1)
        batch = messages(64, "bulk", size=4000)
        while master.store.max_offset < 48 << 20:
            await put_all(master, batch)
        slave = await start_node(tmp_path, 2, cfg, segment_size=segment)
        assert await slave.ha.change_to_slave(master.address, 1)
        await wait_caught_up(master, slave, timeout_s=60)
        client = slave.ha._client
        assert client is not None
        assert (client.connections, client.last_error) == (1, "")
        assert commitlog_bytes(slave.store) == commitlog_bytes(master.store)
        await stop_node(slave)
        await stop_node(master)

    run(body())


def test_a_transfer_arriving_in_pieces_is_received_in_one_receive(tmp_path, monkeypatch):
    """The slave's receive thread asks the kernel (``SO_RCVLOWAT``) to return a receive once the
    transfer being received is whole: a master that writes a 1 MiB transfer in 64 KiB pieces,
    1 ms apart, costs the slave a few receives, not one per piece (with the per-receive work --
    buffer checks, a pass of the session -- each time)."""
    receives: list[int] = []
    real = socket.socket.recv_into

    def counting(self, buffer, *args):
        n = real(self, buffer, *args)
        if n > 1000:
            receives.append(n)
        return n

    async def body():
        cfg = fast_config(ha_send_heartbeat_interval_ms=1000)
        source = await start_node(tmp_path, 1, cfg)
        assert await source.ha.change_to_master(1)
        await put_all(source, messages(240, "piece", size=4000))
        records = bytes(source.store.read_raw(0, 1 << 20))
        await stop_node(source)
        acked = asyncio.get_running_loop().create_future()

        async def master(reader, writer):
            await node_links(1, tls=False).accept(reader, writer, HA_LABEL)
            await reader.readexactly(SLAVE_HANDSHAKE_SIZE)
            writer.write(encode_master_handshake(len(records), [EpochPoint(1, 0)]))
            await reader.readexactly(SLAVE_ACK_SIZE)
            packet = encode_master_transfer_header(len(records), 0, 1, 0, len(records)) + records
            for start in range(0, len(packet), 64 << 10):
                writer.write(packet[start:start + (64 << 10)])
                await writer.drain()
                await asyncio.sleep(0.001)
            while not acked.done():
                ack = await reader.readexactly(SLAVE_ACK_SIZE)
                if int.from_bytes(ack[4:], "big") == len(records):
                    acked.set_result(None)
            writer.close()

        server = await asyncio.start_server(master, "127.0.0.1", 0)
        monkeypatch.setattr(socket.socket, "recv_into", counting)
        # the low-water mark is the plain socket's (under TLS a receive returns one record)
        slave = await start_node(tmp_path, 2, cfg, member=node_links(2, tls=False))
        assert await slave.ha.change_to_slave(("127.0.0.1", server.sockets[0].getsockname()[1]), 1)
        await asyncio.wait_for(acked, 10)
        monkeypatch.undo()
        assert slave.store.max_offset == len(records)
        # the first piece is received before its header tells the length; the kernel may end a
        # receive early while the socket's buffer grows to the low mark: a few, not 15
        assert sum(receives) == 36 + len(records) and len(receives) <= 4, receives
        await stop_node(slave)
        server.close()

    run(body())
