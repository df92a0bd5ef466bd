"""A long catch-up on real sockets: transfers of alternating sizes, one connection, the log copied
byte for byte."""

from __future__ import annotations

from ha_helpers import (commitlog_bytes, fast_config, messages, put_all, run, start_node, stop_node,
                        wait_caught_up)


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
