"""Encoded batches through the HA put path on real sockets: a malformed batch is refused with
MESSAGE_ILLEGAL and writes nothing anywhere; a good one is acknowledged by all-ack, lands
byte-identical on the slave, and both replicas build the same consume queues in one pass."""

from __future__ import annotations

import asyncio
import struct

from rocketray.wire.message import Message
from rocketray.wire.batch import EncodedBatch, encode_batch
from rocketray.wire.put_result import PutStatus, Written
from ha_helpers import (TOPIC, commitlog_bytes, fast_config, put_all, run, start_node, stop_node, switch,
                        wait_caught_up, wait_for)


def queues(store) -> dict:
    return {key: [(e.queue_offset, e.physical_offset, e.size, e.tag_hash) for e in cq.read(0, 1 << 20)]
            for key, cq in sorted(store.cqs.queues.items())}


async def in_sync_pair(tmp_path, **master_config):
    """A master (broker 1) and its slave (broker 2), all-ack, both in the SyncStateSet, caught up."""
    m = await start_node(tmp_path, 1, fast_config(all_ack_in_sync_state_set=True, **master_config))
    s = await start_node(tmp_path, 2, fast_config(all_ack_in_sync_state_set=True))
    await switch(m, [s], 1)
    m.ha.set_sync_state_set({1, 2})
    await wait_caught_up(m, s)
    return m, s


def test_malformed_batch_is_message_illegal_and_a_good_one_replicates(tmp_path):
    async def body():
        m, s = await in_sync_pair(tmp_path)
        first = await put_all(m, encode_batch(Message(TOPIC, q, b"a" * 50, {"TAGS": "x"}) for q in (0, 1, 0)))
        await wait_caught_up(m, s)
        before = m.store.max_offset
        good = encode_batch(Message(TOPIC, i % 2, bytes([i]) * 200, {"pid": f"p{i}"}) for i in range(10))
        bad = bytearray(good.data)
        struct.pack_into(">I", bad, 12, 0)           # the first record's body CRC
        result = await m.ha.put(EncodedBatch(bytes(bad), good.count), 0)
        assert (result.status, result.written, result.offsets, m.store.max_offset) == \
            (PutStatus.MESSAGE_ILLEGAL, Written.NO, (), before)
        result = await put_all(m, good)
        assert [qo for qo, _po in result.offsets] == [2, 1, 3, 2, 4, 3, 5, 4, 6, 5]
        assert result.offsets[0][1] == before and result.end_offset == m.store.max_offset
        assert [qo for qo, _po in first.offsets] == [0, 0, 1]
        await wait_caught_up(m, s)
        await wait_for(lambda: s.store.confirm_offset == m.store.confirm_offset == m.store.max_offset,
                       what="the slave to learn the confirm offset")
        assert commitlog_bytes(s.store) == commitlog_bytes(m.store)
        assert queues(s.store) == queues(m.store)
        assert len(m.store.get_messages(TOPIC, 0, 0, 100)) == 7
        await stop_node(s)
        await stop_node(m)
    run(body())


def test_put_start_sends_in_its_own_step_and_answers_once_from_the_ack(tmp_path):
    """``put_start`` appends and writes the batch to every slave connection before it returns (no
    loop pass in between), answers ``done`` exactly once from the acks, and refuses at once, with
    nothing written, when the broker is not master; a slave that never acks ends in one
    FLUSH_SLAVE_TIMEOUT answer (written) when the wait's bound passes."""
    async def body():
        m, s = await in_sync_pair(tmp_path, slave_timeout_ms=300)
        (conn,) = m.ha.connections
        answers: list = []
        sent_before = conn.bytes_sent
        batch = encode_batch(Message(TOPIC, 0, b"x" * 100, {}) for _ in range(3))
        assert m.ha.put_start(batch, 0, answers.append) is None
        assert conn.bytes_sent == sent_before + len(batch.data) and answers == []
        await wait_for(lambda: answers, what="the put's answer")
        await asyncio.sleep(0.05)
        assert [a.status for a in answers] == [PutStatus.PUT_OK]
        assert answers[0].end_offset == m.store.max_offset
        refusal = s.ha.put_start(batch, 0, answers.append)
        assert refusal is not None and refusal.status is PutStatus.NOT_MASTER and refusal.written is Written.NO
        await stop_node(s)
        await wait_for(lambda: not m.ha.connections, what="the slave's connection to close")
        # the confirmed set still holds the stopped slave (no controller here): all-ack waits for it
        assert m.ha.roles.sync_state_set == {1, 2} and m.ha.replication.put_admitted()
        before = len(answers)
        assert m.ha.put_start(batch, 0, answers.append) is None
        await wait_for(lambda: len(answers) > before, what="the timed-out put's answer")
        await asyncio.sleep(0.4)
        assert [a.status for a in answers[before:]] == [PutStatus.FLUSH_SLAVE_TIMEOUT]
        assert answers[-1].written is Written.YES
        await stop_node(m)
    run(body())


