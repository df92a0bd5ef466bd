"""The controller's Raft journal: durable before anything that depends on it leaves the node.

Theory of operation. pysyncobj 0.3.17's ``FileJournal`` writes through mmap and never syncs, and
compacts by clearing the file and re-adding the kept entries in place, so a power loss (not a
process kill: the page cache survives that) could lose acknowledged entries or leave half a
journal; its term/vote file is renamed into place without fsync. ``DurableJournal`` replaces it
(``RaftHost`` installs it right after pysyncobj's constructor, see ``controller/raft.py``) and
keeps Raft's persistence rules:

* *Entries are on disk before they count.* ``add`` appends the record to an in-memory buffer;
  ``sync()`` writes the buffer with one ``pwrite`` and makes it durable with one fsync (an entry
  that was never synced was never acknowledged, so a crash may take it, as a power loss could
  take it from the page cache before). The host calls ``sync()``
  before every message it sends except the leader's own ``append_entries`` (so a follower's
  acknowledgement ``next_node_idx``, a vote and a candidate's vote request never leave before the
  entries and term they reflect are durable) and at the start of every tick (so the leader, whose
  commit rule counts itself, has its own entries on disk before it counts them). Entries appended
  between two syncs share one fsync: group commit. The leader sends ``append_entries`` before its
  own fsync, so its fsync and the followers' overlap.
* *Term and vote are synced before a vote is asked for or answered.* ``setCurrentTerm`` writes
  ``<journal>.meta`` with ``write_durably`` (temp file, fsync, rename, fsync dir) before returning.
* *Compaction never rewrites in place.* ``deleteEntriesTo`` and ``clear`` mark the file for a
  rewrite; the next ``sync()`` writes the kept entries to a temp file, fsyncs it, renames it over
  the journal and fsyncs the directory. A crash before that leaves the old (longer) journal.
* *Truncation only where the log really conflicts.* pysyncobj's follower drops every entry after
  ``prevLogIdx`` whenever an ``append_entries`` starts before its last entry (a duplicate, or a
  heartbeat after the leader moved its next index back on a late ack), then re-adds what the
  message carries: entries it had acknowledged vanish from its log until the leader resends them.
  ``deleteEntriesFrom`` therefore only moves the dropped entries to a *shadow* (still in the
  file, no longer in the log pysyncobj sees); an ``add`` equal to the first shadow entry takes it
  back without writing, and the first ``add`` that differs (a real conflict: same index, other
  term or command) truncates the file there. So the file is always the in-memory log or an
  earlier valid state of it that extends it, and a power loss cannot take away an acknowledged
  entry through a duplicate delivery.

On disk: the 8-byte magic ``RRJRNL01``, then one frame per entry: ``>II`` (payload length, CRC-32 of
the payload) + payload ``>QQ`` (index, term) + the command bytes. Opening scans the frames and
stops at the first short, CRC-failing, non-contiguous or term-decreasing one (a torn tail or
pieces of a truncated older suffix a power loss left behind) and cuts the file there: those
bytes were never synced, so nothing acknowledged is lost. The commit index is a hint (a lower
bound of what is committed), saved with the term/vote at most once a second, and never read back
above the last entry. So is ``synced_index``, the highest entry index the file held at a sync:
a file whose valid frames end below it lost durable entries (a damaged frame, a cut tail) and the
node refuses to start (``journal_verdict``, ``JournalDamaged``). It is lowered durably before the
file drops entries on purpose (a conflict, a clear, a compaction) and raised lazily, so entries
synced in the last second before a crash are not covered: their loss reads as a torn tail.

All IO goes through the disk port (``rocketray.fs.Disk``), so the power-loss tests run the
journal over the simulated disk (``rocketray.sim.disk.SimDisk``).
"""

from __future__ import annotations

import logging
import os
import posixpath
import struct
import threading
import zlib
from typing import Any

import msgpack
from pysyncobj.journal import Journal

from rocketray.fs import OS_DISK, Disk, DiskFile, read_file
from rocketray.durable import write_durably

log = logging.getLogger(__name__)

