"""Snapshot file format: round trip, damage detection, forward compatibility."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketray.snapshot.format import (HEADER_SIZE, MAGIC, SECTION_HEADER, SnapshotCorrupt, decode_snapshot,
                             encode_snapshot)

SAMPLE = {
    1: {"replica_info": {"broker-a": {"cluster": "c", "next_assign_broker_id": 4,
                                      "broker_id_info": {1: ["127.0.0.1:9000", "127.0.0.1:9000;1"]}}},
        "sync_state": {"broker-a": {"master_epoch": 3, "sync_state_set": [1, 2]}}},
    2: {"last": [b"\x00abc", 11, 2], "prev": [b"\x00abd", 10, 2], "cluster": ["127.0.0.1:1", "127.0.0.1:2"]},
}

bodies = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.text(max_size=8) | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4) | st.integers(0, 99), inner, max_size=4),
    max_leaves=12,
)
section_maps = st.dictionaries(st.integers(1, 2**16 - 1), st.dictionaries(st.text(max_size=6), bodies, max_size=4), max_size=4)


def test_round_trip_sample():
    """A populated snapshot decodes to exactly what was encoded (int map keys and bytes kept)."""
    assert decode_snapshot(encode_snapshot(SAMPLE)) == SAMPLE


def test_empty_snapshot_round_trips():
    """A snapshot with no sections is valid and decodes to {}."""
    data = encode_snapshot({})
    assert len(data) == HEADER_SIZE
    assert decode_snapshot(data) == {}


def test_header_layout():
    """Header: magic, version 1, section count, CRC, reserved 0 (big-endian, 22 bytes)."""
    data = encode_snapshot(SAMPLE)
    magic, version, count, _crc, reserved = struct.unpack_from(">IHIIQ", data)
    assert (magic, version, count, reserved) == (MAGIC, 1, 2, 0)


@settings(max_examples=150, deadline=None)
@given(section_maps)
def test_round_trip_property(sections):
    """Any msgpack-encodable sections round-trip."""
    assert decode_snapshot(encode_snapshot(sections)) == sections


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_every_single_byte_change_is_detected(data):
    """Changing any one byte of a snapshot file (header or body) raises SnapshotCorrupt."""
    blob = bytearray(encode_snapshot(SAMPLE))
    pos = data.draw(st.integers(0, len(blob) - 1), label="pos")
    delta = data.draw(st.integers(1, 255), label="xor")
    blob[pos] ^= delta
    with pytest.raises(SnapshotCorrupt):
        decode_snapshot(bytes(blob))


def test_every_single_byte_flip_exhaustive():
    """Exhaustively: every position, every bit flipped, is detected."""
    blob = encode_snapshot(SAMPLE)
    for pos in range(len(blob)):
        for bit in range(8):
            damaged = bytearray(blob)
            damaged[pos] ^= 1 << bit
            with pytest.raises(SnapshotCorrupt):
                decode_snapshot(bytes(damaged))


def test_every_truncation_is_detected():
    """Every strict prefix of a snapshot (including empty) is rejected."""
    blob = encode_snapshot(SAMPLE)
    for cut in range(len(blob)):
        with pytest.raises(SnapshotCorrupt):
            decode_snapshot(blob[:cut])


def test_trailing_garbage_is_detected():
    """Bytes appended after the last section are corruption."""
    with pytest.raises(SnapshotCorrupt):
        decode_snapshot(encode_snapshot(SAMPLE) + b"\x00")


def test_unknown_section_types_are_skipped():
    """A reader that knows only some section types gets those and skips the rest."""
    sections = dict(SAMPLE)
    sections[999] = {"from": "the future"}
    blob = encode_snapshot(sections)
    assert decode_snapshot(blob, known_types={1, 2}) == SAMPLE
    assert decode_snapshot(blob)[999] == {"from": "the future"}


def test_non_map_body_is_rejected():
    """A section whose body is valid msgpack but not a map is corruption, with a good CRC."""
    import zlib
    body = b"\x93\x01\x02\x03"  # msgpack [1, 2, 3]
    payload = SECTION_HEADER.pack(1, len(body)) + body
    blob = struct.pack(">IHIIQ", MAGIC, 1, 1, zlib.crc32(payload), 0) + payload
    with pytest.raises(SnapshotCorrupt, match="not a map"):
        decode_snapshot(blob)
