"""RIP-59 snapshots on real pysyncobj nodes: take, retain, restart, fall back, refuse, catch up."""

from __future__ import annotations

import time

import pytest

from rocketray.wire.controller_api import (AlterSyncStateSetRequest, ApplyBrokerIdRequest, ElectMasterRequest,
                                           RegisterBrokerRequest)
from rocketray.controller.config import ControllerConfig
from rocketray.controller.event_log import merge_logs, read_whole_log
from rocketray.controller.node import ControllerNode
from rocketray.controller.proc import member_credentials
from rocketray.controller.raft import RecoveryRefused

CLUSTER = "c"


from controller_cluster import everyone_alive, make_cluster  # noqa: E402,F401 - the shared fixture


def restart_all(cluster):
    for i in range(3):
        cluster.stop(i)
    for i in range(3):
        cluster.start(i)


def converged(cluster, expected):
    return all(n.snapshot_state() == expected for n in cluster.running())


def compacted(node):
    """The node's journal no longer starts at entry 1 (a snapshot was taken and the log cut)."""
    return (node.metadata()["journal_first_index"] or 0) > 1


def register(leader, name):
    assert leader.handle(ApplyBrokerIdRequest(CLUSTER, name, 1, f"{name}:1;1")).ok


def churn(leader, rounds):
    """Non-idempotent history: alternating SSS changes bump sync_state_set_epoch every time,
    so an entry applied twice (e.g. replayed over a snapshot that already holds it) shows."""
    for broker_id in (1, 2):
        code = f"h:{broker_id};{broker_id}"
        assert leader.handle(ApplyBrokerIdRequest(CLUSTER, "e", broker_id, code)).ok
        assert leader.handle(RegisterBrokerRequest(CLUSTER, "e", broker_id, f"h:{broker_id}")).ok
    resp = leader.handle(ElectMasterRequest.of_broker_trigger(CLUSTER, "e", 1))
    assert resp.ok, resp
    return churn_more(leader, resp.header.sync_state_set_epoch, rounds)


def churn_more(leader, epoch, rounds):
    for _ in range(rounds):
        new = frozenset({1, 2}) if epoch % 2 else frozenset({1})
        resp = leader.handle(AlterSyncStateSetRequest("e", 1, 1, new, epoch))
        assert resp.ok, resp
        epoch += 1
    return epoch


def test_threshold_10_one_snapshot_each_then_restart_loads_one(make_cluster, wait):
    """16.8 testRecoverControllerFromStatemachineSnapshot: threshold 10, 11 registrations -> each
    node saved exactly one snapshot; after restarting all three each loads exactly one, saves none,
    and the state is intact."""
    cluster = make_cluster(snapshot_threshold=10)
    leader = cluster.wait_leader()
    for i in range(11):
        register(leader, f"broker-{i}")
    expected = leader.snapshot_state()
    wait(lambda: converged(cluster, expected) and all(compacted(n) and n.metadata()["snapshots_saved"] == 1
                                                      for n in cluster.running()),
         timeout_s=15.0, what="one snapshot and a compacted journal on every node")
    for node in cluster.running():
        meta = node.metadata()
        assert meta["snapshots_saved"] == 1 and meta["snapshots_loaded"] == 0
        assert meta["last_applied"] >= 11
    restart_all(cluster)
    leader = cluster.wait_leader(timeout_s=10.0)
    wait(lambda: converged(cluster, expected), timeout_s=10.0, what="state intact after restart")
    for node in cluster.running():
        meta = node.metadata()
        assert meta["snapshots_loaded"] == 1 and meta["snapshots_saved"] == 0, meta
        assert meta["snapshot_loaded_index"] >= 10 and meta["journal_first_index"] > 1


