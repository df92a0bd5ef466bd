"""Message-store configuration.

One frozen dataclass, every key with a default suited to a laptop; ``docs/store.md`` documents each
key and the durability guarantees of the two flush modes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["FlushMode", "StoreConfig"]

MiB = 1024 * 1024


class FlushMode(str, enum.Enum):
    """``SYNC``: fsync before ``put_messages``/``append_raw`` return. ``ASYNC``: a background flusher."""

    SYNC = "sync"
    ASYNC = "async"


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Keys of the message store (see docs/store.md)."""

    segment_size_bytes: int = 64 * MiB
    flush_mode: FlushMode = FlushMode.ASYNC
    flush_interval_ms: int = 500
    read_uncommitted: bool = False
    retention_ms: int | None = 72 * 3600 * 1000
    retention_max_bytes: int | None = None
    retention_check_interval_ms: int = 10_000
    background_thread: bool = True

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
