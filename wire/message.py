"""The one record codec of the commit log.

Theory of operation
-------------------
Every message in the commit log is one self-delimiting, self-verifying record.  All integers are
big-endian.  The fixed header is 66 bytes::

    off  size  field
      0     4  total_size        whole record, header included
      4     4  magic             0x52524D31 ("RRM1"); a new layout gets a new magic
      8     4  header_crc        CRC32 of bytes [0, 8) + [12, body_start): every header byte but itself
     12     4  body_crc          CRC32 of the body
     16     4  flags
     20     4  queue_id          signed
     24     8  queue_offset      signed (-1 = not assigned)
     32     8  physical_offset   signed; a stored record has physical_offset == its byte position
     40     8  born_timestamp_ms
     48     8  store_timestamp_ms
     56     2  topic_len
     58     4  properties_len
     62     4  body_len
     66     .  topic (UTF-8), properties, body

``total_size == 66 + topic_len + properties_len + body_len`` must hold exactly.  Properties are
encoded as ``name 0x01 value 0x02`` pairs (RocketMQ's separators), so names and values may not
contain those two characters.

The header CRC means a torn or overwritten header (for example zeros where a size used to be, or a
size that was written before the rest) is detected without trusting ``total_size``; the body CRC
detects a torn body.  Zero bytes never decode (``total_size`` 0 is too small), which is what lets
recovery find the end of a preallocated segment.

``decode_record`` raises :class:`MessageCodecError` on anything invalid and never anything else.
``record_size`` / ``verify_record`` validate without building a :class:`Message`; ``decode_index``
reads just what the consume-queue dispatcher needs.

A producer's batch of records is :mod:`rocketray.wire.batch`'s; the master's seal of a batch and the index
of stored records are :mod:`rocketray.broker.batch`'s.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from typing import Callable, Mapping

try:  # ISA-L's CRC-32: the same function as zlib's (same polynomial, same results), ~3x faster
    from isal.isal_zlib import crc32 as _crc32_impl  # on 1 KiB bodies; optional (pip install isal)
    CRC32_IMPLEMENTATION = "isal"
except ImportError:
    from zlib import crc32 as _crc32_impl
    CRC32_IMPLEMENTATION = "zlib"
crc32: Callable[..., int] = _crc32_impl

__all__ = [
    "HEADER_SIZE",
    "MAGIC",
    "MAX_RECORD_SIZE",
    "IndexInfo",
    "Message",
    "MessageCodecError",
    "RECORD_HEADER",
    "SIZE_FIELD",
    "decode_index",
    "decode_properties",
    "decode_record",
    "encode_parts",
    "encode_fields",
    "encode_properties",
    "encode_record",
    "record_size",
    "split_records",
    "topic_bytes",
    "tag_hash",
    "verify_record",
]

MAGIC = 0x52524D31
RECORD_HEADER = struct.Struct(">IIIIIiqqqqHII")
SIZE_FIELD = struct.Struct(">I")
HEADER_SIZE = RECORD_HEADER.size
assert HEADER_SIZE == 66
MAX_RECORD_SIZE = 64 * 1024 * 1024
MAX_TOPIC_BYTES = 127
_TOPIC_RE = re.compile(r"^[A-Za-z0-9_%|\-]{1,127}$")
_NAME_SEP = "\x01"
_PROP_SEP = "\x02"
_U32 = 0xFFFFFFFF


class MessageCodecError(ValueError):
    """Bytes that are not a valid record, or a message that cannot be encoded."""


@dataclass(frozen=True, slots=True)
class Message:
    """One message; the store fills ``queue_offset``, ``physical_offset`` and ``store_timestamp_ms``."""

    topic: str
    queue_id: int
    body: bytes
    properties: Mapping[str, str] = field(default_factory=dict)
    flags: int = 0
    born_timestamp_ms: int = 0
    queue_offset: int = -1
    physical_offset: int = -1
    store_timestamp_ms: int = 0

    def with_position(self, queue_offset: int, physical_offset: int, store_timestamp_ms: int) -> "Message":
        """A copy with the three store-assigned fields set."""
        return Message(self.topic, self.queue_id, self.body, self.properties, self.flags, self.born_timestamp_ms,
                       queue_offset, physical_offset, store_timestamp_ms)


@dataclass(frozen=True, slots=True)
class IndexInfo:
    """What the consume-queue dispatcher needs from a record (no CRC check, no body copy)."""

    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    size: int
    tag_hash: int


def valid_topic(topic: str) -> bool:
    """RocketMQ's topic charset; also keeps topics safe as directory names."""
    return bool(_TOPIC_RE.match(topic))