def _damage(path, how):
    if how == "flip":
        blob = bytearray(path.read_bytes())
        blob[len(blob) // 2] ^= 0xFF
        path.write_bytes(bytes(blob))
    elif how == "truncate":
        path.write_bytes(path.read_bytes()[:-7])
    else:
        path.unlink()


def test_damaged_newest_snapshot_falls_back_to_previous(make_cluster, wait):
    """Newest snapshot flipped / truncated / deleted (one way per node): each node loads the
    previous snapshot, replays the journal from there (which still covers it), and ends with the
    same state as before; entries at or below the snapshot index are not applied twice."""
    cluster = make_cluster(snapshot_threshold=5)
    leader = cluster.wait_leader()
    epoch = churn(leader, rounds=20)
    for _ in range(20):  # snapshot fsyncs run in the background; on a busy disk they space out
        if all(len(n.snapshots.list()) == 3 for n in cluster.running()):
            break
        epoch = churn_more(leader, epoch, rounds=10)
    expected = leader.snapshot_state()
    wait(lambda: converged(cluster, expected) and all(len(n.snapshots.list()) == 3 for n in cluster.running()),
         timeout_s=15.0, what="three snapshots kept on every node")
    kept = [n.snapshots.list() for n in cluster.nodes]
    for i in range(3):
        cluster.stop(i)
    for i, how in enumerate(("flip", "truncate", "delete")):
        _damage(cluster.store(i) / "snapshots" / f"snapshot_{kept[i][-1]:020d}.snap", how)
    for i in range(3):
        cluster.start(i)
    for i, node in enumerate(cluster.nodes):
        assert node.metadata()["snapshot_loaded_index"] == kept[i][-2], (i, kept[i])
    cluster.wait_leader()
    wait(lambda: converged(cluster, expected), timeout_s=10.0, what="same state after fallback")
    assert all(n.metadata()["dumps_installed"] == 0 for n in cluster.running()), "recovered locally"
    assert len(list(cluster.store(0).glob("snapshots/*.corrupt"))) == 1
    assert len(list(cluster.store(1).glob("snapshots/*.corrupt"))) == 1


def test_every_snapshot_damaged_and_compacted_journal_refuses_to_start(make_cluster, wait):
    """All snapshots damaged and the journal no longer starts at entry 1: the node refuses to
    start with a clear message instead of coming up with a partial state."""
    cluster = make_cluster(snapshot_threshold=5)
    leader = cluster.wait_leader()
    churn(leader, rounds=12)
    wait(lambda: compacted(cluster.nodes[0]), timeout_s=15.0, what="node 0 journal compacted")
    for i in range(3):
        cluster.stop(i)
    snaps = sorted((cluster.store(0) / "snapshots").glob("snapshot_*.snap"))
    assert snaps
    for path in snaps:
        _damage(path, "flip")
    with pytest.raises(RecoveryRefused, match="Refusing to start with a partial state") as info:
        cluster.start(0)
    assert "starts at entry" in str(info.value)
    cluster.nodes[0] = None


def test_lagging_follower_catches_up_from_leader_snapshot(make_cluster, wait):
    """A node down while the leader compacted past its log gets the leader's snapshot (a full dump
    streamed by pysyncobj), installs it, stores it, and converges; it restarts from it too."""
    cluster = make_cluster(snapshot_threshold=5)
    leader = cluster.wait_leader()
    lagging = next(i for i in range(3) if cluster.nodes[i] is not leader)
    cluster.stop(lagging)
    epoch = churn(leader, rounds=30)
    for _ in range(20):  # snapshot fsyncs run in the background; on a busy disk they space out
        if (leader.metadata()["journal_first_index"] or 0) > 10:
            break
        epoch = churn_more(leader, epoch, rounds=10)
    wait(lambda: (leader.metadata()["journal_first_index"] or 0) > 10, timeout_s=15.0,
         what="leader journal compacted past the stopped node")
    expected = leader.snapshot_state()
    node = cluster.start(lagging)
    wait(lambda: node.snapshot_state() == expected, timeout_s=10.0, what="lagging node to catch up")
    assert node.metadata()["dumps_installed"] >= 1
    cluster.stop(lagging)
    node = cluster.start(lagging)
    wait(lambda: node.snapshot_state() == expected, timeout_s=10.0, what="state after restart")
    assert node.metadata()["snapshots_loaded"] == 1


def test_single_node_keeps_leadership_and_serves_while_snapshotting(tmp_path, port_factory):
    """Snapshots taken every 50 entries while 200 writes stream in: the node stays leader in one
    term and answers every write. (How long a snapshot holds the tick thread is a figure, not a
    pass/fail: `benchmarks/run.py controller-write` reports max_snapshot_tick_ms.)"""
    address = f"127.0.0.1:{port_factory()}"
    config = ControllerConfig.for_tests(snapshot_threshold=50)
    node = ControllerNode({0: address}, tmp_path / "n", config, credentials=member_credentials(1)[0],
                          alive=everyone_alive)
    try:
        end = time.monotonic() + 5
        while not node.is_leader() and time.monotonic() < end:
            time.sleep(0.005)
        term = node.metadata()["term"]
        for i in range(200):
            register(node, f"b{i}")
        meta = node.metadata()
        assert meta["snapshots_saved"] >= 3
        assert meta["is_leader"] and meta["term"] == term, meta
    finally:
        node.close()


# -- the event log across replicas, restarts and snapshots ------------------------------------------

def whole_log(node):
    return read_whole_log(node.events, limit=7)


def test_event_log_is_identical_on_every_node_with_the_leaders_decision_time(make_cluster, wait):
    """Every node logs the same events with the same Raft index, decision time and resulting
    epochs; the ElectMaster records carry the master epoch the state machine reached."""
    cluster = make_cluster(snapshot_threshold=1000)
    leader = cluster.wait_leader()
    before_ms = int(time.time() * 1000)
    epoch = churn(leader, rounds=6)
    after_ms = int(time.time() * 1000)
    expected = leader.snapshot_state()
    wait(lambda: converged(cluster, expected), timeout_s=10.0, what="state on every node")
    logs = [whole_log(n) for n in cluster.running()]
    assert logs[0]["events"] == logs[1]["events"] == logs[2]["events"] and not any(g["gaps"] for g in logs)
    events = logs[0]["events"]
    assert [e["type"] for e in events].count("ElectMasterEvent") == 1
    elect = next(e for e in events if e["type"] == "ElectMasterEvent")
    assert elect["master_epoch"] == 1 and elect["master_broker_id"] == 1 and elect["new_master_broker_id"] == 1
    assert all(before_ms <= e["time_ms"] <= after_ms for e in events)
    alters = [e for e in events if e["type"] == "AlterSyncStateSetEvent"]
    assert len(alters) == 6 and alters[-1]["sync_state_set_epoch"] == epoch
    keys = [(e["index"], e["seq"]) for e in events]
    assert keys == sorted(set(keys))


def test_event_log_survives_restarts_over_snapshots_without_duplicates(make_cluster, wait):
    """Threshold 5, churn, restart everyone, churn again: each node's log holds every event once,
    in order, no gaps (the log is fsynced before a snapshot, and replay skips logged entries)."""
    cluster = make_cluster(snapshot_threshold=5)
    leader = cluster.wait_leader()
    epoch = churn(leader, rounds=12)
    wait(lambda: all(compacted(n) for n in cluster.running()), timeout_s=15.0, what="compacted journals")
    restart_all(cluster)
    leader = cluster.wait_leader(timeout_s=10.0)
    epoch = churn_more(leader, epoch, rounds=5)
    expected = leader.snapshot_state()
    wait(lambda: converged(cluster, expected), timeout_s=10.0, what="state on every node")
    for node in cluster.running():
        log_ = whole_log(node)
        alters = [e for e in log_["events"] if e["type"] == "AlterSyncStateSetEvent"]
        assert log_["gaps"] == [] and len(alters) == 17
        assert [e["sync_state_set_epoch"] for e in alters] == list(range(epoch - 16, epoch + 1))
        keys = [(e["index"], e["seq"]) for e in log_["events"]]
        assert keys == sorted(set(keys))


def test_lagging_node_logs_a_gap_that_the_others_cover(make_cluster, wait):
    """A node that caught up from the leader's snapshot records the unlogged range as a gap;
    merging the three logs fills it and leaves nothing uncovered."""
    cluster = make_cluster(snapshot_threshold=5)
    leader = cluster.wait_leader()
    lagging = next(i for i in range(3) if cluster.nodes[i] is not leader)
    cluster.stop(lagging)
    epoch = churn(leader, rounds=30)
    for _ in range(20):
        if (leader.metadata()["journal_first_index"] or 0) > 10:
            break
        epoch = churn_more(leader, epoch, rounds=10)
    wait(lambda: (leader.metadata()["journal_first_index"] or 0) > 10, timeout_s=15.0,
         what="leader journal compacted past the stopped node")
    node = cluster.start(lagging)
    expected = leader.snapshot_state()
    wait(lambda: node.snapshot_state() == expected, timeout_s=10.0, what="lagging node to catch up")
    logs = [whole_log(n) for n in cluster.running()]
    mine = whole_log(node)
    assert mine["gaps"], "the node installed a snapshot without logging the entries it covers"
    events, uncovered = merge_logs(logs)
    assert uncovered == []
    assert events == whole_log(leader)["events"]
    alone, uncovered_alone = merge_logs([mine])
    assert uncovered_alone == mine["gaps"] and len(alone) < len(events)
