"""``Admin`` and ``Routes``, one layer: an in-memory cluster behind the Transport protocol
(tests/support/fake_client_cluster.py).

"(defect)": TopicNotFound named the request's description ("route of 'x'") instead of the topic."""

from __future__ import annotations

import pytest

from rocketray.client import (AdminError, ClientError, Consumer, InvalidRequest, OffsetChange, Producer,
                              TopicNotFound, TopicQueue)
from rocketray.client.routes import Routes
from rocketray.wire.controller_api import GetTopicRouteRequest, Response
from rocketray.wire.controller_codes import ResponseCode
from rocketray.waiting import wait_for
from tests.support.fake_client_cluster import FakeCluster, FakeTransport


def cluster(queues: int = 4) -> tuple[FakeCluster, FakeTransport]:
    c = FakeCluster()
    c.create_topic("t", queues)
    return c, FakeTransport(c)


@pytest.mark.parametrize("call", ["topic_route", "delete_topic"])
def test_topic_not_found_names_the_topic(call):
    """(defect) Admin's TopicNotFound names the topic, and its remedy names it too."""
    from rocketray.client import Admin

    _, t = cluster()
    with pytest.raises(TopicNotFound) as exc:
        getattr(Admin(transport=t), call)("orders")
    assert exc.value.topic == "orders" and "topic 'orders' does not exist" in str(exc.value)
    assert "-t orders" in str(exc.value)


def test_admin_topics_and_progress():
    from rocketray.client import Admin

    c, t = cluster(2)
    admin = Admin(transport=t)
    route = admin.create_topic("u", queues=3)
    assert [q.broker_group for q in route.queues] == ["broker-a", "broker-b", "broker-a"]
    assert admin.list_topics() == {"t": 2, "u": 3}
    with pytest.raises(AdminError):
        admin.create_topic("u", queues=2)              # never shrinks
    with Producer(transport=t) as p:
        for i in range(4):
            p.send("t", b"x")
    c.committed[("g", "t", 0)] = 1
    rows = admin.consumer_progress("g")
    assert [(r.queue, r.committed_offset, r.max_offset, r.lag) for r in rows] == [(TopicQueue("t", 0), 1, 2, 1)]
    admin.delete_topic("u")
    assert admin.list_topics() == {"t": 2}


def test_routes_are_cached_refreshed_after_their_ttl_and_kept_when_the_controller_is_away():
    c, t = cluster(2)
    calls: list = []

    class Counting(FakeTransport):
        def call_controller(self, request, timeout_s=10.0):
            calls.append(request)
            if getattr(self, "down", False):
                raise TimeoutError("no leader")
            return super().call_controller(request, timeout_s)

    ct = Counting(c)
    routes = Routes(ct, ttl_s=60)
    assert len(routes.get("t").queues) == 2 and len(routes.get("t").queues) == 2 and len(calls) == 1
    c.create_topic("t", 5)
    assert len(routes.get("t").queues) == 2             # cached
    assert len(routes.refresh("t").queues) == 5 and routes.cached("t") is not None
    ct.down = True
    assert len(routes.refresh("t").queues) == 5         # the last known route while no controller answers
    with pytest.raises(ClientError) as exc:
        routes.get("other")
    assert exc.value.retriable and exc.value.code == "CONTROLLER_UNAVAILABLE"
    ct.down = False
    with pytest.raises(TopicNotFound, match="'other'"):
        routes.get("other")
    short = Routes(ct, ttl_s=1e-9)                     # every entry is stale at once
    short.get("t")
    before = len(calls)
    short.get("t")
    assert len(calls) == before + 1 and isinstance(calls[-1], GetTopicRouteRequest)


def test_a_refused_route_answer_is_an_admin_error_with_its_code():
    c, t = cluster(1)

    class Refusing(FakeTransport):
        def call_controller(self, request, timeout_s=10.0):
            return Response.error(ResponseCode.CONTROLLER_INVALID_REQUEST, "bad name")

    with pytest.raises(AdminError) as exc:
        Routes(Refusing(c)).get("t")
    assert exc.value.code == "CONTROLLER_INVALID_REQUEST" and "bad name" in str(exc.value)


def test_group_members_and_reset_offsets_of_a_stopped_group():
    """reset_offsets: refused while the group has members; 'latest' skips the backlog; an offset is
    capped at the end; 'earliest' starts a group that never committed at 0, and moves a committed
    offset back (a reset record: the brokers assign it); a new member then reads everything again."""
    from rocketray.client import Admin

    c, t = cluster(2)
    with Producer(transport=t) as p:
        for i in range(6):
            p.send("t", b"x")                          # 3 per queue
    admin = Admin(transport=t)
    with Consumer(group="g", topics=["t"], transport=t, client_id="m1"):
        assert admin.group_members("g") == ["m1"]
        with pytest.raises(AdminError) as exc:
            admin.reset_offsets("g", "t", "latest")
        assert exc.value.code == "GROUP_ACTIVE"
    assert admin.group_members("g") == []
    assert admin.reset_offsets("g", "t", "earliest") == [OffsetChange(TopicQueue("t", 0), None, 0),
                                                          OffsetChange(TopicQueue("t", 1), None, 0)]
    assert admin.reset_offsets("g", "t", 2) == [OffsetChange(TopicQueue("t", 0), 0, 2),
                                                OffsetChange(TopicQueue("t", 1), 0, 2)]
    assert [ch.after for ch in admin.reset_offsets("g", "t", 99)] == [3, 3]
    with Consumer(group="g", topics=["t"], transport=t) as con:
        assert con.poll(0.1) == []                      # starts at the reset offset: nothing left
    back = admin.reset_offsets("g", "t", "earliest")
    assert [(ch.before, ch.after, ch.moved) for ch in back] == [(3, 0, True), (3, 0, True)]
    with Consumer(group="g", topics=["t"], transport=t) as con:
        got: list = []
        wait_for(lambda: got.extend(con.poll(0.05)) or len(got) >= 6, 10, "the 6 messages again")
        assert sorted((m.queue_id, m.queue_offset) for m in got) == [(q, o) for q in (0, 1) for o in range(3)]
    for bad in ("first", -1, True):
        with pytest.raises(InvalidRequest):
            admin.reset_offsets("g", "t", bad)


def test_reset_offsets_to_a_time_uses_each_queues_store_times():
    """A datetime resets each queue to its first message stored at or after it (the brokers'
    search by store time), back or forward; a naive datetime is refused (its zone is unknown)."""
    import datetime

    from rocketray.wire.message import Message, encode_record
    from rocketray.client import Admin

    c, t = cluster(2)
    for q, times in ((0, [1000, 2000, 3000]), (1, [500])):
        for ts in times:
            records = c.records[("t", q)]
            records.append(encode_record(Message("t", q, b"x").with_position(len(records), 0, ts)))
    at = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc) + datetime.timedelta(milliseconds=2000)
    admin = Admin(transport=t)
    assert admin.reset_offsets("g", "t", at) == [OffsetChange(TopicQueue("t", 0), None, 1),
                                                 OffsetChange(TopicQueue("t", 1), None, 1)]
    assert [(ch.after, ch.moved) for ch in admin.reset_offsets("g", "t", at - datetime.timedelta(seconds=1))] == [
        (0, True), (1, False)]
    with pytest.raises(InvalidRequest, match="timezone"):
        admin.reset_offsets("g", "t", datetime.datetime(2026, 1, 1))
