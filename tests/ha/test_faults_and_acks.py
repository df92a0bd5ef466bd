"""Hostile peers and ack policies on real sockets: garbage and unauthenticated peers are dropped
without touching the master's store; all-ack never returns PUT_OK early; min_in_sync_replicas
fails fast and writes nothing."""

from __future__ import annotations

import asyncio
import random

import pytest

from rocketray.wire.ha_protocol import encode_slave_ack, encode_slave_handshake
from rocketray.wire.put_result import PutStatus, Written
from rocketray.auth import HA_LABEL
from ha_helpers import (node_links, commitlog_bytes, fast_config, messages, put_all, run, start_node,
                        stop_node, switch, wait_caught_up, wait_for)


async def authenticated_peer(port: int, broker_id: int = 9):
    """A raw member connection to the HA port (test member ``broker_id``'s certificate)."""
    reader, writer, _peer = await node_links(broker_id).connect("127.0.0.1", port, HA_LABEL)
    return reader, writer


async def closed_by_peer(reader: asyncio.StreamReader) -> bool:
    try:
        while await asyncio.wait_for(reader.read(65536), 2):
            pass        # (heartbeats are not sent before a handshake; anything else is fine)
    except ConnectionError:
        return True
    except asyncio.TimeoutError:
        return False    # still open after 2 s (housekeeping would take 3 s)
    return True


def test_garbage_from_connected_peers_closes_only_them(tmp_path):
    """Unauthenticated garbage, authenticated garbage (bad state, absurd packets, acks beyond
    what was sent): each such connection is closed; the real slave keeps replicating and the
    master's store holds exactly what was put."""
    async def body():
        m = await start_node(tmp_path, 1)
        s = await start_node(tmp_path, 2)
        await switch(m, [s], 1)
        await put_all(m, messages(20))
        await wait_caught_up(m, s)
        expected = commitlog_bytes(m.store)
        rng = random.Random(7)
        payloads = [b"\xff" + bytes(rng.randrange(256) for _ in range(rng.randrange(3, 200)))
                    for _ in range(8)]
        payloads += [b"\x00\x00\x00\x07" + bytes(12),                      # bad state field
                     encode_slave_ack(5),                                 # ack before handshake
                     encode_slave_handshake(9) + encode_slave_ack(10**12),  # start beyond max
                     encode_slave_handshake(9) + encode_slave_handshake(9)]  # second handshake
        rejected_before = m.ha.rejected_connections
        # 1) no authentication at all: dropped before any RocketMQ packet is read
        reader, writer = await asyncio.open_connection("127.0.0.1", m.port)
        writer.write(encode_slave_handshake(9))
        assert await closed_by_peer(reader)
        await wait_for(lambda: m.ha.rejected_connections == rejected_before + 1,
                       what="unauthenticated peer counted as rejected")
        # 2) authenticated peers sending garbage
        for payload in payloads:
            reader, writer = await authenticated_peer(m.port)
            writer.write(payload)
            await writer.drain()
            assert await closed_by_peer(reader), payload
            writer.close()
        await wait_for(lambda: {c.slave_id for c in m.ha.connections} <= {2, 9},
                       what="garbage connections closed")
        assert m.store.max_offset == len(expected) and commitlog_bytes(m.store) == expected
        await put_all(m, messages(5, "after"))
        await wait_caught_up(m, s)
        assert commitlog_bytes(s.store) == commitlog_bytes(m.store)
        await stop_node(s)
        await stop_node(m)
    run(body())


@pytest.mark.parametrize("tls", [True, False])
def test_slave_with_wrong_secret_never_replicates(tmp_path, tls):
    """A slave without the members' secret is dropped with a logged reason; nothing flows (with TLS
    and a member certificate too: the secret is checked inside the channel)."""
    async def body():
        m = await start_node(tmp_path, 1, member=node_links(1, tls=tls))
        s = await start_node(tmp_path, 2, member=node_links(2, tls=tls, secret="not-the-secret"))
        await switch(m, [s], 1)
        await put_all(m, messages(5))
        await wait_for(lambda: m.ha.rejected_connections >= 2, what="two rejected attempts")
        assert s.store.max_offset == 0 and not m.ha.connections
        # the master closes without proving anything: the slave learns no more than that
        assert "during authentication" in s.ha.status()["slave_last_error"]
        await stop_node(s)
        await stop_node(m)
    run(body())


