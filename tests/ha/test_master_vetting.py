"""A proposal that waited behind another report is vetted when it leaves (found by the simulator, seed 14).

Member 1 lost its connection (removal reported), reconnected and caught up, and its expand was queued
behind the report in flight; the controller confirmed the removal, the confirm offset moved on
without member 1, and the queued expand then put member 1 back into the union view short of the
confirm offset that consumers had already read up to. A member may enter the view only if its live
ack holds the confirm offset (and the epoch start) at the moment the report leaves.
"""

from rocketray.ha.ack import AckPolicy
from rocketray.ha.master import MasterReplication
from rocketray.ha.session import AckEvent


def _master_with_two_slaves(ack1: int, ack2: int) -> MasterReplication:
    r = MasterReplication(3, AckPolicy())
    r.confirmed({2, 3})
    for key, slave in (("c1", 1), ("c2", 2)):
        r.opened(key)
        r.handshake(key, slave)
    r.acked("c1", AckEvent(1, ack1, None), 0, 0)
    r.acked("c2", AckEvent(2, ack2, None), 0, 0)
    return r


def test_a_lagging_member_does_not_enter_the_view():
    r = _master_with_two_slaves(ack1=5667, ack2=5925)
    assert r.confirm_offset(5925, 0) == 5925            # view {2, 3}: member 1 is not counted
    assert r.in_flight({1, 2, 3}, confirm_offset=5925, epoch_start=0) is None
    assert r.view() == {2, 3}
    assert r.confirm_offset(5925, 5925) == 5925


def test_a_member_holding_the_confirm_offset_enters():
    r = _master_with_two_slaves(ack1=5925, ack2=5925)
    assert r.in_flight({1, 2, 3}, confirm_offset=5925, epoch_start=0) == {1, 2, 3}
    assert r.view() == {1, 2, 3}


def test_a_member_behind_the_epoch_start_is_dropped_but_a_removal_still_goes():
    r = _master_with_two_slaves(ack1=100, ack2=5925)
    r.confirmed({1, 2, 3})
    # removing 2 while adding nobody: sent as is
    assert r.in_flight({1, 3}, confirm_offset=100, epoch_start=0) == {1, 3}


def test_members_already_in_the_view_are_kept_whatever_their_ack():
    r = _master_with_two_slaves(ack1=10, ack2=5925)
    r.confirmed({1, 2, 3})
    assert r.in_flight({1, 3}, confirm_offset=5925, epoch_start=0) == {1, 3}
