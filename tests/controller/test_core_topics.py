"""Topics in the pure controller core (controller/topics.py): table-driven decide rows, apply, replay,
snapshot round trips, a property test over random create/extend/delete sequences, and the regression
test of upstream's topic lost on a master switch."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketray.wire.controller_api import (AlterSyncStateSetRequest, ApplyBrokerIdRequest, ConsumerHeartbeatRequest,
                                           CreateTopicRequest, DeleteTopicRequest, ElectMasterRequest,
                                           GetTopicRouteRequest, ListTopicsRequest, RegisterBrokerRequest, Response)
from rocketray.wire.controller_codes import ResponseCode as C
from rocketray.wire.controller_codes import is_retriable
from rocketray.wire.controller_headers import ListTopicsResponseHeader, TopicRouteResponseHeader, header_fields
from rocketray.controller.decide import DecideContext, decide, is_write
from rocketray.controller.events import (ApplyBrokerIdEvent, CleanBrokerDataEvent, CreateTopicEvent, DeleteTopicEvent,
                                         decode_events, encode_events)
from rocketray.controller.state import ControllerState
from rocketray.controller.topics import MAX_QUEUES, assign_queues

GROUPS = ("broker-a", "broker-b", "broker-c")


def state_with(groups: tuple[str, ...] = GROUPS, topics: dict[str, tuple[str, ...]] | None = None) -> ControllerState:
    state = ControllerState()
    for name in groups:
        state.apply(ApplyBrokerIdEvent("c", name, f"{name}:1", f"{name}:1;1", 1))
    for topic, assignment in (topics or {}).items():
        state.apply(CreateTopicEvent(topic, assignment))
    return state


def run(state: ControllerState, request: object) -> tuple[Response, list[Any]]:
    """decide (checking it mutates nothing), then apply its events."""
    before = (state.to_snapshot(), state.topics_to_snapshot())
    response, events = decide(state, request, DecideContext(lambda name, broker_id: True))
    assert (state.to_snapshot(), state.topics_to_snapshot()) == before, "decide must not mutate"
    state.apply_all(events)
    return response, events


A, B, CC = GROUPS
ABCAB = (A, B, CC, A, B)
LONG = "t" * 127

# (id, broker groups, topics before, request, code, header (None: not checked), events, remark contains)
ROWS = [
    ("create-round-robin", GROUPS, {}, CreateTopicRequest("orders", 5), C.SUCCESS,
     {"topic": "orders", "queues": [[0, A], [1, B], [2, CC], [3, A], [4, B]], "created": True},
     [CreateTopicEvent("orders", ABCAB)], ""),
    ("create-one-group", (B,), {}, CreateTopicRequest("orders", 3), C.SUCCESS,
     {"topic": "orders", "queues": [[0, B], [1, B], [2, B]], "created": True}, [CreateTopicEvent("orders", (B, B, B))],
     ""),
    ("create-same-count-is-idempotent", GROUPS, {"orders": ABCAB}, CreateTopicRequest("orders", 5), C.SUCCESS,
     {"topic": "orders", "queues": [[0, A], [1, B], [2, CC], [3, A], [4, B]], "created": False}, [], ""),
    ("extend-continues-round-robin", GROUPS, {"orders": ABCAB}, CreateTopicRequest("orders", 7), C.SUCCESS,
     {"topic": "orders", "queues": [[0, A], [1, B], [2, CC], [3, A], [4, B], [5, CC], [6, A]], "created": True},
     [CreateTopicEvent("orders", ABCAB + (CC, A))], ""),
    ("extend-keeps-queues-of-a-smaller-past", GROUPS, {"orders": (A, A)}, CreateTopicRequest("orders", 4), C.SUCCESS,
     {"topic": "orders", "queues": [[0, A], [1, A], [2, CC], [3, A]], "created": True},
     [CreateTopicEvent("orders", (A, A, CC, A))], ""),
    ("shrink-refused", GROUPS, {"orders": ABCAB}, CreateTopicRequest("orders", 3), C.CONTROLLER_INVALID_REQUEST,
     None, [], "cannot shrink topic orders from 5 to 3 queues"),
    ("no-broker-group", (), {}, CreateTopicRequest("orders", 3), C.CONTROLLER_INVALID_REQUEST, None, [],
     "no broker group registered yet"),
    ("same-count-needs-no-group", (), {"orders": (A,)}, CreateTopicRequest("orders", 1), C.SUCCESS,
     {"topic": "orders", "queues": [[0, A]], "created": False}, [], ""),
    ("max-queues-and-name-length", (A,), {}, CreateTopicRequest(LONG, MAX_QUEUES), C.SUCCESS, None,
     [CreateTopicEvent(LONG, (A,) * MAX_QUEUES)], ""),
    ("percent-and-bar-inside-a-name", (A,), {}, CreateTopicRequest("a%b|c_d-1", 1), C.SUCCESS, None,
     [CreateTopicEvent("a%b|c_d-1", (A,))], ""),
    ("empty-name", GROUPS, {}, CreateTopicRequest("", 1), C.CONTROLLER_INVALID_REQUEST, None, [], "empty"),
    ("name-not-a-string", GROUPS, {}, CreateTopicRequest(None, 1), C.CONTROLLER_INVALID_REQUEST, None, [],
     "topic name must be a string, got NoneType"),
    ("name-too-long", GROUPS, {}, CreateTopicRequest("t" * 128, 1), C.CONTROLLER_INVALID_REQUEST, None, [],
     "128 characters, over 127"),
    ("name-with-space", GROUPS, {}, CreateTopicRequest("a b", 1), C.CONTROLLER_INVALID_REQUEST, None, [],
     "characters outside [%|a-zA-Z0-9_-]"),
    ("name-with-slash", GROUPS, {}, CreateTopicRequest("a/b", 1), C.CONTROLLER_INVALID_REQUEST, None, [],
     "characters outside"),
    ("name-with-dot", GROUPS, {}, CreateTopicRequest("a.b", 1), C.CONTROLLER_INVALID_REQUEST, None, [],
     "characters outside"),
    ("a-groups-retry-topic-may-be-created", (A,), {}, CreateTopicRequest("%RETRY%g", 2), C.SUCCESS, None,
     [CreateTopicEvent("%RETRY%g", (A, A))], ""),
    ("a-groups-dlq-may-be-created", (A,), {}, CreateTopicRequest("%DLQ%g", 1), C.SUCCESS, None,
     [CreateTopicEvent("%DLQ%g", (A,))], ""),
    ("retry-prefix-without-a-group-reserved", GROUPS, {}, CreateTopicRequest("%RETRY%", 1),
     C.CONTROLLER_INVALID_REQUEST, None, [], "reserved for system topics"),
    ("retry-prefix-then-percent-reserved", GROUPS, {}, CreateTopicRequest("%RETRY%%DLQ%g", 1),
     C.CONTROLLER_INVALID_REQUEST, None, [], "reserved for system topics"),
    ("other-percent-name-reserved", GROUPS, {}, CreateTopicRequest("%SYS%g", 1), C.CONTROLLER_INVALID_REQUEST, None,
     [], "reserved for system topics"),
    ("double-underscore-reserved", GROUPS, {}, CreateTopicRequest("__consumer_offsets", 1),
     C.CONTROLLER_INVALID_REQUEST, None, [], "reserved for system topics"),
    ("zero-queues", GROUPS, {}, CreateTopicRequest("orders", 0), C.CONTROLLER_INVALID_REQUEST, None, [],
     "queue count 0 is outside 1..1024"),
    ("too-many-queues", GROUPS, {}, CreateTopicRequest("orders", 1025), C.CONTROLLER_INVALID_REQUEST, None, [],
     "queue count 1025 is outside 1..1024"),
    ("bool-queues", GROUPS, {}, CreateTopicRequest("orders", True), C.CONTROLLER_INVALID_REQUEST, None, [],
     "must be an int"),
    ("str-queues", GROUPS, {}, CreateTopicRequest("orders", "3"), C.CONTROLLER_INVALID_REQUEST, None, [],
     "must be an int"),
    ("delete", GROUPS, {"orders": ABCAB}, DeleteTopicRequest("orders"), C.SUCCESS, {"topic": "orders"},
     [DeleteTopicEvent("orders")], ""),
    ("delete-missing", GROUPS, {"orders": ABCAB}, DeleteTopicRequest("other"), C.TOPIC_NOT_EXIST, None, [],
     "topic 'other' does not exist"),
    ("delete-reserved", GROUPS, {}, DeleteTopicRequest("__consumer_offsets"), C.CONTROLLER_INVALID_REQUEST, None,
     [], "reserved"),
    ("delete-a-groups-dlq", GROUPS, {"%DLQ%g": (A,)}, DeleteTopicRequest("%DLQ%g"), C.SUCCESS, {"topic": "%DLQ%g"},
     [DeleteTopicEvent("%DLQ%g")], ""),
    ("route", GROUPS, {"orders": (B, A)}, GetTopicRouteRequest("orders"), C.SUCCESS,
     {"topic": "orders", "queues": [[0, B], [1, A]]}, [], ""),
    ("route-missing", GROUPS, {}, GetTopicRouteRequest("orders"), C.TOPIC_NOT_EXIST, None, [],
     "topic 'orders' does not exist"),
    ("route-of-a-system-name-is-just-missing", GROUPS, {}, GetTopicRouteRequest("%RETRY%g"), C.TOPIC_NOT_EXIST,
     None, [], "does not exist"),
    ("route-bad-name", GROUPS, {}, GetTopicRouteRequest("a b"), C.CONTROLLER_INVALID_REQUEST, None, [],
     "characters outside"),
    ("list", GROUPS, {"b": (A,), "a": ABCAB}, ListTopicsRequest(), C.SUCCESS, {"topics": {"a": 5, "b": 1}}, [], ""),
    ("list-empty", (), {}, ListTopicsRequest(), C.SUCCESS, {"topics": {}}, [], ""),
    ("consumer-heartbeat-is-not-a-decide-request", GROUPS, {}, ConsumerHeartbeatRequest("g", "c1", ("orders",)),
     C.REQUEST_CODE_NOT_SUPPORTED, None, [], "not supported"),
]


@pytest.mark.parametrize("groups,topics,request_,code,header,events,remark", [r[1:] for r in ROWS],
                         ids=[r[0] for r in ROWS])
def test_topic_decisions(groups, topics, request_, code, header, events, remark):
    """Each row: the answer's code, header, remark and events; after applying them the route answers
    the same assignment and a replay of the same events on a fresh state agrees."""
    state = state_with(groups, topics)
    response, emitted = run(state, request_)
    assert response.code == code, response
    assert remark in response.remark
    if header is not None:
        assert header_fields(response.header) == header   # the typed header's plain fields
    assert emitted == events
    if isinstance(request_, CreateTopicRequest) and response.ok:
        route, _ = run(state, GetTopicRouteRequest(request_.topic))
        assert route.header.queues == response.header.queues
        assert len(state.topics[request_.topic]) == request_.queues
    if isinstance(request_, DeleteTopicRequest) and response.ok:
        assert request_.topic not in state.topics
    replayed = state_with(groups, topics)
    replayed.apply_all(decode_events(encode_events(emitted)))
    assert replayed == state


def test_writes_reads_and_the_topic_not_exist_code():
    """Create/Delete go through Raft (is_write); Route/List are reads; the consumer heartbeat is
    neither (leader-local). TOPIC_NOT_EXIST is RocketMQ's 17 and not retriable."""
    assert is_write(CreateTopicRequest("t", 1)) and is_write(DeleteTopicRequest("t"))
    assert not is_write(GetTopicRouteRequest("t")) and not is_write(ListTopicsRequest())
    assert not is_write(ConsumerHeartbeatRequest("g", "c", ()))
    assert C.TOPIC_NOT_EXIST == 17 and not is_retriable(C.TOPIC_NOT_EXIST)


