"""SyncStateSet bookkeeping (reference 13.1, 13.3) and the confirm-offset rule (quirk 13)."""

from __future__ import annotations

from rocketray.ha.sync_state import SyncStateTracker


def test_union_view_while_synchronizing_bug_5663():
    """While a proposal is in flight every check uses local | proposed (apache/rocketmq#5663)."""
    t = SyncStateTracker(1)
    t.set_sync_state_set({1, 2})
    t.mark_synchronizing({1, 3})
    assert t.sync_state_set() == {1, 2, 3}
    assert t.in_sync_replicas_nums() == 2
    t.set_sync_state_set({1, 3})
    assert not t.synchronizing and t.sync_state_set() == {1, 3}


def test_expand_requires_confirm_offset_and_current_epoch_start():
    t = SyncStateTracker(1)
    assert t.maybe_expand(2, ack=50, confirm_offset=100, current_epoch_start=0) is None
    assert t.maybe_expand(2, ack=100, confirm_offset=100, current_epoch_start=150) is None
    assert t.maybe_expand(2, ack=200, confirm_offset=100, current_epoch_start=150) == {1, 2}
    assert t.synchronizing
    assert t.maybe_expand(2, ack=300, confirm_offset=100, current_epoch_start=150) is None


def test_shrink_after_not_catching_up_and_unknown_members():
    t = SyncStateTracker(1, max_time_slave_not_catchup_ms=15000)
    t.set_sync_state_set({1, 2, 3})
    t.update_caught_up(2, 1000)
    assert t.maybe_shrink(10_000) == {1, 2}      # 3 was never seen
    t.set_sync_state_set({1, 2})
    assert t.maybe_shrink(16_001) == {1}        # 2 last caught up 15.001 s ago
    assert t.synchronizing and t.sync_state_set() == {1, 2}
    assert t.maybe_shrink(16_002) == {1} and t.pending == (frozenset({1}),)   # not proposed twice


def test_disconnect_proposes_removal():
    t = SyncStateTracker(1)
    t.set_sync_state_set({1, 2, 3})
    assert t.on_disconnect(2) == {1, 3}
    assert t.on_disconnect(9) is None


def test_quirk13_confirm_offset_freezes_for_missing_members_and_counts_ack_zero():
    """Quirk 13, decided: a disconnected or not-yet-acked member freezes the confirm offset; a
    member that acked 0 holds it at 0 (upstream skips acks of 0 and would run ahead)."""
    t = SyncStateTracker(1)
    t.set_sync_state_set({1, 2, 3})
    assert t.compute_confirm_offset(500, 100, {2: 400, 3: 300}) == 300
    assert t.compute_confirm_offset(500, 100, {2: 400}) == 100            # 3 disconnected
    assert t.compute_confirm_offset(500, 100, {2: 400, 3: -1}) == 100     # 3 not acked yet
    assert t.compute_confirm_offset(500, 0, {2: 400, 3: 0}) == 0          # ack 0 counts
    # No floor above a member's ack (issue 15 fix 1): a member holding 300 caps it at 300.
    assert t.compute_confirm_offset(500, 350, {2: 400, 3: 300}) == 300
    assert t.compute_confirm_offset(500, 350, {2: 200}) == 200            # 3 missing, 2 at 200
    t.set_sync_state_set({1})
    assert t.compute_confirm_offset(500, 100, {}) == 500
    # during a proposed expand the proposed member counts too
    t.mark_synchronizing({1, 2})
    assert t.compute_confirm_offset(500, 100, {2: 200}) == 200
