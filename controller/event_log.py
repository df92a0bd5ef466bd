"""The controller's event log: every applied event, with its Raft index and decision time.

Theory of operation. The Raft journal is compacted at every snapshot, so it cannot answer "who
was elected when" for long. Each controller node therefore keeps its own append-only audit log
of what it applied: one record per event, carrying the Raft index of the batch, the event's
position in the batch, the term, the leader's clock when it decided the batch (stamped into the
log payload, so every replica records the same time), the event itself (the events codec), and
the group's master / SyncStateSet with their epochs *after* the event (so a reader never has to
recount elections, and a log that starts after a snapshot is still correct).

A node logs an entry once, when it first applies it: a restart replays the journal from its
snapshot and skips entries at or below the log's last index. Where a node cannot log entries
(it installed a leader's snapshot, or lost its log) it appends a *gap* record naming the missing
index range; every replica applies the same entries, so a reader merging the logs of all
controllers fills one node's gap from another.

On disk: segment files ``events-<first index covered>.log`` of frames ``>II`` (body length, CRC-32 of
the body) + a msgpack body ``[LOG_VERSION, kind, ...]``. Only the active (last) segment is
written (buffered); on open its frames are checked and a torn or corrupt tail is cut off. A segment rolls
after ``segment_bytes`` and only ``segments_kept`` are kept, which bounds the disk it uses. The
node fsyncs the log before each snapshot, so every entry a snapshot covers is durable here.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import zlib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import msgpack

from rocketray.acl import AclRule
from rocketray.controller.events import Event, EventCodecError, SetAclEvent, decode_event, encode_event
from rocketray.scram import ScramCredential

log = logging.getLogger(__name__)

LOG_VERSION = 1
KIND_EVENT = 1
KIND_GAP = 2
FRAME_HEADER = struct.Struct(">II")
MAX_BODY_BYTES = 1 << 20
SEGMENT_PREFIX, SEGMENT_SUFFIX = "events-", ".log"


class EventLogError(ValueError):
    """A frame body that is not a valid event-log record."""


@dataclass(frozen=True, slots=True)
class EventLogRecord:
    """One applied event and the state of its group right after it."""

    index: int                      # Raft log index of the batch that carried the event
    seq: int                        # position of the event in that batch
    term: int                       # term of the leader that decided the batch
    time_ms: int | None             # leader's clock at decision (None for version-1 payloads)
    event: Event
    master_broker_id: int | None = None     # the group's state after the event (None: no group)
    master_epoch: int | None = None
    sync_state_set: tuple[int, ...] | None = None
    sync_state_set_epoch: int | None = None

    def to_json(self) -> dict[str, Any]:
        """``{index, seq, term, time_ms, type, <event fields>, master_broker_id, master_epoch, ...}``,
        plain JSON values: a user's SCRAM record shows only its iteration count (never its keys),
        ACL rules their text (``Allow Pub on Topic:orders``)."""
        out: dict[str, Any] = {"index": self.index, "seq": self.seq, "term": self.term,
                               "time_ms": self.time_ms, "type": type(self.event).__name__}
        for f in fields(self.event):  # type: ignore[arg-type]
            out[f.name] = _json_value(getattr(self.event, f.name))
        if isinstance(self.event, SetAclEvent):
            out["rules"] = [str(rule) for rule in self.event.rules]  # a list even when empty
        out.update(master_broker_id=self.master_broker_id, master_epoch=self.master_epoch,
                   sync_state_set=None if self.sync_state_set is None else list(self.sync_state_set),
                   sync_state_set_epoch=self.sync_state_set_epoch)
        return out


def _json_value(value: Any) -> Any:
    if isinstance(value, frozenset):
        return sorted(value)
    if isinstance(value, ScramCredential):
        return {"iterations": value.iterations}
    if isinstance(value, tuple) and any(isinstance(v, AclRule) for v in value):
        return [str(rule) for rule in value]
    return value


@dataclass(frozen=True, slots=True)
class Gap:
    """Indexes ``first_index..last_index`` (inclusive) this node applied without logging them."""

    first_index: int
    last_index: int


Record = EventLogRecord | Gap


# -- codec -----------------------------------------------------------------------------------------

def encode_record(record: Record) -> bytes:
    """One frame: header + msgpack body."""
    body: list[Any]
    if isinstance(record, Gap):
        body = [LOG_VERSION, KIND_GAP, record.first_index, record.last_index]
    else:
        sss = None if record.sync_state_set is None else list(record.sync_state_set)
        body = [LOG_VERSION, KIND_EVENT, record.index, record.seq, record.term, record.time_ms,
                encode_event(record.event), record.master_broker_id, record.master_epoch, sss,
                record.sync_state_set_epoch]
    data = msgpack.packb(body, use_bin_type=True)
    if len(data) > MAX_BODY_BYTES:
        raise EventLogError(f"record of {len(data)} bytes exceeds the frame limit {MAX_BODY_BYTES}")
    return FRAME_HEADER.pack(len(data), zlib.crc32(data)) + data


def _opt_int(value: Any) -> int | None:
    if value is not None and type(value) is not int:
        raise EventLogError(f"expected an int or nil, got {value!r:.40}")
    return value


def decode_body(data: bytes) -> Record:
    """Decode one frame body; raises ``EventLogError`` on anything that is not a record."""
    try:
        body = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)
    except (ValueError, TypeError, OverflowError, RecursionError, msgpack.UnpackException) as exc:
        raise EventLogError(f"not a msgpack frame: {exc}") from exc
    if type(body) is not list or len(body) < 2 or body[0] != LOG_VERSION:
        raise EventLogError(f"not an event-log record of version {LOG_VERSION}: {body!r:.80}")
    if body[1] == KIND_GAP and len(body) == 4 and all(type(v) is int for v in body[2:]):
        return Gap(body[2], body[3])
    if body[1] != KIND_EVENT or len(body) != 11 or type(body[6]) is not bytes:
        raise EventLogError(f"malformed event-log record: {body!r:.80}")
    index, seq, term = body[2:5]
    if not all(type(v) is int for v in (index, seq, term)):
        raise EventLogError("index, seq and term must be ints")
    try:
        event = decode_event(body[6])
    except EventCodecError as exc:
        raise EventLogError(f"bad event: {exc}") from exc
    sss = body[9]
    if sss is not None and (type(sss) is not list or not all(type(v) is int for v in sss)):
        raise EventLogError("sync_state_set must be a list of ints or nil")
    return EventLogRecord(index, seq, term, _opt_int(body[5]), event, _opt_int(body[7]), _opt_int(body[8]),
                          None if sss is None else tuple(sss), _opt_int(body[10]))


def _frames(data: bytes) -> Iterator[tuple[int, int]]:
    """(body start, body end) of each frame whose length fits and whose CRC verifies, from the
    start of ``data`` up to the first one that does not (a torn or damaged tail)."""
    view = memoryview(data)
    pos = 0
    while pos + FRAME_HEADER.size <= len(data):
        length, crc = FRAME_HEADER.unpack_from(data, pos)
        start, end = pos + FRAME_HEADER.size, pos + FRAME_HEADER.size + length
        if length > MAX_BODY_BYTES or end > len(data) or zlib.crc32(view[start:end]) != crc:
            return
        yield start, end
        pos = end


def scan_tail(data: bytes) -> tuple[Record | None, int]:
    """(the last valid record, bytes the valid frames span), decoding only that last record: what
    opening a segment needs, at CRC speed rather than decode speed."""
    spans = list(_frames(data))
    while spans:
        start, end = spans[-1]
        try:
            return decode_body(data[start:end]), end
        except EventLogError:  # CRC-valid but not ours: treat as the damaged tail
            spans.pop()
    return None, 0


def _covered_until(record: Record) -> int:
    """The highest Raft index a record accounts for."""
    return record.last_index if isinstance(record, Gap) else record.index


def _peek_covered_until(body: bytes) -> int | None:
    """``_covered_until`` of a frame body without decoding its event (None: not a record)."""
    try:
        fields_ = msgpack.unpackb(body, raw=False, use_list=True, strict_map_key=True)
    except (ValueError, TypeError, OverflowError, RecursionError, msgpack.UnpackException):
        return None
    if type(fields_) is not list or len(fields_) < 4:
        return None
    value = fields_[3] if fields_[1] == KIND_GAP else fields_[2]
    return value if type(value) is int else None


# -- files -----------------------------------------------------------------------------------------

class EventLog:
    """A node's event log in ``directory``. Thread-safe: the tick thread appends, readers page."""

    def __init__(self, directory: str | Path, segment_bytes: int = 8 << 20, segments_kept: int = 8) -> None:
        assert segment_bytes > 0 and segments_kept >= 1
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.segment_bytes = segment_bytes
        self.segments_kept = segments_kept
        self._lock = threading.Lock()
        self.truncated_bytes = 0
        self.last_index = 0
        self._fh: Any = None
        self._active_size = 0
        self._open_active()

    # -- segments --------------------------------------------------------------------------
    def segments(self) -> list[Path]:
        """Segment files, oldest first."""
        return [path for _, path in self._segments()]

    def _segments(self) -> list[tuple[int, Path]]:
        """(first index covered, path) of each segment file, oldest first."""
        found = []
        for path in self.directory.glob(f"{SEGMENT_PREFIX}*{SEGMENT_SUFFIX}"):
            digits = path.name[len(SEGMENT_PREFIX):-len(SEGMENT_SUFFIX)]
            if digits.isdigit():
                found.append((int(digits), path))
        return sorted(found)

    def _segment_path(self, first_index: int) -> Path:
        return self.directory / f"{SEGMENT_PREFIX}{first_index:020d}{SEGMENT_SUFFIX}"

    def _open(self, path: Path) -> None:
        self._fh = open(path, "ab", buffering=1 << 16)
        self._active_size = self._fh.tell()

    def _open_active(self) -> None:
        """Check the last segment, cut a torn tail, find the last logged index."""
        segments = self.segments()
        for path in reversed(segments):
            data = path.read_bytes()
            last_record, valid = scan_tail(data)
            if path == segments[-1] and valid < len(data):
                self.truncated_bytes = len(data) - valid
                log.warning("event log %s: cut %d bytes of torn or damaged tail", path.name, self.truncated_bytes)
                with open(path, "r+b") as fh:
                    fh.truncate(valid)
                    fh.flush()
                    os.fsync(fh.fileno())
            if last_record is not None:
                self.last_index = _covered_until(last_record)
                break
        if segments:
            self._open(segments[-1])

    def _roll(self, first_index: int) -> None:
        if self._fh is not None:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()
        self._open(self._segment_path(first_index))
        for old in self.segments()[:-self.segments_kept]:
            old.unlink(missing_ok=True)

    # -- writing ---------------------------------------------------------------------------
    def append(self, records: Sequence[Record]) -> None:
        """Append records (all newer than ``last_index``), buffered: what a crash loses from the
        buffer is after the last snapshot (``sync`` runs before each), so the journal replay at
        restart logs it again."""
        if not records:
            return
        first = records[0]
        first_index = first.first_index if isinstance(first, Gap) else first.index
        assert first_index > self.last_index, (first_index, self.last_index)
        data = b"".join(encode_record(r) for r in records)
        with self._lock:
            if self._fh is None or self._active_size >= self.segment_bytes:
                self._roll(self.last_index + 1)  # a segment covers indexes from its name on
            self._fh.write(data)
            self._active_size += len(data)
            self.last_index = _covered_until(records[-1])

    def note_gap(self, first_index: int, last_index: int) -> None:
        """Record that indexes first..last were applied here without being logged."""
        if last_index >= first_index > self.last_index:
            log.warning("event log gap: entries %d..%d were not logged on this node", first_index, last_index)
            self.append([Gap(first_index, last_index)])

    def sync(self) -> None:
        """fsync the active segment (called before a snapshot is written). The fsync runs on a
        duplicate of its descriptor outside the log's lock, so appends (made under the node's state
        lock) do not wait for the disk."""
        with self._lock:
            if self._fh is None:
                return
            self._fh.flush()
            fd = os.dup(self._fh.fileno())
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.flush()
                self._fh.close()
                self._fh = None

    # -- reading ---------------------------------------------------------------------------
    def _iter_records(self, segments: list[tuple[int, Path]], after_index: int) -> Iterator[Record]:
        """Records that account for indexes above ``after_index``, in log order. Segments wholly at
        or below it are not read, and records below it are skipped without decoding their event."""
        for i, (_, path) in enumerate(segments):
            if i + 1 < len(segments) and segments[i + 1][0] <= after_index + 1:
                continue
            data = path.read_bytes()
            for start, end in _frames(data):
                body = data[start:end]
                covered = _peek_covered_until(body)
                if covered is None:
                    return  # a CRC-valid frame that is not a record: the damaged tail
                if covered <= after_index:
                    continue
                try:
                    yield decode_body(body)
                except EventLogError:
                    return

    def read(self, after_index: int = 0, limit: int = 10_000) -> dict[str, Any]:
        """Records with index > ``after_index``, whole batches, about ``limit`` events at most.

        Returns ``{"events": [EventLogRecord...], "gaps": [Gap...], "next_index": cursor for the
        next page, "more": bool, "first_index": the first index the kept segments cover, or None}``."""
        assert limit >= 1
        with self._lock:
            if self._fh is not None:
                self._fh.flush()
            events: list[EventLogRecord] = []
            gaps: list[Gap] = []
            segments = self._segments()
            first_index = segments[0][0] if segments else None
            cursor, more = after_index, False
            for record in self._iter_records(segments, after_index):
                if isinstance(record, Gap):
                    if len(events) >= limit:
                        more = True
                        break
                    gaps.append(record)
                    cursor = max(cursor, record.last_index)
                    continue
                if len(events) >= limit and record.index != cursor:
                    more = True
                    break
                events.append(record)
                cursor = record.index
        return {"events": events, "gaps": gaps, "next_index": cursor, "more": more, "first_index": first_index}


