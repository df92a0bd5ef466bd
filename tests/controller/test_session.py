"""Broker-session frames and the session table (issue 18: failover at connection speed; issue 29:
heartbeats on the session; role-change notifications on the session), pure."""

from __future__ import annotations

import struct

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rocketray.wire.controller_api import BrokerHeartbeatRequest, MasterInfo
from rocketray.controller.notify import ElectionTrigger, RoleChangeNotice
from rocketray.controller.session import (MAX_FRAME_BYTES, Ack, Bye, ControllerFrameDecoder, Heartbeat, Hello,
                                          SessionDecoder, SessionErrorCode, SessionProtocolError, SessionTable,
                                          encode_ack, encode_bye, encode_heartbeat, encode_hello, encode_role,
                                          heartbeat_of, heartbeat_request)

HELLO = Hello("c", "broker-a", 2, "127.0.0.1:10912")
HB = Heartbeat(seq=7, timeout_ms=10_000, epoch=3, max_offset=4096, confirm_offset=2048, priority=5)


def frame(body) -> bytes:
    data = msgpack.packb(body, use_bin_type=True)
    return struct.pack(">I", len(data)) + data


def test_golden_bytes_of_hello_and_bye():
    """The wire layout is pinned: u32 length, then a msgpack map with version and type."""
    assert encode_bye() == bytes.fromhex("0000000a") + b"\x82\xa1v\x01\xa1t\xa3bye"
    data = encode_hello(Hello("c", "g", 1, "h:1"))
    assert data[:4] == struct.pack(">I", len(data) - 4)
    assert msgpack.unpackb(data[4:]) == {"v": 1, "t": "hello", "cluster": "c", "group": "g", "broker_id": 1,
                                         "address": "h:1"}


def test_hello_then_bye_decode_fed_one_byte_at_a_time():
    d = SessionDecoder()
    out = []
    for b in encode_hello(HELLO) + encode_bye():
        out += d.receive_data(bytes([b]))
    assert out == [HELLO, Bye()]


@given(st.lists(st.integers(min_value=0, max_value=60), max_size=6))
def test_any_chunking_of_valid_frames_decodes_the_same(cuts):
    data = encode_hello(HELLO) + encode_bye()
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    d = SessionDecoder()
    out = []
    for a, b in zip(points, points[1:]):
        out += d.receive_data(data[a:b])
    assert out == [HELLO, Bye()]


def hb_body(**changes):
    return {"v": 1, "t": "hb", "seq": 1, "timeout_ms": 1000, "epoch": 1, "max_offset": 0, "confirm_offset": 0,
            "priority": 1, **changes}


H = encode_hello(HELLO)
E = SessionErrorCode


@pytest.mark.parametrize("data, code, why", [
    (encode_bye(), E.OUT_OF_ORDER, "a bye before any hello"),
    (encode_heartbeat(HB), E.OUT_OF_ORDER, "a heartbeat before any hello"),
    (H + H, E.OUT_OF_ORDER, "a second hello"),
    (H + encode_bye() + encode_heartbeat(HB), E.OUT_OF_ORDER, "a heartbeat after the bye"),
    (H + encode_ack(1), E.BAD_FRAME, "an ack, the controller's frame, from a broker"),
    (H + encode_role(MasterInfo(1, "a", 1, 1, frozenset({1}))), E.BAD_FRAME, "a role notice from a broker"),
    (struct.pack(">I", MAX_FRAME_BYTES + 1), E.FRAME_TOO_LARGE, "an oversize length, refused before its body"),
    (frame({"v": 2, "t": "bye"}), E.BAD_VERSION, "an unknown version"),
    (frame({"v": 1, "t": "hello", "cluster": "c", "group": "g", "broker_id": 0, "address": "a"}), E.BAD_FRAME,
     "broker id 0"),
    (frame({"v": 1, "t": "hello", "cluster": "c", "group": "g", "broker_id": True, "address": "a"}), E.BAD_FRAME,
     "a bool id"),
    (frame({"v": 1, "t": "hello", "cluster": "c", "group": "", "broker_id": 1, "address": "a"}), E.BAD_FRAME,
     "no group"),
    (frame({"v": 1, "t": "hello", "cluster": "c", "group": "g", "broker_id": 1}), E.BAD_FRAME, "a missing field"),
    (frame({"v": 1, "t": "hello", "cluster": "c", "group": "g", "broker_id": 1, "address": "a", "x": 1}),
     E.BAD_FRAME, "an extra field"),
    (H + frame(hb_body(seq=-1)), E.BAD_FRAME, "a negative heartbeat seq"),
    (H + frame(hb_body(timeout_ms=0)), E.BAD_FRAME, "a heartbeat timeout of 0"),
    (H + frame(hb_body(epoch="1")), E.BAD_FRAME, "a string epoch"),
    (H + frame(hb_body(max_offset=1.5)), E.BAD_FRAME, "a float offset"),
    (H + frame(hb_body(priority=False)), E.BAD_FRAME, "a bool priority"),
    (H + frame(hb_body(confirm_offset=1 << 63)), E.BAD_FRAME, "an offset past int64"),
    (H + frame({k: v for k, v in hb_body().items() if k != "epoch"}), E.BAD_FRAME, "a heartbeat missing a field"),
    (H + frame(hb_body(x=1)), E.BAD_FRAME, "a heartbeat with an extra field"),
    (H + frame({"v": 1, "t": "ping"}), E.BAD_FRAME, "an unknown type"),
    (frame([1, 2]), E.BAD_VERSION, "not a map"),
    (struct.pack(">I", 3) + b"\xc1\xc1\xc1", E.UNDECODABLE, "not msgpack"),
])
def test_malformed_input_is_a_protocol_error_with_its_code(data, code, why):
    with pytest.raises(SessionProtocolError) as err:
        SessionDecoder().receive_data(data)
    assert err.value.code is code, why
    assert code.value in str(err.value)


