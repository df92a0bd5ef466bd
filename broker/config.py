"""Message-store configuration.

One frozen dataclass, every key with a default suited to a laptop; ``docs/store.md`` documents each
key and the durability guarantees of the two flush modes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from rocketray.schema import internal, key

__all__ = ["FlushMode", "StoreConfig"]

MiB = 1024 * 1024


class FlushMode(str, enum.Enum):
    """``SYNC``: fsync before ``put_messages``/``append_raw`` return. ``ASYNC``: a background flusher."""

    SYNC = "sync"
    ASYNC = "async"


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Keys of the message store (see docs/store.md) and the ``store`` section of ``rocketray.config``."""

    segment_size_bytes: int = key(64 * MiB, "commit-log segment size in bytes (reference "
                                  "mapped_file_size_commit_log, 1 GiB there)")
    flush_mode: FlushMode = key(FlushMode.ASYNC, "async or sync (fsync before acking a put; reference "
                                "flush_disk_type)")
    flush_interval_ms: int = key(500, "async flush period (reference flush_interval_commit_log_ms)")
    read_uncommitted: bool = key(False, "serve messages beyond the confirm offset")
    retention_ms: int | None = key(72 * 3600 * 1000, "commit-log retention by age (none: unlimited; "
                                   "reference file_reserved_time_ms)")
    retention_max_bytes: int | None = key(None, "commit-log retention by size (none: unlimited)")
    retention_check_interval_ms: int = key(10_000, "retention check period")
    track_unsynced: bool = key(False, "chaos testing: keep an undo log of writes not fsynced yet, so the "
                               "lost-unsynced-writes nemesis can drop them before killing the replica "
                               "(rocketray.fs_undo; costs a read of every overwritten range)")
    background_thread: bool = internal(True, "tests drive flush and retention by hand")

    def __post_init__(self) -> None:
        if isinstance(self.flush_mode, str) and not isinstance(self.flush_mode, FlushMode):
            object.__setattr__(self, "flush_mode", FlushMode(self.flush_mode))
        if self.segment_size_bytes < 256:
            raise ValueError(f"segment_size_bytes must be >= 256, got {self.segment_size_bytes}")
        if self.flush_interval_ms <= 0:
            raise ValueError(f"flush_interval_ms must be > 0, got {self.flush_interval_ms}")
        if self.retention_ms is not None and self.retention_ms <= 0:
            raise ValueError("retention_ms must be positive or None")
        if self.retention_max_bytes is not None and self.retention_max_bytes <= 0:
            raise ValueError("retention_max_bytes must be positive or None")
