"""The store's reads: what a slave's replication, a consumer's pull and the status views read.

Part of ``MessageStore`` (its base class, as ``StoreFlushing`` is; the store module's docstring is
the theory of operation). Every read holds the store lock and stops at the confirm offset unless
``read_uncommitted`` (reference 13.2): a consumer never sees a record the SyncStateSet does not all
hold, even after the confirm offset was lowered. ``read_raw`` (replication) reads up to the log's
end; retention may have deleted the records a queue's first entries point at, which are skipped.
"""

from __future__ import annotations

import bisect
import struct
from typing import TYPE_CHECKING, Any, Collection

from rocketray.wire.batch import whole_records_length
from rocketray.broker.batch import CQ_ENTRY
from rocketray.broker.commitlog import StoreError
from rocketray.wire.message import Message, decode_record

if TYPE_CHECKING:
    from rocketray.broker.commitlog import CommitLog
    from rocketray.broker.config import StoreConfig
    from rocketray.broker.consume_queue import ConsumeQueues
    from rocketray.broker.dispatch import Dispatcher

__all__ = ["StoreReading", "FILTER_SCAN_ENTRIES"]

#: A filtered read looks at most this many consume-queue entries (RocketMQ's maxFilterMessageCount
#: is 16000): a pull over a long run of unwanted messages answers with its position moved past the
#: ones it looked at, and the consumer asks again from there.
FILTER_SCAN_ENTRIES = 16_384
_FILTER_CHUNK = 1024
_STORE_TIMESTAMP = struct.Struct(">q")
_STORE_TIMESTAMP_AT = 48   # the record layout's store_timestamp_ms (rocketray.wire.message)


