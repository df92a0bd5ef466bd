"""Segmented commit log: one contiguous byte space in Kafka-style segment files.

Theory of operation
-------------------
Offsets are byte positions in one log.  The log is cut into segment files under ``<root>/commitlog``
named by their base offset, zero-padded to 20 digits.  A segment is *rolled before* a record that
would not fit, and no filler is written, so every segment boundary is a record boundary and the
next segment's base is exactly the previous segment's end.

The active (last) segment is preallocated to ``segment_size`` bytes (``fallocate`` where the file
system can, a sparse ``ftruncate`` elsewhere) and mapped once; its unwritten part is zeros, which never decode as a record.  When it is sealed by a
roll it is ``ftruncate``-d to its data length, so a sealed file's size is its data size.  Appends
are one ``pwrite`` of a whole batch per segment it touches; reads are ``memoryview``-s over the maps.

Bytes are only ever removed from the active segment by overwriting them with zeros (then
``fsync``), never by shrinking a file that may be mapped: a reader holding a view of the removed
range then sees zeros instead of the process dying of SIGBUS.  Later segments are unlinked and the
directory fsynced.  A segment that becomes active again (truncation into a sealed segment) is
re-extended to ``segment_size``.

Cutting (truncation, recovery) unlinks the later segments newest first, fsyncs the directory, then
zeroes the cut range of the segment holding the cut point and fsyncs it.  A kill between two
unlinks so leaves a contiguous prefix of the old log; a power loss may keep any subset of the
unsynced unlinks, which is why recovery checks contiguity.

``recover(start)`` first keeps only the contiguous run of segments from the first one (a segment
that does not start where the previous one ends, and everything after it, is deleted: a hole left
by a crash during a truncation), then scans records from the start of the segment holding
``start`` (the checkpoint's verified offset) to the end of data and cuts at the first invalid or
torn record: the cut bytes are zeroed, later segments deleted, and the number of non-zero bytes
removed is returned.  Every segment it scanned is fsynced (and the directory), so the offset the
store then records as verified is durable: a later power loss cannot tear bytes before it.

All file IO goes through the disk port (``rocketray.fs.Disk``); over the real disk the
segments are read through ``mmap`` views.

This class does no locking; :class:`rocketray.broker.store.MessageStore` serialises calls.
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
from pathlib import Path

from rocketray.broker.checkpoint import nonzero_end, sync_files
from rocketray.fs import OS_DISK, Disk, DiskFile
from rocketray.wire.message import MessageCodecError, decode_index, verify_record
from rocketray.broker.batch import IndexedRecords, index_records
from rocketray.broker.segments import (Segment, first_gap, first_scanned, records_within, segment_name,
                                       unlink_order)

__all__ = ["CommitLog", "StoreError"]

log = logging.getLogger(__name__)

_ZERO_CHUNK = bytes(1 << 20)  # for zeroing cut ranges
_SIZE = struct.Struct(">I")
_PHYSICAL = struct.Struct(">q")


def _base_offset(segment: Segment) -> int:
    return segment.base_offset


def records_valid(view: memoryview, base_offset: int, max_size: int) -> bool:
    """Whether every record of ``view`` (whole records stored from ``base_offset``) passes both CRCs,
    holds its own physical offset and fits ``max_size``: the C loop, one pass."""
    try:
        index_records(view, base_offset, verify=True, max_size=max_size)
    except MessageCodecError:
        return False
    return True


class StoreError(Exception):
    """A refused store operation (bad offset, non-boundary truncation, closed store)."""

    retriable = False


class CommitLog:
    """The segment files of one store (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike[str], segment_size: int, initial_offset: int = 0,
                 disk: Disk = OS_DISK) -> None:
        self.dir = Path(directory)
        self.disk = disk
        self.segment_size = segment_size
        self.segments: list[Segment] = []
        self._dirty: set[Segment] = set()
        self._dir_dirty = False
        for name in disk.listdir(self.dir):
            path = self.dir / name
            if name.isdigit() and len(name) == 20:
                f = disk.open(path, map_reads=True)
                self.segments.append(Segment(int(name), path, f, size=f.size(), sealed=True))
            elif name.endswith(".tmp"):
                disk.unlink(path)
        if not self.segments:
            self._create_segment(initial_offset)

    # ------------------------------------------------------------------ offsets
    @property
    def min_offset(self) -> int:
        return self.segments[0].base_offset

    @property
    def max_offset(self) -> int:
        return self.segments[-1].end_offset

    @property
    def active(self) -> Segment:
        return self.segments[-1]

    def segment_for(self, offset: int) -> Segment | None:
        """The segment holding ``offset`` (``None`` outside ``[min, max)``)."""
        if not self.min_offset <= offset < self.max_offset:
            return None
        idx = bisect.bisect_right(self.segments, offset, key=_base_offset) - 1
        return self.segments[idx]

    # ------------------------------------------------------------------ writing
    def _create_segment(self, base_offset: int) -> Segment:
        path = self.dir / segment_name(base_offset)
        seg = Segment(base_offset, path, self.disk.open(path, create=True, map_reads=True), size=0)
        self.segments.append(seg)
        self._activate(seg)
        self._dir_dirty = True
        return seg

    def _activate(self, seg: Segment) -> None:
        """Make ``seg`` writable: extend it to the segment size (the extension reads as zeros)."""
        seg.sealed = False
        if seg.file.size() < self.segment_size:
            seg.file.truncate(self.segment_size)

    def _seal(self, seg: Segment) -> None:
        """Cut the preallocated tail of ``seg``; readers never look beyond its data."""
        seg.file.truncate(seg.size)
        seg.sealed = True
        self._dirty.add(seg)

    def append(self, data: bytes | bytearray | memoryview) -> int:
        """Append whole records (positions already encoded) with as few ``pwrite``-s as segments
        touched; rolls before a record that does not fit; returns the new end."""
        view = memoryview(data)
        pos, n = 0, len(view)
        seg = self.active
        while pos < n:
            room = self.segment_size - seg.size
            if n - pos <= room:
                self._write(seg, view[pos:])
                break
            fit = records_within(view, pos, room)
            if fit == 0:
                size = _SIZE.unpack_from(view, pos)[0]
                if seg.size == 0 or size > self.segment_size:
                    raise ValueError(f"record of {size} bytes does not fit a segment of {self.segment_size}")
                self._seal(seg)
                seg = self._create_segment(seg.end_offset)
                continue
            self._write(seg, view[pos:pos + fit])
            pos += fit
        return self.max_offset

    def _write(self, seg: Segment, data: memoryview) -> None:
        if not len(data):
            return
        seg.file.pwrite(data, seg.size)
        seg.size += len(data)
        self._dirty.add(seg)

    # ------------------------------------------------------------------ flushing
    def take_dirty_files(self) -> tuple[list[DiskFile], bool]:
        """Duplicated handles of segments written since the last call, and whether the directory
        changed.

        The caller fsyncs and closes them outside the store lock (``dup`` keeps them valid even if
        retention closes the segment meanwhile).
        """
        files = [seg.file.dup() for seg in sorted(self._dirty, key=lambda s: s.base_offset)]
        dir_dirty, self._dir_dirty = self._dir_dirty, False
        self._dirty.clear()
        return files, dir_dirty

    def flush(self) -> None:
        """fsync everything written so far (and the directory if segments were created or deleted)."""
        files, dir_dirty = self.take_dirty_files()
        sync_files(files, self.disk, self.dir if dir_dirty else None)

    # ------------------------------------------------------------------ reading
    def read(self, offset: int, length: int) -> memoryview:
        """Up to ``length`` bytes from ``offset``, not crossing a segment end nor ``max_offset``."""
        seg = self.segment_for(offset)
        if seg is None:
            return memoryview(b"")
        rel = offset - seg.base_offset
        return memoryview(seg.file.pread(rel, min(seg.size, rel + length) - rel))

    def prefetch_handles(self, offset: int, length: int) -> list[tuple[DiskFile, int, int]]:
        """``(handle, position, length)`` for each segment ``[offset, offset + length)`` touches
        (clamped to the log): duplicated handles, for the caller to ``prefetch`` outside the store
        lock and close."""
        out = []
        pos, end = max(offset, self.min_offset), min(offset + length, self.max_offset)
        while pos < end and (seg := self.segment_for(pos)) is not None:
            n = min(end, seg.base_offset + seg.size) - pos
            out.append((seg.file.dup(), pos - seg.base_offset, n))
            pos += n
        return out

    def check_boundary(self, offset: int) -> memoryview:
        """The bytes from ``offset`` to its segment's end; :class:`StoreError` unless a record starts there."""
        view = self.read(offset, self.segment_size)
        try:
            size = decode_index(view, 0).size
        except MessageCodecError as exc:
            raise StoreError(f"offset {offset} is not a record boundary: {exc}") from None
        physical = _PHYSICAL.unpack_from(view, 32)[0]
        if physical != offset or size > len(view):
            raise StoreError(f"offset {offset} is not a record boundary (record claims {physical})")
        return view

    def index_range(self, start: int, end: int) -> list[IndexedRecords]:
        """Consume-queue runs of the whole records in ``[start, end)`` (``start`` a boundary), one
        chunk per segment touched; stops early at an invalid record (logged).  Records are trusted
        (verified when written or recovered), so only headers and properties are read."""
        chunks: list[IndexedRecords] = []
        pos = start
        while pos < end:
            view = self.read(pos, end - pos)
            try:
                chunk = index_records(view, pos, verify=False)
            finally:
                del view
            if chunk.count:
                chunks.append(chunk)
            if chunk.error is not None:
                log.error("commit log %s: invalid record at %d: %s", self.dir, chunk.end_offset, chunk.error)
                break
            if chunk.end_offset == pos:
                break
            pos = chunk.end_offset
        return chunks

    def first_invalid(self, start: int) -> int | None:
        """Fully verify records from ``start`` (a boundary) to the end; the first bad position or None."""
        pos, end = start, self.max_offset
        while pos < end:
            view = self.read(pos, end - pos)
            try:
                size, physical = verify_record(view, 0)
            except MessageCodecError:
                return pos
            finally:
                del view
            if physical != pos:
                return pos
            pos += size
        return None

    # ------------------------------------------------------------------ cutting
    def _zero(self, seg: Segment, start: int, end: int) -> None:
        pos = start
        while pos < end:
            n = min(len(_ZERO_CHUNK), end - pos)
            seg.file.pwrite(memoryview(_ZERO_CHUNK)[:n], pos)
            pos += n

    def _garbage_end(self, seg: Segment, start: int, known: bool) -> int:
        """End of the bytes of ``seg`` from ``start`` that may be non-zero.

        ``known``: in normal operation everything past ``seg.size`` is zeros.  Otherwise (recovery)
        the file is searched, skipping sparse holes with SEEK_DATA/SEEK_HOLE.
        """
        if known:
            return max(start, seg.size)
        end = seg.file.data_end(start, seg.file.size())
        view = seg.file.pread(0, end)
        try:
            return nonzero_end(view, start, min(end, len(view)))
        finally:
            del view

    def _drop_after(self, idx: int, known: bool) -> int:
        """Delete segments after index ``idx`` (newest first, see :func:`unlink_order`), then fsync
        the directory; returns their non-zero byte count."""
        removed = 0
        doomed = self.segments[idx + 1:]
        if not doomed:
            return 0
        for seg in unlink_order(doomed):
            removed += self._garbage_end(seg, 0, known)
            self._dirty.discard(seg)
            seg.close()
            self.disk.unlink(seg.path)
        del self.segments[idx + 1:]
        self.disk.fsync_dir(self.dir)
        return removed

    def cut(self, offset: int, recovering: bool = False) -> int:
        """Remove every byte at or after ``offset`` durably; returns how many non-zero bytes went.

        ``offset`` must lie in ``[min_offset, max_offset]``; checking it is a record boundary is the
        caller's job.  On return the cut bytes are zeros on disk (fsynced) or their files are gone.
        ``recovering``: segment sizes past ``offset`` are not trusted, the files are searched.
        """
        assert self.min_offset <= offset, (offset, self.min_offset)
        idx = bisect.bisect_right(self.segments, offset, key=_base_offset) - 1
        removed = self._drop_after(idx, known=not recovering)
        seg = self.segments[idx]
        rel = offset - seg.base_offset
        garbage_end = self._garbage_end(seg, rel, known=not recovering)
        self._activate(seg)
        removed += garbage_end - rel
        self._zero(seg, rel, garbage_end)
        seg.size = rel
        seg.file.fsync()
        self._dirty.discard(seg)
        return removed

    def delete_expired(self, now_ms: int, retention_ms: int | None, max_bytes: int | None, keep_from: int) -> int:
        """Delete head segments older than ``retention_ms`` (file mtime) or while the log is larger than
        ``max_bytes``; never the active one nor one holding bytes at or after ``keep_from``."""
        deleted = 0
        while len(self.segments) > 1 and self.segments[0].end_offset <= keep_from:
            head = self.segments[0]
            too_big = max_bytes is not None and self.max_offset - self.min_offset > max_bytes
            age_ms = now_ms - head.file.mtime_ns() // 1_000_000
            if not (too_big or (retention_ms is not None and age_ms > retention_ms)):
                break
            self.delete_head()
            deleted += 1
        return deleted

    def delete_head(self) -> Segment:
        """Delete the oldest segment (never the active one); returns it (closed)."""
        assert len(self.segments) > 1, "the active segment is never deleted"
        seg = self.segments.pop(0)
        self._dirty.discard(seg)
        seg.close()
        self.disk.unlink(seg.path)
        self.disk.fsync_dir(self.dir)
        return seg

    def reset(self, base_offset: int) -> None:
        """Throw the (empty) log away and start it at ``base_offset`` (a slave's first transfer)."""
        assert self.min_offset == self.max_offset, "reset only an empty log"
        for seg in self.segments:
            self._dirty.discard(seg)
            seg.close()
            self.disk.unlink(seg.path)
        self.segments = []
        self._create_segment(base_offset)
        self.disk.fsync_dir(self.dir)

    def close(self) -> None:
        for seg in self.segments:
            seg.close()

    # ------------------------------------------------------------------ recovery
    def _scan(self, seg: Segment, rel: int) -> int:
        """Relative end of the last valid record of ``seg`` scanning from ``rel``: the records' header
        and body CRCs and physical offsets, verified by the C loop (``index_records``: a trusted pass
        finds where the headers end, a verifying pass checks everything before it); only a segment
        that fails it is walked record by record to find the first bad one."""
        view = memoryview(seg.file.pread(0, seg.file.size()))
        limit = len(view)
        try:
            end = index_records(view[rel:], seg.base_offset + rel, verify=False).end_offset - seg.base_offset
            if records_valid(view[rel:end], seg.base_offset + rel, self.segment_size):
                return end   # the trusted pass stopped at the first record that is not whole or valid
            while rel < limit:
                try:
                    size, physical = verify_record(view, rel)
                except MessageCodecError:
                    break
                if physical != seg.base_offset + rel:
                    break
                rel += size
            return rel
        finally:
            del view

    def recover(self, start_offset: int) -> int:
        """Find the end of valid data, cut what follows; returns the number of non-zero bytes cut.

        Segments after a hole are deleted first (:func:`first_gap`).  Scanning starts at the
        beginning of the segment holding the byte before ``start_offset`` (the checkpoint's
        verified offset), so a torn write is found even if it lies before that offset; segments
        before it are trusted (they, and their seal, were fsynced before that checkpoint).
        The scanned segments are fsynced (:meth:`_sync_scanned`).
        """
        gap = first_gap(self.segments)  # sizes are the file sizes here
        if gap is not None:
            log.warning("commit log %s: segment %s does not start where the previous one ends (a hole or an "
                        "unsynced seal); recovery keeps the log before it", self.dir, self.segments[gap].path.name)
            self._drop_after(gap - 1, known=False)
        idx = first_scanned([s.base_offset for s in self.segments], start_offset)
        pos, last = self.segments[idx].base_offset, idx - 1
        for i in range(idx, len(self.segments)):
            seg = self.segments[i]
            if seg.base_offset != pos:
                log.warning("commit log gap: segment %s does not start at %d", seg.path.name, pos)
                break
            seg.size = self._scan(seg, 0)
            pos, last = seg.end_offset, i
            if seg.size != seg.file.size():
                break
        scanned = self.segments[idx:last + 1]
        cut = self.cut(pos, recovering=True)  # fsyncs the segment it cuts (the last one left)
        for seg in self.segments[:-1]:
            seg.sealed = True
        self._sync_scanned([s for s in scanned if s in self.segments[:-1]])
        return cut

    def _sync_scanned(self, segments: list[Segment]) -> None:
        """fsync the segments recovery scanned and the directory: what the store records as verified
        after recovery must be durable, or a later power loss could tear it: every scanned segment,
        not only the one recovery cut."""
        for seg in segments:
            seg.file.fsync()
        self.disk.fsync_dir(self.dir)
