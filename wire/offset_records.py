"""Committed consumer offsets as records of a system topic: the record's codec (pure).

A consumer group's commit (and an admin's reset) is one record of the system topic
:data:`OFFSETS_TOPIC`, queue :data:`OFFSETS_QUEUE`, appended by the master through the put path;
``rocketray.broker.offsets`` folds the records into the table of committed offsets (the theory of
operation is there).

Record body (msgpack, versioned): a commit ``[1, group, [[topic, queue_id, offset], ...]]`` (version 1:
the only one commits use, so a reader that knows only version 1 folds every commit); a reset
``[2, "reset", group, [[topic, queue_id, offset], ...]]`` (version 2 names its kind; a version-1
reader skips it as a record it cannot decode).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import msgpack

from rocketray.wire.message import Message, valid_topic

__all__ = ["OFFSETS_TOPIC", "OFFSETS_QUEUE", "OffsetCommit", "OffsetRecordError", "encode_commit", "encode_reset",
           "decode_commit", "commit_message", "reset_message", "MAX_COMMITS_PER_RECORD"]

OFFSETS_TOPIC = "__consumer_offsets"
OFFSETS_QUEUE = 0
VERSION = 1
VERSION_KINDS = 2
KIND_RESET = "reset"
MAX_COMMITS_PER_RECORD = 4096
MAX_GROUP_CHARS = 255


class OffsetRecordError(ValueError):
    """Bytes that are not a valid offset-commit record, or a commit that cannot be encoded."""


@dataclass(frozen=True, slots=True)
class OffsetCommit:
    """``group`` has consumed ``topic``/``queue_id`` up to (not including) ``offset``; with
    ``reset``, the admin set the offset there (an assignment, not a maximum)."""

    group: str
    topic: str
    queue_id: int
    offset: int
    reset: bool = False


def _check(group: str, topic: str, queue_id: int, offset: int) -> None:
    if not isinstance(group, str) or not 0 < len(group) <= MAX_GROUP_CHARS:
        raise OffsetRecordError(f"consumer group must be a name of 1..{MAX_GROUP_CHARS} characters: {group!r}")
    if not isinstance(topic, str) or not valid_topic(topic):
        raise OffsetRecordError(f"invalid topic in an offset commit: {topic!r}")
    for name, value in (("queue_id", queue_id), ("offset", offset)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
            raise OffsetRecordError(f"{name} must be a non-negative int64: {value!r}")


def _checked_entries(group: str, entries: Sequence[tuple[str, int, int]]) -> list[list]:
    if not 0 < len(entries) <= MAX_COMMITS_PER_RECORD:
        raise OffsetRecordError(f"an offset record holds 1..{MAX_COMMITS_PER_RECORD} entries, not {len(entries)}")
    for topic, queue_id, offset in entries:
        _check(group, topic, queue_id, offset)
    return [[t, q, o] for t, q, o in entries]


def encode_commit(group: str, entries: Sequence[tuple[str, int, int]]) -> bytes:
    """The record body committing ``(topic, queue_id, offset)`` entries of ``group``."""
    return msgpack.packb([VERSION, group, _checked_entries(group, entries)], use_bin_type=True)


def encode_reset(group: str, entries: Sequence[tuple[str, int, int]]) -> bytes:
    """The record body resetting ``group``'s offsets of ``(topic, queue_id, offset)`` entries."""
    return msgpack.packb([VERSION_KINDS, KIND_RESET, group, _checked_entries(group, entries)], use_bin_type=True)


def decode_commit(body: bytes | memoryview) -> list[OffsetCommit]:
    """The commits a record body carries; raises :class:`OffsetRecordError` on anything invalid."""
    try:
        item = msgpack.unpackb(bytes(body), raw=False, use_list=True, strict_map_key=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise OffsetRecordError(f"offset record is not msgpack: {exc}") from None
    if isinstance(item, list) and len(item) == 3 and item[0] == VERSION and isinstance(item[2], list):
        reset, group, entries = False, item[1], item[2]
    elif isinstance(item, list) and len(item) == 4 and item[0] == VERSION_KINDS and item[1] == KIND_RESET \
            and isinstance(item[3], list):
        reset, group, entries = True, item[2], item[3]
    else:
        raise OffsetRecordError("offset record is neither [1, group, entries] nor [2, 'reset', group, entries]")
    if not 0 < len(entries) <= MAX_COMMITS_PER_RECORD:
        raise OffsetRecordError(f"offset record holds {len(entries)} entries")
    out = []
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) == 3):
            raise OffsetRecordError(f"offset entry is not [topic, queue_id, offset]: {entry!r}")
        topic, queue_id, offset = entry
        _check(group, topic, queue_id, offset)
        out.append(OffsetCommit(group, topic, queue_id, offset, reset))
    return out


def commit_message(group: str, entries: Sequence[tuple[str, int, int]], born_timestamp_ms: int) -> Message:
    """The system-topic message a master appends for one commit request."""
    return Message(OFFSETS_TOPIC, OFFSETS_QUEUE, encode_commit(group, entries), {"GROUP": group},
                   born_timestamp_ms=born_timestamp_ms)


def reset_message(group: str, entries: Sequence[tuple[str, int, int]], born_timestamp_ms: int) -> Message:
    """The system-topic message a master appends for one admin reset of ``group``'s offsets."""
    return Message(OFFSETS_TOPIC, OFFSETS_QUEUE, encode_reset(group, entries), {"GROUP": group},
                   born_timestamp_ms=born_timestamp_ms)