class StoreReading:
    """The reading half of ``MessageStore`` (see the module docstring); the attributes below are
    the store's."""

    config: StoreConfig
    commitlog: CommitLog
    cqs: ConsumeQueues
    dispatcher: Dispatcher
    _lock: Any
    _closed: bool
    _confirm: int

    def read_raw(self, offset: int, max_bytes: int) -> memoryview:
        """Whole records from ``offset`` (a record boundary), at least one if any, at most ``max_bytes``
        unless the first record alone is larger; never past ``max_offset`` nor a segment end."""
        with self._lock:
            if offset >= self.commitlog.max_offset:
                return memoryview(b"")
            if offset < self.commitlog.min_offset:
                raise StoreError(f"offset {offset} is below min offset {self.commitlog.min_offset}")
            view = self.commitlog.check_boundary(offset)
            if len(view) <= max_bytes:
                return view  # it ends at its segment's data end: a record boundary
            return view[:whole_records_length(view, max_bytes)]

    def warm(self, offset: int, length: int) -> None:
        """Bring the log's ``[offset, offset + length)`` (clamped to the log) into the page cache,
        blocking without the store lock or the GIL: a helper thread does it before a replication
        catch-up sends those bytes, so the sender does not wait for the disk."""
        with self._lock:
            if self._closed:
                return
            handles = self.commitlog.prefetch_handles(offset, length)
        for handle, position, n in handles:
            try:
                handle.prefetch(position, n)
            finally:
                handle.close()

    def get_messages(self, topic: str, queue_id: int, queue_offset: int, max_count: int) -> list[Message]:
        """Messages of a queue from ``queue_offset``, never beyond the confirm offset unless
        ``read_uncommitted``; entries whose segment was deleted by retention are skipped."""
        with self._lock:
            cq = self.cqs.get(topic, queue_id)
            if cq is None or max_count <= 0:
                return []
            limit = self.commitlog.max_offset if self.config.read_uncommitted else self._confirm
            result = []
            if self.commitlog.min_offset > 0:  # skip entries whose records retention deleted
                queue_offset = max(queue_offset, cq.first_at_or_after(self.commitlog.min_offset))
            for entry in cq.read(queue_offset, max_count):
                if entry.physical_offset + entry.size > limit:
                    break
                msg, _size = decode_record(self.commitlog.read(entry.physical_offset, entry.size))
                result.append(msg)
            return result

    def read_queue(self, topic: str, queue_id: int, queue_offset: int, max_count: int,
                   max_bytes: int) -> tuple[bytes, int, int, int]:
        """A consumer pull's raw records: ``(records, count, first_queue_offset, queue_max_offset)``.

        ``records`` are whole stored records of the queue from ``queue_offset`` (moved up to the first
        one retention kept), joined, at most ``max_count`` of them and at most ``max_bytes`` unless the
        first alone is larger; never a record ending beyond the confirm offset (as ``get_messages``).
        ``first_queue_offset`` is the queue offset of the first record (``queue_offset`` or past it,
        where retention left the queue to start); ``queue_max_offset`` one past the queue's last
        dispatched entry."""
        records, count, first, _passed, end = self.read_queue_filtered(topic, queue_id, queue_offset, max_count,
                                                                       max_bytes, None, max_count)
        return records, count, first, end

    def read_queue_filtered(self, topic: str, queue_id: int, queue_offset: int, max_count: int, max_bytes: int,
                            codes: Collection[int] | None,
                            max_scan: int = FILTER_SCAN_ENTRIES) -> tuple[bytes, int, int, int, int]:
        """``read_queue`` keeping only the records whose consume-queue tag code is in ``codes``
        (``rocketray.broker.tag_filter``; None: every record): ``(records, count, first_queue_offset,
        next_queue_offset, queue_max_offset)``. The record of an entry whose code is not wanted is never read.
        ``next_queue_offset`` is one past the last entry looked at (kept or skipped), at most
        ``max_scan`` entries from the start, never an entry ending beyond the confirm offset: where
        the next pull starts, so skipped messages are passed for good."""
        with self._lock:
            cq = self.cqs.get(topic, queue_id)
            if cq is None or max_count <= 0:
                return b"", 0, queue_offset, queue_offset, 0
            limit = self.commitlog.max_offset if self.config.read_uncommitted else self._confirm
            queue_offset = max(queue_offset, cq.min_offset)
            if self.commitlog.min_offset > 0:
                queue_offset = max(queue_offset, cq.first_at_or_after(self.commitlog.min_offset))
            parts: list[bytes | memoryview] = []
            size, position, scan_end, stop = 0, queue_offset, queue_offset + max_scan, False
            while not stop and position < scan_end and len(parts) < max_count:
                chunk = cq.read_packed(position, min(_FILTER_CHUNK, scan_end - position))
                if not chunk:
                    break
                for physical, length, code in CQ_ENTRY.iter_unpack(chunk):   # no object per entry
                    wanted = codes is None or code in codes
                    if physical + length > limit or (wanted and parts and size + length > max_bytes):
                        stop = True
                        break
                    if wanted:
                        record = self.commitlog.read(physical, length)
                        if len(record) != length:
                            stop = True
                            break
                        parts.append(record)
                        size += length
                    position += 1
                    if len(parts) == max_count:
                        break
            return b"".join(parts), len(parts), queue_offset, position, cq.max_offset

    def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset whose record was stored at or after ``timestamp_ms`` (RocketMQ's
        searchOffset): a binary search of the consume queue by the records' store timestamps (8
        bytes read per step), from the first entry retention kept; the queue's end when every
        record is older; 0 for an unknown queue. Store timestamps are taken as non-decreasing
        along a queue (one master's clock; a failover to a master whose clock is behind can make
        the answer land within that overlap)."""
        with self._lock:
            cq = self.cqs.get(topic, queue_id)
            if cq is None:
                return 0
            low = cq.first_at_or_after(self.commitlog.min_offset) if self.commitlog.min_offset else cq.min_offset
            return bisect.bisect_left(range(low, cq.max_offset), timestamp_ms,
                                      key=lambda offset: self._store_timestamp(cq, offset))  + low

    def _store_timestamp(self, cq: Any, queue_offset: int) -> int:
        (entry,) = cq.read(queue_offset, 1)
        raw = self.commitlog.read(entry.physical_offset + _STORE_TIMESTAMP_AT, _STORE_TIMESTAMP.size)
        if len(raw) != _STORE_TIMESTAMP.size:
            return -1     # a record retention is deleting: older than any time asked
        return _STORE_TIMESTAMP.unpack(raw)[0]

    def queue_max_offset(self, topic: str, queue_id: int) -> int:
        """One past the last dispatched (consumer-visible) queue offset; 0 for an unknown queue."""
        with self._lock:
            cq = self.cqs.get(topic, queue_id)
            return cq.max_offset if cq is not None else 0

    def queue_min_offset(self, topic: str, queue_id: int) -> int:
        """First queue offset whose record is still stored."""
        with self._lock:
            cq = self.cqs.get(topic, queue_id)
            return cq.first_at_or_after(self.commitlog.min_offset) if cq is not None else 0

    def queue_positions(self) -> list[dict[str, Any]]:
        """Every consume queue's positions: ``min_offset`` (first queue offset still stored),
        ``max_offset`` (one past the last dispatched entry) and ``visible_offset`` (one past the
        last entry a consumer can read: its record ends at or before the confirm offset)."""
        with self._lock:
            limit = self.commitlog.max_offset if self.config.read_uncommitted else self._confirm
            out = []
            for (topic, queue_id), cq in sorted(self.cqs.queues.items()):
                visible = cq.first_at_or_after(limit)
                last = cq.read(visible - 1, 1) if visible > cq.min_offset else []
                if last and last[0].physical_offset + last[0].size > limit:
                    visible -= 1  # a record that starts before the confirm offset but ends after it
                first = cq.first_at_or_after(self.commitlog.min_offset) if self.commitlog.min_offset else cq.min_offset
                out.append({"topic": topic, "queue_id": queue_id, "min_offset": first,
                            "max_offset": cq.max_offset, "visible_offset": visible})
            return out

    def queues_of(self, prefix: str) -> list[tuple[str, int]]:
        """The ``(topic, queue_id)`` of every consume queue whose topic starts with ``prefix``, sorted."""
        with self._lock:
            return sorted(key for key in self.cqs.queues if key[0].startswith(prefix))

    def next_queue_offset(self, topic: str, queue_id: int) -> int:
        """The queue offset ``put_messages`` would assign next (includes unconfirmed messages)."""
        with self._lock:
            return self.dispatcher.next_queue_offset(topic, queue_id)
