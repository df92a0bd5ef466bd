"""Reference 16.6 (AutoSwitchHATest) rows, on real stores and real loopback sockets.

Records here are 172 bytes (66-byte header + "FooBar" + 100-byte body), so a 1720-byte segment
holds exactly 10 test messages, as the upstream 1700-byte files do.
"""

from __future__ import annotations

from rocketray.wire.put_result import PutStatus
from ha_helpers import (commitlog_bytes, fast_config, messages, open_store, put_all, run, served,
                        start_node, stop_node, switch, wait_caught_up, wait_for)

RECORD = 172
SEG10 = 10 * RECORD


def test_confirm_offset_worked_truncation_scenario(tmp_path):
    """testConfirmOffset / reference 12.6: B1's unreplicated 11th message is truncated when B1
    comes back as a slave of B2 (epoch 2), and B1 ends byte-identical to B2 with 20 messages."""
    async def body():
        cfg = fast_config(all_ack_in_sync_state_set=True, slave_timeout_ms=500)
        b1 = await start_node(tmp_path, 1, cfg)
        b2 = await start_node(tmp_path, 2, cfg)
        await switch(b1, [b2], 1)
        b1.ha.set_sync_state_set({1, 2})
        await put_all(b1, messages(10, "e1"))
        await wait_caught_up(b1, b2)
        e10 = b1.store.max_offset
        await wait_for(lambda: served(b2.store, 20) == 10, what="B2 to serve 10")
        await stop_node(b2)                                   # B2 stops
        await wait_for(lambda: not b1.ha.connections, what="master to notice the slave left")
        confirm_before = b1.store.confirm_offset
        assert confirm_before == e10
        await put_all(b1, messages(1, "lost"), expect=PutStatus.FLUSH_SLAVE_TIMEOUT)
        assert b1.store.max_offset == e10 + RECORD
        assert b1.store.confirm_offset == confirm_before     # frozen: member 2 is missing
        await stop_node(b1)                                   # B1 stops
        b2 = await start_node(tmp_path, 2, cfg)               # B2 restarts as master, epoch 2
        assert await b2.ha.change_to_master(2)
        assert [(e.epoch, e.start_offset) for e in b2.store.epoch_file.entries()] == \
            [(1, 0), (2, e10)]
        await put_all(b2, messages(10, "e2"))
        b1 = await start_node(tmp_path, 1, cfg)               # B1 restarts as slave of B2
        assert b1.store.max_offset == e10 + RECORD
        assert await b1.ha.change_to_slave(b2.address, 2)
        await wait_caught_up(b2, b1)
        assert commitlog_bytes(b1.store) == commitlog_bytes(b2.store)
        assert [(e.epoch, e.start_offset) for e in b1.store.epoch_file.entries()] == \
            [(1, 0), (2, e10)]
        await wait_for(lambda: served(b1.store, 30) == 20, what="B1 to serve 20 messages")
        bodies = [m.body for m in b1.store.get_messages("FooBar", 0, 0, 30)]
        assert not any(b.startswith(b"lost") for b in bodies)
        await stop_node(b1)
        await stop_node(b2)
    run(body())


def test_async_learner_broker_role(tmp_path):
    """testAsyncLearnerBrokerRole: the learner replicates but never enters the SyncStateSet."""
    async def body():
        m = await start_node(tmp_path, 1)
        s = await start_node(tmp_path, 2, fast_config(async_learner=True))
        proposals = []
        m.ha.add_sss_listener(proposals.append)
        await switch(m, [s], 1)
        await put_all(m, messages(10))
        await wait_caught_up(m, s)
        await wait_for(lambda: served(s.store, 20) == 10, what="learner to serve 10")
        assert all(2 not in p for p in proposals)
        assert 2 not in m.ha.sync_state_set()
        await stop_node(s)
        await stop_node(m)
    run(body())


