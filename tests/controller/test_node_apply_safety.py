"""One committed request can never wedge the controllers (issue 16, problem 1).

Reproduction: an ApplyBrokerId with a 1 MiB register check code was decided, committed and
applied, then the event-log encoder refused the record (frame limit) with an AssertionError the
apply path did not catch; the applied index never advanced, the tick loop re-applied the same
entry forever and every later request answered 2007. Now the size is refused at decide time (2005,
nothing replicated), and an entry that still fails after commit is handled the same way on every
replica (batch rolled back or logged as a gap; the applied index advances)."""

from __future__ import annotations

import time

import pytest

from rocketray.wire.controller_api import ApplyBrokerIdRequest, GetNextBrokerIdRequest, GetReplicaInfoRequest
from rocketray.wire.controller_codes import ResponseCode
from rocketray.controller.config import ControllerConfig
from rocketray.controller.events import ApplyBrokerIdEvent, ElectMasterEvent, encode_events
from rocketray.controller.proc import InProcessControllers
from rocketray.controller.raft import encode_payload
from rocketray.controller.state import ControllerState

CLUSTER = "c"
HUGE = "127.0.0.1:9000;" + "x" * (1 << 20)


def everyone_alive(name, broker_id):
    return True


@pytest.fixture
def cluster(tmp_path, port_factory):
    group = InProcessControllers(tmp_path / "g", [port_factory() for _ in range(3)], ControllerConfig.for_tests(),
                         alive=everyone_alive)
    yield group
    group.close()


def wait(predicate, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def commit_raw(leader, events) -> int:
    """Commit a batch straight through Raft, bypassing decide (what a decide bug would let through)."""
    outcome = []
    term = leader.metadata()["term"]
    leader._raft.apply_batch(encode_payload(term, encode_events(events), 0),
                             callback=lambda result, error: outcome.append((result, error)))
    wait(lambda: outcome, 10, "the raw batch to commit")
    assert outcome[0][1] == 0, outcome
    return leader.metadata()["applied_index"]


@pytest.mark.slow
def test_an_oversized_request_is_refused_at_decide_time_and_an_unloggable_committed_entry_does_not_wedge(cluster):
    leader = cluster.wait_leader()
    resp = leader.handle(ApplyBrokerIdRequest(CLUSTER, "big", 1, HUGE))
    assert resp.code == ResponseCode.CONTROLLER_INVALID_REQUEST, resp
    assert max(len(entry[0]) for entry in leader._raft.journal) < 4096   # nothing big replicated
    assert leader.handle(GetNextBrokerIdRequest(CLUSTER, "big")).header.next_broker_id == 1

    # The same event committed anyway: every replica applies it, the event log records a gap for
    # it, the applied index advances everywhere, and the group keeps serving.
    index = commit_raw(leader, [ApplyBrokerIdEvent(CLUSTER, "big", "127.0.0.1:9000", HUGE, 1)])
    wait(lambda: all(n.metadata()["applied_index"] >= index for n in cluster.running()), 10,
         "every replica to apply the oversized entry")
    for node in cluster.running():
        meta = node.metadata()
        assert meta["event_log_errors"] == 1, meta
        assert node.events(index - 1)["gaps"] == [[index, index]]
    assert leader.handle(ApplyBrokerIdRequest(CLUSTER, "small", 1, "127.0.0.1:9001;1")).ok
    assert leader.handle(GetReplicaInfoRequest("small")).ok
    wait(lambda: all(n.snapshot_state() == leader.snapshot_state() for n in cluster.running()), 10,
         "every replica to converge on the leader's state")


@pytest.mark.slow
def test_a_batch_whose_apply_raises_is_skipped_identically_on_every_replica(cluster, monkeypatch):
    leader = cluster.wait_leader()
    assert leader.handle(ApplyBrokerIdRequest(CLUSTER, "g", 1, "127.0.0.1:9001;1")).ok
    real_apply = ControllerState.apply

    def apply(self, event):
        if isinstance(event, ElectMasterEvent) and event.broker_name == "g":
            raise RuntimeError("an apply bug")
        real_apply(self, event)

    monkeypatch.setattr(ControllerState, "apply", apply)   # every replica runs in this process
    # first event applies, the second raises: the whole batch is rolled back everywhere
    batch = [ApplyBrokerIdEvent(CLUSTER, "g", "127.0.0.1:9002", "127.0.0.1:9002;1", 2), ElectMasterEvent(True, "g", 1)]
    index = commit_raw(leader, batch)
    wait(lambda: all(n.metadata()["applied_index"] >= index for n in cluster.running()), 10,
         "every replica to pass the failing batch")
    for node in cluster.running():
        assert node.metadata()["failed_batches"] == 1
        assert sorted(node.snapshot_state()["replica_info"][0][3]) == [[1, "127.0.0.1:9001", "127.0.0.1:9001;1"]]
    monkeypatch.setattr(ControllerState, "apply", real_apply)
    assert leader.handle(ApplyBrokerIdRequest(CLUSTER, "g", 2, "127.0.0.1:9002;1")).ok
    wait(lambda: all(n.snapshot_state() == leader.snapshot_state() for n in cluster.running()), 10,
         "every replica to converge on the leader's state")
