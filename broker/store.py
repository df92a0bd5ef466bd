"""MessageStore: the commit log, consume queues, epoch file and checkpoint of one replica.

Theory of operation
-------------------
One :class:`MessageStore` owns a directory::

    <root>/commitlog/<base offset>      segments (broker.commitlog)
    <root>/consumequeue/<topic>/<qid>/  consume queues (broker.consume_queue)
    <root>/epochFileCheckpoint[.bak]    epoch file (broker.epoch_file)
    <root>/storeCheckpoint              verified, confirm and dispatched offsets (broker.checkpoint)

Writes come from the master path (``put_batch``: a producer's encoded batch, checked and sealed in
one pass -- queue offsets, physical offsets and the store timestamp filled in place, no message
objects -- and appended with one write) or the slave path (``append_raw``: whole records received
from the master, verified, appended byte-for-byte so both logs stay identical).  Both build the
batch's consume-queue entries in the same pass; the dispatcher (``rocketray.broker.dispatch``)
keeps them until the confirm offset covers them.  With
``FlushMode.SYNC`` both fsync before returning; with ``ASYNC`` a background thread fsyncs every
``flush_interval_ms``, and fsyncs the log alone as soon as ``FLUSH_LEAST_BYTES`` were appended since
its last flush.  At each periodic flush the same thread writes the checkpoint after fsyncing the log
and the queues it vouches for; it also runs retention.

The dispatcher indexes records into consume queues in log order but never past the confirm offset
(reference 13.2) unless ``read_uncommitted``; raising the confirm offset dispatches synchronously,
and ``get_messages`` also stops at the confirm offset, so a consumer never sees an unconfirmed
message even if the confirm offset was lowered (the reads are ``rocketray.broker.store_read``).

Start-up recovery: scan from the checkpoint's verified offset, cut a torn or invalid tail
(``recovered_cut_bytes``), report at ERROR, with code ``STORE_LOST_CONFIRMED``, a log that ends below
the checkpoint's confirm offset (``lost_confirmed_bytes``: acknowledged records this replica lost),
clamp the confirm offset into ``[min, max]``, cut consume queues back to
the checkpoint's dispatched offset and dispatch again from there (a missing checkpoint rebuilds all
queues from the start of the log).

``truncate(offset)`` is crash-safe (the fix for apache/rocketmq#10666): it refuses a position that
is not a record boundary, zeroes and fsyncs the cut bytes, deletes later segments and fsyncs the
directory, cuts and fsyncs the consume queues, clamps the confirm offset and writes the checkpoint
durably, all before returning.  A crash after it returns cannot bring cut bytes back.

All public methods hold one re-entrant lock; the fsyncs of the background flusher (log, queues,
checkpoint) run outside it, so a periodic flush does not stall writers and readers.

Every file operation goes through the disk port given to the constructor (``disk``, default the
real one, ``rocketray.fs.OS_DISK``); ``rocketray.sim.disk.SimDisk`` runs the very same store
over a simulated disk with crashes (``StoreConfig(background_thread=False)`` there: the simulator
calls ``flush()`` itself).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from rocketray.broker.checkpoint import StoreCheckpoint, load_checkpoint, save_checkpoint
from rocketray.broker.commitlog import CommitLog, StoreError
from rocketray.broker.config import FlushMode, StoreConfig
from rocketray.broker.consume_queue import ConsumeQueues
from rocketray.broker.dispatch import Dispatcher
from rocketray.broker.queue_check import QueueChecker
from rocketray.broker.segments import recovery_scan_start
from rocketray.broker.epoch_file import EPOCH_FILE_NAME, EpochFileCache
from rocketray.fs import OS_DISK, Disk, ensure_dir
from rocketray.fs_undo import UndoDisk
from rocketray.wire.message import Message, MessageCodecError
from rocketray.wire.batch import EncodedBatch, encode_batch, record_offsets
from rocketray.broker.batch import index_records, seal_batch
from rocketray.broker.store_flush import FLUSH_LEAST_BYTES, FLUSH_TICK_MS, StoreFlushing  # noqa: F401
from rocketray.broker.store_read import StoreReading

__all__ = ["AppendResult", "MalformedBatch", "MessageStore", "StoreCorrupt", "StoreError"]

log = logging.getLogger(__name__)


class MalformedBatch(StoreError, MessageCodecError):
    """A batch refused as bad input (a malformed or oversized record); nothing was written.  Both a
    :class:`StoreError` (a refused store operation) and a :class:`MessageCodecError` (bad bytes)."""


class StoreCorrupt(StoreError):
    """The store's files are damaged beyond what start-up can repair safely; it refuses to open
    (the message names the file and what an operator can do)."""


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Where a batch went: ``[start_offset, end_offset)`` of the log, ``count`` records, and the
    sealed bytes (``data``) that ``offsets()`` reads the records' positions from."""

    start_offset: int
    end_offset: int
    count: int
    data: bytes | bytearray = b""

    def offsets(self) -> tuple[tuple[int, int], ...]:
        """``((queue_offset, physical_offset), ...)`` in batch order."""
        return record_offsets(self.data)


