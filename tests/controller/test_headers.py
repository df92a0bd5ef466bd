"""Typed response headers (issue 28, wire/controller_headers.py): each request kind answers its own frozen
header, a Response refuses anything else, and the field codec that carries a header through a map
(the chaos runner's msgpack wire, the admin CLI's JSON) round-trips every header and refuses a
malformed map with a HeaderCodecError (code SYSTEM_ERROR) instead of building a wrong header."""

from __future__ import annotations

import json
import threading

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketray.wire import controller_headers as h
from rocketray.wire.controller_api import (AlterSyncStateSetRequest, ApplyBrokerIdRequest, CleanBrokerDataRequest,
                                           CreateTopicRequest, DeleteTopicRequest, ElectMasterRequest,
                                           ElectMastersRequest, GetNextBrokerIdRequest, GetReplicaInfoRequest,
                                           GetSyncStateDataRequest, GetTopicRouteRequest, ListTopicsRequest,
                                           MasterInfo, RegisterBrokerRequest, Response)
from rocketray.wire.controller_codes import ResponseCode as C
from rocketray.controller.config import ControllerConfig
from rocketray.controller.decide import DecideContext, decide, election_answers
from rocketray.controller.proc import InProcessControllers, _Server
from rocketray.controller.proc_wire import NodeClient
from rocketray.controller.state import ControllerState
from rocketray.chaos.controller_workload import header_of
from rocketray.verify.controller_model import output_of
from rocketray.verify.linearizability import ReadOutput

EXAMPLES = [
    h.NO_HEADER,
    h.GetNextBrokerIdResponseHeader("c", "g", 4),
    h.ApplyBrokerIdResponseHeader("c", "g"),
    h.RegisterBrokerToControllerResponseHeader("c", "g"),
    h.RegisterBrokerToControllerResponseHeader("c", "g", 1, "h:1", 3, 4),
    h.ElectMasterResponseHeader(),
    h.ElectMasterResponseHeader(master_epoch=5),
    h.ElectMasterResponseHeader(2, "h:2", 5, 6),
    h.ElectMastersResponseHeader(3),
    h.AlterSyncStateSetResponseHeader(7),
    h.GetReplicaInfoResponseHeader(None, None, 2),
    h.GetReplicaInfoResponseHeader(1, "h:1", 2),
    h.TopicRouteResponseHeader("t", ((0, "a"), (1, "b"))),
    h.CreateTopicResponseHeader("t", ((0, "a"),), True),
    h.DeleteTopicResponseHeader("t"),
    h.ListTopicsResponseHeader((("a", 5), ("b", 1))),
    h.ListTopicsResponseHeader(()),
    h.ConsumerHeartbeatResponseHeader("g", ("c1", "c2")),
    h.ControllerConfigResponseHeader("h:9"),
    h.NotLeaderResponseHeader("h:9", "n1"),
    h.NotLeaderResponseHeader(),
    h.UserResponseHeader("app", False, True),
    h.ListUsersResponseHeader((("admin", True), ("app", False))),
    h.ListUsersResponseHeader(()),
    h.AclRulesResponseHeader((("app", "Topic:orders-*", ("Pub", "Sub"), "Allow"), ("app", "Group:g", (), "Deny"))),
    h.AuthTableResponseHeader(4, False),
]


def test_every_header_kind_has_an_example():
    assert {type(e) for e in EXAMPLES} == set(h.HEADER_TYPES)


@pytest.mark.parametrize("header", EXAMPLES, ids=lambda e: type(e).__name__)
def test_fields_round_trip_through_msgpack_and_json(header):
    """A header's plain fields survive msgpack and JSON and rebuild an equal header."""
    fields = h.header_fields(header)
    kind = type(header).__name__
    for data in (msgpack.unpackb(msgpack.packb(fields), raw=False, strict_map_key=False),
                 json.loads(json.dumps(fields))):
        assert h.header_from_fields(kind, data) == header


