"""A controller node re-electing many groups at once (a machine that held dozens of masters died):
the elections go through Raft as batches (``ElectMastersRequest``), not one entry per group."""

from __future__ import annotations

import threading

import pytest

from rocketray.wire.controller_api import (AlterSyncStateSetRequest, ApplyBrokerIdRequest, ElectMasterRequest,
                                           RegisterBrokerRequest)
from rocketray.controller.config import ControllerConfig
from rocketray.controller.notify import ElectionTrigger
from rocketray.controller.proc import InProcessControllers

CLUSTER, GROUPS = "c", 12


@pytest.fixture
def node_with_groups(tmp_path, port_factory):
    """One node serving ``GROUPS`` groups of 3, replica 1 master of each, every replica in sync."""
    dead: set[tuple[str, int]] = set()
    notices = []
    cluster = InProcessControllers(tmp_path / "n", [port_factory()], ControllerConfig.for_tests(),
                                   alive=lambda name, broker_id: (name, broker_id) not in dead,
                                   on_role_changed=notices.append)
    node = cluster.wait_leader()
    for g in range(GROUPS):
        name = f"g{g:02d}"
        for bid in (1, 2, 3):
            assert node.handle(ApplyBrokerIdRequest(CLUSTER, name, bid, f"h:{g}{bid};1")).ok
            assert node.handle(RegisterBrokerRequest(CLUSTER, name, bid, f"h:{g}{bid}")).ok
        assert node.handle(ElectMasterRequest.of_broker_trigger(CLUSTER, name, 1)).ok
        assert node.handle(AlterSyncStateSetRequest(name, 1, 1, frozenset({1, 2, 3}), 1)).ok
    yield node, dead, notices
    cluster.close()


def election_entries(node, after: int) -> dict[str, int]:
    """group -> Raft index of its controller-triggered election applied after ``after``."""
    return {r["broker_name"]: r["index"] for r in node.events(after)["events"]
            if r["type"] == "ElectMasterEvent" and r["new_master_elected"]}


@pytest.mark.slow
def test_many_groups_are_re_elected_in_one_raft_entry(node_with_groups):
    """trigger_elect_masters: every group whose master died gets a new master from its SyncStateSet,
    all in one entry, each notified once with the controller trigger."""
    node, dead, notices = node_with_groups
    lost = [f"g{g:02d}" for g in range(0, GROUPS, 2)]
    dead.update((name, 1) for name in lost)
    after = node.applied_index
    answers = node.trigger_elect_masters(lost + ["nobody"])
    assert all(answers[n].ok and answers[n].header.master_broker_id == 2 for n in lost), answers
    assert not answers["nobody"].ok
    entries = election_entries(node, after)
    assert sorted(entries) == lost and len(set(entries.values())) == 1
    elections = [n for n in notices if n.trigger is ElectionTrigger.CONTROLLER]
    assert sorted(n.broker_name for n in elections) == lost


@pytest.mark.slow
def test_closed_master_sessions_arriving_together_share_raft_entries(node_with_groups):
    """Masters' sessions closing at once from many threads (SessionServer's workers): every group is
    re-elected, in fewer entries than groups (a call during a batch joins the next one)."""
    node, dead, _ = node_with_groups
    dead.update((f"g{g:02d}", 1) for g in range(GROUPS))
    after = node.applied_index
    start = threading.Barrier(GROUPS)

    def close(name: str) -> None:
        start.wait()
        node.on_broker_session_closed(name, 1)

    threads = [threading.Thread(target=close, args=(f"g{g:02d}",)) for g in range(GROUPS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    entries = election_entries(node, after)
    assert len(entries) == GROUPS, sorted(entries)
    assert len(set(entries.values())) < GROUPS, entries
    assert all(node.state.sync_state[n].master_broker_id == 2 for n in entries)
