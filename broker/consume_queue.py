"""Consume queues: per (topic, queue id) index of the commit log.

Theory of operation
-------------------
A consume queue maps a queue offset (0, 1, 2, ... per topic and queue id) to the commit-log record
that holds it, with fixed 20-byte entries ``(physical_offset i64, size u32, tag_hash u64)``, so a
lookup is one ``pread`` at ``(queue_offset - base) * 20``.  Each queue is one file
``<root>/consumequeue/<topic>/<queue_id>/<base queue offset, 20 digits>``; the base is the queue
offset of its first entry (non-zero when the queue was rebuilt after retention deleted its head).

Entries are written by the store's dispatcher in commit-log order, one ``pwrite`` per run of
consecutive queue offsets (``rocketray.broker.batch.QueueRun``, built in the same pass that sealed
or received the batch), so physical offsets increase along a queue and truncating a queue at a
physical offset is a binary search plus an ``ftruncate``.  These files are never mapped, so shrinking them is safe.  The queue offset of an
entry comes from the record itself (assigned by the master's ``put_batch``); a record whose queue
offset does not continue the queue is logged and the queue is re-based or cut to accept it, so the
commit log stays the single source of truth.

Every file operation goes through the disk port (``rocketray.fs.Disk``).  New directories
are created durably (their parent fsynced at once); a queue file's entries are fsynced by the
store before it records a dispatched offset that relies on them (``take_dirty``).

No locking here: :class:`rocketray.broker.store.MessageStore` serialises calls.
"""

from __future__ import annotations

import bisect
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from rocketray.fs import OS_DISK, Disk, DiskFile, ensure_dir, remove_tree
from rocketray.wire.message import valid_topic
from rocketray.broker.batch import CQ_ENTRY, QueueRun

__all__ = ["ConsumeQueue", "ConsumeQueues", "CqEntry", "ENTRY_SIZE", "name_needs_sync", "names_to_sync"]

log = logging.getLogger(__name__)

_ENTRY = CQ_ENTRY
ENTRY_SIZE = _ENTRY.size
assert ENTRY_SIZE == 20


@dataclass(frozen=True, slots=True)
class CqEntry:
    """One consume-queue entry."""

    queue_offset: int
    physical_offset: int
    size: int
    tag_hash: int


def name_needs_sync(created: bool) -> bool:
    """Whether a queue file's name must be made durable (its directory fsynced) before a checkpoint
    vouches for its entries: when this process created it, and also when it found it at start. A
    process killed after creating the file and before fsyncing its directory leaves the name in the
    page cache, where the next process sees it; only a power loss shows it was never durable, and
    by then checkpoints had recorded a dispatched offset past entries that are gone (simulator
    ``async-overlap`` seeds 55 and 70; ``tests/broker/test_queue_name_durable.py``)."""
    return True


def names_to_sync(queue_dir: Path, root: Path) -> list[Path]:
    """The directories to fsync so that a queue file's name *and the names of its directories* are
    durable: its queue-id directory (the file's name), its topic directory (the queue id's) and the
    queues' root (the topic's). ``ensure_dir`` fsyncs the parent of a directory it creates, but a
    directory it finds may have been made by a process killed before that fsync: its name is in the
    page cache only, and a later power loss drops the directory with every queue file in it while
    checkpoints vouched for their entries (simulator ``async-overlap`` seed 456: a kill between
    ``mkdir consumequeue/__consumer_offsets`` and the fsync of ``consumequeue``; the next process
    made the queue-id directory under it). The root's own name needs nothing: a store whose
    ``consumequeue`` is gone rebuilds every queue from the log."""
    return [queue_dir, queue_dir.parent, root]


