"""The pure master replication core (rocketray.ha.master.MasterReplication): connections' acks,
proposals and ack decisions on the union view, without sockets."""

from __future__ import annotations

from rocketray.ha.ack import AckPolicy
from rocketray.ha.master import MasterReplication
from rocketray.ha.session import AckEvent


def core(**policy) -> MasterReplication:
    return MasterReplication(1, AckPolicy(**policy), max_time_slave_not_catchup_ms=1000)


def test_an_ack_counts_only_on_the_live_connection_and_a_reconnect_replaces_the_old_one():
    r = core()
    r.opened("c1")
    assert r.handshake("c1", 2) == []
    r.acked("c1", AckEvent(2, 500, None), 0, 0)
    r.opened("c2")
    assert r.handshake("c2", 2) == ["c1"]          # the shell closes c1
    assert r.acks() == {2: 500}
    assert r.closed("c1", still_master=True) is None   # 2 still has c2: no removal
    assert r.acks() == {2: -1}                     # c2 has not acked yet


def test_a_caught_up_ack_proposes_the_expand_and_the_union_view_counts_it_at_once():
    """Issue 15 #1 in the core: from the proposal on, the confirm offset and acks wait for 2."""
    r = core()
    r.opened("c")
    r.handshake("c", 2)
    assert r.acked("c", AckEvent(2, 100, 5), confirm_offset_now=100, epoch_start=0) == {1, 2}
    assert r.view() == {1, 2}
    assert r.confirm_offset(max_offset=300, current=100) == 100
    assert not r.batch_acked(300)
    r.acked("c", AckEvent(2, 300, 6), 100, 0)
    assert r.batch_acked(300) and r.confirm_offset(300, 100) == 300


def test_an_expand_needs_the_confirm_offset_and_the_epoch_start():
    r = core()
    r.opened("c")
    r.handshake("c", 2)
    assert r.acked("c", AckEvent(2, 50, 5), confirm_offset_now=100, epoch_start=0) is None
    assert r.acked("c", AckEvent(2, 150, 5), confirm_offset_now=100, epoch_start=200) is None
    assert r.acked("c", AckEvent(2, 150, None), confirm_offset_now=100, epoch_start=0) is None


def test_losing_the_last_connection_proposes_removal_only_as_master():
    r = core()
    r.confirmed({1, 2})
    r.opened("c")
    r.handshake("c", 2)
    assert r.closed("c", still_master=False) is None
    r.opened("d")
    r.handshake("d", 2)
    assert r.closed("d", still_master=True) == {1}
    assert r.view() == {1, 2}                      # 2 still counts until the controller answers
    r.confirmed({1})
    assert r.view() == {1}


def test_caught_up_ignores_learners_and_slaves_that_never_acked():
    r = core()
    r.confirmed({1, 2, 3, 4})
    for key, slave in (("a", 2), ("b", 3), ("c", 4)):
        r.opened(key)
        r.handshake(key, slave)
    r.acked("b", AckEvent(3, 0, None), 0, 0)
    r.acked("c", AckEvent(4, 0, None), 0, 0)
    r.caught_up("a", 10_000, async_learner=False)   # 2 never acked: not caught up
    r.caught_up("b", 10_000, async_learner=True)    # learner: not caught up
    r.caught_up("c", 10_000, async_learner=False)
    assert r.shrink(10_500) == {1, 4}


def test_min_in_sync_replicas_and_quorum_acks():
    r = core(all_ack_in_sync_state_set=False, in_sync_replicas=2, min_in_sync_replicas=2)
    assert not r.put_admitted()
    r.confirmed({1, 2})
    assert r.put_admitted()
    r.opened("c")
    r.handshake("c", 2)
    r.acked("c", AckEvent(2, 40, None), 0, 0)
    assert r.batch_acked(40) and not r.batch_acked(41)
    assert r.confirm_offset(100, 0) == 100          # quorum mode: the max offset


# -- property: nothing is acknowledged or confirmed beyond what the controller may count ------------

from hypothesis import given, settings, strategies as st  # noqa: E402

steps = st.lists(st.one_of(
    st.tuples(st.just("connect"), st.integers(2, 4), st.just(0)),
    st.tuples(st.just("ack"), st.integers(2, 4), st.integers(0, 50)),
    st.tuples(st.just("close"), st.integers(2, 4), st.just(0)),
    st.tuples(st.just("shrink"), st.just(0), st.integers(0, 5000)),
    st.tuples(st.just("answer"), st.integers(0, 8), st.just(0)),
    st.tuples(st.just("write"), st.just(0), st.integers(1, 20)),
), max_size=60)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_acks_and_confirm_offset_never_run_ahead_of_a_member_the_controller_may_count(script):
    """Property: whatever the controller ends up confirming (the confirmed set or any proposal not
    answered yet), every member of it other than the master holds the confirm offset and every
    acknowledged batch (acks only grow on a live connection; a lost connection forgets them)."""
    r = core()
    max_offset, confirm, now = 0, 0, 0
    keys: dict[int, int] = {}               # slave -> live connection number
    acks: dict[int, int] = {}               # slave -> its log end (what it holds)
    serial = 0
    unanswered: list[frozenset[int]] = []
    for op, slave, arg in script:
        before = r.tracker.pending
        now += 100
        if op == "connect" and slave not in keys:
            serial += 1
            keys[slave] = serial
            r.opened(serial)
            r.handshake(serial, slave)
        elif op == "ack" and slave in keys:
            held = min(max(acks.get(slave, 0), arg), max_offset)
            acks[slave] = held
            caught = now if held == max_offset else None
            r.acked(keys[slave], AckEvent(slave, held, caught), confirm, 0)
        elif op == "close" and slave in keys:
            r.closed(keys.pop(slave), still_master=True)
        elif op == "shrink":
            r.shrink(now + arg)
        elif op == "answer" and unanswered:
            i = slave % len(unanswered)
            r.confirmed(unanswered[i])
            del unanswered[:i + 1]
        elif op == "write":
            max_offset += arg
        unanswered += [p for p in r.tracker.pending if p not in before]
        confirm = r.confirm_offset(max_offset, confirm)
        may_count = set(r.tracker.local).union(*unanswered)
        for member in may_count - {1}:
            held = acks.get(member, 0)
            assert confirm <= held, (member, held, confirm, may_count)
            for end in range(held + 1, max_offset + 1):
                assert not r.batch_acked(end), (member, held, end)
