"""The dispatcher of one store: consume-queue entries and queue offsets, kept in step with the log.

Theory of operation. Every append builds the consume-queue runs of its records in the same pass
(``rocketray.broker.batch``); they wait in a bounded in-memory :class:`Backlog` until the confirm
offset covers them, then :meth:`Dispatcher.dispatch` hands them to the consume queues in one call.
Where the backlog holds nothing (it was dropped for its size, or cut by a truncation) the
dispatcher scans the log for the runs instead. Start-up indexes the records beyond the confirm
offset into the backlog too (:meth:`Dispatcher.index_tail`), so the confirm offset moving over
them later -- a new master's event loop -- reads no log.

The queue table maps each queue to the queue offset its next message gets (unconfirmed messages
included): the consume queues' ends, advanced over the records appended since (``table_pos``).

The dispatcher holds no lock: :class:`rocketray.broker.store.MessageStore` calls it under its own.
"""

from __future__ import annotations

import bisect
import collections

from rocketray.broker.batch import IndexedRecords, QueueRun
from rocketray.broker.commitlog import CommitLog
from rocketray.broker.consume_queue import ConsumeQueues

__all__ = ["Backlog", "Dispatcher", "PENDING_MAX_ENTRIES"]

#: Consume-queue entries of appended, not yet dispatched records kept in memory (20 bytes each);
#: beyond it the backlog is dropped and dispatched later by scanning the log.
PENDING_MAX_ENTRIES = 1 << 20


