"""Topics and consumer heartbeats on real pysyncobj nodes: topics survive a restart from snapshot +
journal and reach a lagging follower through the leader's snapshot; consumer heartbeats are answered
by the leader only, without Raft, and the membership table starts empty on a new leader."""

from __future__ import annotations

import pytest

from rocketray.wire.controller_headers import ConsumerHeartbeatResponseHeader
from rocketray.wire.controller_api import (ApplyBrokerIdRequest, ConsumerHeartbeatRequest, CreateTopicRequest,
                                           DeleteTopicRequest, GetTopicRouteRequest, ListTopicsRequest)
from rocketray.wire.controller_codes import ResponseCode
from rocketray.snapshot.format import SECTION_TOPICS, decode_snapshot

CLUSTER = "c"


from controller_cluster import everyone_alive, make_cluster  # noqa: E402,F401 - the shared fixture


def register_groups(leader, *names):
    for name in names:
        assert leader.handle(ApplyBrokerIdRequest(CLUSTER, name, 1, f"{name}:1;1")).ok


def make_topics(leader, count):
    """``count`` topics t0..t<count-1> of 1..3 queues, t0 extended once, one deleted: every entry kind."""
    for i in range(count):
        assert leader.handle(CreateTopicRequest(f"t{i}", 1 + i % 3)).ok
    assert leader.handle(CreateTopicRequest("t0", 4)).header.created is True
    assert leader.handle(DeleteTopicRequest(f"t{count - 1}")).ok


def compacted(node):
    return (node.metadata()["journal_first_index"] or 0) > 1


def test_topics_survive_a_restart_from_snapshot_and_journal(make_cluster, wait):
    """Topics created before a snapshot (in its SECTION_TOPICS) and after it (only in the journal)
    are all there after every node restarts; routes are unchanged."""
    cluster = make_cluster(snapshot_threshold=5)
    leader = cluster.wait_leader()
    register_groups(leader, "broker-a", "broker-b")
    make_topics(leader, 8)
    wait(lambda: all(compacted(n) for n in cluster.running()), timeout_s=15.0, what="journals compacted")
    assert leader.handle(CreateTopicRequest("after-snapshot", 3)).ok  # in the journal above the snapshot
    expected = leader.snapshot_state()
    routes = {t: leader.handle(GetTopicRouteRequest(t)).header for t in ("t0", "t1", "after-snapshot")}
    wait(lambda: all(n.snapshot_state() == expected for n in cluster.running()), timeout_s=10.0,
         what="every node applied the last topic")
    snap = cluster.nodes[0].snapshots.list()[-1]
    sections = decode_snapshot((cluster.store(0) / "snapshots" / f"snapshot_{snap:020d}.snap").read_bytes())
    assert sections[SECTION_TOPICS]["version"] == 1 and sections[SECTION_TOPICS]["topics"], sections

    for i in range(3):
        cluster.stop(i)
    for i in range(3):
        cluster.start(i)
    leader = cluster.wait_leader()
    wait(lambda: all(n.snapshot_state() == expected for n in cluster.running()), timeout_s=10.0,
         what="state (topics included) after restart")
    assert all(n.metadata()["snapshots_loaded"] == 1 for n in cluster.running())
    assert expected["topics"] and dict(expected["topics"])["t0"] == ["broker-a", "broker-b", "broker-a", "broker-b"]
    for topic, header in routes.items():
        assert leader.handle(GetTopicRouteRequest(topic)).header == header
    listed = leader.handle(ListTopicsRequest()).header.counts()
    assert "t7" not in listed and listed["after-snapshot"] == 3 and listed["t0"] == 4
    logged = [e for e in leader.events()["events"] if e["type"] in ("CreateTopicEvent", "DeleteTopicEvent")]
    assert {"type": "CreateTopicEvent", "topic": "after-snapshot", "broker_names": ["broker-a", "broker-b", "broker-a"],
            "master_epoch": None}.items() <= {**logged[-1], "broker_names": list(logged[-1]["broker_names"])}.items()
    assert all(n.metadata()["event_log_errors"] == 0 for n in cluster.running())


def test_lagging_follower_gets_the_topics_from_the_leader_snapshot(make_cluster, wait):
    """A node down while the leader compacted past its log installs the leader's snapshot, topics
    included (SnapshotHooks hands every section to the node)."""
    cluster = make_cluster(snapshot_threshold=5)
    leader = cluster.wait_leader()
    lagging = next(i for i in range(3) if cluster.nodes[i] is not leader)
    cluster.stop(lagging)
    register_groups(leader, "broker-a")
    make_topics(leader, 12)
    for round_ in range(40):  # three snapshots are kept: the journal is cut below the oldest one
        if (leader.metadata()["journal_first_index"] or 0) > 10:
            break
        assert leader.handle(CreateTopicRequest(f"more{round_}", 1)).ok
    wait(lambda: (leader.metadata()["journal_first_index"] or 0) > 10, timeout_s=15.0,
         what="leader journal compacted past the stopped node")
    expected = leader.snapshot_state()
    node = cluster.start(lagging)
    wait(lambda: node.snapshot_state() == expected, timeout_s=10.0, what="lagging node to catch up")
    assert node.metadata()["dumps_installed"] >= 1 and dict(expected["topics"])["t0"] == ["broker-a"] * 4


def test_consumer_heartbeats_are_leader_local_and_not_replicated(make_cluster, wait):
    """The leader answers the group's members (through handle() too); a follower answers NOT_LEADER with
    the leader's address; nothing is replicated; a new leader starts with an empty table."""
    cluster = make_cluster()
    leader = cluster.wait_leader()
    followers = [n for n in cluster.running() if n is not leader]
    commit_index = leader.metadata()["commit_index"]
    assert leader.consumer_heartbeat(ConsumerHeartbeatRequest("g", "c1", ("orders",))).header == \
        ConsumerHeartbeatResponseHeader("g", ("c1",))
    response = leader.handle(ConsumerHeartbeatRequest("g", "c2", ("orders",)))
    assert response.ok and response.header == ConsumerHeartbeatResponseHeader("g", ("c1", "c2"))
    assert leader.consumer_groups() == {"g": ["c1", "c2"]}
    assert leader.metadata()["commit_index"] == commit_index, "membership does not go through Raft"
    for follower in followers:
        refused = follower.consumer_heartbeat(ConsumerHeartbeatRequest("g", "c3", ()))
        assert refused.code == ResponseCode.CONTROLLER_NOT_LEADER
        assert refused.header.leader_address == leader.self_address
        assert follower.consumer_groups() == {}
    left = leader.handle(ConsumerHeartbeatRequest("g", "c1", ("orders",), leaving=True))
    assert left.header == ConsumerHeartbeatResponseHeader("g", ("c2",))
    assert leader.consumer_heartbeat(GetTopicRouteRequest("t")).code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED

    cluster.stop(cluster.index_of(leader))
    new_leader = cluster.wait_leader()
    response = new_leader.handle(ConsumerHeartbeatRequest("g", "c3", ()))
    assert response.ok and response.header.members == ("c3",), "a new leader's table fills up from heartbeats"
