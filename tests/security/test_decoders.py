"""Every decoder a border runs on a stranger's bytes decodes, asks for more, or raises its protocol
error; never anything else (the decoders of the earlier ports have their own: tests/broker/
test_client_wire.py, tests/ha/test_protocol.py, tests/controller/test_session.py; SCRAM's in
tests/security/test_scram.py)."""

from __future__ import annotations

import os

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

import functools

from rocketray.wire import client_control as cc
from rocketray.wire import client_frames as cw
from rocketray.wire.client_frames import WireError
from rocketray.wire.controller_api import (ConsumerHeartbeatRequest, CreateTopicRequest, GetTopicRouteRequest,
                                           ListTopicsRequest, Response)
from rocketray.wire.controller_codes import ResponseCode
from rocketray.wire.controller_headers import ListTopicsResponseHeader
from rocketray.controller.proc_wire import FRAME_HEADER, REQ, ProtocolError, Sealer

# msgpack values of every shape a peer could send
values = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 64), 1 << 64) | st.floats(allow_nan=False) | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=20)

DECODERS = [cc.decode_metadata, cc.decode_watch, cc.decode_watch_answer, cc.decode_control, cc.decode_control_answer,
            cw.decode_pull_request, cw.decode_search_request, functools.partial(cw.decode_queue_offsets, what="x")]


@settings(max_examples=300)
@given(st.sampled_from(DECODERS), values)
def test_control_decoders_take_any_msgpack_value_or_raise_wire_error(decode, value):
    try:
        data = msgpack.packb(value, use_bin_type=True)
    except (OverflowError, ValueError):
        return
    try:
        decode(data)
    except WireError:
        pass


@settings(max_examples=300)
@given(st.sampled_from(DECODERS), st.binary(max_size=200))
def test_control_decoders_take_any_bytes_or_raise_wire_error(decode, data):
    try:
        decode(data)
    except WireError:
        pass


def test_control_frames_round_trip_and_refuse_member_requests():
    for request in (CreateTopicRequest("t", 4), GetTopicRouteRequest("t"), ListTopicsRequest(),
                    ConsumerHeartbeatRequest("g", "c", ("a", "b"), leaving=True)):
        assert cc.decode_control(cc.encode_control(request)) == request
    for name in ("ElectMasterRequest", "GetAuthTableRequest", "RegisterBrokerRequest", "CleanBrokerDataRequest"):
        try:
            cc.decode_control(msgpack.packb([name, {}]))
        except WireError as exc:
            assert "not a client request" in str(exc)
        else:
            raise AssertionError(f"{name} must not pass through a client port")
    response = Response(ResponseCode.SUCCESS, ListTopicsResponseHeader((("a", 2),)))
    assert cc.decode_control_answer(cc.encode_control_answer(response)) == response
    md = cc.Metadata("c", (cc.GroupView("g", 1, 4, ((0, "h", 1), (1, "h", 2))),), {"linger_ms": 3})
    assert cc.decode_metadata(cc.encode_metadata(md)) == md
    assert cc.decode_watch(cc.encode_watch("g", 3, 500)) == ("g", 3, 500)


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_the_runner_ports_frames_open_or_raise_protocol_error(data):
    sealer = Sealer(b"s" * 32, os.urandom(32))
    try:
        sealer.open(REQ, 1, data)
    except ProtocolError:
        pass


@settings(max_examples=100)
@given(st.integers(0, 200))
def test_a_sealed_frame_cut_anywhere_is_refused(cut):
    sealer = Sealer(b"s" * 32, os.urandom(32))
    rest = sealer.seal(REQ, 1, {"op": "status", "args": {}})[FRAME_HEADER.size:]
    if cut >= len(rest):
        assert sealer.open(REQ, 1, rest)["op"] == "status"
        return
    try:
        sealer.open(REQ, 1, rest[:cut])
    except ProtocolError:
        return
    raise AssertionError("a cut frame opened")


@settings(max_examples=300)
@given(st.lists(values, min_size=8, max_size=8))
def test_a_pull_with_any_eighth_field_decodes_to_a_str_filter_or_raises_wire_error(fields):
    """The PULL body's tag filter: a str or nil passes to the broker (which parses it and answers
    ILLEGAL for a bad expression), anything else is a malformed frame."""
    fields[:7] = ["t", 0, 0, 1, 1, 0, None]
    try:
        data = msgpack.packb(fields, use_bin_type=True)
    except (OverflowError, ValueError):
        return
    try:
        request = cw.decode_pull_request(data)
    except WireError:
        assert not (fields[7] is None or isinstance(fields[7], str))
        return
    assert request.tag_filter == fields[7]
