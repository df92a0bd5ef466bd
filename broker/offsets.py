"""Committed consumer offsets, kept as records of a system topic in the commit log.

Theory of operation. A consumer group's committed offset of a queue (the next queue offset the
group will read) is stored by the broker group that holds the queue, as Kafka keeps
``__consumer_offsets``: a commit is one record of the system topic :data:`OFFSETS_TOPIC`, queue
:data:`OFFSETS_QUEUE`, appended by the master through the same put path as a message. So it is
replicated, acknowledged only when every SyncStateSet member has it, truncated to the consistent
point with the rest of the log, crash-safe with the store, and visible (served) only up to the
confirm offset. Nothing here is new durability code: this module is the fold that turns the
records into a table (the record's codec is :mod:`rocketray.wire.offset_records`).

The table is a fold of two record kinds, in log order (the system queue's order).

- A **commit** (a consumer's, or the master's retention refresh) takes the maximum: a (group, topic,
  queue) offset never goes backwards through a commit, so a late commit from a consumer that lost the
  queue in a rebalance, or from before a failover, cannot roll a group's progress back (the upstream
  losses of apache/rocketmq#1094, #7790 and #9711 came from offsets copied master -> slave by
  polling, where a stale copy could win).
- A **reset** (written only by the admin's reset of a stopped group, ``Admin.reset_offsets``) is an
  assignment: the offset becomes the reset's, lower or higher. It is the one way an offset goes back.

What a commit does around a reset follows from log order alone. A commit before the reset in the
log is overridden by it. A commit after it takes the maximum against the reset's value: progress
read from the reset point moves the offset forward, as it must, and so does a late commit computed
before the reset (a member the admin's check did not see: one that outlived its heartbeat, or joined
right after the check), which wins the race and leaves the queue above the target. The admin refuses
to reset while the group has live members (GROUP_ACTIVE) so that race needs a member the controller
already counts gone, and after the reset it reads the offsets back and reports every queue a commit
moved past the target (RESET_OVERTAKEN), never a silent half-reset.

Retention. Commit records live in the commit log, whose old segments retention deletes. So that a
group that stops committing keeps its offsets, the master re-appends the offsets of every group whose
newest record is older than half the retention (:meth:`OffsetTable.stale_groups`): the fold keeps
the maximum, so a refresh changes nothing but the records' age (Kafka compacts its topic instead). It
re-appends a reset's value as a commit, which is enough: retention deletes the oldest records first,
so a reset's record goes only together with every record before it, and nothing older is left for
that commit's maximum to meet.
"""

from __future__ import annotations

from typing import Iterable

from rocketray.wire.offset_records import OffsetCommit, OffsetRecordError, decode_commit

__all__ = ["OffsetTable", "fold_all"]


class OffsetTable:
    """The fold of offset records: (group, topic, queue_id) -> the highest offset committed since
    the last reset of it (or the reset's offset).

    ``position`` is the next system-queue offset to fold (the shell reads records from there);
    records that do not decode are counted in ``skipped`` and ignored (a master never appends one:
    it encodes the record itself)."""

    __slots__ = ("_offsets", "_newest_ms", "position", "skipped")

    def __init__(self) -> None:
        self._offsets: dict[tuple[str, str, int], int] = {}
        self._newest_ms: dict[str, int] = {}
        self.position = 0
        self.skipped = 0

    def fold(self, queue_offset: int, body: bytes | memoryview, store_timestamp_ms: int = 0) -> None:
        """Fold the record at system-queue offset ``queue_offset`` (records in queue order)."""
        assert queue_offset == self.position, (queue_offset, self.position)
        self.position += 1
        try:
            commits = decode_commit(body)
        except OffsetRecordError:
            self.skipped += 1
            return
        for c in commits:
            self.apply(c)
        if commits:
            group = commits[0].group
            self._newest_ms[group] = max(self._newest_ms.get(group, 0), store_timestamp_ms)

    def stale_groups(self, now_ms: int, max_age_ms: int) -> list[str]:
        """Groups whose newest record was stored more than ``max_age_ms`` before ``now_ms``: their
        offsets should be appended again before retention deletes the records that hold them."""
        return sorted(g for g, t in self._newest_ms.items() if now_ms - t > max_age_ms)

    def apply(self, c: OffsetCommit) -> None:
        """Fold one entry: a commit takes the maximum, a reset assigns (the module docstring)."""
        key = (c.group, c.topic, c.queue_id)
        if c.reset or c.offset > self._offsets.get(key, -1):
            self._offsets[key] = c.offset

    def committed(self, group: str, topic: str, queue_id: int) -> int | None:
        return self._offsets.get((group, topic, queue_id))

    def of_group(self, group: str) -> dict[tuple[str, int], int]:
        """``(topic, queue_id) -> offset`` of every queue ``group`` committed on this broker group."""
        return {(t, q): o for (g, t, q), o in self._offsets.items() if g == group}

    def groups(self) -> list[str]:
        return sorted({g for g, _t, _q in self._offsets})

    def as_rows(self) -> list[tuple[str, str, int, int]]:
        return sorted((g, t, q, o) for (g, t, q), o in self._offsets.items())


def fold_all(records: Iterable[tuple[int, bytes]]) -> OffsetTable:
    """A table folded from ``(queue_offset, body)`` records in order (tests, the simulator)."""
    table = OffsetTable()
    for queue_offset, body in records:
        table.fold(queue_offset, body)
    return table
