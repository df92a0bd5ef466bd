"""What a broker answers a consumer: typed pull and committed-offset results, and their limits.

These cross the client transport (a Ray call today), so they are plain frozen data with enum
statuses that say whether asking again can help (``retriable``), like ``rocketray.wire.put_result.PutResult``
for a put. A pull's messages travel as the stored records themselves, joined in one ``bytes``
object (``rocketray.wire.message.decode_record`` reads them), so a pull of many messages costs
one object, never one per message.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["PullStatus", "PullResult", "OffsetsStatus", "OffsetsResult", "MAX_PULL_COUNT", "MAX_PULL_BYTES",
           "MAX_HOLD_MS", "check_pull"]

MAX_PULL_COUNT = 4096
MAX_PULL_BYTES = 32 << 20
MAX_HOLD_MS = 60_000


class PullStatus(enum.IntEnum):
    FOUND = 0          # ``records`` holds ``count`` >= 1 messages
    NO_NEW_MSG = 1     # nothing (wanted, for a filtered pull) confirmed before the hold ran out
    NOT_MASTER = 2     # ask the group's current master (retriable after a route refresh)
    ILLEGAL = 3        # the request is invalid (count, bytes or hold out of range): not retriable
    ACCESS_DENIED = 4  # the user may not read the topic or the group (its ACL): not retriable

    @property
    def retriable(self) -> bool:
        return self not in (PullStatus.ILLEGAL, PullStatus.ACCESS_DENIED)


@dataclass(frozen=True, slots=True)
class PullResult:
    """``records``: ``count`` whole stored records from queue offset ``offset`` (which the broker may
    have moved up past records retention deleted); ``next_offset``: where the next pull starts (for
    a pull with a tag filter, past every entry it looked at, the unwanted ones too, also when no
    record is returned); ``max_offset``: one past the queue's last confirmed entry on this broker."""

    status: PullStatus
    records: bytes = b""
    count: int = 0
    offset: int = 0
    next_offset: int = 0
    max_offset: int = 0
    remark: str = ""


class OffsetsStatus(enum.IntEnum):
    OK = 0
    NOT_MASTER = 1     # committed offsets are answered by the master only
    NOT_READY = 2      # a new master has not confirmed its whole log yet: ask again shortly
    ILLEGAL = 3
    ACCESS_DENIED = 4  # the user may not read the group (its ACL)

    @property
    def retriable(self) -> bool:
        return self not in (OffsetsStatus.ILLEGAL, OffsetsStatus.ACCESS_DENIED)


@dataclass(frozen=True, slots=True)
class OffsetsResult:
    """A group's committed offsets on one broker group (``(topic, queue_id, offset)``) and the
    queues' max offsets there (``(topic, queue_id, max_offset)``), as of one confirmed log."""

    status: OffsetsStatus
    committed: tuple[tuple[str, int, int], ...] = ()
    max_offsets: tuple[tuple[str, int, int], ...] = ()
    remark: str = ""

    def committed_map(self) -> dict[tuple[str, int], int]:
        return {(t, q): o for t, q, o in self.committed}

    def max_map(self) -> dict[tuple[str, int], int]:
        return {(t, q): o for t, q, o in self.max_offsets}


def check_pull(queue_offset: int, max_count: int, max_bytes: int, hold_ms: int) -> str | None:
    """Why a pull request is invalid, or None."""
    for name, value, low, high in (("queue_offset", queue_offset, 0, 2**63 - 1),
                                   ("max_count", max_count, 1, MAX_PULL_COUNT),
                                   ("max_bytes", max_bytes, 1, MAX_PULL_BYTES),
                                   ("hold_ms", hold_ms, 0, MAX_HOLD_MS)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            return f"{name} must be an int in [{low}, {high}], not {value!r}"
    return None
