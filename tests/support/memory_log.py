"""An in-memory stand-in of the store for the pure HA session tests (like etcd raft's MemoryStorage).

It plays both ports the sessions' callers use: the master's ``MasterLogView`` (what a master
session reads) and the store a slave's actions are applied to. Its commit log is bytes in memory,
records ``length(4, big-endian) + payload``, so a test writes the bytes a session frames without
encoding real messages. Every rule that decides what a replica keeps is the product's, not a copy:

- the epoch entries are a scratch ``EpochFileCache`` (``broker/epoch_file.py``: strictly increasing
  epochs and starts, ``start_epoch`` for a promotion);
- a slave's actions are executed by ``apply_to_store`` (``ha/slave_client.py``), the function the
  broker's slave link and the simulator's run; ``apply_slave_actions`` adds only what their shells
  do with ``Send`` (hand the bytes to the master) and ``Close`` (drop the connection);
- ``truncate`` and ``confirm_offset`` clamp as ``MessageStore`` does.
"""

from __future__ import annotations

import bisect
import struct
from typing import Iterable

from rocketray.broker.epoch_file import EpochFileCache
from rocketray.wire.ha_protocol import EpochPoint
from rocketray.ha.session import Close, LocalLog, Send, SlaveAction
from rocketray.ha.slave_client import apply_to_store, local_log

__all__ = ["MemoryLog", "SessionClosed", "apply_slave_actions"]


class SessionClosed(Exception):
    """A slave session's ``Close`` action: the shell drops the connection."""


class MemoryLog:
    def __init__(self) -> None:
        self.data = bytearray()
        self.bounds: list[int] = []          # start offset of every record
        self.epoch_file = EpochFileCache(None, [])
        self._confirm = 0
        self.min_offset = 0

    # -- reads -----------------------------------------------------------------------------------
    @property
    def max_offset(self) -> int:
        return len(self.data)

    @property
    def confirm_offset(self) -> int:
        return self._confirm

    @confirm_offset.setter
    def confirm_offset(self, value: int) -> None:
        self._confirm = min(max(int(value), self.min_offset), self.max_offset)

    @property
    def points(self) -> list[EpochPoint]:
        return self.epoch_points()

    def epoch_points(self) -> list[EpochPoint]:
        return [EpochPoint(e.epoch, e.start_offset) for e in self.epoch_file.entries()]

    def last_segment_base_offset(self) -> int:
        return 0

    def local(self) -> LocalLog:
        return local_log(self)  # type: ignore[arg-type]

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

    def append_raw(self, offset: int, data: bytes | memoryview) -> int:
        assert offset == self.max_offset, (offset, self.max_offset)
        data = bytes(data)
        pos = 0
        while pos < len(data):
            (n,) = struct.unpack_from(">i", data, pos)
            assert pos + 4 + n <= len(data), "torn record in a batch"
            self.bounds.append(offset + pos)
            pos += 4 + n
        self.data += data
        return self.max_offset

    def truncate(self, offset: int) -> None:
        """Cut at ``offset`` (a record boundary); clamps the confirm offset and drops epoch entries
        that start beyond it, as ``MessageStore.truncate`` does."""
        if offset >= self.max_offset:
            return
        assert self.is_boundary(offset), offset
        del self.data[offset:]
        del self.bounds[bisect.bisect_left(self.bounds, offset):]
        self._confirm = min(self._confirm, offset)
        last = self.epoch_file.last_entry()
        if last is not None and last.start_offset > offset:
            self.epoch_file.truncate_suffix_by_offset(offset + 1)

    def become_master(self, epoch: int) -> None:
        """What a promotion does to the epoch file: the new term starts at the max offset."""
        self.epoch_file.start_epoch(epoch, self.max_offset)


def apply_slave_actions(log: MemoryLog, actions: Iterable[SlaveAction]) -> list[bytes]:
    """Apply a slave session's actions to ``log`` as the slave shells do; return the bytes to send
    to the master (``Close`` raises :class:`SessionClosed`)."""
    out = []
    for action in actions:
        if isinstance(action, Send):
            out.append(action.data)
        elif isinstance(action, Close):
            raise SessionClosed(action.reason)
        else:
            apply_to_store(log, action)  # type: ignore[arg-type]
    return out
