"""Segmented commit log: one contiguous byte space in Kafka-style segment files.

Theory of operation
-------------------
Offsets are byte positions in one log.  The log is cut into segment files under ``<root>/commitlog``
named by their base offset, zero-padded to 20 digits.  A segment is *rolled before* a record that
would not fit, and no filler is written, so every segment boundary is a record boundary and the
next segment's base is exactly the previous segment's end.

The active (last) segment is preallocated to ``segment_size`` bytes (a sparse ``ftruncate``) and
mapped once; its unwritten part is zeros, which never decode as a record.  When it is sealed by a
roll it is ``ftruncate``-d to its data length, so a sealed file's size is its data size.  Appends
are ``pwrite``-s of whole batches; reads are ``memoryview``-s over the maps.

Bytes are only ever removed from the active segment by overwriting them with zeros (then
``fsync``), never by shrinking a file that may be mapped: a reader holding a view of the removed
range then sees zeros instead of the process dying of SIGBUS.  Later segments are unlinked and the
directory fsynced.  A segment that becomes active again (truncation into a sealed segment) is
re-extended to ``segment_size``.

``recover(start)`` scans records from the start of the segment holding ``start`` (the checkpoint's
verified offset) to the end of data and cuts at the first invalid or torn record: the cut bytes
are zeroed, later segments deleted, and the number of non-zero bytes removed is returned.

This class does no locking; :class:`rocketray.broker.store.MessageStore` serialises calls.
"""

from __future__ import annotations

import bisect
import logging
import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from rocketray.broker.checkpoint import data_end, nonzero_end, sync_fds
from rocketray.durable import fsync_dir
from rocketray.broker.message import HEADER_SIZE, IndexInfo, MessageCodecError, decode_index, verify_record

__all__ = ["CommitLog", "Segment", "StoreError", "segment_name", "sync_fds"]

log = logging.getLogger(__name__)

_ZERO_CHUNK = bytes(1 << 20)  # for zeroing cut ranges
_SIZE = struct.Struct(">I")
_PHYSICAL = struct.Struct(">q")


class StoreError(Exception):
    """A refused store operation (bad offset, non-boundary truncation, closed store)."""

    retriable = False


def segment_name(base_offset: int) -> str:
    """File name of the segment starting at ``base_offset``."""
    return f"{base_offset:020d}"


@dataclass(eq=False)
class Segment:
    """One segment file: ``size`` bytes of records starting at ``base_offset``."""

    base_offset: int
    path: Path
    fd: int
    size: int = 0
    sealed: bool = False
    mm: mmap.mmap | None = field(default=None, repr=False)

    @property
    def end_offset(self) -> int:
        return self.base_offset + self.size

    def view(self) -> memoryview:
        """A view of this segment's mapped bytes (whole map, not only data)."""
        if self.mm is None:
            length = os.fstat(self.fd).st_size
            if length == 0:
                return memoryview(b"")
            self.mm = mmap.mmap(self.fd, length, access=mmap.ACCESS_READ)
        return memoryview(self.mm)

    def remap(self) -> None:
        """Drop the current map (after the file grew); readers keep their views."""
        if self.mm is not None:
            try:
                self.mm.close()
            except BufferError:
                pass  # a reader still holds a view; the map lives until it is released
            self.mm = None

    def close(self) -> None:
        self.remap()
        os.close(self.fd)


