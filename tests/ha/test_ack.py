"""The pure ack policy and confirm-offset core (rocketray.ha.ack) and the tracker's union view,
with the issue 15 violations 1 and 2 replayed at the core level (each also against its old rule)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from ha_old_rules import old_compute_confirm_offset, old_maybe_shrink
from rocketray.wire.put_result import PutResult, PutStatus, Written
from rocketray.ha.ack import AckPolicy, after_write, batch_acked, confirm_offset, put_admitted, refused, union_view
from rocketray.ha.sync_state import SyncStateTracker

ALL_ACK = AckPolicy(all_ack_in_sync_state_set=True)


# -- confirm offset: table ----------------------------------------------------------------------

@pytest.mark.parametrize("members, max_offset, current, acks, expected", [
    ({1}, 500, 100, {}, 500),                          # alone: everything written is confirmed
    ({1}, 500, 100, {2: 10}, 500),                     # a connected non-member does not count
    ({1, 2}, 500, 100, {2: 300}, 300),                 # min over members
    ({1, 2}, 500, 400, {2: 300}, 300),                 # no floor above a member's ack
    ({1, 2}, 500, 100, {}, 100),                       # member not connected: frozen
    ({1, 2}, 500, 100, {2: -1}, 100),                  # connected, not acked yet: frozen
    ({1, 2, 3}, 500, 100, {2: 50}, 50),                # frozen, capped by a known lower ack
    ({1, 2, 3}, 500, 100, {2: 400, 3: 0}, 0),          # an ack of 0 counts as 0
    ({1, 2}, 500, -1, {}, 0),                          # never negative
    ({1, 2}, 200, 100, {2: 300}, 200),                 # never above the max offset
])
def test_confirm_offset_table(members, max_offset, current, acks, expected):
    """Every row: the confirm offset is what every member of the union view is known to hold."""
    assert confirm_offset(1, frozenset(members), max_offset, current, acks) == expected


def test_confirm_offset_quorum_mode_is_the_max_offset():
    assert confirm_offset(1, frozenset({1, 2}), 500, 100, {2: 10}, all_ack=False) == 500


def brute_confirm(self_id, members, max_offset, current, acks):
    """Obviously right: the largest c in [0, max] that every member other than us is known to
    hold, and not beyond the current value if some member's progress is unknown."""
    others = [m for m in members if m != self_id]
    unknown = any(acks.get(m, -1) < 0 for m in others)
    ok = [c for c in range(0, max_offset + 1)
          if all(acks.get(m, -1) < 0 or acks[m] >= c for m in others)
          and (not unknown or c <= max(current, 0))]
    return max(ok)


@settings(max_examples=400, deadline=None)
@given(members=st.frozensets(st.integers(1, 5), min_size=1), max_offset=st.integers(0, 60),
       current=st.integers(-1, 60), acks=st.dictionaries(st.integers(1, 6), st.integers(-1, 70)))
def test_confirm_offset_matches_brute_force(members, max_offset, current, acks):
    """Property: the fast rule equals the brute-force definition for any view and acks."""
    members = members | {1}
    acks = {k: v for k, v in acks.items() if k != 1}
    assert confirm_offset(1, members, max_offset, current, acks) == \
        brute_confirm(1, members, max_offset, current, acks)


# -- ack policy -------------------------------------------------------------------------------

@pytest.mark.parametrize("policy, members, acks, end, expected", [
    (ALL_ACK, {1}, {}, 100, True),
    (ALL_ACK, {1, 2}, {2: 100}, 100, True),
    (ALL_ACK, {1, 2}, {2: 99}, 100, False),
    (ALL_ACK, {1, 2, 3}, {2: 100}, 100, False),                  # 3 not connected
    (ALL_ACK, {1, 2}, {2: 100, 3: 0}, 100, True),                # non-member 3 does not count
    (AckPolicy(False, 2), {1}, {2: 100}, 100, True),             # quorum: master + 1
    (AckPolicy(False, 3), {1}, {2: 100, 3: 50}, 100, False),
    (AckPolicy(False, 1), {1, 2}, {}, 100, True),
])
def test_batch_acked_table(policy, members, acks, end, expected):
    assert batch_acked(policy, 1, frozenset(members), acks, end) is expected