def test_oversized_fields_are_refused_before_anything_is_replicated():
    """check_request_limits runs first: a 5000-byte topic name is refused like any oversized field."""
    response, events = run(state_with(), CreateTopicRequest("t" * 5000, 1))
    assert response.code == C.CONTROLLER_INVALID_REQUEST and events == []


def test_apply_is_total_for_topic_events():
    """Deleting a missing topic is ignored; a create without queues (never decided) is ignored; a
    create sets the whole list (also when it does not start with the old one)."""
    state = state_with()
    state.apply_all([DeleteTopicEvent("nope"), CreateTopicEvent("t", ()), CreateTopicEvent("u", (A, B)),
                     CreateTopicEvent("u", (B,))])
    assert state.topics == {"u": (B,)}


def test_apply_batch_rolls_topic_rows_back_with_the_batch():
    """A batch that fails half way leaves the topic table as it was (all or nothing, like the groups)."""
    state = state_with(topics={"t": (A,)})
    calls = []

    def fail_on_third(event):
        calls.append(event)
        if len(calls) == 3:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        state.apply_batch([CreateTopicEvent("t", (A, B)), DeleteTopicEvent("t"), CreateTopicEvent("v", (A,))],
                          fail_on_third)
    assert state.topics == {"t": (A,)}


