"""Epoch file: the ordered ``epoch -> start offset`` history of a replica (reference 12.1, 12.2).

Theory of operation
-------------------
Each master term (epoch) starts writing at some commit-log offset; the list of ``(epoch,
start_offset)`` pairs, strictly increasing in both, is what replicas compare to find where their
logs diverge (``rocketray.ha.truncation.find_consistent_point``).  End offsets are not stored: an entry ends where the next
one starts and the last one ends at ``2**63 - 1`` until the owner sets it in memory.

On disk the list is a ``CheckpointFile`` in the reference's exact text format::

    <count>\\n<crc32 of the entry lines, masked with 0x7FFFFFFF>\\n<epoch>-<startOffset>\\n...

Every write replaces the main file durably (temp + fsync + rename + directory fsync) and then
writes the same content to ``<path>.bak`` the same way. A promotion (``start_epoch(...,
backup_later=True)``) returns once the main file is durable and leaves the ``.bak`` copy to
``write_backup()``, which the new master's IO thread runs next: its two fsyncs are off the
failover's path. A crash in between leaves ``.bak`` one version behind the main file, which is
what RocketMQ's ``.bak`` always is (it holds the previous content); the main file is read first.
A read falls back to ``.bak`` when the main file is missing, zero-length or invalid. Deliberate fix
of quirk 18.8: an empty list is written too (``0\\n0\\n``) and a valid empty main file is believed,
so truncating every entry sticks.

A cache with ``path=None`` is a scratch cache (no IO), used for the master's entries in the HA
handshake.  The pure text codec is ``encode_entries`` / ``decode_entries``.  File IO goes through
the disk port (``rocketray.fs.Disk``, the real disk by default).
"""

from __future__ import annotations

import logging
import os
import threading
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable

from rocketray.fs import OS_DISK, Disk, ensure_dir, read_file
from rocketray.durable import write_durably

__all__ = ["EpochEntry", "EpochFileCache", "EpochFileError", "MAX_END_OFFSET", "decode_entries",
           "encode_entries", "entries_crc"]

log = logging.getLogger(__name__)

MAX_END_OFFSET = 2**63 - 1
EPOCH_FILE_NAME = "epochFileCheckpoint"


class EpochFileError(ValueError):
    """Text that is not a valid checkpoint file (count or CRC mismatch, bad numbers)."""


@dataclass(frozen=True, slots=True)
class EpochEntry:
    """One term: ``epoch`` wrote from ``start_offset`` up to ``end_offset`` (exclusive)."""

    epoch: int
    start_offset: int
    end_offset: int = MAX_END_OFFSET


def entries_crc(entries: Iterable[tuple[int, int]]) -> int:
    """The masked CRC32 of the entry block, as in the file's second line."""
    block = "".join(f"{e}-{s}\n" for e, s in entries).encode("utf-8")
    return zlib.crc32(block) & 0x7FFFFFFF


def encode_entries(entries: Iterable[tuple[int, int]]) -> bytes:
    """The checkpoint text of ``(epoch, start_offset)`` pairs."""
    pairs = list(entries)
    block = "".join(f"{e}-{s}\n" for e, s in pairs)
    crc = zlib.crc32(block.encode("utf-8")) & 0x7FFFFFFF
    return f"{len(pairs)}\n{crc}\n{block}".encode("utf-8")


def decode_entries(data: bytes) -> list[tuple[int, int]]:
    """Parse checkpoint text; raises :class:`EpochFileError`. CRC 0 means "not checked"."""
    try:
        lines = data.decode("utf-8").split("\n")
        count, crc = int(lines[0]), int(lines[1])
    except (UnicodeDecodeError, ValueError, IndexError) as exc:
        raise EpochFileError(f"bad checkpoint header: {exc}") from None
    pairs: list[tuple[int, int]] = []
    block = []
    for line in lines[2:]:
        parts = line.split("-")
        if len(parts) != 2:
            continue  # the reference ignores lines that do not split into two parts
        try:
            pairs.append((int(parts[0]), int(parts[1])))
        except ValueError:
            raise EpochFileError(f"bad entry line {line!r}") from None
        block.append(line + "\n")
    if count != len(pairs):
        raise EpochFileError(f"count {count} but {len(pairs)} entries")
    if crc != 0 and zlib.crc32("".join(block).encode("utf-8")) & 0x7FFFFFFF != crc:
        raise EpochFileError("entry CRC mismatch")
    return pairs