@pytest.mark.parametrize("kind,fields,problem", [
    ("Nope", {}, "unknown response header"),
    (None, {}, "unknown response header"),
    ("Response", {}, "unknown response header"),
    ("GetNextBrokerIdResponseHeader", [("cluster_name", "c")], "must be a map"),
    ("GetNextBrokerIdResponseHeader", {"cluster_name": "c", "broker_name": "g"}, "needs fields"),
    ("GetNextBrokerIdResponseHeader", {"cluster_name": "c", "broker_name": "g", "next_broker_id": 1, "x": 1},
     "needs fields"),
    ("GetNextBrokerIdResponseHeader", {"cluster_name": "c", "broker_name": "g", "next_broker_id": "1"},
     "'next_broker_id' does not accept"),
    ("GetNextBrokerIdResponseHeader", {"cluster_name": "c", "broker_name": "g", "next_broker_id": True},
     "'next_broker_id' does not accept"),
    ("GetNextBrokerIdResponseHeader", {"cluster_name": "c", "broker_name": "g", "next_broker_id": 2 ** 63},
     "'next_broker_id' does not accept"),
    ("GetNextBrokerIdResponseHeader", {"cluster_name": None, "broker_name": "g", "next_broker_id": 1},
     "'cluster_name' does not accept"),
    ("GetReplicaInfoResponseHeader", {"master_broker_id": None, "master_address": None, "master_epoch": None},
     "'master_epoch' does not accept"),
    ("ElectMasterResponseHeader", {"master_broker_id": 1.0, "master_address": None, "master_epoch": None,
                                   "sync_state_set_epoch": None}, "'master_broker_id' does not accept"),
    ("TopicRouteResponseHeader", {"topic": "t", "queues": [[0, "a", 1]]}, "'queues' does not accept"),
    ("TopicRouteResponseHeader", {"topic": "t", "queues": [["0", "a"]]}, "'queues' does not accept"),
    ("TopicRouteResponseHeader", {"topic": "t", "queues": "ab"}, "'queues' does not accept"),
    ("CreateTopicResponseHeader", {"topic": "t", "queues": [], "created": None}, "'created' does not accept"),
    ("ListTopicsResponseHeader", {"topics": {"a": "5"}}, "'topics' does not accept"),
    ("ListTopicsResponseHeader", {"topics": [["a", 5]]}, "'topics' does not accept"),
    ("ConsumerHeartbeatResponseHeader", {"group": "g", "members": ["c1", 2]}, "'members' does not accept"),
])
def test_a_malformed_map_is_refused_with_a_code(kind, fields, problem):
    with pytest.raises(h.HeaderCodecError, match=problem) as refused:
        h.header_from_fields(kind, fields)
    assert refused.value.code == C.SYSTEM_ERROR and refused.value.retriable is False


def test_header_fields_refuses_what_is_not_a_header():
    with pytest.raises(h.HeaderCodecError, match="not a response header: dict"):
        h.header_fields({"master_epoch": 1})  # type: ignore[arg-type]


def test_a_response_takes_only_a_typed_header():
    """The old dict header is refused at construction, so no reader can meet one."""
    with pytest.raises(TypeError, match="typed header"):
        Response(C.SUCCESS, {"master_epoch": 1})  # type: ignore[arg-type]
    assert Response(C.SUCCESS).header is h.NO_HEADER
    assert Response.error(C.CONTROLLER_NOT_LEADER, "x").header is h.NO_HEADER


@settings(max_examples=200, deadline=None)
@given(st.integers(-(2 ** 63), 2 ** 63 - 1), st.one_of(st.none(), st.text(max_size=20)),
       st.lists(st.tuples(st.integers(0, 2 ** 31), st.text(max_size=8)), max_size=5),
       st.dictionaries(st.text(max_size=8), st.integers(0, 1 << 20), max_size=5))
def test_random_values_round_trip(epoch, address, queues, topics):
    for header in (h.GetReplicaInfoResponseHeader(None if address is None else epoch, address, epoch),
                   h.TopicRouteResponseHeader(address or "", tuple(queues)),
                   h.ListTopicsResponseHeader(tuple(sorted(topics.items())))):
        data = msgpack.unpackb(msgpack.packb(h.header_fields(header)), raw=False, strict_map_key=False)
        assert h.header_from_fields(type(header).__name__, data) == header


def _state_with_group() -> tuple[ControllerState, DecideContext]:
    state, ctx = ControllerState(), DecideContext()
    for broker_id in (1, 2):
        for request in (ApplyBrokerIdRequest("c", "g", broker_id, f"h:{broker_id};1"),
                        RegisterBrokerRequest("c", "g", broker_id, f"h:{broker_id}")):
            response, events = decide(state, request, ctx)
            assert response.ok, response
            state.apply_all(events)
    return state, ctx


