"""ControllerNode on 3 real pysyncobj nodes (loopback): reference 16.2 scenarios, pipeline, security.

Each test starts its own group with tight raft timing (ControllerConfig.for_tests) and waits on
predicates with deadlines. Who may reach the Raft port is tests/security/test_raft_port.py.
"""

from __future__ import annotations

import pytest

from rocketray.wire.controller_api import (AlterSyncStateSetRequest, ApplyBrokerIdRequest, ElectMasterRequest,
                                           GetNextBrokerIdRequest, GetReplicaInfoRequest, RegisterBrokerRequest)
from rocketray.wire.controller_codes import ResponseCode
from rocketray.controller.config import ControllerConfig
from rocketray.controller.events import ApplyBrokerIdEvent, encode_events
from rocketray.controller.proc import InProcessControllers
from rocketray.controller.raft import encode_payload

GROUP = "broker-a"
CLUSTER = "cluster-a"
ADDR = {1: "127.0.0.1:9000", 2: "127.0.0.1:9001", 3: "127.0.0.1:9002"}


def everyone_alive(name, broker_id):
    return True


def one_dead(name, broker_id):
    return broker_id != 1


@pytest.fixture
def make_cluster(tmp_path, port_factory):
    made = []

    def make(config=None, n=3):
        liveness = {"alive": everyone_alive}   # what set_alive changes, read by every node
        cluster = InProcessControllers(tmp_path / f"c{len(made)}", [port_factory() for _ in range(n)],
                               config or ControllerConfig.for_tests(),
                               alive=lambda name, broker_id: liveness["alive"](name, broker_id))
        cluster.liveness = liveness
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.close()


def set_alive(cluster, predicate):
    cluster.liveness["alive"] = predicate


def mock_metadata(leader):
    """16.2 mockMetaData: ids 1,2,3 registered, broker 1 elected, SSS {1,2,3} at epoch 2."""
    for broker_id in (1, 2, 3):
        resp = leader.handle(GetNextBrokerIdRequest(CLUSTER, GROUP))
        assert resp.ok and resp.header.next_broker_id == broker_id
        code = f"{ADDR[broker_id]};{1000 + broker_id}"
        assert leader.handle(ApplyBrokerIdRequest(CLUSTER, GROUP, broker_id, code)).ok
        assert leader.handle(RegisterBrokerRequest(CLUSTER, GROUP, broker_id, ADDR[broker_id])).ok
    assert leader.handle(ElectMasterRequest.of_broker_trigger(CLUSTER, GROUP, 1)).ok
    assert not leader.handle(ElectMasterRequest.of_broker_trigger(CLUSTER, GROUP, 2)).ok
    assert not leader.handle(ElectMasterRequest.of_broker_trigger(CLUSTER, GROUP, 3)).ok
    info = leader.handle(GetReplicaInfoRequest(GROUP))
    assert info.header.master_epoch == 1 and info.header.master_address == ADDR[1]
    resp = leader.handle(AlterSyncStateSetRequest(GROUP, 1, 1, frozenset({1, 2, 3}), 1))
    assert resp.ok, resp
    info = leader.handle(GetReplicaInfoRequest(GROUP))
    assert info.body == {"sync_state_set": [1, 2, 3], "sync_state_set_epoch": 2}


def test_elect_master_with_dead_master(make_cluster):
    """16.2 testElectMaster: master 1 dead, controller trigger -> a new master at epoch 2."""
    cluster = make_cluster()
    leader = cluster.wait_leader()
    mock_metadata(leader)
    set_alive(cluster, one_dead)
    resp = leader.trigger_elect_master(GROUP)
    assert resp.ok, resp
    info = leader.handle(GetReplicaInfoRequest(GROUP))
    assert info.header.master_epoch == 2
    assert info.header.master_broker_id != 1 and info.header.master_address != ADDR[1]


def test_failed_election_never_commits_and_scan_fires(make_cluster, wait):
    """16.2 testBrokerLifecycleListener: with both followers down an election cannot commit; after
    the followers restart (old leader gone) the state still says master 1 at epoch 1, and the new
    leader's inactive-master scan fires for the set whose master is dead."""
    cluster = make_cluster(ControllerConfig.for_tests(elect_master_attempt_timeout_ms=800,
                                                      leader_fallback_timeout_ms=600))
    leader = cluster.wait_leader()
    mock_metadata(leader)
    li = cluster.index_of(leader)
    followers = [i for i in range(3) if i != li]
    for i in followers:
        cluster.stop(i)
    set_alive(cluster, one_dead)
    resp = leader.trigger_elect_master(GROUP)
    assert resp.code in (ResponseCode.CONTROLLER_NOT_LEADER, ResponseCode.SYSTEM_ERROR), resp
    cluster.stop(li)
    for i in followers:
        cluster.start(i)
    set_alive(cluster, everyone_alive)
    new_leader = cluster.wait_leader()
    info = new_leader.handle(GetReplicaInfoRequest(GROUP))
    assert info.ok and info.header.master_broker_id == 1 and info.header.master_epoch == 1
    set_alive(cluster, one_dead)
    fired = wait(lambda: new_leader.scan_inactive_masters(), timeout_s=2.0, what="inactive-master scan")
    assert [name for name, _ in fired] == [GROUP]
    assert fired[0][1].ok and fired[0][1].header.master_broker_id in (2, 3)


