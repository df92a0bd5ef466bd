"""HA packet codecs: exact layouts of reference 11.2-11.5, round trips, and decoder fuzzing."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ha_helpers import chunked

from rocketray.wire.ha_protocol import (ConnState, EpochPoint, MasterHandshake, MasterPacketDecoder, MasterTransfer,
                                        ProtocolError, SlaveAck, SlaveHandshake, SlavePacketDecoder,
                                        encode_master_handshake, encode_master_transfer, encode_slave_ack,
                                        encode_slave_handshake)

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_slave_handshake_layout_is_16_bytes_big_endian():
    """11.2: state(4)=1, isSyncFromLastFile(2), isAsyncLearner(2), slave id(8)."""
    raw = encode_slave_handshake(0x0102030405060708, sync_from_last_file=True, async_learner=False)
    assert raw == bytes.fromhex("00000001" "0001" "0000" "0102030405060708")


def test_slave_ack_layout_is_12_bytes():
    """11.3: state(4)=2, offset(8)."""
    assert encode_slave_ack(1580) == bytes.fromhex("00000002" "000000000000062c")


def test_master_handshake_layout_20_plus_12_per_entry():
    """11.4: state(4), body size(4)=12N, max offset(8), last epoch(4), then epoch(4)+start(8)."""
    raw = encode_master_handshake(3000, [EpochPoint(1, 0), EpochPoint(2, 1570)])
    assert len(raw) == 20 + 24
    assert raw[:20] == struct.pack(">iiqi", 1, 24, 3000, 2)
    assert raw[20:] == struct.pack(">iq", 1, 0) + struct.pack(">iq", 2, 1570)
    assert encode_master_handshake(0, []) == struct.pack(">iiqi", 1, 0, 0, -1)


def test_master_transfer_layout_36_plus_body():
    """11.5: state, body size, offset, epoch, epoch start, confirm offset, body."""
    raw = encode_master_transfer(1700, 2, 1570, 1650, b"abc")
    assert raw == struct.pack(">iiqiqq", 2, 3, 1700, 2, 1570, 1650) + b"abc"
    assert len(encode_master_transfer(0, 0, 0, 0)) == 36


slave_packets = st.one_of(
    st.builds(SlaveHandshake, st.booleans(), st.booleans(), st.integers(0, 2**63 - 1)),
    st.builds(SlaveAck, st.integers(0, 2**63 - 1)),
)


@st.composite
def epoch_lists(draw):
    n = draw(st.integers(0, 6))
    epochs = sorted(draw(st.sets(st.integers(0, 2**31 - 1), min_size=n, max_size=n)))
    starts = sorted(draw(st.sets(st.integers(0, 2**40), min_size=n, max_size=n)))
    return tuple(EpochPoint(e, s) for e, s in zip(epochs, starts))


@st.composite
def master_packets(draw):
    if draw(st.booleans()):
        entries = draw(epoch_lists())
        low = entries[-1].start_offset if entries else 0
        return MasterHandshake(draw(st.integers(low, 2**62)), entries[-1].epoch if entries else -1,
                               entries)
    start = draw(st.integers(0, 2**40))
    return MasterTransfer(draw(st.integers(start, 2**41)), draw(st.integers(0, 2**31 - 1)), start,
                          draw(st.integers(0, 2**41)), draw(st.binary(max_size=64)))


def encode_slave(p) -> bytes:
    if isinstance(p, SlaveHandshake):
        return encode_slave_handshake(p.slave_id, p.sync_from_last_file, p.async_learner)
    return encode_slave_ack(p.offset)


def encode_master(p) -> bytes:
    if isinstance(p, MasterHandshake):
        return encode_master_handshake(p.max_offset, p.entries)
    return encode_master_transfer(p.offset, p.epoch, p.epoch_start_offset, p.confirm_offset, p.body)


def drain(decoder):
    out = []
    while (p := decoder.next_packet()) is not None:
        out.append(p)
    return out


@FAST
@given(st.lists(slave_packets, max_size=6), st.lists(st.integers(0, 10_000), max_size=10))
def test_slave_packets_round_trip_in_any_chunking(packets, cuts):
    """Any chunking of a valid slave stream decodes to exactly the packets sent."""
    data = b"".join(encode_slave(p) for p in packets)
    dec = SlavePacketDecoder()
    got = []
    for chunk in chunked(data, cuts):
        dec.receive_data(chunk)
        got.extend(drain(dec))
    assert got == packets and dec.buffered == 0


@FAST
@given(st.lists(master_packets(), max_size=5), st.lists(st.integers(0, 10_000), max_size=10))
def test_master_packets_round_trip_in_any_chunking(packets, cuts):
    """Any chunking of a valid master stream decodes to exactly the packets sent."""
    data = b"".join(encode_master(p) for p in packets)
    dec = MasterPacketDecoder()
    got = []
    for chunk in chunked(data, cuts):
        dec.receive_data(chunk)
        got.extend(drain(dec))
    assert got == packets and dec.buffered == 0


def test_one_byte_at_a_time_and_every_prefix():
    """Every prefix of a valid packet is 'need more'; the full packet decodes; nothing extra."""
    for raw, dec_cls in [(encode_slave_handshake(7, True, True), SlavePacketDecoder),
                         (encode_slave_ack(99), SlavePacketDecoder),
                         (encode_master_handshake(500, [EpochPoint(1, 0), EpochPoint(3, 400)]),
                          MasterPacketDecoder),
                         (encode_master_transfer(10, 1, 0, 5, b"xyz"), MasterPacketDecoder)]:
        dec = dec_cls()
        for i, byte in enumerate(raw):
            assert dec.next_packet() is None, i
            dec.receive_data(bytes([byte]))
        assert dec.next_packet() is not None
        assert dec.next_packet() is None and dec.buffered == 0


@pytest.mark.parametrize("raw, why", [
    (struct.pack(">i", 0) + bytes(12), "state READY"),
    (struct.pack(">i", 7) + bytes(12), "unknown state"),
    (struct.pack(">ihhq", 1, 2, 0, 1), "flag 2"),
    (struct.pack(">ihhq", 1, 0, 0, -1), "negative id"),
    (struct.pack(">iq", 2, -5), "negative ack"),
])
def test_slave_decoder_rejects_malformed(raw, why):
    dec = SlavePacketDecoder()
    dec.receive_data(raw)
    with pytest.raises(ProtocolError):
        dec.next_packet()
    with pytest.raises(ProtocolError):   # dead after an error
        dec.receive_data(b"")


@pytest.mark.parametrize("raw, why", [
    (struct.pack(">iiqi", 1, 13, 0, 1), "body not a multiple of 12"),
    (struct.pack(">iiqi", 1, 12 * 1001, 0, 1), "too many entries"),
    (struct.pack(">iiqi", 1, 12, 100, -1) + struct.pack(">iq", 1, 0), "count vs last epoch"),
    (struct.pack(">iiqi", 1, 0, 100, 3), "last epoch without entries"),
    (struct.pack(">iiqi", 1, 12, 100, 2) + struct.pack(">iq", 1, 0), "last epoch mismatch"),
    (struct.pack(">iiqi", 1, 24, 100, 1) + struct.pack(">iqiq", 2, 0, 1, 5), "descending"),
    (struct.pack(">iiqi", 1, 12, 100, 1) + struct.pack(">iq", 1, 500), "entry beyond max"),
    (struct.pack(">iiqiqq", 2, 2**31 - 1, 0, 0, 0, 0), "absurd body size"),
    (struct.pack(">iiqiqq", 2, -1, 0, 0, 0, 0), "negative body size"),
    (struct.pack(">iiqiqq", 2, 0, -1, 0, 0, 0), "negative offset"),
    (struct.pack(">iiqiqq", 2, 1, 10, 1, 20, 0) + b"x", "batch before its epoch start"),
    (struct.pack(">iiqi", 4, 0, 0, 0), "SHUTDOWN state"),
])
def test_master_decoder_rejects_malformed(raw, why):
    dec = MasterPacketDecoder()
    dec.receive_data(raw)
    with pytest.raises(ProtocolError):
        dec.next_packet()


@FAST
@given(st.binary(max_size=300), st.lists(st.integers(0, 400), max_size=6))
def test_random_bytes_decode_need_more_or_protocol_error(data, cuts):
    """Fuzz: random bytes in any chunking give packets, None, or ProtocolError, nothing else."""
    for dec in (SlavePacketDecoder(), MasterPacketDecoder(max_body_bytes=1 << 16)):
        try:
            for chunk in chunked(data, cuts):
                dec.receive_data(chunk)
                for p in drain(dec):
                    assert isinstance(p, (SlaveHandshake, SlaveAck, MasterHandshake,
                                          MasterTransfer))
        except ProtocolError:
            pass


@FAST
@given(st.lists(master_packets(), min_size=1, max_size=3), st.integers(0, 10_000),
       st.integers(0, 255))
def test_corrupted_valid_stream_never_raises_anything_else(packets, where, value):
    """A valid stream with one byte changed: packets, need more, or ProtocolError."""
    data = bytearray(b"".join(encode_master(p) for p in packets))
    data[where % len(data)] = value
    dec = MasterPacketDecoder(max_body_bytes=1 << 20)
    try:
        dec.receive_data(bytes(data))
        drain(dec)
    except ProtocolError:
        pass


def test_conn_state_ordinals():
    assert [s.value for s in ConnState] == [0, 1, 2, 3, 4]
    assert [s.name for s in ConnState] == ["READY", "HANDSHAKE", "TRANSFER", "SUSPEND", "SHUTDOWN"]


@FAST
@given(st.lists(master_packets(), max_size=4), st.lists(st.integers(0, 10_000), max_size=8),
       st.one_of(st.none(), st.tuples(st.integers(0, 10_000), st.integers(0, 255))))
def test_packet_buffered_means_the_next_call_returns_a_packet_or_fails(packets, cuts, damage):
    """The slave defers its ack while ``packet_buffered()``: it must then get another packet (or
    an error) at once, never wait for bytes that may not come. Valid and damaged streams, any
    chunking; on a valid stream a whole packet buffered is always reported."""
    encoded = [encode_master(p) for p in packets]
    ends = [sum(map(len, encoded[:i + 1])) for i in range(len(encoded))]
    data = bytearray(b"".join(encoded))
    if damage is not None and data:
        data[damage[0] % len(data)] = damage[1]
    dec = MasterPacketDecoder(max_body_bytes=1 << 16)
    fed = taken = 0
    try:
        for chunk in chunked(bytes(data), cuts):
            dec.receive_data(chunk)
            fed += len(chunk)
            while True:
                buffered = dec.packet_buffered()
                if damage is None:
                    assert buffered == (taken < len(ends) and fed >= ends[taken])
                packet = dec.next_packet()
                if buffered:
                    assert packet is not None
                if packet is None:
                    break
                taken += 1
    except ProtocolError:
        pass