class MessageStore(StoreReading, StoreFlushing):
    """The message store of one replica (see the module docstring)."""

    def __init__(self, root_dir: str | os.PathLike[str], config: StoreConfig | None = None,
                 disk: Disk = OS_DISK) -> None:
        self.root = Path(root_dir)
        self.config = config or StoreConfig()
        ensure_dir(disk, self.root / "commitlog")
        self._undo = UndoDisk(self.root, disk) if self.config.track_unsynced and disk is OS_DISK else None
        disk = self.disk = self._undo if self._undo is not None else disk
        self._lock = threading.RLock()
        self._checkpoint_lock = threading.Lock()  # orders checkpoint saves; taken after the store lock
        self._closed = False
        self._generation = 0
        checkpoint = load_checkpoint(self.root, disk)
        self.commitlog = CommitLog(self.root / "commitlog", self.config.segment_size_bytes, disk=disk)
        self.recovered_cut_bytes = self.commitlog.recover(recovery_scan_start(
            self.commitlog.min_offset, checkpoint.verified_offset if checkpoint else None))
        if self.recovered_cut_bytes:
            log.warning("store %s: recovery cut %d bytes of torn or invalid tail at offset %d",
                        self.root, self.recovered_cut_bytes, self.commitlog.max_offset)
        self.commitlog.flush()
        self._verified = self.commitlog.max_offset
        self.epoch_file = EpochFileCache(self.root / EPOCH_FILE_NAME, disk=disk)
        if self.epoch_file.unreadable and self.commitlog.max_offset > self.commitlog.min_offset:
            self.commitlog.close()
            raise StoreCorrupt(f"store {self.root}: {self.epoch_file.unreadable}, and the commit log holds "
                               f"records [{self.commitlog.min_offset}, {self.commitlog.max_offset}): without "
                               "the epochs this replica cannot tell where its log agrees with the master's. "
                               "Refusing to start; restore the epoch file, or delete this replica's store "
                               "directory so it catches up from the master as a new replica.")
        self._clamp_epoch_file(self.max_offset)
        rebuild = checkpoint is None or not disk.is_dir(self.root / "consumequeue")
        self.cqs = ConsumeQueues(self.root / "consumequeue", disk)
        if rebuild:
            self.cqs.clear()
        lo, hi = self.min_offset, self.max_offset
        #: Bytes below the checkpoint's confirm offset that recovery did not find: acknowledged records
        #: this replica no longer holds (a damaged or torn log, or writes lost before their fsync).
        confirmed = checkpoint.confirm_offset if checkpoint else lo
        self.lost_confirmed_bytes = max(0, confirmed - hi)
        if self.lost_confirmed_bytes:
            log.error("store %s: STORE_LOST_CONFIRMED: the log recovered to %d, below the confirm offset %d "
                      "its checkpoint recorded; this replica no longer holds %d bytes of acknowledged records, "
                      "which survive only on the group's other in-sync replicas", self.root, hi, confirmed,
                      self.lost_confirmed_bytes)
        self._confirm = min(max(confirmed, lo), hi)
        dispatched = lo if rebuild or checkpoint is None else min(max(checkpoint.dispatched_offset, lo), hi)
        self.repaired_queues: list[str] = []   # queues start-up found damaged and rebuilt from the log
        if not rebuild:
            dispatched = self._check_queues(dispatched)
        self.cqs.truncate_physical(dispatched)
        self.dispatcher = Dispatcher(self.commitlog, self.cqs, dispatched)
        self._dispatch()
        self.dispatcher.index_tail()
        self._write_checkpoint()
        self._flush_taken_offset = self.commitlog.max_offset
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self.config.background_thread:
            self._thread = threading.Thread(target=self._background, name=f"store-flush-{self.root.name}",
                                            daemon=True)
            self._thread.start()

    def _check_queues(self, dispatched: int) -> int:
        """Compare every consume queue with the log (``broker/queue_check.py``), cut damaged ones;
        returns the offset to dispatch again from."""
        checker = QueueChecker(self.cqs, dispatched)
        for seg in list(self.commitlog.segments):
            for chunk in self.commitlog.index_range(seg.base_offset, seg.end_offset):
                checker.feed(chunk.runs)
        self.repaired_queues = sorted(d.name for d in checker.damage.values())
        return checker.repair()

    # ------------------------------------------------------------------ offsets
    @property
    def max_offset(self) -> int:
        """One past the last byte of the log."""
        with self._lock:
            return self.commitlog.max_offset

    @property
    def min_offset(self) -> int:
        """First byte still stored (moves forward with retention)."""
        with self._lock:
            return self.commitlog.min_offset

    @property
    def confirm_offset(self) -> int:
        """End of the replicated (committed) log; consumers read up to it."""
        return self._confirm

    @confirm_offset.setter
    def confirm_offset(self, value: int) -> None:
        with self._lock:
            self._confirm = min(max(int(value), self.min_offset), self.max_offset)
            self._dispatch()

    @property
    def dispatched_offset(self) -> int:
        """Every record ending at or before this offset is in the consume queues."""
        return self.dispatcher.dispatched

    def last_segment_base_offset(self) -> int:
        with self._lock:
            return self.commitlog.active.base_offset

    # ------------------------------------------------------------------ writing
    def put_batch(self, batch: EncodedBatch, now_ms: int) -> AppendResult:
        """Master path: check a producer's encoded batch, fill in queue offsets, physical offsets and
        the store timestamp, append it with one write (per segment touched).

        A malformed batch (:class:`MalformedBatch`; a record larger than a segment included) leaves
        the store unchanged.  Its consume-queue entries were built in the same pass and are
        dispatched when the confirm offset covers them.
        """
        with self._lock:
            self._check_open()
            self.dispatcher.catch_up_queue_table()
            start = self.commitlog.max_offset
            try:
                sealed = seal_batch(batch, start, self.dispatcher.queue_table, now_ms,
                                    self.config.segment_size_bytes)
            except MessageCodecError as exc:
                raise MalformedBatch(str(exc)) from None
            if sealed.index.count == 0:
                return AppendResult(start, start, 0)
            self.commitlog.append(sealed.data)
            self.dispatcher.appended(sealed.index, master=True)
            self._after_append()
            return AppendResult(start, sealed.index.end_offset, sealed.index.count, sealed.data)

    def put_messages(self, msgs: Iterable[Message], now_ms: int) -> list[Message]:
        """:meth:`put_batch` of ``msgs`` (encoded here); returns the stored messages."""
        msgs = list(msgs)
        result = self.put_batch(encode_batch(msgs), now_ms)
        return [m.with_position(qo, po, now_ms) for m, (qo, po) in zip(msgs, result.offsets())]

    def append_raw(self, offset: int, data: bytes | memoryview) -> int:
        """Slave path: append whole records received from the master at ``offset == max_offset``.

        Every record is verified (both CRCs, physical offset == its position) while its
        consume-queue entries are built, in one pass; on any error nothing is written and
        :class:`StoreError` is raised.  An empty store accepts any ``offset`` and starts its log
        there.  Returns the new max offset.
        """
        view = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
        with self._lock:
            self._check_open()
            if offset != self.commitlog.max_offset and (
                    self.commitlog.min_offset != self.commitlog.max_offset or offset < 0):
                raise StoreError(f"append_raw at {offset} but max offset is {self.commitlog.max_offset}")
            try:
                index = index_records(view, offset, verify=True, max_size=self.config.segment_size_bytes)
            except MessageCodecError as exc:
                raise StoreError(f"append_raw at {offset}: {exc}") from None
            if offset != self.commitlog.max_offset:
                self._reset_empty(offset)
            self.commitlog.append(view)
            self.dispatcher.appended(index, master=False)
            self._after_append()
            return self.commitlog.max_offset

    def _reset_empty(self, offset: int) -> None:
        log.info("store %s: empty log restarts at offset %d", self.root, offset)
        self.commitlog.reset(offset)
        self.cqs.clear()
        self.dispatcher.restart(offset)
        self._confirm = self._verified = offset
        self._generation += 1
        self._write_checkpoint()

    def _after_append(self) -> None:
        if self.config.flush_mode is FlushMode.SYNC:
            self.commitlog.flush()
        if self.config.read_uncommitted:
            self._dispatch()

    # ------------------------------------------------------------------ dispatch
    def _dispatch(self) -> None:
        """Index records up to the confirm offset (the log end with ``read_uncommitted``)."""
        self.dispatcher.dispatch(self.commitlog.max_offset if self.config.read_uncommitted else self._confirm)

    def rebuild_consume_queues(self) -> None:
        """Throw the consume queues away and rebuild them from the commit log (up to the confirm offset)."""
        with self._lock:
            self._check_open()
            self._generation += 1
            self.cqs.clear()
            self.dispatcher.rebuild()
            self._dispatch()
            self._write_checkpoint()

    # ------------------------------------------------------------------ truncation
    def truncate(self, offset: int) -> None:
        """Cut the log at ``offset`` durably (no-op at or beyond ``max_offset``).

        Refuses (:class:`StoreError`, nothing changed) an offset below ``min_offset`` or not on a
        record boundary.  Also cuts the consume queues, clamps the confirm offset, drops epoch
        entries that start beyond ``offset`` and writes the checkpoint, all durably.
        """
        with self._lock:
            self._check_open()
            if offset >= self.commitlog.max_offset:
                return
            if offset < self.commitlog.min_offset:
                raise StoreError(f"cannot truncate at {offset}: below min offset {self.commitlog.min_offset}")
            if offset != self.commitlog.min_offset:
                self.commitlog.check_boundary(offset)
            self._truncate(offset)

    def _truncate(self, offset: int) -> None:
        self._generation += 1
        self.commitlog.flush()
        cut = self.commitlog.cut(offset)
        self.cqs.truncate_physical(offset)
        self.dispatcher.cut(offset)
        self._confirm = min(self._confirm, offset)
        self._verified = min(self._verified, offset)
        self._clamp_epoch_file(offset)
        self._write_checkpoint()
        log.info("store %s: truncated at %d (%d bytes cut)", self.root, offset, cut)

    def truncate_invalid_tail(self) -> int:
        """Verify the records after the last verified offset; cut an invalid tail.

        Returns the offset cut at, or -1 when the tail was whole (reference 12.4).
        """
        with self._lock:
            self._check_open()
            bad = self.commitlog.first_invalid(self._verified)
            if bad is None:
                return -1
            self._truncate(bad)
            return bad

    def _clamp_epoch_file(self, offset: int) -> None:
        last = self.epoch_file.last_entry()
        if last is not None and last.start_offset > offset:
            self.epoch_file.truncate_suffix_by_offset(offset + 1)

    # ------------------------------------------------------------------ retention
    def delete_expired_segments(self, now_ms: int | None = None) -> int:
        """Delete whole old segments by age (file mtime) or total size; returns how many went.

        The active segment and segments holding records beyond the dispatched offset (so beyond the
        confirm offset) are never deleted.
        """
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        with self._lock:
            self._check_open()
            deleted = self.commitlog.delete_expired(now_ms, self.config.retention_ms,
                                                    self.config.retention_max_bytes,
                                                    keep_from=self.dispatcher.dispatched)
            if deleted:
                lo = self.commitlog.min_offset
                self._confirm = max(self._confirm, lo)
                self.dispatcher.head_deleted(lo)
                self.epoch_file.truncate_prefix_by_offset(lo - 1)
                self._generation += 1
                self.commitlog.flush()
                self._verified = max(self._verified, lo)
                self._write_checkpoint()
                log.info("store %s: retention deleted %d segments; min offset %d", self.root, deleted, lo)
            return deleted

    # ------------------------------------------------------------------ lifecycle
    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"store {self.root} is closed")

    def close(self) -> None:
        """Flush everything, write the checkpoint, release files (idempotent)."""
        self._shutdown(flush=True)

    def abandon(self) -> None:
        """Tests: stop without flushing or checkpointing, like a killed process (page cache kept)."""
        self._shutdown(flush=False)

    def _shutdown(self, flush: bool) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        with self._lock:
            if self._closed:
                return
            if flush:
                self.flush()
            self._closed = True
            self.cqs.close()
            self.commitlog.close()
            if self._undo is not None:
                self._undo.stop()

    def __enter__(self) -> "MessageStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
