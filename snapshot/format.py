"""The controller snapshot file format (after RIP-59), pure encode/decode.

Theory of operation. A snapshot file is a fixed header followed by sections::

    header (22 bytes, big-endian)
        magic        uint32  0xDAA320A7   (RIP-59's -626843481)
        version      uint16  1
        section_count uint32
        crc32        uint32  zlib.crc32 over every byte after the header
        reserved     uint64  0            (must be zero: a flipped reserved byte is corruption)
    section (repeated section_count times)
        type         uint16
        length       uint32
        body         `length` bytes: one msgpack map

RIP-59 has no checksum; we add one so that a damaged newest snapshot is detected and the
store can fall back to the previous one. The CRC covers the sections; every header field is
checked on its own (magic, version, count against what was parsed, reserved == 0), so every
single-byte change anywhere in the file is detected. Unknown section types are skipped by the
caller's choice (`known_types`), so a newer writer can add sections an older reader ignores.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any, Iterable

import msgpack

MAGIC = 0xDAA320A7
VERSION = 1
HEADER = struct.Struct(">IHIIQ")
SECTION_HEADER = struct.Struct(">HI")
HEADER_SIZE = HEADER.size  # 22
MAX_SECTIONS = 1024

# Section types used by the controller.
SECTION_CONTROLLER_STATE = 1   # ControllerState.to_snapshot()
SECTION_RAFT_META = 2          # what pysyncobj needs back: last/prev applied entry, cluster members
SECTION_SNAPSHOT_META = 3      # {"index": n, "term": t}: the log position the snapshot covers
SECTION_TOPICS = 4             # ControllerState.topics_to_snapshot(): {"version": 1, "topics": [[name, [group...]]]}
SECTION_AUTH = 5               # ControllerState.auth_to_snapshot(): users (SCRAM records) and ACL rules, versioned


class SnapshotCorrupt(ValueError):
    """The bytes are not a whole, intact snapshot (bad magic, version, CRC, truncation...)."""


def encode_snapshot(sections: dict[int, dict[str, Any]]) -> bytes:
    """Encode `{section_type: msgpack-encodable dict}` into snapshot file bytes."""
    assert len(sections) <= MAX_SECTIONS, "too many sections"
    parts: list[bytes] = []
    for section_type in sorted(sections):
        assert 0 < section_type < 2 ** 16, f"section type out of range: {section_type}"
        body = msgpack.packb(sections[section_type], use_bin_type=True)
        parts.append(SECTION_HEADER.pack(section_type, len(body)))
        parts.append(body)
    payload = b"".join(parts)
    header = HEADER.pack(MAGIC, VERSION, len(sections), zlib.crc32(payload), 0)
    return header + payload


def decode_snapshot(data: bytes, known_types: Iterable[int] | None = None) -> dict[int, dict[str, Any]]:
    """Decode snapshot bytes; raise `SnapshotCorrupt` on any damage.

    With `known_types`, sections of other types are verified (CRC) but skipped.
    """
    data = bytes(data)
    if len(data) < HEADER_SIZE:
        raise SnapshotCorrupt(f"truncated header: {len(data)} bytes < {HEADER_SIZE}")
    magic, version, count, crc, reserved = HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise SnapshotCorrupt(f"bad magic 0x{magic:08X}")
    if version != VERSION:
        raise SnapshotCorrupt(f"unsupported version {version}")
    if reserved != 0:
        raise SnapshotCorrupt(f"reserved field is {reserved}, expected 0")
    if count > MAX_SECTIONS:
        raise SnapshotCorrupt(f"section count {count} > {MAX_SECTIONS}")
    payload = memoryview(data)[HEADER_SIZE:]
    if zlib.crc32(payload) != crc:
        raise SnapshotCorrupt("CRC32 mismatch (damaged or truncated sections)")
    keep = None if known_types is None else set(known_types)
    return _parse_sections(payload, count, keep)


def _parse_sections(payload: memoryview, count: int, keep: set[int] | None) -> dict[int, dict[str, Any]]:
    sections: dict[int, dict[str, Any]] = {}
    pos = 0
    for _ in range(count):
        if len(payload) - pos < SECTION_HEADER.size:
            raise SnapshotCorrupt("truncated section header")
        section_type, length = SECTION_HEADER.unpack_from(payload, pos)
        pos += SECTION_HEADER.size
        if len(payload) - pos < length:
            raise SnapshotCorrupt(f"truncated section {section_type}: need {length} bytes")
        body = payload[pos:pos + length]
        pos += length
        if keep is not None and section_type not in keep:
            continue
        if section_type in sections:
            raise SnapshotCorrupt(f"duplicate section {section_type}")
        try:
            value = msgpack.unpackb(body, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises several types; all mean "not a valid body"
            raise SnapshotCorrupt(f"section {section_type}: bad msgpack body: {exc}") from exc
        if not isinstance(value, dict):
            raise SnapshotCorrupt(f"section {section_type}: body is {type(value).__name__}, not a map")
        sections[section_type] = value
    if pos != len(payload):
        raise SnapshotCorrupt(f"{len(payload) - pos} trailing bytes after {count} sections")
    return sections
