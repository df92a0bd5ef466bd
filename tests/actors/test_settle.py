"""``pipeline.settle(in_sync=True)``, the node-loss step's precondition: every replica back in its
master's SyncStateSet, not only caught up. A CI dry run killed the master's node while the set was
still the new master alone (its expansion waited for the controller leader killed just before):
no replica was electable and writes never resumed. The old settle returned at once there."""

from __future__ import annotations

import types

import pytest

from rocketray.actors import pipeline
from rocketray.actors.cluster import ClusterError
from rocketray.actors.views import BrokerStatus, Role

from broker_status_factory import broker_status


class Group:
    """A group of three replicas at offset 500, all caught up; the master's confirmed
    SyncStateSet grows to everyone after ``expand_after`` polls (never with None)."""

    def __init__(self, expand_after: int | None) -> None:
        self.spec = types.SimpleNamespace(groups=["g"])
        self.polls = 0
        self.expand_after = expand_after

    def group_status(self, group: str) -> list[BrokerStatus]:
        self.polls += 1
        grown = self.expand_after is not None and self.polls > self.expand_after
        sss = (1, 2, 3) if grown else (1,)
        return [broker_status(replica=r, broker_id=r, role=Role.MASTER if r == 1 else Role.SLAVE,
                              sync_state_set=sss if r == 1 else (), max_offset=500, confirm_offset=500,
                              master_address="m") for r in (1, 2, 3)]


def test_settle_in_sync_waits_for_the_sync_state_set_to_hold_every_replica():
    cluster = Group(expand_after=3)
    pipeline.settle(cluster, timeout_s=10, in_sync=True)
    assert cluster.polls == 4


def test_plain_settle_only_waits_for_the_log():
    cluster = Group(expand_after=3)
    pipeline.settle(cluster, timeout_s=10)
    assert cluster.polls == 1


def test_settle_in_sync_times_out_when_the_set_never_grows():
    with pytest.raises(ClusterError, match="SyncStateSet does not hold every replica"):
        pipeline.settle(Group(expand_after=None), timeout_s=0.5, in_sync=True)
