"""The pipelined leader (controller/pipeline.py, issue 29): requests decided while earlier ones are
still in flight, on a speculation that contains them; group commit under concurrent writers; the
speculation dropped when a proposal fails or a foreign entry changes the state; the follower's
acknowledgement outbox of controller/raft.py."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from rocketray.wire.controller_api import (ApplyBrokerIdRequest, ElectMasterRequest, GetNextBrokerIdRequest,
                                           RegisterBrokerRequest)
from rocketray.wire.controller_codes import ResponseCode
from rocketray.controller.events import ApplyBrokerIdEvent, ElectMasterEvent, encode_events
from rocketray.controller.pipeline import Speculation, copy_state
from rocketray.controller.raft import RaftHost, SyncingTransport, encode_payload
from rocketray.controller.state import ControllerState

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from controller_cluster import make_cluster  # noqa: E402,F401 - the shared fixture

CLUSTER = "c"


def apply_id(name, broker_id):
    return ApplyBrokerIdRequest(CLUSTER, name, broker_id, f"127.0.0.1:{9000 + broker_id};{broker_id}")


class Gate:
    """Holds the leader's commands in pysyncobj's queue (proposed, not appended) while closed."""

    def __init__(self, leader):
        self.raft = leader._raft
        self.open = False
        self.raft._checkCommandsToApply = self._check   # the tick thread looks it up on the instance

    def _check(self):
        if self.open:
            RaftHost._checkCommandsToApply(self.raft)

    def release(self):
        self.open = True


def in_background(fn):
    out = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    return thread, out


def test_a_request_is_decided_while_its_predecessor_is_in_flight_and_sees_it(make_cluster, wait):
    cluster = make_cluster()
    leader = cluster.wait_leader()
    gate = Gate(leader)
    first, first_out = in_background(lambda: leader.handle(apply_id("g", 1)))
    wait(lambda: leader.metadata()["pipeline_in_flight"] == 1, 5, what="the first proposal in flight")
    # Set g does not exist in the applied state yet: id 2 is valid only on a state that has id 1.
    second, second_out = in_background(lambda: leader.handle(apply_id("g", 2)))
    wait(lambda: leader.metadata()["pipeline_in_flight"] == 2, 5, what="the second decided before the first commits")
    assert leader.snapshot_state()["replica_info"] == []      # nothing committed yet
    gate.release()
    first.join(5)
    second.join(5)
    assert first_out[0].ok and second_out[0].ok, (first_out, second_out)
    assert leader.handle(GetNextBrokerIdRequest(CLUSTER, "g")).header.next_broker_id == 3
    expected = leader.snapshot_state()
    wait(lambda: all(n.snapshot_state() == expected for n in cluster.running()), 5, what="followers to converge")


def test_an_unknown_outcome_drops_the_speculation_and_later_requests_see_what_committed(make_cluster, wait):
    cluster = make_cluster()
    leader = cluster.wait_leader()
    rebuilds = leader.metadata()["speculation_rebuilds"]
    gate = Gate(leader)
    first, first_out = in_background(lambda: leader.handle(apply_id("g", 1), timeout_ms=300))
    wait(lambda: leader.metadata()["pipeline_in_flight"] == 1, 5, what="the first proposal in flight")
    second, second_out = in_background(lambda: leader.handle(apply_id("g", 2), timeout_ms=5000))
    first.join(5)
    assert first_out[0].code == ResponseCode.SYSTEM_ERROR, first_out    # outcome unknown
    assert not leader.is_leader()                                       # re-barriers before it serves
    gate.release()                                                      # both commit after all
    second.join(5)
    assert second_out[0].ok, second_out
    assert leader.handle(GetNextBrokerIdRequest(CLUSTER, "g")).header.next_broker_id == 3
    meta = leader.metadata()
    assert meta["speculation_rebuilds"] > rebuilds and meta["speculation_invalidations"] >= 1


def test_a_foreign_entry_that_changes_the_state_drops_the_speculation(make_cluster, wait):
    cluster = make_cluster()
    leader = cluster.wait_leader()
    assert leader.handle(GetNextBrokerIdRequest(CLUSTER, "g")).header.next_broker_id == 1
    done = threading.Event()
    term = leader.metadata()["term"]
    leader._raft.apply_batch(encode_payload(term, encode_events([ApplyBrokerIdEvent(CLUSTER, "g", "h:1", "h:1;1", 1)]), 0),
                             callback=lambda result, error: done.set())
    assert done.wait(5)
    # A read (and a write) decided on the old speculation would not see set g.
    assert leader.handle(GetNextBrokerIdRequest(CLUSTER, "g")).header.next_broker_id == 2
    assert leader.handle(apply_id("g", 2)).ok
    assert leader.metadata()["speculation_invalidations"] >= 1


def test_concurrent_writers_share_fsyncs_and_every_replica_agrees(make_cluster, wait):
    # Timing loose enough that a starved tick on a loaded CI machine costs no leadership.
    cluster = make_cluster(raft_min_timeout_ms=1500, raft_max_timeout_ms=3000, connection_timeout_ms=4000,
                           leader_fallback_timeout_ms=8000, request_timeout_ms=20000)
    leader = cluster.wait_leader(30)
    clients, per_client = 16, 5
    names = [[f"g{k}-{i}" for i in range(per_client)] for k in range(clients)]
    syncs_before = sum(n.metadata()["journal_syncs"] for n in cluster.running())
    answers: list = []

    def client(k):
        for name in names[k]:
            answers.append(leader.handle(apply_id(name, 1)))
            answers.append(leader.handle(RegisterBrokerRequest(CLUSTER, name, 1, "127.0.0.1:9001")))
            answers.append(leader.handle(ElectMasterRequest.of_broker_trigger(CLUSTER, name, 1)))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(answers) == 3 * clients * per_client and all(a.ok for a in answers), \
        [a for a in answers if not a.ok][:3]
    entries = len(answers)      # two writes and a barrier (the register changes nothing) per name
    syncs = sum(n.metadata()["journal_syncs"] for n in cluster.running()) - syncs_before
    assert syncs / entries < 2.5, (syncs, entries)  # one at a time, each costs 3 (leader + 2 followers)
    expected = leader.snapshot_state()
    assert len(expected["sync_state"]) == clients * per_client
    assert all(row[2:4] == [1, 1] for row in expected["sync_state"]), expected["sync_state"][:3]  # master 1, epoch 1
    wait(lambda: all(n.snapshot_state() == expected for n in cluster.running()), 10, what="followers to converge")


# -- one layer: the speculation and the acknowledgement outbox ------------------------------------

def test_speculation_expects_its_own_entries_in_order_and_drops_itself_on_anything_else():
    spec = Speculation()
    spec.reset(3, ControllerState())
    spec.add([ApplyBrokerIdEvent(CLUSTER, "g", "h:1", "h:1;1", 1)], b"p1")
    spec.add([ElectMasterEvent(True, "g", 1)], b"p2")
    assert spec.state.contains("g") and spec.in_flight == 2
    spec.applied(b"p1", True)
    spec.applied(b"barrier", False)            # an entry that changed nothing (barrier, fenced)
    assert spec.valid_for(3) and spec.in_flight == 1
    spec.applied(b"other", True)               # not ours and it changed the state
    assert not spec.valid_for(3) and spec.invalidations == 1


def test_the_speculation_starts_from_a_copy_that_shares_nothing_mutable():
    state = ControllerState()
    for event in (ApplyBrokerIdEvent(CLUSTER, "g", "h:1", "h:1;1", 1), ApplyBrokerIdEvent(CLUSTER, "g", "h:2", "h:2;2", 2),
                  ElectMasterEvent(True, "g", 1)):
        state.apply(event)
    state.topics["t"] = ("g",)
    before = state.to_snapshot(), state.topics_to_snapshot()
    copy = copy_state(state)
    assert copy == state
    copy.apply(ApplyBrokerIdEvent(CLUSTER, "g", "h:3", "h:3;3", 3))
    copy.sync_state["g"].update_sync_state_set({1, 2})
    copy.topics["u"] = ("g",)
    assert (state.to_snapshot(), state.topics_to_snapshot()) == before


def test_speculation_whose_apply_raises_is_dropped():
    spec = Speculation()
    spec.reset(1, ControllerState())
    spec.add(["not an event"], b"p")          # ControllerState.apply raises TypeError
    assert not spec.valid_for(1)


class _Node:
    pass


@pytest.mark.parametrize("first, second, kept", [
    ((True, False, 5), (True, False, 7), [7]),          # newer success supersedes
    ((True, False, 7), (True, False, 5), [7, 5]),       # never replace by a lower index
    ((True, False, 5), (False, True, 3), [5, 3]),       # a reset is always sent
    ((False, True, 3), (True, False, 5), [3, 5]),
])
def test_acknowledgements_of_one_poll_collapse_only_when_nothing_is_lost(first, second, kept):
    transport = SyncingTransport.__new__(SyncingTransport)
    transport._outbox = []
    leader = _Node()
    for success, reset, idx in (first, second):
        transport._defer(leader, {"type": "next_node_idx", "success": success, "reset": reset,
                                  "next_node_idx": idx})
    assert [m["next_node_idx"] for _, m in transport._outbox] == kept


def test_acknowledgements_to_different_leaders_are_all_kept():
    transport = SyncingTransport.__new__(SyncingTransport)
    transport._outbox = []
    a, b = _Node(), _Node()
    for node, idx in ((a, 5), (b, 6)):
        transport._defer(node, {"type": "next_node_idx", "success": True, "reset": False, "next_node_idx": idx})
    assert [(n, m["next_node_idx"]) for n, m in transport._outbox] == [(a, 5), (b, 6)]