def test_option_all_ack_in_sync_state_set(tmp_path):
    """testOptionAllAckInSyncStateSet: the caught-up slave is proposed ({1,2}); once the set is
    {1,2} and the slave is gone, an all-ack put times out."""
    async def body():
        cfg = fast_config(all_ack_in_sync_state_set=True, slave_timeout_ms=400)
        m = await start_node(tmp_path, 1, cfg)
        s = await start_node(tmp_path, 2, cfg)
        proposals = []
        m.ha.add_sss_listener(proposals.append)
        await switch(m, [s], 1)
        await put_all(m, messages(10))
        await wait_caught_up(m, s)
        await wait_for(lambda: frozenset({1, 2}) in proposals, what="expand proposal {1,2}")
        await stop_node(s)
        m.ha.set_sync_state_set({1, 2})
        await put_all(m, messages(1), expect=PutStatus.FLUSH_SLAVE_TIMEOUT)
        await stop_node(m)
    run(body())


def test_change_role_many_times(tmp_path):
    """testChangeRoleManyTimes: epochs 1, 2, 3 with alternating masters, 10 messages each."""
    async def body():
        a = await start_node(tmp_path, 1)
        b = await start_node(tmp_path, 2)
        for epoch, (master, slave) in enumerate([(a, b), (b, a), (a, b)], start=1):
            await switch(master, [slave], epoch)
            await put_all(master, messages(10, f"e{epoch}"))
            await wait_caught_up(master, slave)
            await wait_for(lambda: served(slave.store, 100) == 10 * epoch,
                           what=f"{10 * epoch} messages on the slave")
            assert commitlog_bytes(slave.store) == commitlog_bytes(master.store)
        assert [(e.epoch, e.start_offset) for e in b.store.epoch_file.entries()] == \
            [(1, 0), (2, 10 * RECORD), (3, 20 * RECORD)]
        await stop_node(a)
        await stop_node(b)
    run(body())


def test_add_broker(tmp_path):
    """testAddBroker: a third store joining later receives the history."""
    async def body():
        m = await start_node(tmp_path, 1)
        s = await start_node(tmp_path, 2)
        await switch(m, [s], 1)
        await put_all(m, messages(10))
        await wait_caught_up(m, s)
        third = await start_node(tmp_path, 3)
        assert await third.ha.change_to_slave(m.address, 1)
        await wait_caught_up(m, third)
        await wait_for(lambda: served(third.store, 20) == 10, what="store 3 to serve 10")
        for n in (third, s, m):
            await stop_node(n)
    run(body())


async def two_epochs_in_two_files(tmp_path, cfg=None):
    m = await start_node(tmp_path, 1, cfg, segment_size=SEG10)
    s = await start_node(tmp_path, 2, cfg, segment_size=SEG10)
    await switch(m, [s], 1)
    await put_all(m, messages(10, "e1"))
    await switch(m, [s], 2)
    await put_all(m, messages(10, "e2"))
    await wait_caught_up(m, s)
    assert [(e.epoch, e.start_offset) for e in m.store.epoch_file.entries()] == \
        [(1, 0), (2, SEG10)]
    assert len(m.store.commitlog.segments) == 2
    return m, s


def test_truncate_epoch_log_and_add_broker(tmp_path):
    """testTruncateEpochLogAndAddBroker: the master's first file is deleted (min offset = 10
    messages in) and epoch 1 dropped from its epoch file; a new store joins at epoch 2 and
    starts from the master's min offset."""
    async def body():
        m, s = await two_epochs_in_two_files(tmp_path)
        assert m.store.delete_expired_segments(now_ms=2**62) == 1
        assert m.store.min_offset == SEG10
        m.store.epoch_file.truncate_prefix_by_offset(SEG10)
        assert [(e.epoch, e.start_offset) for e in m.store.epoch_file.entries()] == [(2, SEG10)]
        assert served(m.store, 10, 10) == 10
        third = await start_node(tmp_path, 3, segment_size=SEG10)
        assert await third.ha.change_to_slave(m.address, 2)
        await wait_caught_up(m, third)
        assert third.store.min_offset == SEG10
        await wait_for(lambda: served(third.store, 10, 10) == 10, what="store 3: 10 from 10")
        return m, s, third

    async def outer():
        m, s, third = await body()
        for n in (third, s, m):
            await stop_node(n)
    run(outer())


