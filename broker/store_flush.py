"""The store's flushing: what makes a :class:`~rocketray.broker.store.MessageStore` durable.

Part of ``MessageStore`` (its base class; the store module's docstring is the theory of operation):
``flush`` fsyncs the log and the queues and writes the checkpoint under the store lock; the
background thread (``_background``, started by the store in async mode or with a flush interval)
runs the periodic flush with every fsync outside the store lock, fsyncs the log alone as soon as
``FLUSH_LEAST_BYTES`` were appended since the last flush (RocketMQ's flushLeastPages), and runs
retention. A periodic flush saves its checkpoint only if no truncation, retention or rebuild ran
meanwhile (they bump the generation and write their own).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rocketray.broker.checkpoint import StoreCheckpoint, save_checkpoint, sync_files
from rocketray.broker.commitlog import StoreError
from rocketray.broker.config import FlushMode
from rocketray.fs import DiskFile

if TYPE_CHECKING:
    from rocketray.broker.commitlog import CommitLog
    from rocketray.broker.config import StoreConfig
    from rocketray.broker.consume_queue import ConsumeQueues
    from rocketray.broker.dispatch import Dispatcher
    from rocketray.fs import Disk

__all__ = ["FLUSH_LEAST_BYTES", "FLUSH_TICK_MS", "StoreFlushing"]

log = logging.getLogger("rocketray.broker.store")

#: Async mode: the background thread fsyncs the log as soon as this many bytes were appended since its
#: last flush (and flushes everything every ``flush_interval_ms``); it looks every ``FLUSH_TICK_MS``.
FLUSH_LEAST_BYTES = 4 << 20
FLUSH_TICK_MS = 10


class StoreFlushing:
    """The flushing half of ``MessageStore`` (see the module docstring); the attributes below are
    the store's."""

    root: Path
    config: StoreConfig
    disk: Disk
    commitlog: CommitLog
    cqs: ConsumeQueues
    dispatcher: Dispatcher
    _lock: Any
    _checkpoint_lock: threading.Lock
    _stop: threading.Event
    _closed: bool
    _generation: int
    _verified: int
    _confirm: int
    _flush_taken_offset: int

    if TYPE_CHECKING:
        def _check_open(self) -> None: ...

        def delete_expired_segments(self, now_ms: int | None = None) -> int: ...

    def _write_checkpoint(self) -> None:
        """Under the lock, with the log fsynced up to ``_verified``: fsync the queues, save."""
        files, dirs = self.cqs.take_dirty()
        sync_files(files, self.disk, None)
        for directory in dirs:
            self.disk.fsync_dir(directory)
        with self._checkpoint_lock:
            save_checkpoint(self.root, StoreCheckpoint(self._verified, self._confirm,
                                                             self.dispatcher.dispatched), self.disk)

    def flush(self) -> None:
        """fsync the log and the queues and write the checkpoint."""
        with self._lock:
            self._check_open()
            self.commitlog.flush()
            self._verified = self.commitlog.max_offset
            self._write_checkpoint()

    def _flush_in_background(self) -> None:
        """The periodic flush, with every fsync outside the store lock (writers keep going): take the
        dirty log and queue files and the offsets they vouch for under the lock, fsync them, then
        save the checkpoint unless a truncation, retention or rebuild ran meanwhile (it bumps the
        generation and writes its own checkpoint; the checkpoint lock orders the two saves)."""
        with self._lock:
            if self._closed:
                return
            generation = self._generation
            files, directory, verified = self._take_dirty_log()
            cq_files, cq_dirs = self.cqs.take_dirty()
            dispatched = self.dispatcher.dispatched
        sync_files(files, self.disk, directory)
        sync_files(cq_files, self.disk, None)
        for directory in cq_dirs:
            self.disk.fsync_dir(directory)
        with self._lock:
            if self._closed or generation != self._generation:
                return  # a truncation, retention or rebuild ran meanwhile and wrote its own checkpoint
            self._verified = verified
            checkpoint = StoreCheckpoint(verified, self._confirm, dispatched)
        with self._checkpoint_lock:  # never taken before the store lock by this thread: no deadlock
            if generation == self._generation:
                save_checkpoint(self.root, checkpoint, self.disk)

    def _flush_log_early(self) -> None:
        """The early async flush: fsync only the log written since the last flush (outside the
        store lock). The queues and the checkpoint wait for the periodic flush, which then has
        little of the log left to sync; recovery rescans at most one interval of records."""
        with self._lock:
            if self._closed:
                return
            files, directory, _ = self._take_dirty_log()
        sync_files(files, self.disk, directory)

    def _take_dirty_log(self) -> tuple[list[DiskFile], Path | None, int]:
        """Under the lock: duplicated handles of the log files written since the last flush, the
        log's directory if it changed, and the offset they reach once synced."""
        files, dir_dirty = self.commitlog.take_dirty_files()
        self._flush_taken_offset = self.commitlog.max_offset
        return files, self.commitlog.dir if dir_dirty else None, self._flush_taken_offset

    def _background(self) -> None:
        """Flush every ``flush_interval_ms``, and in async mode fsync the log alone as soon as
        ``FLUSH_LEAST_BYTES`` were appended since the last flush (like RocketMQ's flushLeastPages):
        small fsyncs, because a large one makes the writer's next ``pwrite`` wait for the disk (tail
        latency)."""
        interval_s = self.config.flush_interval_ms / 1000
        early = self.config.flush_mode is FlushMode.ASYNC
        tick_s = min(interval_s, FLUSH_TICK_MS / 1000) if early else interval_s
        next_flush = time.monotonic() + interval_s
        next_retention = time.monotonic() + self.config.retention_check_interval_ms / 1000
        while not self._stop.wait(tick_s):
            try:
                now = time.monotonic()
                if now >= next_flush:
                    next_flush = now + interval_s
                    self._flush_in_background()
                elif early and self._unflushed_bytes() >= FLUSH_LEAST_BYTES:
                    self._flush_log_early()
                if now >= next_retention:
                    next_retention = now + self.config.retention_check_interval_ms / 1000
                    self.delete_expired_segments()
            except StoreError:
                return
            except Exception:  # noqa: BLE001 - a shell keeps running and logs
                log.exception("store %s: background flush failed", self.root)

    def _unflushed_bytes(self) -> int:
        """Bytes appended since the last background flush took the dirty files."""
        with self._lock:
            return 0 if self._closed else self.commitlog.max_offset - self._flush_taken_offset