def _read_file(disk: Disk, path: Path) -> list[tuple[int, int]] | None:
    """Entries of one file; ``None`` when missing, zero-length or invalid."""
    data = read_file(disk, path)
    if not data:
        return None
    try:
        return decode_entries(data)
    except EpochFileError as exc:
        log.warning("epoch file %s is invalid: %s", path, exc)
        return None


class EpochFileCache:
    """The ordered epoch map of reference 12.2, persisted at ``path`` (``None``: scratch, no IO)."""

    def __init__(self, path: str | os.PathLike[str] | None, entries: Iterable[EpochEntry] | None = None,
                 disk: Disk = OS_DISK) -> None:
        self.path = Path(path) if path is not None else None
        self.disk = disk
        self._lock = threading.RLock()
        # a tuple replaced whole under ``_lock``: readers take the reference without the lock, so
        # a reader on the event loop never waits for a write's fsyncs on the IO thread
        self._entries: tuple[EpochEntry, ...] = ()
        self._defer_backup = False
        self._backup_due: bytes | None = None   # content the .bak copy still waits for (write_backup)
        #: why no copy of the file could be read though one exists (None: read, or none written yet)
        self.unreadable: str | None = None
        if entries is not None:
            self.init_from_entries(entries)
        elif self.path is not None:
            self._init_from_file()

    @classmethod
    def scratch(cls, entries: Iterable[EpochEntry | tuple[int, int]]) -> "EpochFileCache":
        """An in-memory cache built like ``initFromEntries`` (ends recomputed from starts)."""
        return cls(None, [e if isinstance(e, EpochEntry) else EpochEntry(*e) for e in entries])

    # -------------------------------------------------------------- persistence
    def _init_from_file(self) -> None:
        assert self.path is not None
        pairs = _read_file(self.disk, self.path)
        if pairs is None:
            backup = self.path.with_name(self.path.name + ".bak")
            pairs = _read_file(self.disk, backup)
            if pairs is None and (read_file(self.disk, self.path) or read_file(self.disk, backup)):
                self.unreadable = f"{self.path} and its .bak are both damaged (CRC or count mismatch)"
            pairs = pairs or []
        self._rebuild(EpochEntry(e, s) for e, s in pairs)

    def _rebuild(self, entries: Iterable[EpochEntry]) -> None:
        ordered = sorted(entries, key=lambda e: e.epoch)
        self._entries = tuple(
            EpochEntry(e.epoch, e.start_offset,
                       ordered[i + 1].start_offset if i + 1 < len(ordered) else MAX_END_OFFSET)
            for i, e in enumerate(ordered)
        )

    def _flush(self) -> None:
        if self.path is None:
            return
        data = encode_entries((e.epoch, e.start_offset) for e in self._entries)
        ensure_dir(self.disk, self.path.parent)
        write_durably(self.path, data, disk=self.disk)
        if self._defer_backup:
            self._backup_due = data
        else:
            self._write_backup(data)

    def _write_backup(self, data: bytes) -> None:
        assert self.path is not None
        write_durably(self.path.with_name(self.path.name + ".bak"), data, disk=self.disk)
        self._backup_due = None

    def write_backup(self) -> None:
        """Write the ``.bak`` copy a ``start_epoch(..., backup_later=True)`` left due (else nothing)."""
        with self._lock:
            if self._backup_due is not None:
                self._write_backup(self._backup_due)

    @property
    def backup_due(self) -> bool:
        return self._backup_due is not None

    def init_from_entries(self, entries: Iterable[EpochEntry]) -> None:
        """Replace the map (ends recomputed from the next start) and persist."""
        with self._lock:
            self._rebuild(entries)
            self._flush()

    # -------------------------------------------------------------- queries
    def entries(self) -> list[EpochEntry]:
        return list(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def first_entry(self) -> EpochEntry | None:
        entries = self._entries
        return entries[0] if entries else None

    def last_entry(self) -> EpochEntry | None:
        entries = self._entries
        return entries[-1] if entries else None

    def last_epoch(self) -> int:
        """The highest epoch, -1 if empty."""
        last = self.last_entry()
        return last.epoch if last is not None else -1

    def get_entry(self, epoch: int) -> EpochEntry | None:
        return next((e for e in self._entries if e.epoch == epoch), None)

    def find_by_offset(self, offset: int) -> EpochEntry | None:
        """The entry with ``start <= offset < end``."""
        return next((e for e in self._entries if e.start_offset <= offset < e.end_offset), None)

    def next_entry(self, epoch: int) -> EpochEntry | None:
        """The entry with the smallest epoch greater than ``epoch``."""
        return next((e for e in self._entries if e.epoch > epoch), None)

    # -------------------------------------------------------------- changes
    def append(self, entry: EpochEntry | int, start_offset: int | None = None) -> bool:
        """Append ``entry`` (or ``(epoch, start_offset)``); refused (False) unless both epoch and start
        offset are strictly greater than the last entry's."""
        if not isinstance(entry, EpochEntry):
            assert start_offset is not None, "append(epoch, start_offset)"
            entry = EpochEntry(entry, start_offset)
        with self._lock:
            entries = list(self._entries)
            if entries:
                last = entries[-1]
                if last.epoch >= entry.epoch or last.start_offset >= entry.start_offset:
                    log.warning("epoch entry %s refused after %s", entry, last)
                    return False
                entries[-1] = replace(last, end_offset=entry.start_offset)
            entries.append(EpochEntry(entry.epoch, entry.start_offset, MAX_END_OFFSET))
            self._entries = tuple(entries)
            self._flush()
            return True

    def set_last_entry_end_offset(self, end_offset: int) -> None:
        """In memory only: the last entry ends at ``end_offset`` (if it starts at or before it)."""
        with self._lock:
            entries = self._entries
            if entries and entries[-1].start_offset <= end_offset:
                self._entries = (*entries[:-1], replace(entries[-1], end_offset=end_offset))

    def _truncate_suffix(self, keep) -> None:
        with self._lock:
            kept = [e for e in self._entries if keep(e)]
            if kept:
                kept[-1] = replace(kept[-1], end_offset=MAX_END_OFFSET)
            self._entries = tuple(kept)
            self._flush()

    def truncate_suffix_by_epoch(self, epoch: int) -> None:
        """Remove entries with ``epoch >= epoch``."""
        self._truncate_suffix(lambda e: e.epoch < epoch)

    def start_epoch(self, epoch: int, max_offset: int, backup_later: bool = False) -> None:
        """A new master term begins at ``max_offset`` (idempotent for the term already started).

        Entries starting at or after ``max_offset`` hold no data (a promotion with no writes); the
        new epoch replaces them, since start offsets must strictly increase. ``backup_later``: the
        main file is durable on return, the ``.bak`` copy waits for ``write_backup()``."""
        with self._lock:
            if self.last_epoch() == epoch:
                return
            self._defer_backup = backup_later
            try:
                last = self.last_entry()
                if last is not None and last.start_offset >= max_offset:
                    self.truncate_suffix_by_offset(max_offset)
                assert self.append(epoch, max_offset), (epoch, max_offset, self.entries())
            finally:
                self._defer_backup = False

    def truncate_suffix_by_offset(self, offset: int) -> None:
        """Remove entries that start at or after ``offset``."""
        self._truncate_suffix(lambda e: e.start_offset < offset)

    def truncate_prefix_by_offset(self, offset: int) -> None:
        """Remove entries that end at or before ``offset`` (retention deleted their data)."""
        with self._lock:
            self._entries = tuple(e for e in self._entries if e.end_offset > offset)
            self._flush()