def test_golden_bytes_of_heartbeat_and_ack():
    """The heartbeat and ack layouts are pinned like the hello's."""
    assert encode_ack(5) == bytes.fromhex("0000000f") + b"\x83\xa1v\x01\xa1t\xa3ack\xa3seq\x05"
    data = encode_heartbeat(HB)
    assert data[:4] == struct.pack(">I", len(data) - 4)
    assert msgpack.unpackb(data[4:]) == {"v": 1, "t": "hb", "seq": 7, "timeout_ms": 10_000, "epoch": 3,
                                         "max_offset": 4096, "confirm_offset": 2048, "priority": 5}


def test_a_session_is_hello_heartbeats_bye_and_the_heartbeat_speaks_for_the_hello():
    """The heartbeat round-trips; the controller's request takes identity from the hello only."""
    d = SessionDecoder()
    out = []
    for b in H + encode_heartbeat(HB) + encode_heartbeat(Heartbeat(8, 10_000, 3, 5000, 4096, 5)) + encode_bye():
        out += d.receive_data(bytes([b]))
    assert out == [HELLO, HB, Heartbeat(8, 10_000, 3, 5000, 4096, 5), Bye()]
    request = heartbeat_request(HELLO, HB)
    assert request == BrokerHeartbeatRequest("c", "broker-a", "127.0.0.1:10912", 2, epoch=3, max_offset=4096,
                                             confirm_offset=2048, heartbeat_timeout_ms=10_000, election_priority=5)
    assert heartbeat_of(request, 7) == HB


def test_the_broker_side_takes_acks_and_role_notices_only():
    d = ControllerFrameDecoder()
    assert d.receive_data(encode_ack(1) + encode_ack(2)[:3]) == [Ack(1)]
    assert d.receive_data(encode_ack(2)[3:] + encode_role(INFO)) == [Ack(2), INFO]
    for bad, code in [(encode_hello(HELLO), E.BAD_FRAME), (encode_heartbeat(HB), E.BAD_FRAME),
                      (encode_bye(), E.BAD_FRAME), (frame({"v": 1, "t": "ack", "seq": -1}), E.BAD_FRAME),
                      (frame({"v": 1, "t": "ack"}), E.BAD_FRAME), (struct.pack(">I", 1 << 20), E.FRAME_TOO_LARGE)]:
        with pytest.raises(SessionProtocolError) as err:
            ControllerFrameDecoder().receive_data(bad)
        assert err.value.code is code


INFO = MasterInfo(3, "127.0.0.1:10913", 7, 9, frozenset({3, 1}))


def role_body(**changes):
    return {"v": 1, "t": "role", "master_broker_id": 3, "master_address": "127.0.0.1:10913", "master_epoch": 7,
            "sss_epoch": 9, "sss": [1, 3], **changes}


def test_golden_bytes_of_a_role_notice_and_it_is_the_notification_the_node_builds():
    """The role frame's layout is pinned (the SyncStateSet as a sorted list), and it carries exactly
    what ``RoleChangeNotice.notification()`` gives a broker's ``on_role_change`` over Ray."""
    data = encode_role(INFO)
    assert data[:4] == struct.pack(">I", len(data) - 4)
    assert msgpack.unpackb(data[4:]) == role_body()
    notice = RoleChangeNotice(ElectionTrigger.CONTROLLER, "broker-a", 3, "127.0.0.1:10913", 7, 9, (1, 3),
                              ((1, "127.0.0.1:10911"),))
    assert ControllerFrameDecoder().receive_data(encode_role(notice.notification())) == [notice.notification()]
    no_master = MasterInfo(None, None, 0)
    assert ControllerFrameDecoder().receive_data(encode_role(no_master)) == [no_master]