MAGIC = b"RRJRNL01"
FRAME = struct.Struct(">II")
ENTRY = struct.Struct(">QQ")
MAX_ENTRY_BYTES = 64 << 20
META_VERSION = 1

Entry = tuple[bytes, int, int]


class JournalCorrupt(ValueError):
    """A journal or meta file that is not ours at all (wrong magic, undecodable meta)."""


class JournalDamaged(JournalCorrupt):
    """The journal lost entries it had made durable (a damaged frame or a cut tail before the last
    synced entry the meta file records): a Raft node that lost entries it may have acknowledged
    must not vote or serve with that log, so it refuses to start."""


def journal_verdict(last_index: int, synced_index: int, cut_bytes: int) -> str:
    """What opening a journal found: ``clean`` (every byte a valid frame), ``torn-tail`` (invalid
    bytes after the last valid frame, all beyond the last synced entry: a write never acknowledged),
    or ``damaged`` (the valid frames end before ``synced_index``, the highest entry index the file
    held when the meta was last saved: durable entries are gone). ``last_index``: the last valid
    entry's index (0 for none)."""
    if last_index < synced_index:
        return "damaged"
    return "torn-tail" if cut_bytes else "clean"


def encode_entry(command: bytes, index: int, term: int) -> bytes:
    """One journal frame (what ``add`` writes)."""
    payload = ENTRY.pack(index, term) + command
    return FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def scan_entries(data: bytes) -> tuple[list[Entry], list[int], int]:
    """(entries, their frame offsets, bytes the valid frames span, magic included) of a journal
    file; stops at the first frame that is short, damaged, non-contiguous or goes back in term."""
    if not data:
        return [], [], 0
    if len(data) < len(MAGIC):
        return [], [], 0  # a torn creation
    if data[:len(MAGIC)] != MAGIC:
        raise JournalCorrupt(f"not a rocketray journal (magic {data[:8]!r})")
    entries: list[Entry] = []
    offsets: list[int] = []
    pos = len(MAGIC)
    view = memoryview(data)
    while pos + FRAME.size <= len(data):
        length, crc = FRAME.unpack_from(data, pos)
        start, end = pos + FRAME.size, pos + FRAME.size + length
        if length < ENTRY.size or length > MAX_ENTRY_BYTES or end > len(data) or zlib.crc32(view[start:end]) != crc:
            break
        index, term = ENTRY.unpack_from(data, start)
        if entries and (index != entries[-1][1] + 1 or term < entries[-1][2]):
            break
        entries.append((bytes(view[start + ENTRY.size:end]), index, term))
        offsets.append(pos)
        pos = end
    return entries, offsets, pos


