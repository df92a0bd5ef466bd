"""Committed consumer offsets in the simulated world: the master's answer and the checker's fold.

Theory of operation. A commit is a record of the system topic ``__consumer_offsets`` appended by a
master through the put path (``rocketray.broker.offsets``), so the simulated brokers need nothing
new to store, replicate, acknowledge or truncate it. Two readings of the records are needed:

- what a master *answers* when a consumer asks for its group's committed offsets (the rule the real
  broker follows): it waits until its confirm offset reaches the max offset it had when asked
  (``answerable``), then folds the system queue's records its store serves, which never go beyond
  the confirm offset (``fold_confirmed``; ``SimBroker.offset_table`` keeps that fold between calls);
- what a replica *holds* (invariant 8): the fold of every commit record in its log, confirmed or
  not (``LogFold``, scanned incrementally, as invariant 1 reads every acknowledged message).

Both folds use ``OffsetTable`` and so its rules: a commit never moves an offset back, and a reset
record (an admin's, of a stopped group) assigns it. The simulated consumers never reset (a reset
needs a stopped group), so in a simulated run any offset that goes back is a violation (invariant 9).
"""

from __future__ import annotations

from dataclasses import dataclass

from rocketray.broker.batch import CQ_ENTRY, index_records
from rocketray.wire.message import MessageCodecError, decode_record
from rocketray.wire.offset_records import OFFSETS_QUEUE, OFFSETS_TOPIC, OffsetRecordError, decode_commit
from rocketray.broker.offsets import OffsetTable

__all__ = ["CONSUMER_GROUP", "CommittedOffsets", "OffsetAnswer", "LogFold", "answerable", "fold_confirmed"]

#: The consumer group of every simulated consumer (each broker group keeps its own queue's offsets).
CONSUMER_GROUP = "sim-consumers"
_READ_BATCH = 64


@dataclass(frozen=True, slots=True)
class CommittedOffsets:
    """A master's answer: ``(topic, queue_id) -> offset`` of one consumer group."""

    offsets: dict[tuple[str, int], int]


@dataclass(frozen=True, slots=True)
class OffsetAnswer:
    """One answer as the master gave it (the checker reads these, invariant 9)."""

    broker: str
    group: str
    asked_ms: int
    offsets: dict[tuple[str, int], int]


def answerable(confirm_offset: int, asked_max_offset: int) -> bool:
    """The wait rule: a master answers once its confirm offset reaches the max offset it had when
    asked, so everything it held then (every commit acknowledged by any earlier master included:
    an elected replica holds them) is folded, however recently it took the term."""
    return confirm_offset >= asked_max_offset


def fold_confirmed(store, table: OffsetTable) -> None:
    """Fold into ``table`` the system queue's records ``store`` serves from ``table.position`` (never
    a record beyond the confirm offset: ``get_messages``)."""
    while True:
        msgs = store.get_messages(OFFSETS_TOPIC, OFFSETS_QUEUE, table.position, _READ_BATCH)
        for msg in msgs:
            table.fold(msg.queue_offset, msg.body)
        if len(msgs) < _READ_BATCH:
            return


class LogFold:
    """The fold of every commit record of one replica's log, confirmed or not, advanced as the log
    grows. Valid while the log only grows: the owner keys it by (process, truncations) and starts a
    new one when that changes."""

    __slots__ = ("key", "position", "table")

    def __init__(self, key: object) -> None:
        self.key = key
        self.position = 0
        self.table = OffsetTable()

    def advance(self, store) -> OffsetTable:
        end = store.max_offset
        if self.position < store.min_offset:
            self.position = store.min_offset
        while self.position < end:
            chunk = store.read_raw(self.position, 1 << 20)
            if not chunk:
                break
            index = index_records(chunk, self.position, verify=False)
            for run in index.runs:
                if run.topic == OFFSETS_TOPIC and run.queue_id == OFFSETS_QUEUE:
                    for i in range(run.count):
                        physical, _size, _tag = CQ_ENTRY.unpack_from(run.entries, i * CQ_ENTRY.size)
                        self._fold(chunk, physical - self.position)
            if index.end_offset <= self.position:
                break
            self.position = index.end_offset
        return self.table

    def _fold(self, chunk, pos: int) -> None:
        try:
            msg, _size = decode_record(chunk, pos)
            commits = decode_commit(msg.body)
        except (MessageCodecError, OffsetRecordError):
            self.table.skipped += 1
            return
        for c in commits:
            self.table.apply(c)
