"""pysyncobj's snapshot hooks and the start-up recovery plan of a controller node.

Theory of operation.

*Snapshots and log compaction.* pysyncobj compacts its journal after its `serializer` hook
wrote a full dump; it then deletes journal entries before the id the serializer reports. We
set `logCompactionMinEntries`/`MinTime` out of reach and instead call `forceLogCompaction()`
every `snapshot_threshold` applied entries. Our serializer writes a RIP-59 snapshot (controller
tables + the raft metadata pysyncobj needs back: last applied entry, previous entry, members)
into the snapshot store and, as pysyncobj's dump file, the same bytes (that file is what the
leader streams to a follower that fell behind the journal). Our `serializeChecker` then reports
success with the compaction point moved back to the *oldest kept* snapshot, so the journal
always covers every kept snapshot and a node can fall back to an older one if the newest is
damaged.

*Start.* pysyncobj loads the dump file on its first tick if the file exists, and if the journal
does not start with exactly the (previous, last) entries the dump names, it throws the journal
away. So before the host starts, the node plans recovery itself (`plan_recovery`): it loads the
newest valid snapshot into its own state machine and, when the journal was compacted, writes a
dump file whose raft metadata *is* the journal's first two entries. pysyncobj then keeps the
journal and replays it from there; the node skips entries at or below its snapshot index.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pysyncobj import SyncObj
from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.journal import FileJournal

from rocketray.fs import OS_DISK, Disk
from rocketray.controller.journal import DurableJournal, peek_entries
from rocketray.durable import write_durably
from rocketray.snapshot.format import (SECTION_CONTROLLER_STATE, SECTION_RAFT_META, SECTION_SNAPSHOT_META,
                                       decode_snapshot, encode_snapshot)
from rocketray.snapshot.store import SnapshotMeta, SnapshotStore

log = logging.getLogger("rocketray.controller.raft")

Entry = tuple[bytes, int, int]  # pysyncobj journal entry: (command, index, term)
_RAFT_SECTIONS = frozenset({SECTION_RAFT_META, SECTION_SNAPSHOT_META})  # written by SnapshotHooks itself


class RecoveryRefused(ValueError):
    """The node cannot rebuild its state from snapshot + journal; it must not start."""


@dataclass(frozen=True, slots=True)
class JournalHead:
    """The first two entries and the length of a journal file, read before the node starts."""

    length: int
    first: Entry | None
    second: Entry | None
    last_index: int

    @property
    def first_index(self) -> int | None:
        return None if self.first is None else self.first[1]


def peek_journal(path: str | os.PathLike[str], disk: Disk = OS_DISK) -> JournalHead:
    entries = peek_entries(path, disk)
    n = len(entries)
    return JournalHead(n, entries[0] if n > 0 else None, entries[1] if n > 1 else None,
                       entries[-1][1] if n > 0 else 0)


def import_pysyncobj_journal(old: Path, new: Path, disk: Disk = OS_DISK) -> bool:
    """Copy a journal pysyncobj's own FileJournal wrote (``old``, with its ``.meta``) into a
    ``DurableJournal`` at ``new`` once, before the first start on this format; False if there is
    nothing to import."""
    if not old.exists() or disk.exists(new):
        return False
    legacy = FileJournal(str(old))
    try:
        journal = DurableJournal(new, disk)
        for i in range(len(legacy)):
            journal.add(*_entry(legacy[i]))
        journal.setCurrentTerm(legacy.getCurrentTerm(), legacy.getVotedForNodeId())
        journal.setRaftCommitIndex(legacy.getRaftCommitIndex())
        journal._destroy()
    finally:
        legacy._destroy()
    log.info("imported %s (pysyncobj format) into %s", old, new)
    return True


def _entry(raw: Any) -> Entry:
    command, index, term = raw
    return bytes(command), int(index), int(term)


@dataclass(frozen=True, slots=True)
class RecoveryPlan:
    """What the node loads before pysyncobj starts."""

    snapshot: SnapshotMeta | None
    #: The snapshot's sections other than the Raft ones (SECTION_CONTROLLER_STATE, SECTION_TOPICS
    #: and SECTION_AUTH when present), empty without a snapshot.
    state_sections: dict[int, dict[str, Any]]
    startup_entries: tuple[Entry, Entry, list[str]] | None  # what the deserializer returns at start
    journal: JournalHead


def plan_recovery(store: SnapshotStore, journal_file: Path, dump_file: Path) -> RecoveryPlan:
    """Choose the snapshot to load and prepare pysyncobj's dump file; refuse partial states.

    The journal and the snapshots are read over the store's disk port; the dump file is
    pysyncobj's own (real disk) and is rebuilt here from a snapshot at every start."""
    head = peek_journal(journal_file, store.disk)
    first = head.first_index or 0
    compacted = first > 1
    loaded = store.load_newest_valid()
    if loaded is None:
        if compacted:
            raise RecoveryRefused(
                f"no valid snapshot in {store.dir} (damaged ones set aside: "
                f"{[p.name for p in store.set_aside]}) and the journal {journal_file} starts at entry "
                f"{first}, not 1: the entries before it are gone, so the state cannot be rebuilt. "
                "Refusing to start with a partial state; restore a snapshot, or wipe this node's store "
                "so it rejoins empty and catches up from the leader.")
        dump_file.unlink(missing_ok=True)
        return RecoveryPlan(None, {}, None, head)
    meta, sections = loaded
    if compacted and meta.index < first + 1:
        raise RecoveryRefused(
            f"newest valid snapshot {meta.path.name} covers the log up to {meta.index}, but the journal "
            f"{journal_file} starts at entry {first}: entries {meta.index + 1}..{first} are missing. "
            "Refusing to start with a partial state.")
    if head.last_index and meta.index > head.last_index:
        log.warning("snapshot index %d is beyond the journal end %d (journal lost its tail?)",
                    meta.index, head.last_index)
    raft_meta = sections.get(SECTION_RAFT_META)
    if SECTION_CONTROLLER_STATE not in sections or raft_meta is None:
        raise RecoveryRefused(f"snapshot {meta.path} lacks the controller or raft section")
    state_sections = {t: body for t, body in sections.items() if t not in _RAFT_SECTIONS}
    if not compacted:
        dump_file.unlink(missing_ok=True)
        return RecoveryPlan(meta, state_sections, None, head)
    cluster = list(raft_meta.get("cluster", []))
    if head.second is not None:
        startup = (head.second, head.first, cluster)
    else:
        startup = (_entry(raft_meta["last"]), _entry(raft_meta["prev"]), cluster)
    _write_file(dump_file, store.read_bytes(meta.index))
    log.info("recovery: snapshot index=%d, journal %d..%d (%d entries) replayed above it",
             meta.index, first, head.last_index, head.length)
    return RecoveryPlan(meta, state_sections, startup, head)  # type: ignore[arg-type]