def test_state_equality_and_snapshot_include_topics():
    a, b = state_with(topics={"t": (A,)}), state_with()
    assert a != b
    restored = ControllerState.from_snapshot(msgpack.unpackb(msgpack.packb(a.to_snapshot())),
                                             msgpack.unpackb(msgpack.packb(a.topics_to_snapshot())))
    assert restored == a and restored.topics == {"t": (A,)}


@pytest.mark.parametrize("section", [
    {"version": 2, "topics": []},
    {"version": 1, "topics": [["t"]]},
    {"version": 1, "topics": [["t", []]]},
    {"version": 1, "topics": [["t", [1]]]},
    {"version": 1, "topics": [[1, ["a"]]]},
    {"version": 1, "topics": ["t"]},
    [],
])
def test_malformed_topics_section_raises_value_error(section):
    with pytest.raises(ValueError):
        ControllerState.from_snapshot(ControllerState().to_snapshot(), section)


def test_assign_queues_keeps_the_prefix_and_continues_from_the_old_count():
    assert assign_queues((), 4, [A, B]) == (A, B, A, B)
    assert assign_queues((CC,), 4, [A, B]) == (CC, B, A, B)  # index 1 -> names[1]
    assert assign_queues((A, B), 2, [A]) == (A, B)


# --- the regression of upstream's topic lost on a master switch -----------------------------------

