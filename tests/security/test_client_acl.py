"""The client port checks every operation against the user's ACL (RocketMQ 5.3 ACL 2.0 shape):
users authenticate with SCRAM, a refusal names the resource and action, nothing is written or read
past a denial, and a change of the table takes effect on the next operation of an open connection.
The real ``ClientPort`` and ``UserDirectory`` over real sockets; the broker's endpoints are stand-ins
that seal a put's records the way the store does (so the per-topic check is the product's)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from rocketray.actors.client_port import ClientPort
from rocketray.wire.batch import TopicRefused, encode_batch
from rocketray.broker.batch import seal_batch
from rocketray.wire.client_control import GroupView, Metadata, encode_control
from rocketray.wire.client_frames import PUT_COUNT, FrameType, decode_offsets_answer, decode_pull_answer, \
    decode_put_answer, pack
from rocketray.wire.message import Message
from rocketray.wire.pull_result import OffsetsResult, OffsetsStatus, PullResult, PullStatus
from rocketray.client import AccessDenied, Bootstrap, Consumer, Producer, SendStatus, TopicQueue
from rocketray.client.connections import AuthenticationFailed, Connection, Dialer
from rocketray.wire.controller_api import (ConsumerHeartbeatRequest, CreateTopicRequest, GetTopicRouteRequest,
                                           ListTopicsRequest, Response)
from rocketray.wire.client_control import decode_control_answer
from rocketray.wire.controller_codes import ResponseCode
from rocketray.wire.controller_headers import ConsumerHeartbeatResponseHeader, ListTopicsResponseHeader, \
    TopicRouteResponseHeader
from rocketray.wire.put_result import PutResult, PutStatus, Written
from rocketray.ha.ack import refused
from rocketray.tls import ClientTrust
from rocketray.waiting import wait_for
from rr_members import CLUSTER, broker, ca_for, member
from rr_users import authenticator, directory_of, login, table_of

USERS = {"producer": "p-secret", "consumer": "c-secret", "admin": "a-secret"}
RULES = {
    "producer": [("Topic:orders", "Pub", "allow")],
    "consumer": [("Topic:orders,Group:billing", "Sub", "allow"), ("Topic:orders-*", "Sub", "allow")],
}


class Endpoints:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.pulled: list[str] = []
        self.commits: list[tuple] = []
        self.port_number = 1             # the port's own, once it listens: the client library's data connections

    def put_start(self, batch, done):
        try:
            sealed = seal_batch(batch, 0, {}, int(time.time() * 1000), 1 << 20)
        except TopicRefused:
            return refused(PutStatus.ACCESS_DENIED)
        self.written.append(bytes(sealed.data))
        return PutResult(PutStatus.PUT_OK, Written.YES, tuple((i, i) for i in range(batch.count)), 1, 1)

    def pull_start(self, topic, queue_id, queue_offset, max_count, max_bytes, hold_ms, group, done,
                   tag_filter=None):
        self.pulled.append(topic)
        return PullResult(PullStatus.FOUND, b"r", 1, queue_offset, queue_offset + 1, 9)

    async def commit_offsets(self, group, entries, reset=False):
        self.commits.append((group, tuple(entries)))
        return PutResult(PutStatus.PUT_OK, Written.YES, ((0, 0),), 1, 1)

    async def committed_offsets(self, group, topics=None):
        return OffsetsResult(OffsetsStatus.OK, (("orders", 0, 3),), (("orders", 0, 5),))

    async def queue_max_offsets(self, queues):
        return tuple((t, q, 5) for t, q in queues)

    async def search_offsets(self, queues, timestamp_ms):
        return tuple((t, q, timestamp_ms % 7) for t, q in queues)

    # control
    async def metadata(self):
        return Metadata(CLUSTER, (GroupView("broker-a", 0, 1, ((0, "127.0.0.1", self.port_number),)),), {})

    async def watch(self, group, known_epoch, wait_ms):
        return 1, 0

    async def control(self, request):
        if isinstance(request, ListTopicsRequest):
            return Response(ResponseCode.SUCCESS, ListTopicsResponseHeader((("orders", 4), ("orders-eu", 2),
                                                                            ("secret", 1))))
        if isinstance(request, GetTopicRouteRequest):
            return Response(ResponseCode.SUCCESS, TopicRouteResponseHeader(request.topic, ((0, "broker-a"),)))
        if isinstance(request, ConsumerHeartbeatRequest):
            return Response(ResponseCode.SUCCESS, ConsumerHeartbeatResponseHeader(request.group, ("c",)))
        return Response(ResponseCode.SUCCESS, TopicRouteResponseHeader("x", ()))


@pytest.fixture
def port():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    endpoints = Endpoints()
    directory = directory_of(table_of(USERS, superusers=("admin",), rules=RULES))
    server = ClientPort(endpoints, authenticator(directory), member(broker(0)).open_server_context(),
                        control=endpoints, authorize=directory.authorize)
    number = asyncio.run_coroutine_threadsafe(server.start("127.0.0.1", 0), loop).result(5)
    endpoints.port_number = number
    yield ("127.0.0.1", number), endpoints, directory, server
    asyncio.run_coroutine_threadsafe(server.close(), loop).result(5)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def connect(address, user: str, secret: str | None = None) -> Connection:
    return Connection(address, Dialer(ClientTrust(CLUSTER, ca_for().cert_pem), login(user, secret or USERS[user])))


def put(conn: Connection, *topics: str) -> PutResult:
    batch = encode_batch(Message(t, 0, b"x") for t in topics)
    return decode_put_answer(conn.request(FrameType.PUT, PUT_COUNT.pack(batch.count), batch.data).result(5).body)


def control(conn: Connection, request) -> Response:
    return decode_control_answer(conn.request(FrameType.CONTROL, encode_control(request)).result(5).body)


def test_a_wrong_secret_and_an_unknown_user_are_refused_alike(port):
    address, endpoints, _, server = port
    for user, secret in (("producer", "not-it"), ("nobody", "p-secret")):
        with pytest.raises(AuthenticationFailed, match="refused the credential"):
            connect(address, user, secret)
    # the port counts a refusal after it answered it: the client may see the answer first
    wait_for(lambda: server.rejected == 2, 5, "the port to count both refusals", 0.01)
    assert endpoints.written == []


def test_a_producer_writes_only_topics_it_may_publish_and_nothing_of_a_refused_batch(port):
    address, endpoints, _, _ = port
    conn = connect(address, "producer")
    assert put(conn, "orders", "orders").status is PutStatus.PUT_OK
    refused_put = put(conn, "orders", "secret")
    assert refused_put.status is PutStatus.ACCESS_DENIED and refused_put.written is Written.NO
    assert len(endpoints.written) == 1, "the refused batch wrote nothing, not even its orders record"
    # the connection stays usable after a refusal
    assert put(conn, "orders").status is PutStatus.PUT_OK
    # a producer may not read
    pulled = decode_pull_answer(conn.request(FrameType.PULL, pack(["orders", 0, 0, 10, 1 << 20, 0, None])).result(5).body)
    assert pulled.status is PullStatus.ACCESS_DENIED and "Sub" in pulled.remark and "Topic:orders" in pulled.remark
    assert endpoints.pulled == []
    conn.close("done")


def test_a_consumer_reads_and_commits_only_what_its_rules_allow(port):
    address, endpoints, _, _ = port
    conn = connect(address, "consumer")
    ok = decode_pull_answer(conn.request(FrameType.PULL, pack(["orders", 0, 0, 10, 1 << 20, 0, "billing"])).result(5).body)
    assert ok.status is PullStatus.FOUND
    other_group = decode_pull_answer(
        conn.request(FrameType.PULL, pack(["orders", 0, 0, 10, 1 << 20, 0, "fraud"])).result(5).body)
    assert other_group.status is PullStatus.ACCESS_DENIED and "Group:fraud" in other_group.remark
    commit = decode_put_answer(conn.request(FrameType.COMMIT, pack(["billing", [["orders", 0, 5]]])).result(5).body)
    assert commit.status is PutStatus.PUT_OK
    denied = decode_put_answer(conn.request(FrameType.COMMIT, pack(["billing", [["secret", 0, 5]]])).result(5).body)
    assert denied.status is PutStatus.ACCESS_DENIED and endpoints.commits == [("billing", (("orders", 0, 5),))]
    committed = decode_offsets_answer(conn.request(FrameType.COMMITTED, pack(["fraud", None])).result(5).body)
    assert committed.status is OffsetsStatus.ACCESS_DENIED
    maxes = conn.request(FrameType.QUEUE_MAX, pack([["orders", 0], ["secret", 0]])).result(5)
    from rocketray.wire.client_frames import unpack
    assert unpack(maxes.body, "t") == [["orders", 0, 5]], "a topic it may not read is left out"
    by_time = conn.request(FrameType.SEARCH_OFFSET, pack([[["orders", 0], ["secret", 0]], 9])).result(5)
    assert unpack(by_time.body, "t") == [["orders", 0, 2]], "a topic it may not read is left out"
    assert put(conn, "orders").status is PutStatus.ACCESS_DENIED
    conn.close("done")


def test_controller_requests_need_their_actions_and_a_listing_shows_only_visible_topics(port):
    address, _, _, _ = port
    producer, consumer, admin = (connect(address, u) for u in ("producer", "consumer", "admin"))
    denied = control(producer, CreateTopicRequest("orders", 8))
    assert denied.code is ResponseCode.NO_PERMISSION and "Admin on Topic:orders" in denied.remark
    assert control(admin, CreateTopicRequest("orders", 8)).ok
    assert control(producer, GetTopicRouteRequest("orders")).ok          # Pub suffices for a route
    assert control(producer, GetTopicRouteRequest("secret")).code is ResponseCode.NO_PERMISSION
    assert control(consumer, ConsumerHeartbeatRequest("billing", "c", ("orders",))).ok
    assert control(consumer, ConsumerHeartbeatRequest("fraud", "c", ("orders",))).code is ResponseCode.NO_PERMISSION
    assert control(consumer, ListTopicsRequest()).header.topics == (("orders", 4), ("orders-eu", 2))
    assert control(admin, ListTopicsRequest()).header.topics == (("orders", 4), ("orders-eu", 2), ("secret", 1))
    for c in (producer, consumer, admin):
        c.close("done")


def test_a_revoked_rule_or_a_deleted_user_takes_effect_on_the_next_operation(port):
    address, _, directory, _ = port
    conn = connect(address, "producer")
    assert put(conn, "orders").status is PutStatus.PUT_OK
    directory.table = table_of({"producer": "p-secret"}, rules={}, version=2)       # its rule removed
    assert put(conn, "orders").status is PutStatus.ACCESS_DENIED
    directory.table = table_of({}, version=3)                                       # the user deleted
    assert put(conn, "orders").status is PutStatus.ACCESS_DENIED
    conn.close("done")
    with pytest.raises(AuthenticationFailed):
        connect(address, "producer")


def bootstrap(address, user: str, secret: str | None = None) -> Bootstrap:
    return Bootstrap(CLUSTER, (f"{address[0]}:{address[1]}",), user, secret or USERS[user], ca_for().cert_pem)


def test_the_client_library_raises_typed_errors_naming_the_resource_and_the_action(port):
    """What an application meets: AccessDenied (not retriable; its resource and action) for a topic
    whose route the ACL hides, for a put the broker refuses, for a group it may not join; a wrong
    secret is AuthenticationFailed at once, not a retry until the send timeout."""
    address, endpoints, _, _ = port
    with Producer(bootstrap(address, "producer")) as p:
        assert p.send("orders", b"x").status is SendStatus.SEND_OK
        with pytest.raises(AccessDenied) as hidden:
            p.send("secret", b"x")                                  # no right on it: its route is refused
        assert (hidden.value.resource, hidden.value.action, hidden.value.retriable) == ("Topic:secret", "Pub", False)
        assert hidden.value.code == "ACCESS_DENIED" and "acl create" in str(hidden.value)
    with Producer(bootstrap(address, "consumer"), send_timeout_ms=5000) as p:
        started = time.monotonic()
        with pytest.raises(AccessDenied) as put_denied:
            p.send("orders", b"x")                                  # the route is visible (Sub); Pub is not
        assert (put_denied.value.resource, put_denied.value.action) == ("Topic:orders", "Pub")
        assert time.monotonic() - started < 2.5, "a denial is not retried until the send timeout"
    with pytest.raises(AccessDenied) as joined:
        Consumer(bootstrap(address, "consumer"), group="fraud", topics=["orders"])
    assert (joined.value.resource, joined.value.action) == ("Group:fraud", "Sub")
    with Consumer(bootstrap(address, "consumer"), group="billing", topics=["orders"]) as c:
        with pytest.raises(AccessDenied) as commit_denied:
            c.commit({TopicQueue("secret", 0): 5})
        assert (commit_denied.value.resource, commit_denied.value.action) == ("Topic:secret", "Sub")
    written = len(endpoints.written)
    started = time.monotonic()
    with pytest.raises(AuthenticationFailed) as refused_login:
        with Producer(bootstrap(address, "producer", "not-it"), send_timeout_ms=5000) as p:
            p.send("orders", b"x")
    assert refused_login.value.code == "AUTHENTICATION_FAILED" and not refused_login.value.retriable
    assert time.monotonic() - started < 2.5 and len(endpoints.written) == written


def test_a_consumer_without_rights_on_its_retry_topic_consumes_and_a_nack_says_what_to_allow(port):
    """The group's retry topic is read only where the user may see it: a consumer with no right on
    it joins and commits as before. Its first nack must create the topic, which needs Admin on it:
    the AccessDenied names the resource and the operator's command that makes it instead."""
    from rocketray.client import ReceivedMessage

    address, endpoints, _, _ = port
    with Consumer(bootstrap(address, "consumer"), group="billing", topics=["orders"]) as c:
        assert all(q.topic == "orders" for q in c.assignment())
        m = ReceivedMessage("orders", 0, 3, "ID3", None, None, {}, b"x", 0)
        with pytest.raises(AccessDenied) as denied:
            c.nack(m)
        assert (denied.value.resource, denied.value.action) == ("Topic:%RETRY%billing", "Admin")
        assert "rocketray admin update-topic -t %RETRY%billing -q 16" in str(denied.value)
        assert c.commit({TopicQueue("orders", 0): 3}) == {TopicQueue("orders", 0): 3}
    assert not any(t.startswith("%RETRY%") for t in endpoints.pulled)