def tag_hash(properties: Mapping[str, str]) -> int:
    """The consume-queue tag code: CRC32 of the ``TAGS`` property, 0 without tags."""
    tags = properties.get("TAGS")
    return crc32(tags.encode("utf-8")) if tags else 0


def encode_properties(properties: Mapping[str, str]) -> bytes:
    if not properties:
        return b""
    try:
        text = "".join([f"{name}\x01{value}\x02" for name, value in properties.items()])
    except TypeError:
        raise MessageCodecError("properties must be a mapping of str to str") from None
    n = len(properties)
    if text.count(_NAME_SEP) != n or text.count(_PROP_SEP) != n or _NAME_SEP + _NAME_SEP in text \
            or text.startswith(_NAME_SEP) or _PROP_SEP + _NAME_SEP in text \
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in properties.items()):
        raise MessageCodecError(f"invalid properties {dict(properties)!r}: str names (non-empty) and values, "
                                "without the reserved separators \\x01 and \\x02")
    return text.encode("utf-8")


def decode_properties(raw: bytes) -> dict[str, str]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MessageCodecError(f"properties are not UTF-8: {exc}") from None
    result: dict[str, str] = {}
    if not text:
        return result
    if not text.endswith(_PROP_SEP):
        raise MessageCodecError("properties do not end with a separator")
    for item in text[:-1].split(_PROP_SEP):
        name, sep, value = item.partition(_NAME_SEP)
        if not sep or not name or _NAME_SEP in value:
            raise MessageCodecError(f"malformed property {item!r}")
        result[name] = value
    return result


def encode_record(msg: Message) -> bytes:
    """Encode one message as a record (fields are stored as given; the store fills positions first)."""
    parts: list[bytes] = []
    encode_parts(msg, topic_bytes(msg.topic), parts)
    return b"".join(parts)


def topic_bytes(topic: object) -> bytes:
    if not isinstance(topic, str) or not valid_topic(topic):
        raise MessageCodecError(f"invalid topic {topic!r} (allowed: [A-Za-z0-9_%|-], 1-127 chars)")
    return topic.encode("ascii")


def encode_parts(msg: Message, topic: bytes, parts: list[bytes]) -> None:
    """Append ``msg``'s record to ``parts`` (``topic`` already checked)."""
    if not isinstance(msg.body, (bytes, bytearray, memoryview)):
        raise MessageCodecError("body must be bytes")
    body = msg.body if isinstance(msg.body, bytes) else bytes(msg.body)
    parts.append(encode_fields(topic, encode_properties(msg.properties), body, msg.queue_id, msg.born_timestamp_ms,
                               msg.flags, msg.queue_offset, msg.physical_offset, msg.store_timestamp_ms))


def encode_fields(topic: bytes, props: bytes, body: bytes, queue_id: int, born_ms: int, flags: int = 0,
                  queue_offset: int = -1, physical_offset: int = -1, store_ms: int = 0) -> bytes:
    """One record from its fields, already encoded and checked: ``topic`` by :func:`valid_topic`,
    ``props`` by ``encode_properties`` (or built of checked names and values). A producer encodes
    each message here once, without a :class:`Message` in between."""
    total = HEADER_SIZE + len(topic) + len(props) + len(body)
    if total > MAX_RECORD_SIZE:
        raise MessageCodecError(f"record of {total} bytes exceeds {MAX_RECORD_SIZE}")
    if not (0 <= flags <= _U32 and -2**31 <= queue_id < 2**31):
        raise MessageCodecError(f"flags {flags} or queue id {queue_id} out of range")
    try:
        header = RECORD_HEADER.pack(total, MAGIC, 0, crc32(body), flags, queue_id, queue_offset, physical_offset,
                              born_ms, store_ms, len(topic), len(props), len(body))
    except struct.error as exc:
        raise MessageCodecError(f"field out of range: {exc}") from None
    rest = header[12:] + topic + props
    return b"".join((header[:8], crc32(rest, crc32(header[:8])).to_bytes(4, "big"), rest, body))


