"""Batches of records in the commit log: the master's seal of a put and the index of stored records (pure).

The record layout is :mod:`rocketray.wire.message`'s; a producer's batch (:class:`EncodedBatch`) and
the checks of a record's topic and properties are :mod:`rocketray.wire.batch`'s.

The master never builds a :class:`Message` for a producer's records: ``seal_batch`` walks a copy of
the bytes once, checks every record (magic, sizes, topic, properties, body CRC), fills its queue
offset, physical offset and store timestamp with ``struct.pack_into`` and recomputes its header CRC
in place; the result is the bytes to write plus the consume-queue entries (:class:`QueueRun`, 20
packed bytes a record). A slave's received bytes go through ``index_records(..., verify=True)``
(both CRCs, position, topic, properties), which builds the same queue runs in the same pass;
``verify=False`` is the dispatcher's trusted scan of the log.

Both loops run in C (the ``scan`` of ``rocketray.wire._records``, :data:`rocketray.wire.batch.C_LOOPS`,
with ISA-L's CRC-32 when libisal is installed): about 0.3 us a 1 KiB record instead of 1.2-1.8 us
(2 us with a client's UNIQ_KEY, whose properties differ per record: the C loop checks plain
properties itself). ``seal_batch_py`` and ``index_records_py`` are the same loops in Python: the
reference the C ones are tested against (tests/broker/test_records_c.py) and what runs when the
extension was not built (``rocketray.wire.batch.RECORDS_IMPLEMENTATION`` says which runs).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Callable, Mapping

from rocketray.wire.batch import C_LOOPS as _records
from rocketray.wire.batch import EncodedBatch, properties_tag_hash, topic_of
from rocketray.wire.message import (HEADER_SIZE, MAGIC, MAX_RECORD_SIZE, MAX_TOPIC_BYTES, RECORD_HEADER, SIZE_FIELD,
                                    MessageCodecError)
from rocketray.wire.message import crc32 as crc32_impl

__all__ = [
    "CQ_ENTRY",
    "IndexedRecords",
    "QueueRun",
    "SealedBatch",
    "index_records",
    "seal_batch",
]


# ---------------------------------------------------------------------------------------- batches
#: A consume-queue entry: (physical offset i64, size u32, tag hash u64), 20 bytes.
CQ_ENTRY = struct.Struct(">qIQ")
_POSITIONS = struct.Struct(">qqqq")  # queue_offset, physical_offset, born, store at bytes [24, 56)
_POSITIONS_AT = 24
_I64 = 2**63


@dataclass(slots=True)
class QueueRun:
    """Consume-queue entries of consecutive queue offsets of one queue, packed (``CQ_ENTRY``)."""

    topic: str
    queue_id: int
    first_queue_offset: int
    entries: bytearray
    count: int = 0

    @property
    def next_queue_offset(self) -> int:
        return self.first_queue_offset + self.count

    def end_of(self, index: int) -> int:
        """Commit-log end of the record of entry ``index``."""
        physical, size, _tag = CQ_ENTRY.unpack_from(self.entries, index * CQ_ENTRY.size)
        return physical + size

    def split(self, count: int) -> "QueueRun":
        """Keep the first ``count`` entries here; return the rest as a new run."""
        cut = count * CQ_ENTRY.size
        rest = QueueRun(self.topic, self.queue_id, self.first_queue_offset + count, self.entries[cut:],
                        self.count - count)
        del self.entries[cut:]
        self.count = count
        return rest


@dataclass(frozen=True, slots=True)
class IndexedRecords:
    """Whole records ``[start_offset, end_offset)`` and their consume-queue entries, in log order per
    queue.  ``error``: why an index scan stopped early (the records before it are indexed)."""

    start_offset: int
    end_offset: int
    count: int
    runs: list[QueueRun]
    error: str | None = None


@dataclass(frozen=True, slots=True)
class SealedBatch:
    """A batch made ready to write: ``data`` (positions filled, CRCs valid) and its queue runs."""

    data: bytearray
    index: IndexedRecords


def seal_batch(batch: EncodedBatch, physical_offset: int, next_queue_offsets: Mapping[tuple[str, int], int],
               now_ms: int, max_size: int) -> SealedBatch:
    """The master's one pass over a producer's batch (see the module docstring): the C loop of
    ``rocketray.wire._records`` when it is built, else :func:`seal_batch_py`; same result."""
    if _records is None:
        return seal_batch_py(batch, physical_offset, next_queue_offsets, now_ms, max_size)
    data = _writable_copy(batch, physical_offset, now_ms)
    _end, count, runs, _error = _records.scan(data, physical_offset, 0, max_size, now_ms, next_queue_offsets,
                                               _topic_reader(batch), properties_tag_hash, MessageCodecError)
    return _sealed(batch, data, physical_offset, count, [QueueRun(*run) for run in runs])


def _topic_reader(batch: EncodedBatch) -> Callable[[bytes, int], str]:
    """The seal's topic reader: ``topic_of``, then the batch's ``topic_check`` if it has one."""
    check = batch.topic_check
    if check is None:
        return topic_of

    def checked(raw: bytes, where: int) -> str:
        topic = topic_of(raw, where)
        check(topic)
        return topic

    return checked


def _writable_copy(batch: EncodedBatch, physical_offset: int, now_ms: int) -> bytearray:
    """The batch's bytes to fill in, after checking the arguments both seal loops share."""
    if not isinstance(batch.data, bytes):
        raise MessageCodecError("batch data must be bytes")
    if not (0 <= physical_offset < _I64 and -_I64 <= now_ms < _I64):
        raise MessageCodecError(f"position {physical_offset} or timestamp {now_ms} out of range")
    return bytearray(batch.data)


