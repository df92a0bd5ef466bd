"""Issue 15 violations 1 and 4 replayed with real stores and HA services over loopback sockets
(each also against its old rule, patched back in)."""

from __future__ import annotations

import asyncio

import rocketray.ha.ack as ack_mod
from ha_helpers import (commitlog_bytes, fast_config, messages, put_all, run, served, start_node,
                        stop_node, switch, wait_caught_up, wait_for)
from ha_old_rules import old_after_write, old_compute_confirm_offset
from rocketray.wire.put_result import PutStatus, Written
from rocketray.ha.sync_state import SyncStateTracker

RECORD = 172


async def violation_1(tmp_path) -> dict:
    """Master B=2 alone in its set; slave A=1 catches up, B proposes {1,2}; A stops; B puts M
    (FLUSH_SLAVE_TIMEOUT); the controller confirms {1,2}; B dies, A is elected, B rejoins as A's
    slave. Returns what consumers of B could read of M, and the end state."""
    cfg = fast_config(all_ack_in_sync_state_set=True, slave_timeout_ms=400)
    b = await start_node(tmp_path, 2, cfg)
    a = await start_node(tmp_path, 1, cfg)
    await switch(b, [a], 1)
    b.ha.set_sync_state_set({2})
    await put_all(b, messages(10, "e1"))
    await wait_caught_up(b, a)
    await wait_for(lambda: b.ha.tracker.synchronizing and b.ha.sync_state_set() == {1, 2},
                   what="B to propose {1,2}")
    e10 = b.store.max_offset
    await stop_node(a)                                         # A stops replicating
    await wait_for(lambda: not b.ha.connections, what="B to notice A left")
    await put_all(b, messages(1, "M"), expect=PutStatus.FLUSH_SLAVE_TIMEOUT)
    read_m = [served(b.store, 100) > 10]
    b.ha.set_sync_state_set({1, 2})                            # the controller confirms {1,2}
    b.ha.notify_new_data()
    read_m.append(served(b.store, 100) > 10)
    await stop_node(b)                                         # B dies
    a = await start_node(tmp_path, 1, cfg)
    assert await a.ha.change_to_master(2)                      # A is elected (it is in the set)
    b = await start_node(tmp_path, 2, cfg)
    assert await b.ha.change_to_slave(a.address, 2)            # B rejoins and truncates M
    await wait_caught_up(a, b)
    out = {"read_m": read_m, "b_end": b.store.max_offset, "e10": e10,
           "same": commitlog_bytes(a.store) == commitlog_bytes(b.store)}
    await stop_node(b)
    await stop_node(a)
    return out


def test_violation_1_no_consumer_reads_a_message_later_truncated(tmp_path):
    """Issue 15 #1 over sockets: M is never readable on B (its confirm offset stays at what A
    holds), and after the failover M is gone everywhere, so nothing read disappeared."""
    out = run(violation_1(tmp_path))
    assert out["read_m"] == [False, False]
    assert out["b_end"] == out["e10"] and out["same"]


def test_violation_1_old_rule_is_caught_over_sockets(tmp_path, monkeypatch):
    monkeypatch.setattr(SyncStateTracker, "compute_confirm_offset", old_compute_confirm_offset)
    out = run(violation_1(tmp_path))
    assert any(out["read_m"]) and out["b_end"] == out["e10"]   # M was read, then truncated


async def violation_4(tmp_path) -> tuple:
    """Master 1, set {1,2}; slave 2 stops; a put waits for 2's ack; meanwhile 1 becomes a slave
    of epoch 2. Returns the put's result, and whether the batch is in 1's log."""
    cfg = fast_config(all_ack_in_sync_state_set=True, slave_timeout_ms=5000)
    m = await start_node(tmp_path, 1, cfg)
    s = await start_node(tmp_path, 2, cfg)
    await switch(m, [s], 1)
    m.ha.set_sync_state_set({1, 2})
    await put_all(m, messages(3, "before"))
    await stop_node(s)
    before = m.store.max_offset
    put = asyncio.create_task(m.ha.put(messages(2, "during"), 0))
    await wait_for(lambda: m.store.max_offset > before, what="the batch to be written")
    assert await m.ha.change_to_slave(None, 2)                 # role change during the ack wait
    result = await asyncio.wait_for(put, 10)
    in_log = m.store.max_offset > before
    await stop_node(m)
    return result, in_log


def test_violation_4_a_written_batch_is_never_reported_as_not_written(tmp_path):
    """Issue 15 #4 over sockets: the answer is MASTER_CHANGED, written UNKNOWN, not retriable, with
    the batch's offsets; never NOT_MASTER (which the client reads as "nothing written")."""
    result, in_log = run(violation_4(tmp_path))
    assert in_log
    assert (result.status, result.written, result.retriable) == \
        (PutStatus.MASTER_CHANGED, Written.UNKNOWN, False)
    assert len(result.offsets) == 2 and result.end_offset > 0


def test_violation_4_old_rule_is_caught_over_sockets(tmp_path, monkeypatch):
    monkeypatch.setattr(ack_mod, "after_write", old_after_write)
    result, in_log = run(violation_4(tmp_path))
    assert in_log and result.status == PutStatus.NOT_MASTER and result.retriable


async def promote_torn(tmp_path) -> tuple[int, int, list]:
    """A replica whose last record is torn (a kill mid-append) is promoted to master of epoch 2.
    Returns (victim offset, max offset after promotion, epoch entries)."""
    from rocketray.broker.store import MessageStore
    cfg = fast_config(all_ack_in_sync_state_set=True)
    m = await start_node(tmp_path, 1, cfg)
    s = await start_node(tmp_path, 2, cfg)
    await switch(m, [s], 1)
    result = await m.ha.put(messages(8, "x"), 0)
    assert result.written is Written.YES
    await wait_caught_up(m, s)
    await stop_node(m)
    victim = result.offsets[-1][1]
    seg = s.store.commitlog.segment_for(victim)
    seg.file.pwrite(b"\xff\xff", victim - seg.base_offset + 80)      # the last record is torn
    assert isinstance(s.store, MessageStore)
    assert await s.ha.change_to_master(2)
    out = (victim, s.store.max_offset,
           [(e.epoch, e.start_offset) for e in s.store.epoch_file.entries()])
    await stop_node(s)
    return out


def test_promotion_cuts_the_torn_tail_to_the_last_whole_message(tmp_path):
    """Issue 15 fix 7 (promotion cut): change_to_master cuts a torn last record and starts the new
    epoch at the last whole message, so the new term never serves or replicates torn bytes."""
    victim, max_offset, entries = run(promote_torn(tmp_path))
    assert max_offset == victim and entries == [(1, 0), (2, victim)]


def test_promotion_cut_old_rule_is_caught(tmp_path, monkeypatch):
    from rocketray.broker.store import MessageStore
    monkeypatch.setattr(MessageStore, "truncate_invalid_tail", lambda self: -1)
    victim, max_offset, entries = run(promote_torn(tmp_path))
    assert max_offset > victim and entries[-1][1] > victim
