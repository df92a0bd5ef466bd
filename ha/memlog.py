"""An in-memory log with the store operations the HA sessions use (like etcd raft's MemoryStorage).

Records are ``length(4, big-endian) + payload``. Used by simulations and property tests to drive
the pure sessions without files or sockets; ``apply_slave_actions`` applies a slave session's
actions exactly as the asyncio shell applies them to a real store.
"""

from __future__ import annotations

import bisect
import struct
from typing import Iterable

from rocketray.ha.protocol import EpochPoint
from rocketray.ha.session import (
    Append, Close, LocalLog, RecordEpoch, Send, SetConfirmOffset, SlaveAction, Truncate,
)

__all__ = ["MemoryLog", "apply_slave_actions", "SessionClosed"]


class SessionClosed(Exception):
    pass


class MemoryLog:
    def __init__(self) -> None:
        self.data = bytearray()
        self.bounds: list[int] = []          # start offset of every record
        self.points: list[EpochPoint] = []
        self.confirm_offset = 0
        self.min_offset = 0

    # -- reads -----------------------------------------------------------------------------------
    @property
    def max_offset(self) -> int:
        return len(self.data)

    def epoch_points(self) -> list[EpochPoint]:
        return list(self.points)

    def last_segment_base_offset(self) -> int:
        return 0

    def local(self) -> LocalLog:
        return LocalLog(self.min_offset, self.max_offset,
                        tuple((p.epoch, p.start_offset) for p in self.points))

    def records(self) -> list[bytes]:
        ends = self.bounds[1:] + [len(self.data)]
        return [bytes(self.data[s + 4:e]) for s, e in zip(self.bounds, ends)]

    def is_boundary(self, offset: int) -> bool:
        return offset == len(self.data) or (
            (i := bisect.bisect_left(self.bounds, offset)) < len(self.bounds)
            and self.bounds[i] == offset)

    def read_raw(self, offset: int, max_bytes: int) -> bytes:
        assert self.is_boundary(offset), offset
        i = bisect.bisect_left(self.bounds, offset)
        end = offset
        while i < len(self.bounds):
            nxt = self.bounds[i + 1] if i + 1 < len(self.bounds) else len(self.data)
            if end > offset and nxt - offset > max_bytes:
                break
            end = nxt
            i += 1
        return bytes(self.data[offset:end])

    # -- writes ----------------------------------------------------------------------------------
    def append_record(self, payload: bytes) -> int:
        self.bounds.append(len(self.data))
        self.data += struct.pack(">i", len(payload)) + payload
        return len(self.data)

    def append_raw(self, offset: int, data: bytes) -> int:
        assert offset == self.max_offset, (offset, self.max_offset)
        pos = 0
        while pos < len(data):
            (n,) = struct.unpack_from(">i", data, pos)
            assert pos + 4 + n <= len(data), "torn record in a batch"
            self.bounds.append(offset + pos)
            pos += 4 + n
        self.data += data
        return self.max_offset

    def truncate(self, offset: int) -> None:
        assert self.is_boundary(offset), offset
        del self.data[offset:]
        del self.bounds[bisect.bisect_left(self.bounds, offset):]
        self.confirm_offset = min(self.confirm_offset, offset)

    def append_epoch(self, epoch: int, start_offset: int) -> bool:
        if self.points and (self.points[-1].epoch >= epoch or
                            self.points[-1].start_offset >= start_offset):
            return False
        self.points.append(EpochPoint(epoch, start_offset))
        return True

    def truncate_epochs_from(self, offset: int) -> None:
        self.points = [p for p in self.points if p.start_offset < offset]

    def become_master(self, epoch: int) -> None:
        """What change_to_master does to the epoch file: drop data-less entries, append."""
        self.truncate_epochs_from(self.max_offset)
        assert self.append_epoch(epoch, self.max_offset)


def apply_slave_actions(log: MemoryLog, actions: Iterable[SlaveAction]) -> list[bytes]:
    """Apply a slave session's actions to ``log``; return the bytes to send to the master."""
    out = []
    for action in actions:
        if isinstance(action, Send):
            out.append(action.data)
        elif isinstance(action, Truncate):
            if action.offset < log.max_offset:
                log.truncate(action.offset)
            log.truncate_epochs_from(action.offset)
        elif isinstance(action, RecordEpoch):
            log.append_epoch(action.epoch, action.start_offset)
        elif isinstance(action, Append):
            log.append_raw(action.offset, action.data)
        elif isinstance(action, SetConfirmOffset):
            log.confirm_offset = action.offset
        elif isinstance(action, Close):
            raise SessionClosed(action.reason)
    return out
