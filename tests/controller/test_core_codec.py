"""The versioned msgpack event codec: round trips for every event type, and garbage in -> EventCodecError."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketray.controller.events import (CODEC_VERSION, AlterSyncStateSetEvent, ApplyBrokerIdEvent, CleanBrokerDataEvent,
                               CreateTopicEvent, DeleteTopicEvent, ElectMasterEvent, EventCodecError, ReadEvent,
                               UpdateBrokerAddressEvent, decode_event, decode_events, encode_event, encode_events)

EXAMPLES = [
    AlterSyncStateSetEvent("b", frozenset({1, 2, 3})),
    AlterSyncStateSetEvent("b", frozenset()),
    ApplyBrokerIdEvent("c", "b", "127.0.0.1:9000", "127.0.0.1:9000;1700000000000", 1),
    ElectMasterEvent(True, "b", 2),
    ElectMasterEvent(False, "b", None),
    ReadEvent(),
    CleanBrokerDataEvent("b", frozenset({1, 2})),
    CleanBrokerDataEvent("b", None),
    UpdateBrokerAddressEvent("c", "b", "10.0.0.1:9000", 3),
    CreateTopicEvent("orders", ("broker-a", "broker-b", "broker-a")),
    CreateTopicEvent("t", ()),
    DeleteTopicEvent("orders"),
]

int64 = st.integers(-(2**63), 2**63 - 1)
ids = st.frozensets(int64, max_size=5)
text = st.text(max_size=20)
events = st.one_of(
    st.builds(AlterSyncStateSetEvent, text, ids),
    st.builds(ApplyBrokerIdEvent, text, text, text, text, int64),
    st.builds(ElectMasterEvent, st.booleans(), text, st.none() | int64),
    st.just(ReadEvent()),
    st.builds(CleanBrokerDataEvent, text, st.none() | ids),
    st.builds(UpdateBrokerAddressEvent, text, text, text, int64),
    st.builds(CreateTopicEvent, text, st.lists(text, max_size=6).map(tuple)),
    st.builds(DeleteTopicEvent, text),
)


@pytest.mark.parametrize("event", EXAMPLES, ids=lambda e: type(e).__name__)
def test_every_event_type_round_trips_single_and_batch(event):
    """encode/decode of one event and of a batch is the identity (type ids: tests/controller/test_golden_bytes.py)."""
    assert decode_event(encode_event(event)) == event
    assert decode_events(encode_events([event, event])) == [event, event]


def test_empty_batch_round_trips():
    """An empty batch is valid and decodes to []."""
    assert decode_events(encode_events([])) == []


@settings(max_examples=200, deadline=None)
@given(st.lists(events, max_size=8))
def test_generated_events_round_trip(batch):
    """Hypothesis events of every type round-trip exactly, alone and as a batch."""
    assert decode_events(encode_events(batch)) == batch
    for event in batch:
        assert decode_event(encode_event(event)) == event


def _frames():
    yield encode_events(EXAMPLES)
    for e in EXAMPLES:
        yield encode_event(e)


@pytest.mark.parametrize("data", list(_frames())[:3])
def test_every_truncation_raises_codec_error(data):
    """Every strict prefix of a valid frame is refused with EventCodecError only."""
    for cut in range(len(data)):
        with pytest.raises(EventCodecError):
            decode_events(data[:cut])
        with pytest.raises(EventCodecError):
            decode_event(data[:cut])


WRONG = [
    pytest.param(msgpack.packb([CODEC_VERSION + 1, 3, True, "b", 1]), id="wrong-version"),
    pytest.param(msgpack.packb([True, 3, True, "b", 1]), id="bool-version"),
    pytest.param(msgpack.packb([CODEC_VERSION, 9, "b"]), id="unknown-type"),
    pytest.param(msgpack.packb([CODEC_VERSION, 0]), id="type-zero"),
    pytest.param(msgpack.packb([CODEC_VERSION, 3, 1, "b", 1]), id="int-for-bool"),
    pytest.param(msgpack.packb([CODEC_VERSION, 3, True, b"b", 1]), id="bytes-for-str"),
    pytest.param(msgpack.packb([CODEC_VERSION, 3, True, "b", True]), id="bool-for-int"),
    pytest.param(msgpack.packb([CODEC_VERSION, 3, True, "b", 1.5]), id="float-for-int"),
    pytest.param(msgpack.packb([CODEC_VERSION, 3, True, "b", 2**64 - 1]), id="uint64-overflow"),
    pytest.param(msgpack.packb([CODEC_VERSION, 1, "b", [1, "x"]]), id="bad-set-member"),
    pytest.param(msgpack.packb([CODEC_VERSION, 1, "b", {"1": 1}]), id="map-for-set"),
    pytest.param(msgpack.packb([CODEC_VERSION, 7, "t", ["a", 1]]), id="int-in-str-tuple"),
    pytest.param(msgpack.packb([CODEC_VERSION, 7, "t", "ab"]), id="str-for-str-tuple"),
    pytest.param(msgpack.packb([CODEC_VERSION, 7, "t", None]), id="nil-for-str-tuple"),
    pytest.param(msgpack.packb([CODEC_VERSION, 7, "t", [b"a"]], use_bin_type=True), id="bytes-in-str-tuple"),
    pytest.param(msgpack.packb([CODEC_VERSION, 8, 1]), id="int-for-topic"),
    pytest.param(msgpack.packb([CODEC_VERSION, 3, True, "b"]), id="missing-field"),
    pytest.param(msgpack.packb([CODEC_VERSION, 3, True, "b", 1, 2]), id="extra-field"),
    pytest.param(msgpack.packb({"v": 1}), id="map-frame"),
    pytest.param(msgpack.packb([CODEC_VERSION]), id="version-only"),
    pytest.param(msgpack.packb("hello"), id="string-frame"),
    pytest.param(msgpack.packb([CODEC_VERSION, [[3, True, "b", 1]]]) + b"\x00", id="trailing-bytes"),
    pytest.param(msgpack.packb([CODEC_VERSION, [[3, True, "b", 1], "x"]]), id="bad-batch-item"),
    pytest.param(msgpack.packb([CODEC_VERSION, [[]]]), id="empty-batch-item"),
    pytest.param(msgpack.packb({1: 2}), id="int-map-key"),
    pytest.param(msgpack.packb(msgpack.ExtType(5, b"xx")), id="ext-type"),
    pytest.param(b"\xc1", id="reserved-byte"),
    pytest.param(b"\xa2\xff\xfe", id="invalid-utf8"),
    pytest.param(b"\xdd\xff\xff\xff\xff", id="huge-array-header"),
    pytest.param(b"\x91" * 100_000 + b"\x01", id="deep-nesting"),
    pytest.param(b"", id="empty"),
]


@pytest.mark.parametrize("data", WRONG)
def test_wrong_frames_raise_codec_error(data):
    """Wrong version, types, shapes and malformed msgpack raise EventCodecError (a ValueError)."""
    with pytest.raises(EventCodecError):
        decode_events(data)
    with pytest.raises(EventCodecError):
        decode_event(data)


def test_non_bytes_input_raises_codec_error():
    """A str or None instead of bytes is a codec error too."""
    for bad in ("abc", None, 12):
        with pytest.raises(EventCodecError):
            decode_events(bad)  # type: ignore[arg-type]


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_decode_or_raise_codec_error(data):
    """Random bytes either decode to events or raise EventCodecError; never another exception."""
    for fn in (decode_events, decode_event):
        try:
            fn(data)
        except EventCodecError:
            pass


@settings(max_examples=300, deadline=None)
@given(st.lists(events, min_size=1, max_size=4), st.data())
def test_mutated_frames_decode_or_raise_codec_error(batch, data):
    """Bit flips in valid frames decode to something well-typed or raise EventCodecError only."""
    raw = bytearray(encode_events(batch))
    pos = data.draw(st.integers(0, len(raw) - 1))
    raw[pos] ^= data.draw(st.integers(1, 255))
    try:
        out = decode_events(bytes(raw))
    except EventCodecError:
        return
    assert decode_events(encode_events(out)) == out


def test_apply_is_total_for_well_typed_events():
    """apply never raises for any decodable event, even nonsense ones (elected without an id, unknown sets)."""
    from rocketray.controller.state import ControllerState
    state = ControllerState()
    for event in EXAMPLES + [ElectMasterEvent(True, "b", None), UpdateBrokerAddressEvent("c", "zz", "x", 1)]:
        state.apply(event)
    assert state.contains("b") is False or state.sync_state["b"].master_epoch >= 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(
    st.builds(AlterSyncStateSetEvent, st.sampled_from("ab"), st.frozensets(st.integers(1, 4), max_size=4)),
    st.builds(ApplyBrokerIdEvent, st.just("c"), st.sampled_from("ab"), text, text, st.integers(1, 4)),
    st.builds(ElectMasterEvent, st.booleans(), st.sampled_from("ab"), st.none() | st.integers(1, 4)),
    st.builds(CleanBrokerDataEvent, st.sampled_from("ab"), st.none() | st.frozensets(st.integers(1, 4), max_size=3)),
    st.builds(UpdateBrokerAddressEvent, st.just("c"), st.sampled_from("ab"), text, st.integers(1, 4)),
    st.builds(CreateTopicEvent, st.sampled_from("tu"), st.lists(st.sampled_from("ab"), max_size=4).map(tuple)),
    st.builds(DeleteTopicEvent, st.sampled_from("tu")),
), max_size=30))
def test_apply_is_deterministic_and_snapshots_round_trip(log):
    """Any event log applied to two fresh states (one through the codec) gives equal tables; snapshots
    survive msgpack and from_snapshot."""
    from rocketray.controller.state import ControllerState
    a, b = ControllerState(), ControllerState()
    a.apply_all(log)
    b.apply_all(decode_events(encode_events(log)))
    assert a == b
    restored = ControllerState.from_snapshot(msgpack.unpackb(msgpack.packb(a.to_snapshot())),
                                             msgpack.unpackb(msgpack.packb(a.topics_to_snapshot())))
    assert restored == a