def test_put_admitted_by_min_in_sync_replicas():
    assert put_admitted(AckPolicy(min_in_sync_replicas=2), 2)
    assert not put_admitted(AckPolicy(min_in_sync_replicas=2), 1)


def test_put_results_say_written_and_retriable():
    """Fix 4 at the core: a role change after the write is MASTER_CHANGED, written UNKNOWN, not
    retriable; refusals are written NO and retriable; a timeout is written YES."""
    assert refused(PutStatus.NOT_MASTER) == PutResult(PutStatus.NOT_MASTER, Written.NO)
    assert refused(PutStatus.FENCED).retriable
    changed = after_write(False, False, ((0, 0),), 120)
    assert (changed.status, changed.written, changed.retriable) == \
        (PutStatus.MASTER_CHANGED, Written.UNKNOWN, False)
    timeout = after_write(False, True, ((0, 0),), 120)
    assert (timeout.status, timeout.written, timeout.retriable) == \
        (PutStatus.FLUSH_SLAVE_TIMEOUT, Written.YES, False)
    ok = after_write(True, True, ((0, 0),), 120)
    assert ok.ok and not ok.retriable
    with pytest.raises(AssertionError):
        PutResult(PutStatus.PUT_OK, Written.UNKNOWN)
    with pytest.raises(AssertionError):
        PutResult(PutStatus.NOT_MASTER, Written.NO, ((0, 0),))


# -- violation 1: a consumer reads a message later truncated --------------------------------------

def replay_violation_1(t: SyncStateTracker) -> list[int]:
    """Master B=2 alone in the set; slave A=1 catches up at 1000 and B proposes {1,2}; A stops;
    B writes M (max 1100); the controller confirms {1,2}. Returns B's confirm offset after the
    write and after the confirmation (consumers read up to it)."""
    t.set_sync_state_set({2})
    t.update_caught_up(1, 0)
    assert t.maybe_expand(1, ack=1000, confirm_offset=1000, current_epoch_start=0) == {1, 2}
    seen = [t.compute_confirm_offset(1100, 1000, {1: 1000})]      # A connected, stopped at 1000
    seen.append(t.compute_confirm_offset(1100, 1000, {}))          # A gone
    t.set_sync_state_set({1, 2})
    seen.append(t.compute_confirm_offset(1100, seen[-1], {1: 1000}))   # A back, holds 1000
    return seen


def test_violation_1_confirm_offset_never_covers_what_a_joining_member_lacks():
    """Issue 15 #1: with an expand in flight the confirm offset stays at what A holds (1000), so no
    consumer can read M, which A (electable once the controller confirms {A,B}) does not have."""
    assert replay_violation_1(SyncStateTracker(2)) == [1000, 1000, 1000]


def test_violation_1_old_rule_is_caught(monkeypatch):
    """The old rule (confirmed set of one -> max offset; never-backwards floor) lets M be read."""
    monkeypatch.setattr(SyncStateTracker, "compute_confirm_offset", old_compute_confirm_offset)
    assert max(replay_violation_1(SyncStateTracker(2))) > 1000


def test_confirm_offset_moves_down_to_a_member_that_holds_less():
    """The floor must not keep a confirm offset above what the new set's members hold."""
    t = SyncStateTracker(2)
    t.set_sync_state_set({1, 2})
    assert t.compute_confirm_offset(1100, 1100, {1: 1000}) == 1000


# -- violation 2: a put acknowledged without a joining member ---------------------------------------

def replay_violation_2(t: SyncStateTracker) -> bool:
    """Confirmed {1,2}, expand to {1,2,3} in flight; member 2 lags past the limit, the shrink check
    runs; 3 stops at 500. Returns whether a put ending at 600 counts as acknowledged."""
    t.set_sync_state_set({1, 2})
    t.update_caught_up(2, 0)
    t.update_caught_up(3, 20_000)
    assert t.maybe_expand(3, ack=500, confirm_offset=500, current_epoch_start=0) == {1, 2, 3}
    t.maybe_shrink(20_000)                       # 2 not caught up for 20 s (limit 15 s)
    return batch_acked(ALL_ACK, 1, t.sync_state_set(), {2: 600, 3: 500}, 600)


