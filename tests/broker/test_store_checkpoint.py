"""Store checkpoint file: round trip, corruption detection, durable replacement; epoch clamp on open."""

from __future__ import annotations

from pathlib import Path

from rocketray.broker.checkpoint import CHECKPOINT_FILE, StoreCheckpoint, load_checkpoint, save_checkpoint
from rocketray.broker.config import StoreConfig
from rocketray.wire.message import Message
from rocketray.broker.store import MessageStore


def test_round_trip_and_replace(tmp_path: Path) -> None:
    """A saved checkpoint loads back equal; saving again replaces it; no temp file is left."""
    save_checkpoint(tmp_path, StoreCheckpoint(10, 5, 3))
    assert load_checkpoint(tmp_path) == StoreCheckpoint(10, 5, 3)
    save_checkpoint(tmp_path, StoreCheckpoint(20, 15, 13))
    assert load_checkpoint(tmp_path) == StoreCheckpoint(20, 15, 13)
    assert [p.name for p in tmp_path.iterdir()] == [CHECKPOINT_FILE]


def test_missing_or_corrupt_loads_none(tmp_path: Path) -> None:
    """Missing, short, or any flipped byte: None (the store then recovers from the start of the log)."""
    assert load_checkpoint(tmp_path) is None
    good = StoreCheckpoint(1, 2, 3).encode()
    for i in range(len(good)):
        bad = bytearray(good)
        bad[i] ^= 0x01
        (tmp_path / CHECKPOINT_FILE).write_bytes(bytes(bad))
        assert load_checkpoint(tmp_path) is None, i
    (tmp_path / CHECKPOINT_FILE).write_bytes(good[:-1])
    assert load_checkpoint(tmp_path) is None


def test_epoch_entries_beyond_recovered_end_are_dropped(tmp_path: Path) -> None:
    """On open, epoch entries starting beyond the recovered max offset are dropped (a crash after a
    log truncation but before the epoch file was cut); an entry starting at max offset is kept."""
    cfg = StoreConfig(segment_size_bytes=4096, background_thread=False)
    store = MessageStore(tmp_path, cfg)
    store.put_messages([Message("T", 0, b"x" * 50)] * 5, now_ms=1)
    store.epoch_file.append(1, 0)
    store.epoch_file.append(2, store.max_offset)
    store.epoch_file.append(3, store.max_offset + 100)
    store.close()
    store = MessageStore(tmp_path, cfg)
    assert [(e.epoch, e.start_offset) for e in store.epoch_file.entries()] == [(1, 0), (2, store.max_offset)]
    store.close()
