"""Broker-session frames and the session table (issue 18: failover at connection speed), pure."""

from __future__ import annotations

import struct

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rocketray.controller.session import (MAX_FRAME_BYTES, Bye, Hello, SessionDecoder, SessionProtocolError,
                                          SessionTable, encode_bye, encode_hello)

HELLO = Hello("c", "broker-a", 2, "127.0.0.1:10912")


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


@pytest.mark.parametrize("data, why", [
    (encode_bye(), "a bye before any hello"),
    (encode_hello(HELLO) + encode_hello(HELLO), "a second hello"),
    (struct.pack(">I", MAX_FRAME_BYTES + 1), "an oversize length, refused before its body arrives"),
    (frame({"v": 2, "t": "bye"}), "an unknown version"),
    (frame({"v": 1, "t": "hello", "cluster": "c", "group": "g", "broker_id": 0, "address": "a"}), "broker id 0"),
    (frame({"v": 1, "t": "hello", "cluster": "c", "group": "g", "broker_id": True, "address": "a"}), "a bool id"),
    (frame({"v": 1, "t": "hello", "cluster": "c", "group": "", "broker_id": 1, "address": "a"}), "no group"),
    (frame({"v": 1, "t": "hello", "cluster": "c", "group": "g", "broker_id": 1}), "a missing field"),
    (frame({"v": 1, "t": "hello", "cluster": "c", "group": "g", "broker_id": 1, "address": "a", "x": 1}),
     "an extra field"),
    (frame([1, 2]), "not a map"),
    (struct.pack(">I", 3) + b"\xc1\xc1\xc1", "not msgpack"),
])
def test_malformed_input_is_a_protocol_error(data, why):
    with pytest.raises(SessionProtocolError):
        SessionDecoder().receive_data(data)


@given(st.binary(max_size=64))
def test_random_bytes_decode_ask_for_more_or_raise_a_protocol_error(data):
    try:
        for f in SessionDecoder().receive_data(data):
            assert isinstance(f, (Hello, Bye))
    except SessionProtocolError:
        pass


def test_only_the_current_session_of_a_broker_that_ends_without_bye_counts_as_dead():
    table = SessionTable()
    first = table.opened(HELLO)
    assert table.closed(HELLO, first, said_bye=False) == ("broker-a", 2)
    assert len(table) == 0

    old = table.opened(HELLO)
    new = table.opened(HELLO)                       # the broker restarted and opened a new session
    assert table.closed(HELLO, old, said_bye=False) is None, "an older session's close is stale"
    assert len(table) == 1, "the newer session is still open"
    assert table.closed(HELLO, new, said_bye=True) is None, "a bye is a move, not a death"
    assert len(table) == 0