def test_a_delayed_message_needs_pub_on_its_real_topic_and_the_schedule_is_nobodys_to_read(port):
    """A delayed send's record is of %SCHEDULE%<topic>: Pub on <topic> allows it; reading a schedule
    topic, or pulling and committing as the scheduler's group, is refused to everyone (the superuser
    included), so no user can skip or see another's pending messages."""
    address, endpoints, _, _ = port
    producer = connect(address, "producer")
    assert put(producer, "%SCHEDULE%orders").status is PutStatus.PUT_OK
    assert put(producer, "%SCHEDULE%secret").status is PutStatus.ACCESS_DENIED
    assert put(producer, "%SCHEDULE%%SCHEDULE%orders").status is PutStatus.ACCESS_DENIED
    assert len(endpoints.written) == 1
    producer.close("done")
    for user in ("consumer", "admin"):
        conn = connect(address, user)
        for topic, group in (("%SCHEDULE%orders", "billing"), ("orders", "%SCHEDULE%")):
            pulled = decode_pull_answer(conn.request(FrameType.PULL, pack([topic, 0, 0, 10, 1 << 20, 0, group]))
                                        .result(5).body)
            assert pulled.status is PullStatus.ACCESS_DENIED and "%SCHEDULE%" in pulled.remark, (user, topic)
        commit = decode_put_answer(conn.request(FrameType.COMMIT, pack(["%SCHEDULE%", [["%SCHEDULE%orders", 0, 5]]]))
                                   .result(5).body)
        assert commit.status is PutStatus.ACCESS_DENIED
        conn.close("done")
    assert endpoints.pulled == [] and endpoints.commits == []