def test_the_confirm_listeners_hear_an_ack_before_the_puts_it_decides_are_answered(tmp_path):
    """The slave ack that confirms a batch first moves the confirm offset (its listeners: the held
    pulls, answered in that step), then answers the puts it decides: a consumer long-polling the
    queue wakes before the producer sends again (issue 27: send -> another group's poll was 1.3-2.4x
    a send when the producer's next put came first; ~1.05-1.2x after). Both in one step."""
    async def body():
        m, s = await in_sync_pair(tmp_path)
        order: list[str] = []
        m.ha.add_confirm_listener(lambda offset: order.append(f"confirm {offset}"))
        batch = encode_batch(Message(TOPIC, 0, b"x" * 100, {}) for _ in range(2))
        assert m.ha.put_start(batch, 0, lambda result: order.append(f"put {result.end_offset}")) is None
        await wait_for(lambda: any(o.startswith("put") for o in order), what="the put's answer")
        end = m.store.max_offset
        assert order[-2:] == [f"confirm {end}", f"put {end}"], order
        await stop_node(s)
        await stop_node(m)
    run(body())


def test_the_write_loop_is_not_woken_for_acks_of_bytes_it_already_sent_and_the_confirm_offset_still_arrives(tmp_path):
    """A put written whole by ``send_now`` and the slave's ack of it give the master's write loop
    nothing to do: it is not woken for them (it was for each, about three passes per put and
    slave); the confirm offset the ack moves reaches the idle slave when its push is due
    (``ha_confirm_push_delay_ms``), well before the next heartbeat, without a pass to learn it."""
    async def body():
        m, s = await in_sync_pair(tmp_path, ha_send_heartbeat_interval_ms=2000, ha_housekeeping_interval_ms=6000)
        (conn,) = m.ha.connections
        await put_all(m, encode_batch([Message(TOPIC, 0, b"w" * 100, {})]))
        await wait_for(lambda: s.store.confirm_offset == m.store.confirm_offset == m.store.max_offset,
                       what="the slave to learn the confirm offset")
        puts = 40
        passes = conn.write_passes
        for i in range(puts):
            await put_all(m, encode_batch([Message(TOPIC, i % 2, bytes([i]) * 100, {})]))
        per_put = (conn.write_passes - passes) / puts
        assert per_put <= 1.5, per_put
        # the last put's confirm offset: pushed when due, not at the next heartbeat (2 s)
        await wait_for(lambda: s.store.confirm_offset == m.store.confirm_offset == m.store.max_offset,
                       timeout_s=1.0, what="the slave to learn the last confirm offset from the push")
        await stop_node(s)
        await stop_node(m)
    run(body())


def test_wake_at_ends_a_sleep_sooner_without_waking_it_now():
    from rocketray.ha.transport import Wake

    async def body():
        loop = asyncio.get_running_loop()
        wake = Wake()
        started = loop.time()
        sleeper = asyncio.ensure_future(wake.wait(5.0))
        await asyncio.sleep(0)
        wake.wake_at(started + 0.2)
        wake.wake_at(started + 3.0)          # later than the sleep's end now: no effect
        await asyncio.sleep(0.05)
        assert not sleeper.done()            # not woken at the call
        await asyncio.wait_for(sleeper, 2.0)
        assert 0.15 <= loop.time() - started < 2.0
        wake.wake_at(loop.time())            # nobody sleeps: nothing happens, nothing raised
        assert not wake.is_set()
        sleeper = asyncio.ensure_future(wake.wait(5.0))
        await asyncio.sleep(0)
        wake.set()
        await asyncio.wait_for(sleeper, 1.0)
    run(body())
