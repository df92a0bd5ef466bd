"""Record codec: round trips, and garbage decodes to MessageCodecError and nothing else."""

from __future__ import annotations

import random
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketray.wire.message import (HEADER_SIZE, Message, MessageCodecError, decode_index, decode_record, encode_record,
                                    record_size, tag_hash, verify_record)

topics = st.from_regex(r"[A-Za-z0-9_%|\-]{1,20}", fullmatch=True)
prop_text = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), max_size=10)
messages = st.builds(
    Message,
    topic=topics,
    queue_id=st.integers(-2**31, 2**31 - 1),
    body=st.binary(max_size=300),
    properties=st.dictionaries(prop_text.filter(bool), prop_text, max_size=4),
    flags=st.integers(0, 2**32 - 1),
    born_timestamp_ms=st.integers(0, 2**62),
    queue_offset=st.integers(-1, 2**62),
    physical_offset=st.integers(-1, 2**62),
    store_timestamp_ms=st.integers(0, 2**62),
)


@given(messages)
@settings(max_examples=200, deadline=None)
def test_round_trip(msg: Message) -> None:
    """Any valid message encodes to a record that decodes to an equal message of the same size."""
    rec = encode_record(msg)
    decoded, size = decode_record(rec)
    assert decoded == msg
    assert size == len(rec) == record_size(rec)
    assert verify_record(rec) == (size, msg.physical_offset)
    info = decode_index(rec)
    assert (info.topic, info.queue_id, info.queue_offset, info.size) == (msg.topic, msg.queue_id, msg.queue_offset, size)
    assert info.tag_hash == tag_hash(msg.properties)


@given(messages, st.integers(0, 50))
@settings(max_examples=50, deadline=None)
def test_decode_at_position_inside_buffer(msg: Message, pad: int) -> None:
    """A record is decoded at its position inside a larger buffer, ignoring what follows."""
    rec = encode_record(msg)
    buf = b"\xab" * pad + rec + b"\xcd" * 7
    assert decode_record(buf, pad) == (msg, len(rec))


def test_every_prefix_is_rejected() -> None:
    """A torn record (any strict prefix) raises MessageCodecError."""
    rec = encode_record(Message("T", 1, b"hello world", {"TAGS": "x", "k": "v"}, queue_offset=3, physical_offset=9))
    for cut in range(len(rec)):
        with pytest.raises(MessageCodecError):
            decode_record(rec[:cut])


def test_every_single_byte_flip_is_rejected() -> None:
    """Flipping any byte of header, topic, properties or body is detected (header CRC + body CRC)."""
    rec = bytearray(encode_record(Message("Topic", 2, b"payload" * 3, {"a": "b"}, physical_offset=100)))
    for i in range(len(rec)):
        bad = bytearray(rec)
        bad[i] ^= 0x5A
        with pytest.raises(MessageCodecError):
            decode_record(bytes(bad))


def test_zeros_never_decode() -> None:
    """The zeros of a preallocated segment are not a record."""
    with pytest.raises(MessageCodecError):
        decode_record(bytes(4096))


def test_random_garbage_raises_only_codec_error() -> None:
    """Random bytes and random mutations raise MessageCodecError or decode; nothing else."""
    rng = random.Random(1234)
    good = encode_record(Message("T", 0, b"x" * 40, {"TAGS": "t"}))
    for _ in range(3000):
        if rng.random() < 0.5:
            data = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 200)))
        else:
            data = bytearray(good)
            for _ in range(rng.randrange(1, 4)):
                data[rng.randrange(len(data))] = rng.getrandbits(8)
            data = bytes(data[:rng.randrange(len(data) + 1)])
        try:
            decode_record(data, 0)
        except MessageCodecError:
            pass


def test_forged_header_crc_with_bad_fields_is_rejected() -> None:
    """A header with a valid CRC but inconsistent sizes or a bad topic is still refused."""
    rec = bytearray(encode_record(Message("T", 0, b"abc")))
    rec[0:4] = (len(rec) + 1).to_bytes(4, "big")
    crc = zlib.crc32(bytes(rec[12:HEADER_SIZE + 1]), zlib.crc32(bytes(rec[0:8])))
    rec[8:12] = crc.to_bytes(4, "big")
    with pytest.raises(MessageCodecError):
        decode_record(bytes(rec) + b"\0")


@pytest.mark.parametrize("msg", [
    Message("", 0, b""),
    Message("bad topic", 0, b""),
    Message("T", 0, b"", {"a\x01": "b"}),
    Message("T", 0, b"", {"a": "b\x02"}),
    Message("T", 0, b"", flags=-1),
    Message("T", 2**31, b""),
])
def test_invalid_messages_do_not_encode(msg: Message) -> None:
    """Unencodable messages raise MessageCodecError (never write a record that cannot be read)."""
    with pytest.raises(MessageCodecError):
        encode_record(msg)


def test_the_record_crc_is_zlibs_crc32_whichever_implementation_is_loaded() -> None:
    """message.crc32 (ISA-L's when the isal package is installed, else zlib's) is exactly zlib's
    CRC-32, with and without a start value, on bytes and memoryview slices of every small length."""
    import os
    import zlib

    from rocketray.wire.message import crc32

    data = os.urandom(3000)
    view = memoryview(bytearray(data))
    for n in list(range(0, 70)) + [1024, 1500, 2999]:
        assert crc32(data[:n]) == zlib.crc32(data[:n])
        assert crc32(view[1:n + 1], 12345) == zlib.crc32(data[1:n + 1], 12345)