def test_truncate_epoch_log_and_change_master(tmp_path):
    """testTruncateEpochLogAndChangeMaster: after the above, store 2 becomes master of epoch 3
    with store 3 following (+10), then store 1 follows store 2 at epoch 3."""
    async def body():
        m, s = await two_epochs_in_two_files(tmp_path)
        m.store.delete_expired_segments(now_ms=2**62)
        m.store.epoch_file.truncate_prefix_by_offset(SEG10)
        third = await start_node(tmp_path, 3, segment_size=SEG10)
        assert await third.ha.change_to_slave(m.address, 2)
        await wait_caught_up(m, third)
        await switch(s, [third], 3)
        await put_all(s, messages(10, "e3"))
        await wait_caught_up(s, third)
        await wait_for(lambda: served(third.store, 30, 10) == 20, what="store 3: 20 from 10")
        assert await m.ha.change_to_slave(s.address, 3)
        await wait_caught_up(s, m)
        await wait_for(lambda: served(m.store, 30, 10) == 20, what="store 1: 20 from 10")
        assert commitlog_bytes(m.store) == commitlog_bytes(s.store)[SEG10:]
        for n in (third, s, m):
            await stop_node(n)
    run(body())


def test_add_broker_and_sync_from_last_file(tmp_path):
    """testAddBrokerAndSyncFromLastFile: an empty store with sync_from_last_file starts at the
    master's last segment (10 messages in)."""
    async def body():
        m, s = await two_epochs_in_two_files(tmp_path)
        third = await start_node(tmp_path, 3, fast_config(sync_from_last_file=True),
                                 segment_size=SEG10)
        assert await third.ha.change_to_slave(m.address, 2)
        await wait_caught_up(m, third)
        assert third.store.min_offset == SEG10
        await wait_for(lambda: served(third.store, 10, 10) == 10, what="store 3: 10 from 10")
        assert all(msg.queue_offset >= 10 for msg in third.store.get_messages("FooBar", 0, 0, 30))
        for n in (third, s, m):
            await stop_node(n)
    run(body())


def test_check_synchronizing_sync_state_set_flag(tmp_path):
    """testCheckSynchronizingSyncStateSetFlag: the caught-up slave makes the master
    'synchronizing' with union {1,2}; confirm offset == max; setSyncStateSet clears the flag."""
    async def body():
        cfg = fast_config(all_ack_in_sync_state_set=True)
        m = await start_node(tmp_path, 1, cfg)
        s = await start_node(tmp_path, 2, cfg)
        await switch(m, [s], 1)
        await put_all(m, messages(10))
        await wait_caught_up(m, s)
        await wait_for(lambda: m.ha.tracker.synchronizing, what="synchronizing flag")
        assert m.store.confirm_offset == m.store.max_offset == 10 * RECORD
        assert m.ha.sync_state_set() == {1, 2}
        m.ha.set_sync_state_set({1, 2})
        assert not m.ha.tracker.synchronizing
        await put_all(m, messages(5))                 # all-ack with a live member succeeds
        assert s.store.max_offset >= m.store.max_offset
        await stop_node(s)
        await stop_node(m)
    run(body())


def test_build_consume_queue_not_exceed_confirm_offset(tmp_path):
    """testBuildConsumeQueueNotExceedConfirmOffset (HA part): the slave's confirm offset follows
    the master's, survives a restart, and the slave serves nothing beyond it."""
    async def body():
        cfg = fast_config(all_ack_in_sync_state_set=True, slave_timeout_ms=300)
        m = await start_node(tmp_path, 1, cfg)
        s = await start_node(tmp_path, 2, cfg)
        await switch(m, [s], 1)
        m.ha.set_sync_state_set({1, 2})
        await put_all(m, messages(10))
        await wait_for(lambda: s.store.confirm_offset == 10 * RECORD, what="slave confirm")
        await stop_node(s)
        # the master writes 5 more that nobody acks: its confirm offset stays at 10 records
        await put_all(m, messages(5), expect=PutStatus.FLUSH_SLAVE_TIMEOUT)
        assert m.store.confirm_offset == 10 * RECORD
        assert served(m.store, 100) == 10
        s2 = open_store(tmp_path / "store2")
        assert s2.confirm_offset == 10 * RECORD
        assert served(s2, 100) == 10
        s2.close()
        await stop_node(m)
    run(body())