class Backlog:
    """Consume-queue runs of appended records the confirm offset does not cover yet, contiguous in
    log order, at most ``max_entries`` entries: a batch that would exceed it (or that does not
    continue the backlog) empties it, and the dispatcher scans the log for what is missing."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._chunks: collections.deque[IndexedRecords] = collections.deque()
        self._entries = 0

    def add(self, chunk: IndexedRecords) -> None:
        if self._chunks and self._chunks[-1].end_offset != chunk.start_offset:
            self.clear()
        if self._entries + chunk.count > self.max_entries:
            self.clear()
            return
        self._chunks.append(chunk)
        self._entries += chunk.count

    def head(self) -> IndexedRecords | None:
        return self._chunks[0] if self._chunks else None

    def pop_head(self) -> None:
        self._entries -= self._chunks.popleft().count

    def replace_head(self, chunk: IndexedRecords) -> None:
        self._entries += chunk.count - self._chunks[0].count
        self._chunks[0] = chunk

    def clear(self) -> None:
        self._chunks.clear()
        self._entries = 0


class Dispatcher:
    """Consume-queue dispatch and the queue table of one store (see the module docstring)."""

    def __init__(self, commitlog: CommitLog, cqs: ConsumeQueues, dispatched: int,
                 max_entries: int = PENDING_MAX_ENTRIES) -> None:
        self.commitlog = commitlog
        self.cqs = cqs
        self.pending = Backlog(max_entries)
        self.dispatched = dispatched     # every record ending at or before it is in the queues
        # built by ``index_tail`` once start-up has dispatched up to the confirm offset
        self.queue_table: dict[tuple[str, int], int] = {}
        self.table_pos = dispatched      # the queue table counts the records before this offset

    # ------------------------------------------------------------------ dispatch
    def dispatch(self, limit: int) -> None:
        """Index records up to ``limit`` (the confirm offset, or the log end with
        ``read_uncommitted``): from the backlog's runs, or by scanning the log where it holds none.
        One ``cqs.dispatch`` for the whole range."""
        runs: list[QueueRun] = []
        dispatched = self.dispatched
        while dispatched < limit:
            head = self.pending.head()
            if head is not None and head.start_offset < dispatched:
                self.pending.clear()  # stale (cannot happen: runs are dropped with the bytes they index)
                continue
            if head is not None and head.start_offset == dispatched:
                end = self._take_from_backlog(head, limit, runs)
            else:
                scan_end = min(limit, head.start_offset) if head is not None else limit
                chunks = self.commitlog.index_range(dispatched, scan_end)
                for chunk in chunks:
                    runs += chunk.runs
                end = chunks[-1].end_offset if chunks else dispatched
            if end == dispatched:
                break
            dispatched = end
        if dispatched != self.dispatched:
            self.cqs.dispatch(runs)
            self.dispatched = dispatched

    def _take_from_backlog(self, chunk: IndexedRecords, limit: int, runs: list[QueueRun]) -> int:
        """Move the runs of ``chunk`` (the head of the backlog) whose records end at or before
        ``limit`` to ``runs``; returns the end of the last such record (a record boundary)."""
        if chunk.end_offset <= limit:
            self.pending.pop_head()
            runs += chunk.runs
            return chunk.end_offset
        done: list[QueueRun] = []
        rest: list[QueueRun] = []
        end = chunk.start_offset
        for run in chunk.runs:
            k = bisect.bisect_right(range(run.count), limit, key=run.end_of)
            if k:
                end = max(end, run.end_of(k - 1))
            if k == run.count:
                done.append(run)
            elif k == 0:
                rest.append(run)
            else:
                rest.append(run.split(k))
                done.append(run)
        if end == chunk.start_offset:
            return end
        runs += done
        self.pending.replace_head(IndexedRecords(end, chunk.end_offset, sum(r.count for r in rest), rest))
        return end

    # ------------------------------------------------------------------ appends and cuts
    def appended(self, index: IndexedRecords, master: bool) -> None:
        """Records were appended: keep their runs for dispatch; on the master path (queue offsets
        assigned from the table, which was caught up first) move the table past them."""
        if master:
            for run in index.runs:
                self.queue_table[(run.topic, run.queue_id)] = run.next_queue_offset
            self.table_pos = index.end_offset
        self.pending.add(index)

    def index_tail(self) -> None:
        """Start-up, after the first dispatch: the queue table from the queues' ends, then the
        records beyond the dispatched offset into the backlog and the table, like appends do, here
        at start-up: scanning them later, on the thread that raises the confirm offset, would block
        a new master's loop (260 ms for 256 MiB read from disk)."""
        self.rebuild_queue_table()
        for chunk in self.commitlog.index_range(self.dispatched, self.commitlog.max_offset):
            self.pending.add(chunk)
            self._advance_queue_table(chunk)

    def cut(self, offset: int) -> None:
        """The log was cut at ``offset`` (the queues too): forget runs and table entries past it."""
        self.pending.clear()
        self.dispatched = min(self.dispatched, offset)
        self.rebuild_queue_table()

    def restart(self, offset: int) -> None:
        """An empty log (and emptied queues) restarts at ``offset``."""
        self.pending.clear()
        self.dispatched = offset
        self.rebuild_queue_table()

    def rebuild(self) -> None:
        """The queues were cleared: dispatch again from the start of the log."""
        self.dispatched = self.commitlog.min_offset
        self.rebuild_queue_table()

    def head_deleted(self, min_offset: int) -> None:
        """Retention deleted the segments before ``min_offset``."""
        self.dispatched = max(self.dispatched, min_offset)
        self.table_pos = max(self.table_pos, min_offset)

    # ------------------------------------------------------------------ queue table
    def next_queue_offset(self, topic: str, queue_id: int) -> int:
        self.catch_up_queue_table()
        return self.queue_table.get((topic, queue_id), 0)

    def rebuild_queue_table(self) -> None:
        self.queue_table = {key: cq.max_offset for key, cq in self.cqs.queues.items()}
        self.table_pos = self.dispatched

    def catch_up_queue_table(self) -> None:
        if self.table_pos >= self.commitlog.max_offset:
            return
        for chunk in self.commitlog.index_range(self.table_pos, self.commitlog.max_offset):
            self._advance_queue_table(chunk)

    def _advance_queue_table(self, chunk: IndexedRecords) -> None:
        for run in chunk.runs:
            key = (run.topic, run.queue_id)
            self.queue_table[key] = max(self.queue_table.get(key, 0), run.next_queue_offset)
        self.table_pos = chunk.end_offset
