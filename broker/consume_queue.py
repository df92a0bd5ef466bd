"""Consume queues: per (topic, queue id) index of the commit log.

Theory of operation
-------------------
A consume queue maps a queue offset (0, 1, 2, ... per topic and queue id) to the commit-log record
that holds it, with fixed 20-byte entries ``(physical_offset i64, size u32, tag_hash u64)``, so a
lookup is one ``pread`` at ``(queue_offset - base) * 20``.  Each queue is one file
``<root>/consumequeue/<topic>/<queue_id>/<base queue offset, 20 digits>``; the base is the queue
offset of its first entry (non-zero when the queue was rebuilt after retention deleted its head).

Entries are written by the store's dispatcher in commit-log order, so physical offsets increase
along a queue and truncating a queue at a physical offset is a binary search plus an
``ftruncate``.  These files are never mapped, so shrinking them is safe.  The queue offset of an
entry comes from the record itself (assigned by the master's ``put_messages``); a record whose queue
offset does not continue the queue is logged and the queue is re-based or cut to accept it, so the
commit log stays the single source of truth.

No locking here: :class:`rocketray.broker.store.MessageStore` serialises calls.
"""

from __future__ import annotations

import bisect
import logging
import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

from rocketray.durable import fsync_dir
from rocketray.broker.message import IndexInfo, valid_topic

__all__ = ["ConsumeQueue", "ConsumeQueues", "CqEntry", "ENTRY_SIZE"]

log = logging.getLogger(__name__)

_ENTRY = struct.Struct(">qIQ")
ENTRY_SIZE = _ENTRY.size
assert ENTRY_SIZE == 20


@dataclass(frozen=True, slots=True)
class CqEntry:
    """One consume-queue entry."""

    queue_offset: int
    physical_offset: int
    size: int
    tag_hash: int


class ConsumeQueue:
    """The index file of one (topic, queue id)."""

    def __init__(self, directory: Path, topic: str, queue_id: int) -> None:
        self.dir = directory
        self.topic = topic
        self.queue_id = queue_id
        self.dir.mkdir(parents=True, exist_ok=True)
        files = sorted(p for p in self.dir.iterdir() if p.name.isdigit() and len(p.name) == 20)
        for extra in files[:-1]:
            extra.unlink()  # a crash between creating a new base file and unlinking the old one
        self.path = files[-1] if files else self.dir / f"{0:020d}"
        self.base = int(self.path.name)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        size = os.fstat(self.fd).st_size
        if size % ENTRY_SIZE:
            os.ftruncate(self.fd, size - size % ENTRY_SIZE)  # torn last entry
        self.count = os.fstat(self.fd).st_size // ENTRY_SIZE
        self.dirty = False

    @property
    def min_offset(self) -> int:
        return self.base

    @property
    def max_offset(self) -> int:
        """One past the last queue offset in this queue."""
        return self.base + self.count

    def _rebase(self, base: int) -> None:
        """Empty the queue and make ``base`` its first queue offset."""
        os.close(self.fd)
        self.path.unlink()
        self.base, self.count = base, 0
        self.path = self.dir / f"{base:020d}"
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        fsync_dir(self.dir)

    def _set_count(self, count: int) -> None:
        os.ftruncate(self.fd, count * ENTRY_SIZE)
        self.count = count
        self.dirty = True

    def append(self, infos: list[IndexInfo]) -> None:
        """Append entries for records in commit-log order."""
        chunk: list[bytes] = []
        for info in infos:
            if info.queue_offset != self.base + self.count + len(chunk):
                self._write(chunk)
                chunk = []
                self._accept_discontinuity(info.queue_offset)
            chunk.append(_ENTRY.pack(info.physical_offset, info.size, info.tag_hash))
        self._write(chunk)

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

    def _write(self, chunk: list[bytes]) -> None:
        if not chunk:
            return
        data = b"".join(chunk)
        os.pwrite(self.fd, data, self.count * ENTRY_SIZE)
        self.count += len(chunk)
        self.dirty = True

    def read(self, queue_offset: int, max_count: int) -> list[CqEntry]:
        """Up to ``max_count`` entries from ``queue_offset`` (clamped up to the queue's base)."""
        start = max(queue_offset, self.base)
        n = min(max_count, self.max_offset - start)
        if n <= 0:
            return []
        data = os.pread(self.fd, n * ENTRY_SIZE, (start - self.base) * ENTRY_SIZE)
        return [CqEntry(start + i, *_ENTRY.unpack_from(data, i * ENTRY_SIZE)) for i in range(len(data) // ENTRY_SIZE)]

    def _physical(self, index: int) -> int:
        return _ENTRY.unpack(os.pread(self.fd, ENTRY_SIZE, index * ENTRY_SIZE))[0]

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
        phys, size, _tag = _ENTRY.unpack(os.pread(self.fd, ENTRY_SIZE, (self.count - 1) * ENTRY_SIZE))
        return phys + size

    def close(self) -> None:
        os.close(self.fd)


class ConsumeQueues:
    """All consume queues of a store under ``<root>/consumequeue``."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._new_dirs: set[Path] = set()
        for topic_dir in self.dir.iterdir():
            if not topic_dir.is_dir() or not valid_topic(topic_dir.name):
                continue
            for qdir in topic_dir.iterdir():
                try:
                    qid = int(qdir.name)
                except ValueError:
                    continue
                self.queues[(topic_dir.name, qid)] = ConsumeQueue(qdir, topic_dir.name, qid)

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def _queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        key = (topic, queue_id)
        cq = self.queues.get(key)
        if cq is None:
            cq = ConsumeQueue(self.dir / topic / str(queue_id), topic, queue_id)
            self.queues[key] = cq
            self._new_dirs.update((self.dir, self.dir / topic, cq.dir))
        return cq

    def dispatch(self, infos: list[IndexInfo]) -> None:
        """Index records (in commit-log order)."""
        by_queue: dict[tuple[str, int], list[IndexInfo]] = {}
        for info in infos:
            by_queue.setdefault((info.topic, info.queue_id), []).append(info)
        for (topic, qid), items in by_queue.items():
            self._queue(topic, qid).append(items)

    def truncate_physical(self, physical_offset: int) -> None:
        """Cut every queue at ``physical_offset`` (entries of records at or after it go)."""
        for cq in self.queues.values():
            cq.truncate_physical(physical_offset)

    def take_dirty(self) -> tuple[list[int], list[Path]]:
        """Duplicated fds of queues written and directories created since the last call.

        The caller fsyncs (and closes) them before recording a dispatched offset that relies on them.
        """
        fds = []
        for cq in self.queues.values():
            if cq.dirty:
                fds.append(os.dup(cq.fd))
                cq.dirty = False
        dirs, self._new_dirs = sorted(self._new_dirs, key=lambda p: len(p.parts), reverse=True), set()
        return fds, dirs

    def clear(self) -> None:
        """Delete every queue (before a rebuild from the commit log)."""
        self.close()
        self.queues = {}
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True, exist_ok=True)
        fsync_dir(self.dir.parent)

    def close(self) -> None:
        for cq in self.queues.values():
            cq.close()
