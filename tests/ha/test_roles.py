"""Role switches (reference 12.5) and connection liveness on real sockets."""

from __future__ import annotations

import time

from rocketray.broker.role import Role

from ha_helpers import (commitlog_bytes, data_epochs, fast_config, messages, put_all, run,
                        start_node, stop_node, switch, wait_caught_up, wait_for)


def test_change_to_master_same_keeps_connections_and_starts_a_new_epoch(tmp_path):
    """Same master, new epoch: only an epoch entry; the slave keeps its connection and records
    the new epoch when its first data arrives."""
    async def body():
        m = await start_node(tmp_path, 1)
        s = await start_node(tmp_path, 2)
        await switch(m, [s], 1)
        await put_all(m, messages(5))
        await wait_caught_up(m, s)
        (conn,) = m.ha.connections
        e1_end = m.store.max_offset
        assert await m.ha.change_to_master_same(2)
        assert await m.ha.change_to_master_same(2)          # idempotent
        assert not await m.ha.change_to_master_same(1)      # stale
        await put_all(m, messages(5, "e2"))
        await wait_caught_up(m, s)
        assert m.ha.connections == {conn} and s.ha._client.connections == 1
        assert data_epochs(s.store) == data_epochs(m.store) == [(1, 0), (2, e1_end)]
        assert commitlog_bytes(s.store) == commitlog_bytes(m.store)
        await stop_node(s)
        await stop_node(m)
    run(body())


def test_stale_role_changes_are_refused(tmp_path):
    async def body():
        n = await start_node(tmp_path, 1)
        assert await n.ha.change_to_master(3)
        assert not await n.ha.change_to_master(2)
        assert not await n.ha.change_to_slave("127.0.0.1:1", 2)
        assert n.ha.role == Role.MASTER and n.ha.epoch == 3
        await stop_node(n)
    run(body())


def test_heartbeats_keep_an_idle_connection_alive_past_housekeeping(tmp_path):
    """With heartbeats every 100 ms and housekeeping at 600 ms, an idle pair keeps one
    connection for well over the housekeeping interval."""
    async def body():
        cfg = fast_config(ha_send_heartbeat_interval_ms=100, ha_housekeeping_interval_ms=600)
        m = await start_node(tmp_path, 1, cfg)
        s = await start_node(tmp_path, 2, cfg)
        await switch(m, [s], 1)
        await put_all(m, messages(2))
        await wait_caught_up(m, s)
        (conn,) = m.ha.connections
        t0 = time.monotonic()
        await wait_for(lambda: time.monotonic() - t0 > 1.5 and m.ha.connections == {conn}
                       and s.ha._client.connections == 1 or (m.ha.connections != {conn} and
                                                             "changed"),
                       5, "idle connection to survive 1.5 s")
        assert m.ha.connections == {conn} and s.ha._client.connections == 1
        await stop_node(s)
        await stop_node(m)
    run(body())


def test_master_housekeeping_closes_a_silent_slave(tmp_path):
    """A peer that authenticates, handshakes and then says nothing is closed after the
    housekeeping interval, and the master proposes it out of the SyncStateSet."""
    async def body():
        import asyncio

        from rocketray.wire.ha_protocol import encode_slave_ack, encode_slave_handshake
        from rocketray.auth import HA_LABEL
        from ha_helpers import node_links
        cfg = fast_config(ha_send_heartbeat_interval_ms=100, ha_housekeeping_interval_ms=500)
        m = await start_node(tmp_path, 1, cfg)
        await m.ha.change_to_master(1)
        proposals = []
        m.ha.add_sss_listener(proposals.append)
        m.ha.set_sync_state_set({1, 7})
        reader, writer, _peer = await node_links(7).connect("127.0.0.1", m.port, HA_LABEL)
        writer.write(encode_slave_handshake(7))
        await reader.readexactly(20 + 12)           # handshake reply with one epoch entry
        writer.write(encode_slave_ack(0))
        await wait_for(lambda: any(c.slave_id == 7 for c in m.ha.connections), what="silent peer")
        await wait_for(lambda: not m.ha.connections, 5, "housekeeping close")
        assert frozenset({1}) in proposals
        writer.close()
        await stop_node(m)
    run(body())


def test_set_broker_id_before_the_first_role_change(tmp_path):
    """The ReplicasManager learns its id at registration and hands it to the service."""
    async def body():
        n = await start_node(tmp_path, 0)
        n.ha.set_broker_id(5)
        assert await n.ha.change_to_master(1)
        assert n.ha.sync_state_set() == {5} and n.ha.status()["broker_id"] == 5
        await stop_node(n)
    run(body())


def test_stopping_a_slave_ends_its_receive_thread_and_leaves_no_unretrieved_error(tmp_path):
    """``stop`` returns only after the receive thread ended (no store work after it), and the
    session's end ("stopped") is not left in a future nobody awaits: the loop's exception handler
    hears of nothing, even after a garbage collection (an unretrieved future's finalizer logs at
    whatever point the collector runs, once inside pytest's own module compilation)."""
    import asyncio
    import gc

    async def body():
        errors: list[dict] = []
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: errors.append(context))
        m = await start_node(tmp_path, 1)
        s = await start_node(tmp_path, 2)
        await switch(m, [s], 1)
        await put_all(m, messages(5))
        await wait_caught_up(m, s)
        client = s.ha._client
        assert client is not None and client._thread is not None and client._thread.is_alive()
        thread = client._thread
        await client.stop()
        assert not thread.is_alive()
        await asyncio.sleep(0.05)           # the thread's last callback runs on the loop
        del client
        gc.collect()
        await stop_node(s)
        await stop_node(m)
        gc.collect()
        assert errors == []

    run(body())