def merge_logs(logs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[list[int]]]:
    """Merge the JSON event logs of several controllers (each ``{"events", "gaps", "first_index",
    "last_index"}`` as ``ControllerNode.events`` pages them, all pages joined).

    Returns (events in log order without duplicates, gaps no other log covers). Every controller
    applies the same entries, so a gap in one log is covered by a log that holds the whole range
    without a gap of its own."""
    merged: dict[tuple[int, int], dict[str, Any]] = {}
    for one in logs:
        for event in one["events"]:
            merged.setdefault((event["index"], event["seq"]), event)

    def covers(other: dict[str, Any], first: int, last: int) -> bool:
        return (other.get("first_index") is not None and other["first_index"] <= first
                and other.get("last_index", 0) >= last
                and not any(g[0] <= last and first <= g[1] for g in other["gaps"]))

    uncovered = set()
    for i, one in enumerate(logs):
        for first, last in one["gaps"]:
            if not any(covers(other, first, last) for j, other in enumerate(logs) if j != i):
                uncovered.add((first, last))
    return [merged[k] for k in sorted(merged)], [list(g) for g in sorted(uncovered)]


def read_whole_log(page: Callable[[int, int], dict[str, Any]], limit: int = 10_000,
                   max_pages: int = 10_000) -> dict[str, Any]:
    """Follow ``page(after_index, limit)`` (``ControllerNode.events`` or its remote twin) to the end:
    ``{"events", "gaps", "first_index", "last_index"}`` ready for ``event_log.merge_logs``."""
    events: list[dict[str, Any]] = []
    gaps: list[list[int]] = []
    cursor, first, last = 0, None, 0
    for _ in range(max_pages):
        got = page(cursor, limit)
        events += got["events"]
        gaps += got["gaps"]
        first = got["first_index"] if first is None else first
        last = got["last_index"]
        cursor = got["next_index"]
        if not got["more"]:
            break
    return {"events": events, "gaps": gaps, "first_index": first, "last_index": last}