class DurableJournal(Journal):
    """pysyncobj's ``Journal`` interface over one append-only file; see the module docstring.

    Thread-safety: pysyncobj calls it from the tick thread; ``sync`` and the read accessors may
    also be called from other threads (status), so mutations hold a lock."""

    def __init__(self, path: str | os.PathLike[str], disk: Disk = OS_DISK, fsync: bool = True) -> None:
        self.path = os.fspath(path)
        self.meta_path = self.path + ".meta"
        self.directory = posixpath.dirname(self.path) or "."
        self.disk = disk
        self.fsync_enabled = fsync
        self._lock = threading.RLock()
        self.syncs = 0              # fsyncs of the journal file (group commits)
        self.rewrites = 0           # compactions/clears written as a new file
        self.truncated_bytes = 0    # torn or stale tail cut at open
        self._meta = self._load_meta()
        data = read_file(disk, self.path)
        created = data is None
        self._entries, self._offsets, valid = scan_entries(data or b"")
        last = self._entries[-1][1] if self._entries else 0
        synced = int(self._meta.get("synced_index", 0))
        if journal_verdict(last, synced, len(data or b"") - valid) == "damaged":
            raise JournalDamaged(
                f"journal {self.path}: its valid entries end at {last} (byte {valid} of "
                f"{len(data or b'')}), but entries up to {synced} were durable: a frame is damaged or the "
                "file was cut. Refusing to start: this node may have acknowledged the lost entries. "
                "Restore the store from a backup, or wipe it so the node rejoins empty and catches up "
                "from the leader (docs/chaos.md: what that costs).")
        self._file: DiskFile = disk.open(self.path, create=True)
        if created or valid < len(MAGIC):
            self._file.truncate(0)
            self._file.pwrite(MAGIC, 0)
            self._fsync_file()
            disk.fsync_dir(self.directory)
            valid = len(MAGIC)
        elif data is not None and valid < len(data):
            self.truncated_bytes = len(data) - valid
            log.warning("journal %s: cut %d bytes of torn or stale tail after entry %s", self.path,
                        self.truncated_bytes, self._entries[-1][1] if self._entries else None)
            self._file.truncate(valid)
            self._fsync_file()
        self._end = valid           # logical end: file bytes up to _written, then the buffer
        self._written = valid       # bytes of the file that hold frames (written, maybe unsynced)
        self._buf = bytearray()     # frames added since the last sync, not yet written
        self._shadow: list[tuple[Entry, int]] = []   # (entry, offset) in the file, beyond the log
        self._dirty = False
        self._rewrite = False
        self._meta_saved = True
        self._lowered = False

    # -- pysyncobj's Journal ----------------------------------------------------------------------
    def add(self, command: Any, idx: int, term: int) -> None:
        entry = (bytes(command), int(idx), int(term))
        with self._lock:
            if self._shadow:
                old, offset = self._shadow[0]
                if old == entry:               # the same entry delivered again: nothing to write
                    self._shadow.pop(0)
                    self._entries.append(entry)
                    self._offsets.append(-1 if self._rewrite else offset)
                    return
                if not self._rewrite:
                    self._truncate(offset)         # a real conflict: the old suffix goes
                self._shadow = []
                self._dirty = True
            self._entries.append(entry)
            if self._rewrite:
                self._offsets.append(-1)  # written by the pending rewrite
            else:
                frame = encode_entry(*entry)
                self._buf += frame
                self._offsets.append(self._end)
                self._end += len(frame)
            self._dirty = True

    def _truncate(self, offset: int) -> None:
        """Cut the journal at ``offset``: in the buffer if it was not written yet, else the file."""
        self._lower_synced_index(self._entries[-1][1] if self._entries else 0)   # the shadow is what goes
        if offset >= self._written:
            del self._buf[offset - self._written:]
        else:
            self._buf.clear()
            self._file.truncate(offset)
            self._written = offset
        self._end = offset

    def clear(self) -> None:
        with self._lock:
            self._lower_synced_index(0)
            self._entries, self._offsets, self._shadow = [], [], []
            self._rewrite = self._dirty = True

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        """Drop entries from position ``entryFrom`` on from the log; they stay in the file as the
        shadow until an ``add`` conflicts with them (see the module docstring)."""
        with self._lock:
            if entryFrom >= len(self._entries):
                return
            dropped = list(zip(self._entries[entryFrom:], self._offsets[entryFrom:]))
            del self._entries[entryFrom:]
            del self._offsets[entryFrom:]
            self._shadow = dropped + self._shadow

    def deleteEntriesTo(self, entryTo: int) -> None:
        with self._lock:
            del self._entries[:entryTo]
            del self._offsets[:entryTo]
            self._rewrite = self._dirty = True

    def __getitem__(self, item: Any) -> Any:
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    def _destroy(self) -> None:
        with self._lock:
            self.sync()
            if not self._meta_saved:
                self._save_meta()
            self._file.close()

    def flush(self) -> None:
        self.sync()

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        self._meta["commit_index"] = int(raftCommitIndex)
        self._meta_saved = False

    def getRaftCommitIndex(self) -> int:
        last = self._entries[-1][1] if self._entries else 1
        return max(1, min(int(self._meta.get("commit_index", 1)), last))

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:
        """Durable before it returns: pysyncobj sends the vote request/answer right after."""
        with self._lock:
            self._meta["term"] = int(term)
            self._meta["voted_for"] = votedForNodeId
            self._save_meta()

    def getCurrentTerm(self) -> int:
        return int(self._meta.get("term", 0))

    def getVotedForNodeId(self) -> Any:
        return self._meta.get("voted_for")

    def onOneSecondTimer(self) -> None:
        if not self._meta_saved:
            with self._lock:
                self._save_meta()

    # -- durability ---------------------------------------------------------------------------------
    @property
    def dirty(self) -> bool:
        """Entries or a rewrite not yet on disk."""
        return self._dirty

    def sync(self) -> None:
        """Make every entry added so far durable (one fsync for all of them), or write a pending
        compaction as a new file renamed over the old one."""
        with self._lock:
            if not self._dirty:
                return
            if self._rewrite:
                self._write_new_file()
            else:
                if self._buf:
                    self._file.pwrite(bytes(self._buf), self._written)
                    self._written += len(self._buf)
                    self._buf.clear()
                self._fsync_file()
            self._note_synced()
            self._dirty = False

    def _file_max_index(self) -> int:
        return max([e[1] for e in self._entries[-1:]] + [e[1] for e, _ in self._shadow[-1:]] + [0])

    def _note_synced(self) -> None:
        """The file's entries are durable: the meta (saved within a second) may say so; the start-up
        check (``journal_verdict``) then refuses a file that lost any of them."""
        index = self._file_max_index()
        if index > int(self._meta.get("synced_index", 0)):
            self._meta["synced_index"] = index
            self._meta_saved = False
            if self._lowered:   # raise it durably at once after it was lowered: the check stays tight
                self._save_meta()
                self._lowered = False

    def _lower_synced_index(self, index: int) -> None:
        """Entries above ``index`` leave the file on purpose (a conflict, a clear): the meta says so
        durably first, so the start-up check never takes their absence for damage."""
        if int(self._meta.get("synced_index", 0)) > index:
            self._meta["synced_index"] = index
            self._save_meta()
            self._lowered = True

    def _fsync_file(self) -> None:
        if self.fsync_enabled:
            self._file.fsync()
            self.syncs += 1

    def _write_new_file(self) -> None:
        self._lower_synced_index(self._file_max_index())
        tmp = self.path + ".rewrite"
        out = self.disk.open(tmp, create=True, truncate=True)
        parts, offsets, pos = [MAGIC], [], len(MAGIC)
        for entry in self._entries + [e for e, _ in self._shadow]:   # the shadow is kept too
            frame = encode_entry(*entry)
            parts.append(frame)
            offsets.append(pos)
            pos += len(frame)
        self._shadow = list(zip((e for e, _ in self._shadow), offsets[len(self._entries):]))
        offsets = offsets[:len(self._entries)]
        try:
            out.pwrite(b"".join(parts), 0)
            if self.fsync_enabled:
                out.fsync()
        finally:
            out.close()
        self._file.close()
        self.disk.rename(tmp, self.path)
        if self.fsync_enabled:
            self.disk.fsync_dir(self.directory)
        self._file = self.disk.open(self.path)
        self._offsets, self._end = offsets, pos
        self._written, self._buf = pos, bytearray()
        self._rewrite = False
        self.rewrites += 1
        self.syncs += 1

    def _load_meta(self) -> dict[str, Any]:
        data = read_file(self.disk, self.meta_path)
        if not data:
            return {}
        try:
            meta = msgpack.unpackb(data, raw=False)
        except (ValueError, msgpack.UnpackException) as exc:
            raise JournalCorrupt(f"{self.meta_path}: undecodable ({exc})") from exc
        if type(meta) is not dict or meta.get("version") != META_VERSION:
            raise JournalCorrupt(f"{self.meta_path}: not a version {META_VERSION} journal meta: {meta!r:.80}")
        return meta

    def _save_meta(self) -> None:
        meta = dict(self._meta, version=META_VERSION)
        write_durably(self.meta_path, msgpack.packb(meta, use_bin_type=True), disk=self.disk)
        self._meta_saved = True


def peek_entries(path: str | os.PathLike[str], disk: Disk = OS_DISK) -> list[Entry]:
    """The valid entries of a journal file without opening it for writing (recovery planning)."""
    data = read_file(disk, path)
    return scan_entries(data or b"")[0]