def test_unclean_election_disabled(make_cluster):
    """16.2 testAllReplicasShutdownAndRestartWithUnEnableElectUnCleanMaster."""
    cluster = make_cluster()
    leader = cluster.wait_leader()
    mock_metadata(leader)
    assert leader.handle(AlterSyncStateSetRequest(GROUP, 1, 1, frozenset({1}), 2)).ok
    set_alive(cluster, one_dead)
    assert not leader.trigger_elect_master(GROUP).ok
    info = leader.handle(GetReplicaInfoRequest(GROUP))
    assert info.body["sync_state_set"] == [1]
    assert info.header.master_broker_id is None and info.header.master_epoch == 2
    resp = leader.handle(ElectMasterRequest.of_broker_trigger(CLUSTER, GROUP, 2))
    assert resp.header.master_broker_id is None and resp.header.master_address is None
    set_alive(cluster, everyone_alive)
    resp = leader.handle(ElectMasterRequest.of_broker_trigger(CLUSTER, GROUP, 1))
    assert resp.ok, resp
    assert resp.header.master_broker_id == 1 and resp.header.master_address == ADDR[1]
    assert resp.header.master_epoch == 3


def test_unclean_election_enabled(make_cluster):
    """16.2 testEnableElectUnCleanMaster: a replica outside the SSS becomes master."""
    cluster = make_cluster(ControllerConfig.for_tests(enable_elect_unclean_master=True))
    leader = cluster.wait_leader()
    mock_metadata(leader)
    assert leader.handle(AlterSyncStateSetRequest(GROUP, 1, 1, frozenset({1}), 2)).ok
    set_alive(cluster, one_dead)
    resp = leader.trigger_elect_master(GROUP)
    assert resp.ok, resp
    info = leader.handle(GetReplicaInfoRequest(GROUP))
    new_master = info.header.master_broker_id
    assert new_master not in (None, 1)
    assert info.body["sync_state_set"] == [new_master] and info.header.master_epoch == 2


def test_change_controller_leader_keeps_state(make_cluster, wait):
    """16.2 testChangeControllerLeader: a new leader serves the same state."""
    cluster = make_cluster()
    leader = cluster.wait_leader()
    mock_metadata(leader)
    cluster.stop(cluster.index_of(leader))
    new_leader = cluster.wait_leader()
    assert new_leader is not leader

    def replica_info():
        info = new_leader.handle(GetReplicaInfoRequest(GROUP))
        return info if info.ok else None

    info = wait(replica_info, timeout_s=5.0, what="replica info from the new leader")
    assert info.header.master_address == ADDR[1] and info.header.master_epoch == 1
    assert info.body["sync_state_set"] == [1, 2, 3]


def test_followers_answer_not_leader_with_leader_identity(make_cluster, wait):
    """Non-leaders answer 2007 with the leader's Raft address and id in the header."""
    cluster = make_cluster()
    leader = cluster.wait_leader()
    for node in cluster.running():
        if node is leader:
            continue
        wait(lambda: node.metadata()["leader_address"] == leader.self_address, timeout_s=10.0,
             what="the follower to hear from the leader")
        resp = node.handle(GetNextBrokerIdRequest(CLUSTER, GROUP))
        assert resp.code == ResponseCode.CONTROLLER_NOT_LEADER
        assert resp.header.leader_address == leader.self_address
        assert resp.header.leader_id == leader.metadata()["self_id"]
        assert node.metadata()["leader_address"] == leader.self_address


def test_write_is_visible_to_next_request_on_every_node(make_cluster, wait):
    """Decide, replicate, apply, answer: the next request sees its predecessor; followers converge."""
    cluster = make_cluster()
    leader = cluster.wait_leader()
    for i in range(1, 6):
        assert leader.handle(ApplyBrokerIdRequest(CLUSTER, f"g{i}", 1, f"h:{i};1")).ok
        assert leader.handle(GetNextBrokerIdRequest(CLUSTER, f"g{i}")).header.next_broker_id == 2
    expected = leader.snapshot_state()
    wait(lambda: all(n.snapshot_state() == expected for n in cluster.running()), timeout_s=5.0,
         what="followers to apply every write")


def test_relaxed_reads_append_nothing(make_cluster):
    """is_process_read_event=False: reads do not go through the log; default reads do."""
    cluster = make_cluster(ControllerConfig.for_tests(is_process_read_event=False))
    leader = cluster.wait_leader()
    before = leader.metadata()["commit_index"]
    for _ in range(5):
        assert leader.handle(GetNextBrokerIdRequest(CLUSTER, GROUP)).ok
    assert leader.metadata()["commit_index"] == before


def test_batch_decided_in_another_term_is_fenced_on_every_node(make_cluster, wait):
    """A payload stamped with a term other than its log entry's (a command forwarded from a
    deposed leader) is skipped by every node alike, and the caller learns it did not apply."""
    import threading

    cluster = make_cluster()
    leader = cluster.wait_leader()
    term = leader.metadata()["term"]
    stale = encode_payload(term + 7, encode_events([ApplyBrokerIdEvent("c", "stale", "x", "x;1", 1)]))
    done, outcome = threading.Event(), []
    leader._raft.apply_batch(stale, callback=lambda res, err: (outcome.append((res, err)), done.set()))
    assert done.wait(5)
    assert outcome == [(False, 0)]
    wait(lambda: all(n.fenced_batches == 1 for n in cluster.running()), timeout_s=5.0,
         what="every node to fence the batch")
    assert all("stale" not in str(n.snapshot_state()) for n in cluster.running())