@pytest.mark.parametrize("request_,code,header_type", [
    (GetNextBrokerIdRequest("c", "g"), C.SUCCESS, h.GetNextBrokerIdResponseHeader),
    (ApplyBrokerIdRequest("c", "g", 3, "h:3;1"), C.SUCCESS, h.ApplyBrokerIdResponseHeader),
    (ApplyBrokerIdRequest("c", "g", 1, "h:9;9"), C.CONTROLLER_BROKER_ID_INVALID, h.ApplyBrokerIdResponseHeader),
    (RegisterBrokerRequest("c", "g", 1, "h:1"), C.SUCCESS, h.RegisterBrokerToControllerResponseHeader),
    (RegisterBrokerRequest("c", "x", 1, "h:1"), C.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED, h.NoHeader),
    (ElectMasterRequest.of_broker_trigger("c", "g", 1), C.SUCCESS, h.ElectMasterResponseHeader),
    (ElectMasterRequest.of_controller_trigger("g"), C.CONTROLLER_MASTER_NOT_AVAILABLE, h.ElectMasterResponseHeader),
    (ElectMastersRequest(("g",)), C.SUCCESS, h.ElectMastersResponseHeader),
    (AlterSyncStateSetRequest("g", 1, 0, frozenset({1}), 0), C.CONTROLLER_INVALID_MASTER, h.NoHeader),
    (GetReplicaInfoRequest("g"), C.SUCCESS, h.GetReplicaInfoResponseHeader),
    (GetSyncStateDataRequest(("g",)), C.SUCCESS, h.NoHeader),
    (CleanBrokerDataRequest("c", "g", "3"), C.CONTROLLER_INVALID_CLEAN_BROKER_METADATA, h.NoHeader),
    (CreateTopicRequest("t", 2), C.SUCCESS, h.CreateTopicResponseHeader),
    (GetTopicRouteRequest("t"), C.TOPIC_NOT_EXIST, h.NoHeader),
    (DeleteTopicRequest("t"), C.TOPIC_NOT_EXIST, h.NoHeader),
    (ListTopicsRequest(), C.SUCCESS, h.ListTopicsResponseHeader),
], ids=lambda v: type(v).__name__ if not isinstance(v, (C, type)) else str(v))
def test_each_request_kind_answers_its_header(request_, code, header_type):
    """The table of wire/controller_headers.py's docstring, decided on a registered group of two."""
    state, ctx = _state_with_group()
    response, _events = decide(state, request_, ctx)
    assert (response.code, type(response.header)) == (code, header_type), response


def test_an_election_batch_answers_each_group_with_its_elect_header():
    state, ctx = _state_with_group()
    for request in (ElectMasterRequest.of_broker_trigger("c", "g", 1),
                    AlterSyncStateSetRequest("g", 1, 1, frozenset({1, 2}), 1)):
        response, events = decide(state, request, ctx)
        assert response.ok, response
        state.apply_all(events)
    response, _events = decide(state, ElectMastersRequest(("g", "unknown")), DecideContext(lambda name, i: i != 1))
    assert response.header == h.ElectMastersResponseHeader(2)
    answers = election_answers(response)
    assert answers["g"].header == h.ElectMasterResponseHeader(2, "h:2", 2, 3)
    assert answers["unknown"].code == C.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED
    assert MasterInfo.from_response(answers["g"]) == MasterInfo(2, "h:2", 2, 3, frozenset({2}))


def test_the_chaos_wire_carries_a_typed_header_end_to_end(tmp_path, port_factory):
    """A real node behind the chaos runner's authenticated socket answers a read; the runner rebuilds
    the typed header from the wire and the checker reads it (controller/proc.py, proc_wire.py)."""
    cluster = InProcessControllers(tmp_path / "n", [port_factory()], ControllerConfig.for_tests(),
                                   alive=lambda name, broker_id: True)
    server = _Server(("127.0.0.1", 0), cluster.wait_leader(), b"wire-secret")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    client = NodeClient("127.0.0.1", server.server_address[1], b"wire-secret")
    try:
        for args in ({"type": "apply", "broker_name": "g", "broker_id": 1, "check_code": "h:1;1"},
                     {"type": "register", "broker_name": "g", "broker_id": 1, "address": "h:1"},
                     {"type": "elect", "broker_name": "g", "broker_id": 1, "designate": True}):
            assert client.call("request", args, timeout_s=10.0)["code"] == 0
        reply = client.call("request", {"type": "read", "broker_name": "g"}, timeout_s=10.0)
        header = header_of(reply)
        assert header == h.GetReplicaInfoResponseHeader(1, "h:1", 1)
        assert output_of("read", reply["code"], header, reply["body"]) == ReadOutput(0, 1, 1, (1,), 1)
        reply["header"]["master_epoch"] = "1"          # a tampered map is refused, not half read
        with pytest.raises(h.HeaderCodecError):
            header_of(reply)
    finally:
        client.close()
        server.shutdown()
        server.server_close()
        cluster.close()