class ConsumeQueue:
    """The index file of one (topic, queue id)."""

    def __init__(self, directory: Path, topic: str, queue_id: int, disk: Disk = OS_DISK) -> None:
        self.dir = directory
        self.disk = disk
        self.topic = topic
        self.queue_id = queue_id
        ensure_dir(disk, self.dir)
        files = [self.dir / n for n in disk.listdir(self.dir) if n.isdigit() and len(n) == 20]
        for extra in files[:-1]:
            disk.unlink(extra)  # a crash between creating a new base file and unlinking the old one
        self.path = files[-1] if files else self.dir / f"{0:020d}"
        self.base = int(self.path.name)
        self.file: DiskFile = disk.open(self.path, create=True)
        size = self.file.size()
        if size % ENTRY_SIZE:
            size -= size % ENTRY_SIZE
            self.file.truncate(size)  # torn last entry
        self.count = size // ENTRY_SIZE
        self.dirty = False
        # its directory is fsynced with its first entries (or the next checkpoint)
        self.new_name = name_needs_sync(created=not files)

    @property
    def min_offset(self) -> int:
        return self.base

    @property
    def max_offset(self) -> int:
        """One past the last queue offset in this queue."""
        return self.base + self.count

    def _rebase(self, base: int) -> None:
        """Empty the queue and make ``base`` its first queue offset."""
        self.file.close()
        self.disk.unlink(self.path)
        self.base, self.count = base, 0
        self.path = self.dir / f"{base:020d}"
        self.file = self.disk.open(self.path, create=True, truncate=True)
        self.disk.fsync_dir(self.dir)

    def _set_count(self, count: int) -> None:
        self.file.truncate(count * ENTRY_SIZE)
        self.count = count
        self.dirty = True

    def cut_to(self, queue_offset: int) -> None:
        """Keep only the entries before ``queue_offset`` (at least the queue's base)."""
        assert self.base <= queue_offset <= self.max_offset, (self.base, queue_offset, self.max_offset)
        self._set_count(queue_offset - self.base)

    def append_entries(self, first_queue_offset: int, entries: bytes, count: int) -> None:
        """Append ``count`` packed entries of consecutive queue offsets from ``first_queue_offset``
        (records in commit-log order): one ``pwrite``."""
        assert len(entries) == count * ENTRY_SIZE, (len(entries), count)
        if not count:
            return
        if first_queue_offset != self.max_offset:
            self._accept_discontinuity(first_queue_offset)
        self.file.pwrite(entries, self.count * ENTRY_SIZE)
        self.count += count
        self.dirty = True

    def _accept_discontinuity(self, queue_offset: int) -> None:
        if self.count == 0:  # a log that starts mid-queue (slave from the master's min offset, retention)
            self._rebase(queue_offset)
            return
        log.warning("consume queue %s/%d: record queue offset %d does not continue [%d, %d)",
                    self.topic, self.queue_id, queue_offset, self.base, self.max_offset)
        if self.base <= queue_offset < self.max_offset:
            self._set_count(queue_offset - self.base)
        else:
            self._rebase(queue_offset)

    def read(self, queue_offset: int, max_count: int) -> list[CqEntry]:
        """Up to ``max_count`` entries from ``queue_offset`` (clamped up to the queue's base)."""
        start = max(queue_offset, self.base)
        data = self.read_packed(start, max_count)
        return [CqEntry(start + i, *_ENTRY.unpack_from(data, i * ENTRY_SIZE)) for i in range(len(data) // ENTRY_SIZE)]

    def read_packed(self, queue_offset: int, max_count: int) -> bytes:
        """The packed entries (``CQ_ENTRY``) of up to ``max_count`` queue offsets from ``queue_offset``
        (at least the base): what a scan that builds no object per entry reads."""
        assert queue_offset >= self.base, (queue_offset, self.base)
        n = min(max_count, self.max_offset - queue_offset)
        if n <= 0:
            return b""
        return self.file.pread((queue_offset - self.base) * ENTRY_SIZE, n * ENTRY_SIZE)

    def _physical(self, index: int) -> int:
        return _ENTRY.unpack_from(self.file.pread(index * ENTRY_SIZE, ENTRY_SIZE))[0]

    def first_at_or_after(self, physical_offset: int) -> int:
        """Queue offset of the first entry whose record starts at or after ``physical_offset``."""
        return self.base + bisect.bisect_left(range(self.count), physical_offset, key=self._physical)

    def truncate_physical(self, physical_offset: int) -> None:
        """Remove entries whose record starts at or after ``physical_offset``."""
        keep = self.first_at_or_after(physical_offset) - self.base
        if keep < self.count:
            self._set_count(keep)

    def last_end(self) -> int:
        """Commit-log end of the last entry's record (0 if empty)."""
        if self.count == 0:
            return 0
        phys, size, _tag = _ENTRY.unpack_from(self.file.pread((self.count - 1) * ENTRY_SIZE, ENTRY_SIZE))
        return phys + size

    def close(self) -> None:
        self.file.close()


class ConsumeQueues:
    """All consume queues of a store under ``<root>/consumequeue``."""

    def __init__(self, directory: str | os.PathLike[str], disk: Disk = OS_DISK) -> None:
        self.dir = Path(directory)
        self.disk = disk
        ensure_dir(disk, self.dir)
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        for topic in disk.listdir(self.dir):
            topic_dir = self.dir / topic
            if not valid_topic(topic) or not disk.is_dir(topic_dir):
                continue
            for qname in disk.listdir(topic_dir):
                try:
                    qid = int(qname)
                except ValueError:
                    continue
                if disk.is_dir(topic_dir / qname):
                    self.queues[(topic, qid)] = ConsumeQueue(topic_dir / qname, topic, qid, disk)

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def _queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        key = (topic, queue_id)
        cq = self.queues.get(key)
        if cq is None:
            cq = ConsumeQueue(self.dir / topic / str(queue_id), topic, queue_id, self.disk)
            self.queues[key] = cq
        return cq

    def dispatch(self, runs: list[QueueRun]) -> None:
        """Index records: runs in commit-log order per queue; the runs of one queue that continue
        each other are written together (one ``pwrite`` per queue in the common case)."""
        by_queue: dict[tuple[str, int], list[QueueRun]] = {}
        for run in runs:
            by_queue.setdefault((run.topic, run.queue_id), []).append(run)
        for (topic, queue_id), queue_runs in by_queue.items():
            cq = self._queue(topic, queue_id)
            i = 0
            while i < len(queue_runs):
                j = i + 1
                while j < len(queue_runs) and \
                        queue_runs[j].first_queue_offset == queue_runs[j - 1].next_queue_offset:
                    j += 1
                group = queue_runs[i:j]
                cq.append_entries(group[0].first_queue_offset, b"".join(r.entries for r in group),
                                  sum(r.count for r in group))
                i = j

    def truncate_physical(self, physical_offset: int) -> None:
        """Cut every queue at ``physical_offset`` (entries of records at or after it go)."""
        for cq in self.queues.values():
            cq.truncate_physical(physical_offset)

    def take_dirty(self) -> tuple[list[DiskFile], list[Path]]:
        """Duplicated handles of queues written since the last call, and the directories whose new
        names (a new queue file, and its directories: ``names_to_sync``) they need.

        The caller fsyncs (and closes) them before recording a dispatched offset that relies on them.
        """
        files: list[DiskFile] = []
        dirs: dict[Path, None] = {}
        for cq in self.queues.values():
            if cq.dirty:
                files.append(cq.file.dup())
                cq.dirty = False
            if cq.new_name:
                dirs.update(dict.fromkeys(names_to_sync(cq.dir, self.dir)))
                cq.new_name = False
        return files, list(dirs)

    def clear(self) -> None:
        """Delete every queue (before a rebuild from the commit log)."""
        self.close()
        self.queues = {}
        remove_tree(self.disk, self.dir)
        self.disk.fsync_dir(self.dir.parent)
        ensure_dir(self.disk, self.dir)

    def close(self) -> None:
        for cq in self.queues.values():
            cq.close()