def test_topic_survives_master_switch():
    """Upstream RocketMQ bug: a topic created with mqadmin lived only in the master broker's topics.json
    and vanished after a master switch. Here the topic is controller state naming broker groups, not
    replicas: electing another master of the group (old master dead) leaves the route unchanged."""
    state = ControllerState()
    alive = {1, 2}
    ctx = DecideContext(lambda name, broker_id: broker_id in alive)

    def call(request):
        response, events = decide(state, request, ctx)
        state.apply_all(events)
        return response

    for broker_id in (1, 2):
        assert call(ApplyBrokerIdRequest("c", A, broker_id, f"h:{broker_id};1")).ok
        assert call(RegisterBrokerRequest("c", A, broker_id, f"h:{broker_id}")).ok
    assert call(ElectMasterRequest.of_broker_trigger("c", A, 1)).header.master_broker_id == 1
    assert call(AlterSyncStateSetRequest(A, 1, 1, frozenset({1, 2}), 1)).ok
    created = call(CreateTopicRequest("orders", 4))
    assert created.ok and created.header.queues == ((0, A), (1, A), (2, A), (3, A))

    alive.discard(1)  # the master dies; the controller elects the other replica of the group
    elected = call(ElectMasterRequest.of_controller_trigger(A))
    assert elected.ok and elected.header.master_broker_id == 2 and elected.header.master_epoch == 2
    route = call(GetTopicRouteRequest("orders"))
    assert route.ok and route.header == TopicRouteResponseHeader("orders", created.header.queues)
    assert call(ListTopicsRequest()).header == ListTopicsResponseHeader((("orders", 4),))


def test_cleaning_a_broker_group_keeps_the_topics_naming_it():
    """Forgetting a group's metadata does not silently drop topics: their queues still name the group
    (messages may still be on its disks); an admin deletes the topic explicitly."""
    state = state_with((A, B), {"orders": (A, B)})
    state.apply(CleanBrokerDataEvent(A, None))
    assert state.topics == {"orders": (A, B)} and state.broker_names() == [B]


# --- property: random create/extend/delete sequences ----------------------------------------------

ops = st.lists(st.one_of(
    st.tuples(st.just("create"), st.sampled_from(["t", "u", "v"]), st.integers(0, 12)),
    st.tuples(st.just("delete"), st.sampled_from(["t", "u", "v", "w"]), st.just(0)),
    st.tuples(st.just("register"), st.sampled_from(["g1", "g2", "g3"]), st.just(0)),
), max_size=40)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_random_topic_histories_keep_the_invariants(history):
    """Random create/extend/delete (and groups appearing) sequences: an extension never moves an
    existing queue, every topic has 1..1024 queues on registered-at-the-time groups, the answer's
    route is what was applied, replaying the events through the codec on a fresh state gives an equal
    state, and the snapshot sections round-trip through msgpack to an equal state."""
    state, log = ControllerState(), []
    for kind, name, queues in history:
        if kind == "register":
            events = [ApplyBrokerIdEvent("c", name, "h:1", "h:1;1", 1)]
            response = Response(C.SUCCESS)
        else:
            request = CreateTopicRequest(name, queues) if kind == "create" else DeleteTopicRequest(name)
            before = state.topics.get(name)
            response, events = decide(state, request, DecideContext(lambda n, i: True))
            if kind == "create" and response.ok and before is not None:
                assert response.header.queues[:len(before)] == tuple(enumerate(before))
            if not response.ok:
                assert events == []
        state.apply_all(events)
        log.extend(events)
        if kind == "create" and response.ok:
            assert response.header.queues == tuple(enumerate(state.topics[name]))
        for assignment in state.topics.values():
            assert 1 <= len(assignment) <= MAX_QUEUES
            assert set(assignment) <= {"g1", "g2", "g3"}
    fresh = ControllerState()
    fresh.apply_all(decode_events(encode_events(log)))
    assert fresh == state
    restored = ControllerState.from_snapshot(msgpack.unpackb(msgpack.packb(state.to_snapshot())),
                                             msgpack.unpackb(msgpack.packb(state.topics_to_snapshot())))
    assert restored == state