class CommitLog:
    """The segment files of one store (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike[str], segment_size: int, initial_offset: int = 0) -> None:
        self.dir = Path(directory)
        self.segment_size = segment_size
        self.dir.mkdir(parents=True, exist_ok=True)
        self.segments: list[Segment] = []
        self._dirty: set[Segment] = set()
        self._dir_dirty = False
        for path in sorted(self.dir.iterdir()):
            if path.name.isdigit() and len(path.name) == 20:
                fd = os.open(path, os.O_RDWR)
                size = os.fstat(fd).st_size
                self.segments.append(Segment(int(path.name), path, fd, size=size, sealed=True))
            elif path.name.endswith(".tmp"):
                path.unlink()
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
        idx = bisect.bisect_right([s.base_offset for s in self.segments], offset) - 1
        return self.segments[idx]

    # ------------------------------------------------------------------ writing
    def _create_segment(self, base_offset: int) -> Segment:
        path = self.dir / segment_name(base_offset)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        seg = Segment(base_offset, path, fd, size=0)
        self.segments.append(seg)
        self._activate(seg)
        self._dir_dirty = True
        return seg

    def _activate(self, seg: Segment) -> None:
        """Make ``seg`` writable: extend to the segment size and map it read/write."""
        seg.sealed = False
        if os.fstat(seg.fd).st_size < self.segment_size:
            os.ftruncate(seg.fd, self.segment_size)
        seg.remap()
        seg.mm = mmap.mmap(seg.fd, os.fstat(seg.fd).st_size)

    def _seal(self, seg: Segment) -> None:
        """Cut the preallocated tail of ``seg``; readers never look beyond its data."""
        os.ftruncate(seg.fd, seg.size)
        seg.sealed = True
        self._dirty.add(seg)

    def append(self, records: Sequence[bytes | memoryview]) -> int:
        """Append whole records (positions already encoded); rolls segments as needed; returns the new end."""
        pending: list[bytes | memoryview] = []
        pending_size = 0
        seg = self.active
        for rec in records:
            size = len(rec)
            if size > self.segment_size:
                raise ValueError(f"record of {size} bytes does not fit a segment of {self.segment_size}")
            if seg.size + pending_size + size > self.segment_size:
                self._write(seg, pending, pending_size)
                pending, pending_size = [], 0
                self._seal(seg)
                seg = self._create_segment(seg.end_offset)
            pending.append(rec)
            pending_size += size
        self._write(seg, pending, pending_size)
        return self.max_offset

    def _write(self, seg: Segment, chunks: list[bytes | memoryview], total: int) -> None:
        if not chunks:
            return
        data = b"".join(chunks) if len(chunks) > 1 else chunks[0]
        view = memoryview(data)
        pos = seg.size
        while view:
            written = os.pwrite(seg.fd, view, pos)
            view, pos = view[written:], pos + written
        seg.size += total
        self._dirty.add(seg)

    # ------------------------------------------------------------------ flushing
    def take_dirty_fds(self) -> tuple[list[int], bool]:
        """Duplicated fds of segments written since the last call, and whether the directory changed.

        The caller fsyncs and closes the fds outside the store lock (``dup`` keeps them valid even if
        retention closes the segment meanwhile).
        """
        fds = [os.dup(seg.fd) for seg in self._dirty]
        dir_dirty, self._dir_dirty = self._dir_dirty, False
        self._dirty.clear()
        return fds, dir_dirty

    def flush(self) -> None:
        """fsync everything written so far (and the directory if segments were created or deleted)."""
        fds, dir_dirty = self.take_dirty_fds()
        sync_fds(fds, self.dir if dir_dirty else None)

    # ------------------------------------------------------------------ reading
    def read(self, offset: int, length: int) -> memoryview:
        """Up to ``length`` bytes from ``offset``, not crossing a segment end nor ``max_offset``."""
        seg = self.segment_for(offset)
        if seg is None:
            return memoryview(b"")
        rel = offset - seg.base_offset
        return seg.view()[rel:min(seg.size, rel + length)]

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

    def index_records(self, start: int, end: int) -> Iterator[IndexInfo]:
        """Index info of the whole records in ``[start, end)`` (``start`` a boundary); stops early at an
        invalid one (logged).  Records are trusted (verified when written or recovered)."""
        pos = start
        while pos < end:
            view = self.read(pos, end - pos)
            rel = 0
            while rel + HEADER_SIZE <= len(view):
                size = _SIZE.unpack_from(view, rel)[0]
                if rel + size > len(view):
                    break
                try:
                    info = decode_index(view, rel)
                except MessageCodecError as exc:
                    log.error("commit log %s: invalid record at %d: %s", self.dir, pos + rel, exc)
                    return
                yield info
                rel += size
            del view
            if rel == 0:
                return
            pos += rel

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
            pos += os.pwrite(seg.fd, memoryview(_ZERO_CHUNK)[:n], pos)

    def _garbage_end(self, seg: Segment, start: int, known: bool) -> int:
        """End of the bytes of ``seg`` from ``start`` that may be non-zero.

        ``known``: in normal operation everything past ``seg.size`` is zeros.  Otherwise (recovery)
        the file is searched, skipping sparse holes with SEEK_DATA/SEEK_HOLE.
        """
        if known:
            return max(start, seg.size)
        end = data_end(seg.fd, start, os.fstat(seg.fd).st_size)
        view = seg.view()
        try:
            return nonzero_end(view, start, min(end, len(view)))
        finally:
            del view

    def _drop_after(self, idx: int, known: bool) -> int:
        """Delete segments after index ``idx``; returns their non-zero byte count."""
        removed = 0
        for seg in self.segments[idx + 1:]:
            removed += self._garbage_end(seg, 0, known)
            self._dirty.discard(seg)
            seg.close()
            seg.path.unlink()
        del self.segments[idx + 1:]
        fsync_dir(self.dir)
        return removed

    def cut(self, offset: int, recovering: bool = False) -> int:
        """Remove every byte at or after ``offset`` durably; returns how many non-zero bytes went.

        ``offset`` must lie in ``[min_offset, max_offset]``; checking it is a record boundary is the
        caller's job.  On return the cut bytes are zeros on disk (fsynced) or their files are gone.
        ``recovering``: segment sizes past ``offset`` are not trusted, the files are searched.
        """
        assert self.min_offset <= offset, (offset, self.min_offset)
        idx = bisect.bisect_right([s.base_offset for s in self.segments], offset) - 1
        removed = self._drop_after(idx, known=not recovering)
        seg = self.segments[idx]
        rel = offset - seg.base_offset
        garbage_end = self._garbage_end(seg, rel, known=not recovering)
        self._activate(seg)
        removed += garbage_end - rel
        self._zero(seg, rel, garbage_end)
        seg.size = rel
        os.fsync(seg.fd)
        self._dirty.discard(seg)
        return removed

    def delete_expired(self, now_ms: int, retention_ms: int | None, max_bytes: int | None, keep_from: int) -> int:
        """Delete head segments older than ``retention_ms`` (file mtime) or while the log is larger than
        ``max_bytes``; never the active one nor one holding bytes at or after ``keep_from``."""
        deleted = 0
        while len(self.segments) > 1 and self.segments[0].end_offset <= keep_from:
            head = self.segments[0]
            too_big = max_bytes is not None and self.max_offset - self.min_offset > max_bytes
            age_ms = now_ms - os.fstat(head.fd).st_mtime_ns // 1_000_000
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
        seg.path.unlink()
        fsync_dir(self.dir)
        return seg

    def reset(self, base_offset: int) -> None:
        """Throw the (empty) log away and start it at ``base_offset`` (a slave's first transfer)."""
        assert self.min_offset == self.max_offset, "reset only an empty log"
        for seg in self.segments:
            self._dirty.discard(seg)
            seg.close()
            seg.path.unlink()
        self.segments = []
        self._create_segment(base_offset)
        fsync_dir(self.dir)

    def close(self) -> None:
        for seg in self.segments:
            seg.close()

    # ------------------------------------------------------------------ recovery
    def _scan(self, seg: Segment, rel: int) -> int:
        """Relative end of the last valid record of ``seg`` scanning from ``rel``."""
        view = seg.view()
        limit = min(len(view), os.fstat(seg.fd).st_size)
        try:
            while rel < limit:
                try:
                    size, physical = verify_record(view[:limit], rel)
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

        Scanning starts at the beginning of the segment holding ``start_offset`` (the checkpoint's
        verified offset), so a torn write is found even if it lies before that offset; segments
        before it are trusted.
        """
        bases = [s.base_offset for s in self.segments]
        idx = max(0, bisect.bisect_right(bases, start_offset) - 1)
        for seg in self.segments[:idx]:
            seg.size = os.fstat(seg.fd).st_size
        pos = self.segments[idx].base_offset
        for i in range(idx, len(self.segments)):
            seg = self.segments[i]
            if seg.base_offset != pos:
                log.warning("commit log gap: segment %s does not start at %d", seg.path.name, pos)
                break
            seg.size = self._scan(seg, 0)
            pos, idx = seg.end_offset, i
            if seg.size != os.fstat(seg.fd).st_size:
                break
        cut = self.cut(pos, recovering=True)
        for seg in self.segments[:-1]:
            seg.sealed = True
        return cut