def _sealed(batch: EncodedBatch, data: bytearray, physical_offset: int, count: int,
            runs: list[QueueRun]) -> SealedBatch:
    if count != batch.count:
        raise MessageCodecError(f"batch claims {batch.count} records, holds {count}")
    return SealedBatch(data, IndexedRecords(physical_offset, physical_offset + len(data), count, runs))


def seal_batch_py(batch: EncodedBatch, physical_offset: int, next_queue_offsets: Mapping[tuple[str, int], int],
                  now_ms: int, max_size: int) -> SealedBatch:
    """The master's one pass over a producer's batch, in Python (the reference of the C loop).

    Checks every record (magic, sizes within ``max_size``, topic, properties, body CRC), assigns
    queue offsets continuing ``next_queue_offsets`` and physical offsets from ``physical_offset``,
    stamps ``now_ms``, recomputes the header CRCs, and returns the bytes to write with their
    consume-queue runs.  Raises :class:`MessageCodecError` on any bad record (nothing is returned,
    so nothing gets written).  The record count must match ``batch.count``.

    Per record it makes no Python object but the 20-byte queue entry: the queue is found by queue
    id and an in-place comparison of the topic bytes, properties equal to the previous record's are
    compared in place, and the CRC of the header's first 8 bytes is cached by record size.
    """
    topic_of = _topic_reader(batch)
    data = _writable_copy(batch, physical_offset, now_ms)
    src = batch.data
    mv = memoryview(data)
    n = len(src)
    crc32 = crc32_impl
    unpack = RECORD_HEADER.unpack_from
    pack_positions = _POSITIONS.pack_into
    pack_crc = SIZE_FIELD.pack_into
    pack_entry = CQ_ENTRY.pack
    by_queue_id: dict[int, tuple[bytes, int, QueueRun]] = {}  # the last topic seen per queue id
    runs: dict[tuple[bytes, int], QueueRun] = {}
    ordered: list[QueueRun] = []
    head_crcs: dict[int, int] = {}  # record size -> CRC32 of (size, magic)
    last_props, last_props_len, last_tag = b"", -1, 0
    pos = count = 0
    try:
        while pos < n:
            if n - pos < HEADER_SIZE:
                raise MessageCodecError(f"batch: {n - pos} trailing bytes at {pos} are not a record")
            (total, magic, _hcrc, body_crc, _flags, queue_id, _qo, _po, born, _st,
             topic_len, props_len, body_len) = unpack(src, pos)
            end = pos + total
            if magic != MAGIC or total != HEADER_SIZE + topic_len + props_len + body_len or end > n \
                    or not 1 <= topic_len <= MAX_TOPIC_BYTES:
                raise MessageCodecError(f"batch: malformed record header at {pos} (total {total}, magic {magic:#x})")
            if total > max_size:
                raise MessageCodecError(f"batch: record of {total} bytes at {pos} exceeds the limit {max_size}")
            body_start = end - body_len
            if crc32(mv[body_start:end]) != body_crc:
                raise MessageCodecError(f"batch: body CRC mismatch in the record at {pos}")
            topic_start = pos + HEADER_SIZE
            props_start = topic_start + topic_len
            known = by_queue_id.get(queue_id)
            if known is not None and known[1] == topic_len and src.startswith(known[0], topic_start):
                run = known[2]
            else:
                topic_bytes = src[topic_start:props_start]
                run = _run_for(runs, ordered, topic_bytes, queue_id, next_queue_offsets, pos, topic_of)
                by_queue_id[queue_id] = (topic_bytes, topic_len, run)
            if props_len:
                if props_len != last_props_len or not src.startswith(last_props, props_start):
                    last_props = src[props_start:body_start]
                    last_props_len = props_len
                    last_tag = properties_tag_hash(last_props)
                tag = last_tag
            else:
                tag = 0
            queue_offset = run.first_queue_offset + run.count
            physical = physical_offset + pos
            pack_positions(data, pos + _POSITIONS_AT, queue_offset, physical, born, now_ms)
            head = head_crcs.get(total)
            if head is None:
                head = head_crcs[total] = crc32(mv[pos:pos + 8])
            pack_crc(data, pos + 8, crc32(mv[pos + 12:body_start], head))
            run.entries += pack_entry(physical, total, tag)
            run.count += 1
            pos = end
            count += 1
    finally:
        mv.release()
    return _sealed(batch, data, physical_offset, count, ordered)