@pytest.mark.parametrize("body, why", [
    (role_body(master_broker_id=0), "master id 0"),
    (role_body(master_broker_id=True), "a bool master id"),
    (role_body(master_broker_id="3"), "a string master id"),
    (role_body(master_address=b"127.0.0.1:10913"), "a bytes address"),
    (role_body(master_address=1), "an int address"),
    (role_body(master_epoch=-1), "a negative epoch"),
    (role_body(master_epoch=None), "no epoch"),
    (role_body(master_epoch=1.0), "a float epoch"),
    (role_body(sss_epoch=-1), "a negative SyncStateSet epoch"),
    (role_body(sss_epoch=1 << 63), "a SyncStateSet epoch past int64"),
    (role_body(sss="13"), "a SyncStateSet that is a string"),
    (role_body(sss={"1": 1}), "a SyncStateSet that is a map"),
    (role_body(sss=[3, 1]), "an unsorted SyncStateSet"),
    (role_body(sss=[1, 1, 3]), "a repeated member"),
    (role_body(sss=[0, 1]), "member id 0"),
    (role_body(sss=[1, "3"]), "a string member"),
    (role_body(sss=None), "no SyncStateSet"),
    ({k: v for k, v in role_body().items() if k != "sss_epoch"}, "a missing field"),
    ({k: v for k, v in role_body().items() if k != "master_address"} | {"address": "a"}, "a renamed field"),
    (role_body(x=1), "an extra field"),
])
def test_a_malformed_role_notice_is_a_bad_frame(body, why):
    """A controller's role frame the broker cannot trust closes that session (the broker reconnects)."""
    with pytest.raises(SessionProtocolError) as err:
        ControllerFrameDecoder().receive_data(encode_ack(1) + frame(body))
    assert err.value.code is E.BAD_FRAME, why


@given(st.one_of(st.none(), st.integers(1, (1 << 63) - 1)), st.one_of(st.none(), st.text(max_size=40)),
       st.integers(0, (1 << 63) - 1), st.integers(0, (1 << 63) - 1), st.frozensets(st.integers(1, 1 << 20), max_size=8))
def test_role_notices_round_trip(master, address, epoch, sss_epoch, sss):
    info = MasterInfo(master, address, epoch, sss_epoch, sss)
    d = ControllerFrameDecoder()
    out = []
    for b in encode_role(info):
        out += d.receive_data(bytes([b]))
    assert out == [info]


@given(st.binary(max_size=64))
def test_random_bytes_decode_ask_for_more_or_raise_a_protocol_error(data):
    for decoder, kinds in ((SessionDecoder(), (Hello, Heartbeat, Bye)), (ControllerFrameDecoder(), (Ack, MasterInfo))):
        try:
            for f in decoder.receive_data(data):
                assert isinstance(f, kinds)
        except SessionProtocolError as exc:
            assert isinstance(exc.code, SessionErrorCode)


@given(st.integers(0, 300), st.binary(max_size=16))
def test_a_valid_session_with_bytes_flipped_decodes_or_raises_a_protocol_error(at, junk):
    data = bytearray(H + encode_heartbeat(HB) + encode_bye())
    at = at % len(data)
    data[at:at + len(junk)] = junk
    try:
        for f in SessionDecoder().receive_data(bytes(data)):
            assert isinstance(f, (Hello, Heartbeat, Bye))
    except SessionProtocolError as exc:
        assert isinstance(exc.code, SessionErrorCode)


@given(st.lists(st.integers(min_value=0, max_value=120), max_size=6))
def test_the_frames_before_a_bad_one_are_taken_however_the_stream_was_cut(cuts):
    """A stream has no segment boundaries: a hello and a heartbeat followed by garbage give the
    hello and the heartbeat, then the error, whether they arrived in one read or many (the CI
    failure of 2026-11-25: one read holding the hello and a bad frame lost the hello)."""
    data = H + encode_heartbeat(HB) + struct.pack(">I", 3) + b"\xc1\xc1\xc1"
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    d, out = SessionDecoder(), []
    with pytest.raises(SessionProtocolError) as err:
        for a, b in zip(points, points[1:]):
            for f in d.frames(data[a:b]):
                out.append(f)
    assert err.value.code is E.UNDECODABLE
    assert out == [HELLO, HB]


def test_only_the_current_session_of_a_broker_that_ends_without_bye_counts_as_dead():
    table = SessionTable()
    first = table.opened(HELLO)
    assert table.closed(HELLO, first, said_bye=False) == ("broker-a", 2)
    assert len(table) == 0

    old = table.opened(HELLO)
    new = table.opened(HELLO)                       # the broker restarted and opened a new session
    assert table.closed(HELLO, old, said_bye=False) is None, "an older session's close is stale"
    assert len(table) == 1, "the newer session is still open"
    assert table.is_current(HELLO, new) and not table.is_current(HELLO, old)
    assert table.closed(HELLO, new, said_bye=True) is None, "a bye is a move, not a death"
    assert len(table) == 0