def _write_file(path: Path, data: bytes) -> None:
    write_durably(path, data, tmp_name=path.name + ".plan.tmp")


class SnapshotHooks:
    """pysyncobj's serializer / deserializer / serializeChecker, bound to one node.

    `capture()` returns `(applied_index, {section type: body})` consistently (it runs on the
    tick thread, the only thread that applies): the controller's own sections, to which the Raft
    ones are added here. `install(index, sections)` replaces the node's state with a snapshot
    received from the leader (every section of it, the Raft ones included).
    """

    def __init__(self, store: SnapshotStore, dump_file: Path,
                 capture: Callable[[], tuple[int, dict[int, dict[str, Any]]]],
                 install: Callable[[int, dict[int, dict[str, Any]]], None],
                 startup_entries: tuple[Entry, Entry, list[str]] | None) -> None:
        self.store = store
        self.dump_file = dump_file
        self.capture = capture
        self.install = install
        self.host: SyncObj | None = None  # the node's RaftHost, set once it is built
        self.startup_entries = startup_entries
        self.started = False
        self.pending: str | None = None
        self.truncate_to = 0
        self.last_snapshot_index = 0
        self.last_snapshot_ms = 0.0
        self.max_snapshot_ms = 0.0
        self.snapshots_taken = 0
        self.dumps_installed = 0
        self.last_persist_ms = 0.0
        self.serialize_calls = 0
        self._writer: threading.Thread | None = None

    # -- pysyncobj hooks (all on the tick thread) ---------------------------------------------
    def serialize(self, tmp_file: str, data: tuple[Any, Any, Any]) -> None:
        """Tick thread: capture + encode + write pysyncobj's dump file; the durable store write
        (fsyncs) runs on a background thread; `check` reports SERIALIZING until it is done, and
        pysyncobj compacts the journal only after that."""
        started = time.monotonic()
        self.serialize_calls += 1
        try:
            last, prev, cluster = data
            blob, last_entry = self._encode(_entry(last), _entry(prev), cluster)
            with open(tmp_file, "wb") as f:
                f.write(blob)
            self.last_snapshot_index = last_entry[1]
            self.pending = "writing"
            self._writer = threading.Thread(target=self._persist, args=(blob, last_entry), daemon=True,
                                            name="snapshot-writer")
            self._writer.start()
        except Exception:
            self.pending = "failed"
            log.exception("snapshot failed")
            raise
        finally:
            self.last_snapshot_ms = (time.monotonic() - started) * 1000
            self.max_snapshot_ms = max(self.max_snapshot_ms, self.last_snapshot_ms)

    def _encode(self, last: Entry, prev: Entry, cluster: Any) -> tuple[bytes, Entry]:
        applied_index, state_sections = self.capture()
        if applied_index > last[1]:
            raise RuntimeError(f"state at {applied_index} is ahead of the raft log at {last[1]} (replay)")
        assert SECTION_CONTROLLER_STATE in state_sections, "capture must return the controller state"
        assert not set(state_sections) & _RAFT_SECTIONS, "capture must not write the Raft sections"
        members = sorted(getattr(n, "address", str(n)) for n in cluster)
        sections = {
            **state_sections,
            SECTION_RAFT_META: {"last": list(last), "prev": list(prev), "cluster": members},
            SECTION_SNAPSHOT_META: {"index": last[1], "term": last[2]},
        }
        return encode_snapshot(sections), last

    def _persist(self, blob: bytes, last: Entry) -> None:
        started = time.monotonic()
        try:
            self.store.save_bytes(last[1], last[2], blob)
            kept = self.store.list()
            self.truncate_to = max(1, (kept[0] if kept else last[1]) - 1)
            self.snapshots_taken += 1
            self.pending = "ok"
        except Exception:
            log.exception("snapshot write failed index=%d", last[1])
            self.pending = "failed"
        self.last_persist_ms = (time.monotonic() - started) * 1000

    def check(self) -> int:
        pending = self.pending
        if pending is None:
            return SERIALIZER_STATE.NOT_SERIALIZING
        if pending == "writing":
            return SERIALIZER_STATE.SERIALIZING
        self.pending = None
        if pending == "failed":
            return SERIALIZER_STATE.FAILED
        # Compact only up to the oldest kept snapshot (pysyncobj would cut at the newest).
        assert self.host is not None
        self.host._SyncObj__serializer._Serializer__currentID = self.truncate_to  # type: ignore[attr-defined]
        return SERIALIZER_STATE.SUCCESS

    def wait_idle(self, timeout_s: float = 10.0) -> None:
        """Wait for a background snapshot write (used on close)."""
        writer = self._writer
        if writer is not None:
            writer.join(timeout_s)

    def deserialize(self, file_name: str) -> tuple[Entry, Entry, list[str]]:
        if not self.started:
            self.started = True
            if self.startup_entries is not None:
                return self.startup_entries
        # A dump streamed by the leader because we fell behind its journal.
        blob = Path(file_name).read_bytes()
        sections = decode_snapshot(blob)
        raft_meta = sections[SECTION_RAFT_META]
        last, prev = _entry(raft_meta["last"]), _entry(raft_meta["prev"])
        self.install(last[1], sections)
        self.store.save_bytes(last[1], last[2], blob)
        self.last_snapshot_index = last[1]
        self.dumps_installed += 1
        log.info("installed snapshot from the leader index=%d term=%d", last[1], last[2])
        return last, prev, list(raft_meta.get("cluster", []))