def test_all_ack_never_returns_ok_before_every_union_member_acked(tmp_path):
    """With all-ack on and SSS {1,2,3}, each PUT_OK finds both slaves already holding the batch;
    a pending proposal adding an absent member (union view) makes puts time out; confirming a
    set without it makes them succeed again."""
    async def body():
        cfg = fast_config(all_ack_in_sync_state_set=True, slave_timeout_ms=400)
        m = await start_node(tmp_path, 1, cfg)
        s2 = await start_node(tmp_path, 2, cfg)
        s3 = await start_node(tmp_path, 3, cfg)
        await switch(m, [s2, s3], 1)
        m.ha.set_sync_state_set({1, 2, 3})

        async def one(i):
            result = await m.ha.put(messages(3, f"p{i}"), 0)
            end = result.end_offset
            assert result.status == PutStatus.PUT_OK and result.written is Written.YES
            assert s2.store.max_offset >= end and s3.store.max_offset >= end
        await asyncio.gather(*(one(i) for i in range(20)))
        m.ha.tracker.mark_synchronizing({1, 2, 3, 4})        # proposal with an absent member
        await put_all(m, messages(1), expect=PutStatus.FLUSH_SLAVE_TIMEOUT)
        m.ha.set_sync_state_set({1, 2, 3})
        await put_all(m, messages(1))
        for n in (s3, s2, m):
            await stop_node(n)
    run(body())


def test_min_in_sync_replicas_fails_fast_and_writes_nothing(tmp_path):
    async def body():
        m = await start_node(tmp_path, 1, fast_config(min_in_sync_replicas=2))
        s = await start_node(tmp_path, 2)
        await switch(m, [s], 1)
        before = m.store.max_offset
        result = await m.ha.put(messages(3), 0)
        assert (result.status, result.written, result.retriable, m.store.max_offset) == \
            (PutStatus.IN_SYNC_REPLICAS_NOT_ENOUGH, Written.NO, True, before)
        m.ha.set_sync_state_set({1, 2})
        await put_all(m, messages(3))
        assert (await s.ha.put(messages(1), 0)).status == PutStatus.NOT_MASTER
        await stop_node(s)
        await stop_node(m)
    run(body())


def test_in_sync_replicas_counts_acks_including_master(tmp_path):
    """in_sync_replicas=2 without all-ack: one slave ack suffices; with none it times out."""
    async def body():
        m = await start_node(tmp_path, 1, fast_config(in_sync_replicas=2, slave_timeout_ms=300))
        await m.ha.change_to_master(1)
        await put_all(m, messages(1), expect=PutStatus.FLUSH_SLAVE_TIMEOUT)
        s = await start_node(tmp_path, 2)
        assert await s.ha.change_to_slave(m.address, 1)
        await wait_caught_up(m, s)
        await put_all(m, messages(2))
        await stop_node(s)
        await stop_node(m)
    run(body())


def test_disconnect_and_not_catching_up_propose_shrink(tmp_path):
    """A member whose connection closes is proposed out; maybe_shrink drops members not caught
    up within ha_max_time_slave_not_catchup_ms."""
    async def body():
        m = await start_node(tmp_path, 1)
        s = await start_node(tmp_path, 2)
        proposals = []
        m.ha.add_sss_listener(proposals.append)
        await switch(m, [s], 1)
        await put_all(m, messages(3))
        await wait_caught_up(m, s)
        m.ha.set_sync_state_set({1, 2})
        import time
        now = int(time.time() * 1000)
        assert m.ha.maybe_shrink_sync_state_set(now) == {1, 2}
        assert m.ha.maybe_shrink_sync_state_set(now + 60_000) == {1}
        m.ha.set_sync_state_set({1, 2})
        await stop_node(s)
        await wait_for(lambda: frozenset({1}) in proposals, what="shrink proposal on disconnect")
        await stop_node(m)
    run(body())
