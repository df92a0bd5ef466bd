"""Batches of records as they cross a process: the producer's encoding and what reads them (pure).

The record layout is :mod:`rocketray.wire.message`'s.

A producer encodes its messages once into an :class:`EncodedBatch`: the records, back to back, in
exactly the record layout, with ``queue_offset`` and ``physical_offset`` -1 and
``store_timestamp_ms`` 0 (``encode_batch``; ``encode_new_record`` is the producer's encoding of
one new message, ``encode_fields``'s bytes). The master seals it without decoding it
(``rocketray.broker.batch``: positions filled in place, consume-queue entries built in the same
pass); ``record_offsets`` reads the ``(queue offset, physical offset)`` pairs of the put result back
from the sealed bytes, and ``whole_records_length`` finds the last whole record of a transfer.
``properties_tag_hash`` and ``topic_of`` are the checks of a record's properties and topic that the
seal and index loops call back.

The record loops run in C (``wire/_records.c``, the extension ``rocketray.wire._records`` that
setup.py builds, with ISA-L's CRC-32 when libisal is installed; :data:`C_LOOPS` is it, or None when
it was not built): about 0.3 us a 1 KiB record instead of 1.2-1.8 us. The ``*_py`` functions are the
same loops in Python: the reference the C ones are tested against (tests/broker/test_records_c.py)
and what runs when the extension was not built. ``RECORDS_IMPLEMENTATION`` says which runs.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from types import ModuleType
from typing import Callable, Iterable

from rocketray.wire.message import (CRC32_IMPLEMENTATION, HEADER_SIZE, SIZE_FIELD, Message, MessageCodecError,
                                    decode_properties, encode_fields, encode_parts, tag_hash, topic_bytes,
                                    valid_topic)

try:  # the record loops in C (wire/_records.c, built by setup.py when a compiler is present)
    from rocketray.wire import _records
    RECORDS_IMPLEMENTATION = "c+" + _records.CRC32
except ImportError:  # pure Python: the *_py loops here and in rocketray.broker.batch
    _records = None  # type: ignore[assignment]
    RECORDS_IMPLEMENTATION = "python+" + CRC32_IMPLEMENTATION

#: The C extension ``rocketray.wire._records`` (its ``scan`` is the seal and index loop of
#: ``rocketray.broker.batch``), or None when it was not built.
C_LOOPS: ModuleType | None = _records

__all__ = [
    "C_LOOPS",
    "EncodedBatch",
    "RECORDS_IMPLEMENTATION",
    "TopicRefused",
    "encode_batch",
    "encode_new_record",
    "properties_tag_hash",
    "record_offsets",
    "topic_of",
    "whole_records_length",
]


def encode_new_record(topic: bytes, props: bytes, body: bytes, queue_id: int, born_ms: int) -> bytes:
    """``encode_fields(topic, props, body, queue_id, born_ms)``, a new message's record (the
    producer's one encoding of each message): the same bytes, made in C when the extension is
    built; what the C case does not take (not bytes, out of range) goes to ``encode_fields``,
    which raises its own error."""
    if _records is not None:
        record = _records.encode(topic, props, body, queue_id, born_ms)
        if record is not None:
            return record
    return encode_fields(topic, props, body, queue_id, born_ms)


def whole_records_length(buf: bytes | memoryview, max_bytes: int) -> int:
    """Length of the longest prefix of (trusted) records in ``buf`` within ``max_bytes``, but at least
    the first record if it is whole (in C when the extension is built)."""
    if _records is not None:
        return _records.whole_length(buf, max_bytes)
    return whole_records_length_py(buf, max_bytes)


def whole_records_length_py(buf: bytes | memoryview, max_bytes: int) -> int:
    """:func:`whole_records_length` in Python."""
    end = 0
    while end + HEADER_SIZE <= len(buf):
        size = SIZE_FIELD.unpack_from(buf, end)[0]
        if size < HEADER_SIZE or end + size > len(buf) or (end > 0 and end + size > max_bytes):
            break
        end += size
    return end


# ---------------------------------------------------------------------------------------- batches
_TAGS_NAME = b"TAGS\x01"
_NOT_SEPARATORS = bytes(b for b in range(256) if b not in (1, 2))   # deleted: the separators remain
_PAIR_SEPARATORS = b"\x01\x02"
_TOPICS_CACHE_MAX = 4096
_topics_cache: dict[bytes, str] = {}  # valid topics (bounded, cleared when full)


class TopicRefused(MessageCodecError):
    """A record of a topic its sender may not write (``EncodedBatch.topic_check``): nothing written."""


@dataclass(frozen=True, slots=True)
class EncodedBatch:
    """Records encoded once by the producer, back to back (``encode_batch``); the master checks them
    and fills in their positions without decoding them (``seal_batch``). ``topic_check(topic)``, if
    given, is asked once per distinct topic the seal finds and raises :class:`TopicRefused` for one
    the sender may not write (the client port's ACL check of a put)."""

    data: bytes
    count: int
    topic_check: Callable[[str], None] | None = field(default=None, compare=False)


def encode_batch(messages: Iterable[Message]) -> EncodedBatch:
    """Encode messages as one batch (positions as given: -1 / -1 / 0 for a new message); each
    distinct topic is checked once."""
    parts: list[bytes] = []
    topics: dict[str, bytes] = {}
    count = 0
    for msg in messages:
        topic = topics.get(msg.topic) if isinstance(msg.topic, str) else None
        if topic is None:
            topic = topics[msg.topic] = topic_bytes(msg.topic)
        encode_parts(msg, topic, parts)
        count += 1
    return EncodedBatch(b"".join(parts), count)


def properties_tag_hash(raw: bytes) -> int:
    """Check encoded properties (``name 0x01 value 0x02`` pairs, names non-empty, UTF-8) and return
    the tag hash; :class:`MessageCodecError` if malformed. Run on every stored record (a client's
    ``UNIQ_KEY`` makes each message's properties unique), so the check is a few C-speed byte
    operations: the separators alone must read ``0x01 0x02`` per pair, the last byte is a ``0x02``
    and no name may be empty."""
    if raw and (raw.translate(None, _NOT_SEPARATORS) != _PAIR_SEPARATORS * raw.count(b"\x02")
                or raw[0] == 1 or raw[-1] != 2 or b"\x02\x01" in raw):
        raise MessageCodecError(f"malformed properties {raw[:64]!r}")
    if _TAGS_NAME in raw:
        return tag_hash(decode_properties(raw))
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MessageCodecError(f"properties are not UTF-8: {exc}") from None
    return 0


def topic_of(raw: bytes, where: int) -> str:
    """The topic of a record's topic bytes found at ``where`` (named in the error), checked;
    :class:`MessageCodecError` if it is not a valid topic. Valid topics are cached."""
    topic = _topics_cache.get(raw)
    if topic is not None:
        return topic
    topic = _check_topic(raw, where)
    if len(_topics_cache) >= _TOPICS_CACHE_MAX:
        _topics_cache.clear()
    _topics_cache[raw] = topic
    return topic


def _check_topic(raw: bytes, where: int) -> str:
    try:
        topic = raw.decode("ascii")
    except UnicodeDecodeError:
        raise MessageCodecError(f"topic at {where} is not ASCII") from None
    if not valid_topic(topic):
        raise MessageCodecError(f"invalid topic {topic!r} at {where}")
    return topic


_OFFSETS = struct.Struct(">I20xqq")  # total_size, then queue_offset and physical_offset at 24


def record_offsets(data: bytes | bytearray | memoryview) -> tuple[tuple[int, int], ...]:
    """``(queue_offset, physical_offset)`` of every record in ``data`` (trusted, e.g. a sealed batch)."""
    if _records is not None:
        return _records.offsets(data)
    return record_offsets_py(data)


def record_offsets_py(data: bytes | bytearray | memoryview) -> tuple[tuple[int, int], ...]:
    """:func:`record_offsets` in Python."""
    out = []
    pos, n = 0, len(data)
    unpack = _OFFSETS.unpack_from
    while pos < n:
        total, queue_offset, physical = unpack(data, pos)
        out.append((queue_offset, physical))
        pos += total
    return tuple(out)
