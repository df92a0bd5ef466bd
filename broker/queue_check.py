"""Start-up check of the consume queues against the commit log.

Theory of operation. A consume-queue entry (physical offset, size, tag hash) carries no CRC of its
own, but everything in it is a function of the record it points at, and that record's CRCs were
verified by the log's recovery just before. So start-up indexes the log again (the trusted C loop:
the same entries dispatch would write) and compares each queue file with what the log says, entry
for entry: a flipped bit (a different entry), a truncated file or a deleted one (entries missing
for records the checkpoint says were dispatched) all show as the queue's *first disagreement*.
Each damaged queue is cut before it and the dispatched offset moves back to that entry's record, so
dispatch writes the queue again from the log (``MessageStore`` does both). Entries of records the
log no longer holds (recovery cut them) are cut as well; entries for records retention deleted
(below the log's first record) cannot be checked and are kept.

``first_mismatch`` is the pure rule; :class:`QueueChecker` walks a store's queues with it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from rocketray.broker.batch import CQ_ENTRY, QueueRun
from rocketray.broker.consume_queue import ConsumeQueues

__all__ = ["QueueChecker", "QueueDamage", "first_mismatch"]

log = logging.getLogger(__name__)

_E = CQ_ENTRY.size


def first_mismatch(expected: bytes | bytearray, actual: bytes | bytearray) -> int | None:
    """Index of the first entry of ``actual`` that differs from ``expected``, or ``len(actual)//20``
    when ``actual`` is a strict prefix of ``expected`` (entries missing); None when they are equal.
    Both are packed 20-byte entries of the same consecutive queue offsets."""
    assert len(expected) % _E == 0 and len(actual) % _E == 0, (len(expected), len(actual))
    if actual == expected:
        return None
    n = min(len(expected), len(actual))
    if actual[:n] == expected[:n]:
        return n // _E
    lo, hi = 0, n // _E   # the first differing entry: bisect on equal prefixes
    while lo < hi:
        mid = (lo + hi) // 2
        if actual[:(mid + 1) * _E] == expected[:(mid + 1) * _E]:
            lo = mid + 1
        else:
            hi = mid
    return lo


@dataclass(frozen=True, slots=True)
class QueueDamage:
    """Queue ``topic/queue_id`` disagrees with the log from ``queue_offset`` (its record at
    ``physical_offset``) on: ``differs`` (a wrong entry) or ``missing`` (entries the checkpoint says
    were dispatched are not in the file)."""

    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    reason: str

    @property
    def name(self) -> str:
        return f"{self.topic}/{self.queue_id}"


class QueueChecker:
    """Compares the queues of ``cqs`` with the runs of the log, fed in log order (see module doc).
    ``dispatched``: the checkpoint's dispatched offset (an entry may be missing only for a record
    ending after it)."""

    def __init__(self, cqs: ConsumeQueues, dispatched: int) -> None:
        self.cqs = cqs
        self.dispatched = dispatched
        self.damage: dict[tuple[str, int], QueueDamage] = {}
        self.checked_to: dict[tuple[str, int], int] = {}   # queue offset up to which entries agree

    def feed(self, runs: Iterable[QueueRun]) -> None:
        for run in runs:
            key = (run.topic, run.queue_id)
            if key not in self.damage:
                self._check(key, run)

    def _check(self, key: tuple[str, int], run: QueueRun) -> None:
        cq = self.cqs.get(*key)
        base = cq.base if cq is not None else run.first_queue_offset
        skip = max(0, base - run.first_queue_offset)     # entries below a rebased queue's start
        if skip >= run.count:
            return
        first = run.first_queue_offset + skip
        expected = bytes(run.entries[skip * _E:run.count * _E])
        actual = b"" if cq is None or first > cq.max_offset else \
            bytes(cq.file.pread((first - cq.base) * _E, len(expected)))
        bad = first_mismatch(expected, actual)
        if bad is None:
            self.checked_to[key] = first + len(expected) // _E
            return
        physical, size, _tag = CQ_ENTRY.unpack_from(expected, bad * _E)
        if bad * _E < len(actual):
            reason = "differs"
        elif physical + size > self.dispatched:
            self.checked_to[key] = first + bad   # not dispatched yet: nothing is wrong
            return
        else:
            reason = "missing"
        self.damage[key] = QueueDamage(key[0], key[1], first + bad, physical, reason)
        self.checked_to[key] = first + bad

    def repair(self) -> int:
        """Cut every checked queue after its last agreeing entry; returns the dispatched offset to
        dispatch again from (the earliest damaged record's, or the given one)."""
        for key, upto in self.checked_to.items():
            cq = self.cqs.get(*key)
            if cq is not None and cq.max_offset > upto:
                cq.cut_to(upto)
        for d in sorted(self.damage.values(), key=lambda d: d.physical_offset):
            log.warning("consume queue %s: entry %d %s the log (record at %d); rebuilt from the log",
                        d.name, d.queue_offset, "disagrees with" if d.reason == "differs" else "is missing from",
                        d.physical_offset)
        return min([self.dispatched, *(d.physical_offset for d in self.damage.values())])
