"""Consumer-group membership (controller/consumers.py) driven by now_ms: join, refresh, expiry, leave,
validation and bounds."""

from __future__ import annotations

import pytest

from rocketray.wire.controller_headers import ConsumerHeartbeatResponseHeader
from rocketray.controller import consumers as cg
from rocketray.wire.controller_api import ConsumerHeartbeatRequest
from rocketray.wire.controller_codes import ResponseCode

TIMEOUT_MS = 3000


def beat(client_id: str = "c1", group: str = "g", topics: tuple[str, ...] = ("orders",),
         leaving: bool = False) -> ConsumerHeartbeatRequest:
    return ConsumerHeartbeatRequest(group, client_id, topics, leaving)


def test_members_are_sorted_and_include_the_caller():
    """Each answer is {group, members}: the group's live client ids, sorted, the caller included."""
    t = cg.ConsumerGroups(TIMEOUT_MS)
    assert t.on_heartbeat(beat("c2"), 0).header == ConsumerHeartbeatResponseHeader("g", ("c2",))
    response = t.on_heartbeat(beat("c1"), 10)
    assert response.ok and response.header == ConsumerHeartbeatResponseHeader("g", ("c1", "c2"))
    assert t.on_heartbeat(beat("x", group="other"), 10).header == ConsumerHeartbeatResponseHeader("other", ("x",))
    assert t.members("g", 10) == ["c1", "c2"] and t.groups(10) == {"g": ["c1", "c2"], "other": ["x"]}


def test_alive_until_timeout_then_gone():
    """Live while last + timeout >= now; the next heartbeat of anyone in the group no longer lists it."""
    t = cg.ConsumerGroups(TIMEOUT_MS)
    t.on_heartbeat(beat("c1"), 1000)
    t.on_heartbeat(beat("c2"), 2000)
    assert t.members("g", 4000) == ["c1", "c2"]
    assert t.members("g", 4001) == ["c2"]
    assert t.on_heartbeat(beat("c2"), 4001).header.members == ("c2",)
    assert t.member("g", "c1") is None, "pruned on its group's heartbeat"


def test_refresh_extends_liveness_and_takes_the_new_topics():
    t = cg.ConsumerGroups(TIMEOUT_MS)
    t.on_heartbeat(beat("c1"), 0)
    t.on_heartbeat(beat("c1", topics=("a", "b")), 2500)
    assert t.members("g", 5500) == ["c1"] and t.member("g", "c1").topics == ("a", "b")
    assert len(t) == 1


def test_leaving_removes_the_member_at_once():
    """leaving=True: gone now (not one timeout later); the answer lists the others only."""
    t = cg.ConsumerGroups(TIMEOUT_MS)
    t.on_heartbeat(beat("c1"), 0)
    t.on_heartbeat(beat("c2"), 0)
    response = t.on_heartbeat(beat("c1", leaving=True), 1)
    assert response.ok and response.header == ConsumerHeartbeatResponseHeader("g", ("c2",))
    assert t.members("g", 1) == ["c2"]
    assert t.on_heartbeat(beat("c2", leaving=True), 2).header == ConsumerHeartbeatResponseHeader("g", ())
    assert t.groups(2) == {} and len(t) == 0
    assert t.on_heartbeat(beat("never-joined", leaving=True), 3).ok, "leaving twice is harmless"


def test_expire_removes_dead_members_and_reports_them():
    t = cg.ConsumerGroups(TIMEOUT_MS)
    t.on_heartbeat(beat("c1"), 0)
    t.on_heartbeat(beat("c2", group="h"), 1000)
    assert t.expire(3000) == []
    assert t.expire(3001) == [("g", "c1")]
    assert t.expire(4001) == [("h", "c2")] and len(t) == 0


@pytest.mark.parametrize("request_,remark", [
    (beat(group=""), "consumer group name is empty"),
    (beat(group="a b"), "is not [%|a-zA-Z0-9_-]"),
    (beat(group="g" * 256), "is not [%|a-zA-Z0-9_-]"),
    (beat(client_id=""), "client id is empty"),
    (beat(topics=["orders"]), "topics must be a tuple"),
    (beat(topics=("a b",)), "characters outside"),
    (beat(topics=("t",) * 1025), "over 1024"),
    (ConsumerHeartbeatRequest("g", "c1", (), leaving=1), "leaving must be a bool"),
    (beat(client_id="c" * 5000), "over 4096"),
])
def test_malformed_heartbeats_are_refused(request_, remark):
    t = cg.ConsumerGroups(TIMEOUT_MS)
    response = t.on_heartbeat(request_, 0)
    assert response.code == ResponseCode.CONTROLLER_INVALID_REQUEST and remark in response.remark, response
    assert len(t) == 0


def test_a_member_may_subscribe_to_system_topics_and_to_none():
    t = cg.ConsumerGroups(TIMEOUT_MS)
    assert t.on_heartbeat(beat(topics=("%RETRY%g", "orders")), 0).ok
    assert t.on_heartbeat(beat("c2", topics=()), 0).ok


def test_members_per_group_are_bounded(monkeypatch):
    """A full group refuses a new member (an old one refreshes); an expired one frees its place."""
    monkeypatch.setattr(cg, "MAX_MEMBERS_PER_GROUP", 2)
    t = cg.ConsumerGroups(TIMEOUT_MS)
    assert t.on_heartbeat(beat("c1"), 0).ok and t.on_heartbeat(beat("c2"), 1000).ok
    refused = t.on_heartbeat(beat("c3"), 1000)
    assert refused.code == ResponseCode.CONTROLLER_INVALID_REQUEST and "already has 2 members" in refused.remark
    assert t.on_heartbeat(beat("c1"), 2000).ok, "a member of a full group still refreshes"
    assert t.on_heartbeat(beat("c3"), 4001).header.members == ("c1", "c3")  # c2 (1000) expired at 4001


def test_groups_are_bounded(monkeypatch):
    monkeypatch.setattr(cg, "MAX_GROUPS", 2)
    t = cg.ConsumerGroups(TIMEOUT_MS)
    assert t.on_heartbeat(beat(group="a"), 0).ok and t.on_heartbeat(beat(group="b"), 0).ok
    refused = t.on_heartbeat(beat(group="c"), 0)
    assert refused.code == ResponseCode.CONTROLLER_INVALID_REQUEST and "2 consumer groups" in refused.remark
    assert t.on_heartbeat(beat(group="c"), TIMEOUT_MS + 1).ok, "expired groups free their places"


def test_clear_forgets_everyone():
    t = cg.ConsumerGroups(TIMEOUT_MS)
    t.on_heartbeat(beat(), 0)
    t.clear()
    assert t.groups(0) == {} and t.members("g", 0) == []


def test_timeout_must_be_positive():
    with pytest.raises(AssertionError):
        cg.ConsumerGroups(0)