def _run_for(runs: dict[tuple[bytes, int], QueueRun], ordered: list[QueueRun], topic_bytes: bytes,
             queue_id: int, next_queue_offsets: Mapping[tuple[str, int], int], pos: int,
             topic_of: Callable[[bytes, int], str] = topic_of) -> QueueRun:
    """The batch's run of (topic, queue id); created (topic checked, appended to ``ordered``) at
    its first record."""
    run = runs.get((topic_bytes, queue_id))
    if run is None:
        topic = topic_of(topic_bytes, pos)
        run = QueueRun(topic, queue_id, next_queue_offsets.get((topic, queue_id), 0), bytearray())
        runs[(topic_bytes, queue_id)] = run
        ordered.append(run)
    return run


def index_records(buf: bytes | bytearray | memoryview, base_offset: int, verify: bool,
                  max_size: int = MAX_RECORD_SIZE) -> IndexedRecords:
    """Consume-queue runs of the whole records in ``buf`` (see :func:`index_records_py`): the C loop
    of ``rocketray.wire._records`` when it is built; same result."""
    if _records is None:
        return index_records_py(buf, base_offset, verify, max_size)
    end, count, runs, error = _records.scan(buf, base_offset, 1 if verify else 2, max_size, 0, None,
                                            topic_of, properties_tag_hash, MessageCodecError)
    return IndexedRecords(base_offset, base_offset + end, count, [QueueRun(*run) for run in runs], error)


def index_records_py(buf: bytes | bytearray | memoryview, base_offset: int, verify: bool,
                     max_size: int = MAX_RECORD_SIZE) -> IndexedRecords:
    """Consume-queue runs of the whole records in ``buf``, stored at ``base_offset``, in one pass.

    ``verify`` (a slave's received bytes): every record must be whole and valid (both CRCs, its
    physical offset equal to its position, at most ``max_size`` bytes, topic and properties well
    formed), else :class:`MessageCodecError`.  Without ``verify`` (the dispatcher's scan of its own
    log, trusted): a partial record at the end ends the scan; an invalid one ends it with ``error``.
    """
    mv = memoryview(buf)
    n = len(mv)
    crc32 = crc32_impl
    unpack = RECORD_HEADER.unpack_from
    pack_entry = CQ_ENTRY.pack
    by_queue_id: dict[int, tuple[bytes, QueueRun]] = {}
    ordered: list[QueueRun] = []
    head_crcs: dict[int, int] = {}
    last_props, last_tag = b"", 0
    pos = count = 0
    error: str | None = None
    while n - pos >= HEADER_SIZE:
        (total, magic, hcrc, body_crc, _flags, queue_id, queue_offset, physical, _born, _st,
         topic_len, props_len, body_len) = unpack(mv, pos)
        end = pos + total
        try:
            if magic != MAGIC or total != HEADER_SIZE + topic_len + props_len + body_len \
                    or not 1 <= topic_len <= MAX_TOPIC_BYTES or total > MAX_RECORD_SIZE:
                raise MessageCodecError(f"malformed record header at {base_offset + pos}")
            if end > n:
                if verify:
                    raise MessageCodecError(f"record at {base_offset + pos} needs {total} bytes, "
                                            f"have {n - pos}")
                break
            body_start = end - body_len
            topic_start = pos + HEADER_SIZE
            props_start = topic_start + topic_len
            if verify:
                head = head_crcs.get(total)
                if head is None:
                    head = head_crcs[total] = crc32(mv[pos:pos + 8])
                if crc32(mv[pos + 12:body_start], head) != hcrc:
                    raise MessageCodecError(f"header CRC mismatch at {base_offset + pos}")
                if crc32(mv[body_start:end]) != body_crc:
                    raise MessageCodecError(f"body CRC mismatch at {base_offset + pos}")
                if physical != base_offset + pos:
                    raise MessageCodecError(f"record at {base_offset + pos} claims physical offset {physical}")
                if total > max_size:
                    raise MessageCodecError(f"record of {total} bytes exceeds the limit {max_size}")
            known = by_queue_id.get(queue_id)
            if known is not None and len(known[0]) == topic_len and mv[topic_start:props_start] == known[0] \
                    and known[1].first_queue_offset + known[1].count == queue_offset:
                run = known[1]
            else:
                topic_bytes = bytes(mv[topic_start:props_start])
                run = QueueRun(topic_of(topic_bytes, base_offset + pos), queue_id, queue_offset, bytearray())
                by_queue_id[queue_id] = (topic_bytes, run)
                ordered.append(run)
            if props_len:
                if props_len != len(last_props) or mv[props_start:body_start] != last_props:
                    last_props = bytes(mv[props_start:body_start])
                    last_tag = properties_tag_hash(last_props)
                tag = last_tag
            else:
                tag = 0
        except MessageCodecError as exc:
            if verify:
                raise
            error = str(exc)
            break
        run.entries += pack_entry(base_offset + pos, total, tag)
        run.count += 1
        pos = end
        count += 1
    if verify and pos != n:
        raise MessageCodecError(f"{n - pos} trailing bytes at {base_offset + pos} are not a record")
    mv.release()
    return IndexedRecords(base_offset, base_offset + pos, count, ordered, error)
