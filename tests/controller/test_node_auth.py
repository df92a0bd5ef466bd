"""Users and ACL rules on real pysyncobj nodes: they survive a restart of every node from snapshot +
journal and reach a lagging follower through the leader's snapshot; every node answers
GetAuthTable from its applied state without a Raft round trip."""

from __future__ import annotations

from rocketray.wire.controller_api import (CreateAclRequest, CreateUserRequest, DeleteUserRequest, GetAclRequest,
                                           UpdateUserRequest)
from rocketray.wire.controller_codes import ResponseCode
from rocketray.controller.users import auth_table_of
from rocketray.scram import ScramCredential
from rocketray.snapshot.format import SECTION_AUTH, decode_snapshot

from controller_cluster import everyone_alive, make_cluster  # noqa: E402,F401 - the shared fixture


def credential(i: int) -> ScramCredential:
    return ScramCredential.from_secret(f"secret-{i}-long-enough", bytes([i]) * 16, 4096)


def make_users(leader, count: int) -> None:
    """``count`` users u0.., each with a rule; u0 updated to superuser; the last one deleted."""
    for i in range(count):
        assert leader.handle(CreateUserRequest(f"u{i}", credential(i))).ok
        assert leader.handle(CreateAclRequest(f"u{i}", (f"Topic:t{i}-*", "Group:g"), ("Sub",), "allow")).ok
    assert leader.handle(UpdateUserRequest("u0", superuser=True)).header.changed
    assert leader.handle(DeleteUserRequest(f"u{count - 1}")).ok


def tables(cluster):
    return [n.state.auth for n in cluster.running()]


def test_users_and_rules_survive_a_restart_and_followers_answer_without_raft(make_cluster, wait):
    """Users and rules made before a snapshot (in its SECTION_AUTH) and after it (journal only) are
    on every node after all restart, keys included; each follower answers GetAuthTable from its
    applied state (no new Raft entry), "unchanged" at its own version."""
    cluster = make_cluster(snapshot_threshold=5)
    leader = cluster.wait_leader()
    make_users(leader, 6)
    wait(lambda: all((n.metadata()["journal_first_index"] or 0) > 1 for n in cluster.running()), timeout_s=15.0,
         what="journals compacted")
    assert leader.handle(CreateUserRequest("late", credential(99))).ok  # above the last snapshot
    expected = leader.state.auth
    wait(lambda: all(t == expected for t in tables(cluster)), timeout_s=10.0, what="every node applied the last user")
    snap = cluster.nodes[0].snapshots.list()[-1]
    sections = decode_snapshot((cluster.store(0) / "snapshots" / f"snapshot_{snap:020d}.snap").read_bytes())
    assert sections[SECTION_AUTH]["version"] == 1 and sections[SECTION_AUTH]["users"]

    for i in range(3):
        cluster.stop(i)
    for i in range(3):
        cluster.start(i)
    leader = cluster.wait_leader()
    wait(lambda: all(t == expected for t in tables(cluster)), timeout_s=10.0, what="users and rules after restart")
    assert expected.users["u0"].superuser and "u5" not in expected.users and expected.credential("late") == credential(99)
    assert leader.handle(GetAclRequest("u1")).header.rules == (
        ("u1", "Group:g", ("Sub",), "Allow"), ("u1", "Topic:t1-*", ("Sub",), "Allow"))
    commit_index = leader.metadata()["commit_index"]
    for node in cluster.running():
        assert auth_table_of(node.auth_table(-1)) == expected
        unchanged = node.auth_table(expected.version)
        assert unchanged.ok and not unchanged.header.changed and unchanged.body is None
    assert leader.metadata()["commit_index"] == commit_index, "GetAuthTable from applied state is not a Raft entry"
    public = leader.snapshot_state()["auth"]
    assert public["auth_version"] == expected.version and ["late", False, 4096] in public["users"]
    assert "stored_key" not in repr(public) and not any(isinstance(v, bytes) for row in public["users"] for v in row)


def test_lagging_follower_gets_users_from_the_leader_snapshot(make_cluster, wait):
    """A node down while the leader compacted past its log installs the leader's snapshot, users and
    rules included, and then answers GetAuthTable with the leader's version."""
    cluster = make_cluster(snapshot_threshold=5)
    leader = cluster.wait_leader()
    lagging = next(i for i in range(3) if cluster.nodes[i] is not leader)
    cluster.stop(lagging)
    make_users(leader, 8)
    for round_ in range(40):
        if (leader.metadata()["journal_first_index"] or 0) > 10:
            break
        assert leader.handle(CreateUserRequest(f"more{round_}", credential(round_ % 200))).ok
    wait(lambda: (leader.metadata()["journal_first_index"] or 0) > 10, timeout_s=15.0,
         what="leader journal compacted past the stopped node")
    expected = leader.state.auth
    node = cluster.start(lagging)
    wait(lambda: node.state.auth == expected, timeout_s=10.0, what="lagging node to catch up")
    assert node.metadata()["dumps_installed"] >= 1
    answer = node.auth_table(0)
    assert answer.code == ResponseCode.SUCCESS and answer.header.version == expected.version
    assert auth_table_of(answer) == expected