def _check_header(buf: memoryview, pos: int) -> tuple:
    """Unpack and validate the header at ``pos``; returns the unpacked tuple."""
    if pos < 0 or len(buf) - pos < HEADER_SIZE:
        raise MessageCodecError(f"need {HEADER_SIZE} header bytes at {pos}, have {max(0, len(buf) - pos)}")
    fields = RECORD_HEADER.unpack_from(buf, pos)
    total, magic, hcrc = fields[0], fields[1], fields[2]
    topic_len, props_len, body_len = fields[10], fields[11], fields[12]
    if magic != MAGIC:
        raise MessageCodecError(f"bad magic {magic:#x} at {pos}")
    if total != HEADER_SIZE + topic_len + props_len + body_len or total > MAX_RECORD_SIZE:
        raise MessageCodecError(f"inconsistent sizes at {pos}: total {total}")
    if not 1 <= topic_len <= MAX_TOPIC_BYTES:
        raise MessageCodecError(f"bad topic length {topic_len} at {pos}")
    if len(buf) - pos < total:
        raise MessageCodecError(f"record at {pos} needs {total} bytes, have {len(buf) - pos}")
    body_start = pos + HEADER_SIZE + topic_len + props_len
    crc = crc32(buf[pos + 12:body_start], crc32(buf[pos:pos + 8]))
    if crc != hcrc:
        raise MessageCodecError(f"header CRC mismatch at {pos}")
    return fields


def record_size(buf: bytes | bytearray | memoryview, pos: int = 0) -> int:
    """Size of the record at ``pos`` after checking its header (header CRC, not the body CRC)."""
    return _check_header(memoryview(buf), pos)[0]


def verify_record(buf: bytes | bytearray | memoryview, pos: int = 0) -> tuple[int, int]:
    """Fully verify the record at ``pos`` (both CRCs); returns ``(size, physical_offset)``."""
    mv = memoryview(buf)
    fields = _check_header(mv, pos)
    total, body_len = fields[0], fields[12]
    if crc32(mv[pos + total - body_len:pos + total]) != fields[3]:
        raise MessageCodecError(f"body CRC mismatch at {pos}")
    return total, fields[7]


def decode_index(buf: bytes | bytearray | memoryview, pos: int = 0) -> IndexInfo:
    """The dispatcher's view of a record (header CRC checked, body not read)."""
    mv = memoryview(buf)
    fields = _check_header(mv, pos)
    start = pos + HEADER_SIZE
    topic = bytes(mv[start:start + fields[10]]).decode("ascii", errors="replace")
    props = decode_properties(bytes(mv[start + fields[10]:start + fields[10] + fields[11]]))
    return IndexInfo(topic, fields[5], fields[6], fields[7], fields[0], tag_hash(props))


def decode_record(buf: bytes | bytearray | memoryview, pos: int = 0) -> tuple[Message, int]:
    """Decode the record at ``pos``; returns ``(message, size)`` or raises :class:`MessageCodecError`."""
    mv = memoryview(buf)
    fields = _check_header(mv, pos)
    (total, _magic, _hcrc, body_crc, flags, queue_id, queue_offset, physical_offset,
     born_ms, store_ms, topic_len, props_len, body_len) = fields
    start = pos + HEADER_SIZE
    try:
        topic = bytes(mv[start:start + topic_len]).decode("ascii")
    except UnicodeDecodeError:
        raise MessageCodecError(f"topic at {pos} is not ASCII") from None
    if not valid_topic(topic):
        raise MessageCodecError(f"invalid topic {topic!r} at {pos}")
    props = decode_properties(bytes(mv[start + topic_len:start + topic_len + props_len]))
    body = bytes(mv[pos + total - body_len:pos + total])
    if crc32(body) != body_crc:
        raise MessageCodecError(f"body CRC mismatch at {pos}")
    msg = Message(topic, queue_id, body, props, flags, born_ms, queue_offset, physical_offset, store_ms)
    return msg, total


def split_records(buf: bytes | memoryview, base_offset: int, max_size: int) -> list[memoryview]:
    """Verify that ``buf`` is whole records stored at ``base_offset`` (both CRCs, each record's physical
    offset equal to its position, none larger than ``max_size``); returns a view per record."""
    view = memoryview(buf)
    records, pos = [], 0
    while pos < len(view):
        size, physical = verify_record(view, pos)
        if physical != base_offset + pos:
            raise MessageCodecError(f"record at {base_offset + pos} claims physical offset {physical}")
        if size > max_size:
            raise MessageCodecError(f"record of {size} bytes exceeds the limit {max_size}")
        records.append(view[pos:pos + size])
        pos += size
    return records
