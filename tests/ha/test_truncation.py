"""find_consistent_point / decide_truncation: table rows, the 12.6 scenario, and a property test
that random histories of appends and role changes, replicated through the real pure sessions,
always truncate exactly to the longest common prefix found by brute force."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory_log import MemoryLog, apply_slave_actions
from rocketray.ha.session import MasterSession, SlaveSession
from rocketray.ha.truncation import EpochRange, decide_truncation, find_consistent_point, ranges_from_points


@pytest.mark.parametrize("local, local_max, master, master_max, expected", [
    # 12.6 testConfirmOffset: B1 {1:[0,E11)} vs B2 {1:[0,E10), 2:[E10,E20)} -> E10
    ([(1, 0)], 1738, [(1, 0), (2, 1580)], 3160, 1580),
    # identical histories: nothing to cut
    ([(1, 0), (2, 100)], 300, [(1, 0), (2, 100)], 500, 300),
    # slave ahead in the same epoch (the master lost unreplicated tail): cut to the master's end
    ([(1, 0)], 500, [(1, 0)], 300, 300),
    # same epoch number but different start: not the same history -> fall back to older epoch
    ([(1, 0), (3, 200)], 400, [(1, 0), (3, 250)], 600, 200),
    # nothing in common
    ([(2, 0)], 100, [(1, 0)], 100, None),
    # master truncated its prefix; highest common epoch still matches
    ([(1, 0), (2, 1570)], 3000, [(2, 1570)], 5000, 3000),
])
def test_find_consistent_point_table(local, local_max, master, master_max, expected):
    got = find_consistent_point(ranges_from_points(local, local_max),
                                ranges_from_points(master, master_max))
    assert got == expected


def test_decide_truncation_cases():
    """Empty slave keeps nothing unattributed; no consistent point is a failure; the 12.6 cut."""
    assert decide_truncation([], 0, 0, [(1, 0)], 100).truncate_to is None
    d = decide_truncation([], 0, 50, [(1, 0)], 100)
    assert (d.truncate_to, d.resume_offset) == (0, 0)
    # different epochs from the same first offset: provably nothing shared -> cut to 0
    d = decide_truncation([(2, 0)], 0, 10, [(1, 0)], 10)
    assert (d.truncate_to, d.failure) == (0, None)
    # master's history starts later (prefix deleted) and shares no epoch: cannot prove anything
    assert decide_truncation([(1, 0)], 0, 10, [(2, 1570)], 1800).failure
    # a data-less local epoch (promoted, never wrote) is dropped: Truncate at the local max
    d = decide_truncation([(1, 0), (2, 100)], 0, 100, [(1, 0), (3, 100)], 300)
    assert (d.truncate_to, d.resume_offset) == (100, 100)
    d = decide_truncation([(1, 0)], 0, 1738, [(1, 0), (2, 1580)], 3160)
    assert (d.truncate_to, d.resume_offset, d.failure) == (1580, 1580, None)
    d = decide_truncation([(1, 0)], 0, 1000, [(1, 0), (2, 1580)], 3160)
    assert (d.truncate_to, d.resume_offset) == (None, 1000)


def test_ranges_end_at_next_start_and_last_at_max():
    assert ranges_from_points([(1, 0), (4, 10)], 25) == [EpochRange(1, 0, 10), EpochRange(4, 10, 25)]


# ---------------------------------------------------------------------------------------------
# Simulation through the pure sessions over MemoryLogs


def sync(master: MemoryLog, slave: MemoryLog, slave_id: int, budget_bytes: int | None,
         batch_size: int) -> int | None:
    """Connect ``slave`` to ``master``, handshake, stream until caught up (or ``budget_bytes``
    transferred). Returns the truncation point the slave resumed from (its first ack)."""
    now = 1000
    s = SlaveSession(slave_id, heartbeat_interval_ms=100, housekeeping_interval_ms=10_000)
    m = MasterSession(now, heartbeat_interval_ms=100, housekeeping_interval_ms=10_000,
                      batch_size=batch_size)
    to_master = [s.connect(slave.local(), now)]
    resume = None
    sent = 0
    for _ in range(10_000):
        for data in to_master:
            m.receive_data(data, now)
        to_master = []
        while (ev := m.next_event(master.max_offset, now)) is not None:
            if type(ev).__name__ == "AckEvent" and resume is None:
                resume = ev.offset
        to_slave = b""
        if m.reply_due:
            to_slave += m.handshake_reply(master, now)
        out = m.next_send(master, now)
        if out is not None and out.body:
            to_slave += out.header + bytes(out.body)
            sent += len(out.body)
        elif out is not None and out.caught_up and resume is not None:
            return resume
        if to_slave:
            s.receive_data(to_slave, now)
            while (actions := s.next_actions(slave.local(), now)) is not None:
                to_master += apply_slave_actions(slave, actions)
        if budget_bytes is not None and sent >= budget_bytes and resume is not None:
            return resume
        now += 1
    raise AssertionError("did not converge")


def common_prefix_bytes(a: MemoryLog, b: MemoryLog) -> int:
    """Brute force: length in bytes of the longest common prefix of whole records."""
    n = 0
    for x, y in zip(a.records(), b.records()):
        if x != y:
            break
        n += 4 + len(x)
    return n


ops = st.lists(st.one_of(
    st.tuples(st.just("elect"), st.integers(0, 2)),
    st.tuples(st.just("append"), st.integers(1, 6)),
    st.tuples(st.just("sync"), st.integers(0, 2), st.one_of(st.none(), st.integers(0, 60))),
), min_size=1, max_size=25)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops, st.integers(1, 40), st.integers(0, 2**16))
def test_truncation_matches_brute_force_over_random_histories(history, batch_size, seed):
    """Random appends, elections (clean or not) and partial syncs across 3 replicas: every
    handshake cuts the slave exactly at the longest common prefix with its master, and after a
    full catch-up the slave is byte-identical to the master with matching epoch entries."""
    logs = [MemoryLog() for _ in range(3)]
    master, epoch, uid = 0, 1, 0
    logs[0].become_master(epoch)
    for op in history:
        if op[0] == "elect":
            master, epoch = op[1], epoch + 1
            logs[master].become_master(epoch)
        elif op[0] == "append":
            for _ in range(op[1]):
                uid += 1
                logs[master].append_record(f"e{epoch}-u{uid}-s{seed}".encode() * (uid % 3 + 1))
        elif op[1] != master:
            slave = logs[op[1]]
            before = MemoryLog()
            before.data, before.bounds = bytearray(slave.data), list(slave.bounds)
            lcp = common_prefix_bytes(before, logs[master])
            resume = sync(logs[master], slave, op[1], op[2], batch_size)
            if slave.points or before.max_offset == 0:
                assert resume == lcp, (resume, lcp)
            assert slave.data == logs[master].data[:slave.max_offset]
            if op[2] is None:
                assert slave.data == logs[master].data
                assert slave.points == logs[master].points[:len(slave.points)]
                assert [p.start_offset for p in slave.points] == \
                    [p.start_offset for p in logs[master].points
                     if p.start_offset < slave.max_offset]