def test_violation_2_shrink_keeps_the_pending_expand_in_the_union_view():
    """Issue 15 #2: the controller may already hold {1,2,3}; until it answers, 3 must ack."""
    t = SyncStateTracker(1)
    assert replay_violation_2(t) is False
    assert t.sync_state_set() == {1, 2, 3}
    assert t.latest() == {1, 3}                  # the candidate: 2 leaves, 3 stays
    t.set_sync_state_set({1, 2, 3})              # the controller answers the expand
    assert t.sync_state_set() == {1, 2, 3} and t.pending == (frozenset({1, 3}),)
    t.set_sync_state_set({1, 3})                 # then the shrink
    assert t.sync_state_set() == {1, 3} and not t.synchronizing


def test_violation_2_old_rule_is_caught(monkeypatch):
    monkeypatch.setattr(SyncStateTracker, "maybe_shrink", old_maybe_shrink)
    assert replay_violation_2(SyncStateTracker(1)) is True


def test_mark_in_flight_keeps_a_queued_proposal_after_an_earlier_confirmation():
    """The role machine sends a queued proposal after confirming the previous one: marking it in
    flight puts it back in the union view."""
    t = SyncStateTracker(1)
    t.set_sync_state_set({1, 2})
    t.mark_in_flight({1, 2, 3})
    t.set_sync_state_set({1, 2, 3})
    assert not t.synchronizing
    t.mark_in_flight({1, 2, 3, 4})
    assert t.sync_state_set() == {1, 2, 3, 4} and t.in_sync_replicas_nums() == 4


# -- property: the union view covers every proposal the controller may hold ---------------------------

ops = st.lists(st.one_of(
    st.tuples(st.just("expand"), st.integers(2, 5)),
    st.tuples(st.just("disconnect"), st.integers(2, 5)),
    st.tuples(st.just("shrink"), st.integers(0, 40_000)),
    st.tuples(st.just("caught_up"), st.integers(2, 5)),
    st.tuples(st.just("answer"), st.integers(0, 10)),
), max_size=40)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_union_view_covers_confirmed_and_every_unanswered_proposal(script):
    """Property: after any sequence of proposals (expand, disconnect, shrink) and controller answers
    (confirming one of the unanswered proposals, the ones before it count as answered too), the
    union view contains the confirmed set and every proposal not yet answered."""
    check_union_view(script)


def test_union_view_property_catches_the_old_shrink_rule(monkeypatch):
    """The property's checker fails against the old shrink rule on a short script."""
    monkeypatch.setattr(SyncStateTracker, "maybe_shrink", old_maybe_shrink)
    script = [("caught_up", 2), ("expand", 2), ("answer", 0), ("caught_up", 3), ("expand", 3),
              ("shrink", 40_000)]
    with pytest.raises(AssertionError):
        check_union_view(script)


def check_union_view(script) -> None:
    t = SyncStateTracker(1, max_time_slave_not_catchup_ms=15_000)
    unanswered: list[frozenset[int]] = []
    for op, arg in script:
        before = t.pending
        if op == "expand":
            t.maybe_expand(arg, ack=10, confirm_offset=0, current_epoch_start=0)
        elif op == "disconnect":
            t.on_disconnect(arg)
        elif op == "shrink":
            t.maybe_shrink(arg)
        elif op == "caught_up":
            t.update_caught_up(arg, 20_000)
        elif unanswered:
            i = arg % len(unanswered)
            t.set_sync_state_set(unanswered[i])
            del unanswered[:i + 1]
        unanswered += [p for p in t.pending if p not in before]
        view = t.sync_state_set()
        assert t.local <= view and 1 in view
        for p in unanswered:
            assert p <= view, (p, view, t.pending)
