"""File faults on a closed store, then a restart: every damage is detected by a CRC (or by the
CRC-checked record a queue entry points at), nothing damaged is served, and the store recovers
(cut to the last valid record, queues rebuilt from the log, the epoch file's backup) or refuses to
start with a clear error. One test per file fault of the chaos runs' file nemesis."""

from __future__ import annotations

from pathlib import Path

import pytest

from rocketray.broker.checkpoint import CHECKPOINT_FILE, load_checkpoint
from rocketray.broker.config import StoreConfig
from rocketray.broker.epoch_file import EPOCH_FILE_NAME
from rocketray.wire.message import Message
from rocketray.broker.store import MessageStore, StoreCorrupt

SEG = 4096
CFG = StoreConfig(segment_size_bytes=SEG, background_thread=False)


def body(i: int) -> bytes:
    return f"payload-{i:05d}".encode() * 8


def fill(root: Path, n: int = 90) -> list[Message]:
    """A closed store with ``n`` confirmed messages over three queues of topic T, several segments,
    and an epoch file with two entries."""
    store = MessageStore(root, CFG)
    store.epoch_file.append(1, 0)
    stored = store.put_messages([Message("T", i % 3, body(i)) for i in range(n // 2)], now_ms=7)
    store.epoch_file.append(2, store.max_offset)
    stored += store.put_messages([Message("T", i % 3, body(i)) for i in range(n // 2, n)], now_ms=8)
    store.confirm_offset = store.max_offset
    store.close()
    assert len(list((root / "commitlog").iterdir())) >= 3
    return stored


def queue_bodies(store: MessageStore, queue_id: int) -> list[bytes]:
    return [m.body for m in store.get_messages("T", queue_id, 0, 10_000)]


def expected_bodies(stored: list[Message], queue_id: int, end: int | None = None) -> list[bytes]:
    return [m.body for m in stored if m.queue_id == queue_id and (end is None or m.physical_offset + len(
        m.body) < end)]


def flip(path: Path, offset: int, bit: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 1 << bit
    path.write_bytes(bytes(data))
    assert path.read_bytes()[offset] != data[offset] ^ (1 << bit)   # the flip is on disk


def queue_file(root: Path, queue_id: int) -> Path:
    (path,) = (root / "consumequeue" / "T" / str(queue_id)).iterdir()
    return path


def test_deleted_consume_queue_is_rebuilt_from_the_log(tmp_path: Path) -> None:
    """A deleted queue file: the old store re-created the queue at the next dispatched record's
    queue offset, so its first entries were gone for good (a consumer from 0 read nothing)."""
    stored = fill(tmp_path)
    queue_file(tmp_path, 1).unlink()
    with MessageStore(tmp_path, CFG) as store:
        assert queue_bodies(store, 1) == expected_bodies(stored, 1)
        assert store.repaired_queues == ["T/1"]


def test_flipped_bit_in_a_consume_queue_entry_is_repaired(tmp_path: Path) -> None:
    """A flipped bit in an entry's physical offset: the old store served the bytes at the wrong
    position (or none); start-up now checks every entry against the record it points at."""
    stored = fill(tmp_path)
    path = queue_file(tmp_path, 2)
    flip(path, 20 * 5 + 6, bit=3)   # entry 5, a low byte of its physical offset
    with MessageStore(tmp_path, CFG) as store:
        assert queue_bodies(store, 2) == expected_bodies(stored, 2)
        assert store.repaired_queues == ["T/2"]


def test_flipped_tag_hash_is_repaired(tmp_path: Path) -> None:
    stored = fill(tmp_path)
    flip(queue_file(tmp_path, 0), 20 * 3 + 19)
    with MessageStore(tmp_path, CFG) as store:
        assert queue_bodies(store, 0) == expected_bodies(stored, 0)
        assert store.repaired_queues == ["T/0"]


def test_truncated_consume_queue_is_refilled(tmp_path: Path) -> None:
    stored = fill(tmp_path)
    path = queue_file(tmp_path, 0)
    path.write_bytes(path.read_bytes()[:20 * 4 + 7])
    with MessageStore(tmp_path, CFG) as store:
        assert queue_bodies(store, 0) == expected_bodies(stored, 0)


def test_flipped_bit_in_an_old_segment_is_cut_there(tmp_path: Path) -> None:
    """A bit flipped in the first (sealed, long verified) segment: the old recovery trusted every
    segment before the checkpoint's verified offset and served the damaged record; start-up now
    verifies every record and cuts the log at the damaged one (the replica catches up from its
    master afterwards)."""
    stored = fill(tmp_path)
    first = sorted((tmp_path / "commitlog").iterdir())[0]
    victim = stored[3]
    flip(first, victim.physical_offset + 70)   # inside the record's body
    with MessageStore(tmp_path, CFG) as store:
        assert store.max_offset == victim.physical_offset
        assert store.recovered_cut_bytes > 0
        for q in range(3):
            assert queue_bodies(store, q) == [m.body for m in stored[:3] if m.queue_id == q]
        assert [e.epoch for e in store.epoch_file.entries()] == [1]
        assert store.confirm_offset == victim.physical_offset


def test_a_log_cut_below_the_checkpointed_confirm_offset_is_reported_as_lost_acknowledged_bytes(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The cut of the test above removes confirmed (acknowledged) records: the store says how many
    bytes, at ERROR with code STORE_LOST_CONFIRMED, so an operator learns that this replica lost
    acknowledged data rather than a torn tail nobody was promised."""
    stored = fill(tmp_path)
    with MessageStore(tmp_path, CFG) as store:
        confirmed = store.confirm_offset
        assert store.lost_confirmed_bytes == 0
    victim = stored[3]
    flip(sorted((tmp_path / "commitlog").iterdir())[0], victim.physical_offset + 70)
    with caplog.at_level("ERROR", logger="rocketray.broker.store"), MessageStore(tmp_path, CFG) as store:
        assert store.lost_confirmed_bytes == confirmed - victim.physical_offset > 0
    (line,) = [r.getMessage() for r in caplog.records if "STORE_LOST_CONFIRMED" in r.getMessage()]
    assert f"recovered to {victim.physical_offset}, below the confirm offset {confirmed}" in line


def test_a_torn_tail_above_the_confirm_offset_loses_nothing_acknowledged(tmp_path: Path) -> None:
    """Cutting records the group never confirmed is ordinary recovery, not a loss."""
    stored = fill(tmp_path)
    with MessageStore(tmp_path, CFG) as store:
        store.confirm_offset = stored[-2].physical_offset
        store.flush()
    last = sorted((tmp_path / "commitlog").iterdir())[-1]
    with open(last, "r+b") as fh:
        fh.truncate(stored[-1].physical_offset - int(last.name) + 30)
    with MessageStore(tmp_path, CFG) as store:
        assert store.max_offset == stored[-1].physical_offset and store.recovered_cut_bytes > 0
        assert store.lost_confirmed_bytes == 0


def test_truncated_tail_of_the_active_segment_is_cut_to_the_last_whole_record(tmp_path: Path) -> None:
    stored = fill(tmp_path)
    last = sorted((tmp_path / "commitlog").iterdir())[-1]
    end = stored[-1].physical_offset - int(last.name) + 30
    with open(last, "r+b") as fh:
        fh.truncate(end)
    with MessageStore(tmp_path, CFG) as store:
        assert store.max_offset == stored[-1].physical_offset
        assert queue_bodies(store, stored[-1].queue_id) == expected_bodies(stored[:-1], stored[-1].queue_id)


def test_truncated_middle_segment_drops_what_follows(tmp_path: Path) -> None:
    stored = fill(tmp_path)
    middle = sorted((tmp_path / "commitlog").iterdir())[1]
    with open(middle, "r+b") as fh:
        fh.truncate(middle.stat().st_size - 100)
    with MessageStore(tmp_path, CFG) as store:
        assert store.max_offset < int(middle.name) + middle.stat().st_size
        kept = [m for m in stored if m.physical_offset < store.max_offset]
        for q in range(3):
            assert queue_bodies(store, q) == [m.body for m in kept if m.queue_id == q]


def test_flipped_epoch_file_falls_back_to_its_backup(tmp_path: Path) -> None:
    fill(tmp_path)
    flip(tmp_path / EPOCH_FILE_NAME, 6)
    with MessageStore(tmp_path, CFG) as store:
        assert [e.epoch for e in store.epoch_file.entries()] == [1, 2]


def test_truncated_epoch_file_falls_back_to_its_backup(tmp_path: Path) -> None:
    fill(tmp_path)
    path = tmp_path / EPOCH_FILE_NAME
    path.write_bytes(path.read_bytes()[:-3])
    with MessageStore(tmp_path, CFG) as store:
        assert [e.epoch for e in store.epoch_file.entries()] == [1, 2]


def test_both_epoch_copies_damaged_refuses_to_start(tmp_path: Path) -> None:
    """No valid epoch file while the log holds records: the old store started with no epochs (a
    replica that then looks like it never had a term); no safe recovery exists, so it refuses."""
    fill(tmp_path)
    flip(tmp_path / EPOCH_FILE_NAME, 6)
    flip(tmp_path / (EPOCH_FILE_NAME + ".bak"), 6)
    with pytest.raises(StoreCorrupt, match="epoch file"):
        MessageStore(tmp_path, CFG)


def test_flipped_checkpoint_rescans_and_rebuilds(tmp_path: Path) -> None:
    stored = fill(tmp_path)
    flip(tmp_path / CHECKPOINT_FILE, 9)
    assert load_checkpoint(tmp_path) is None
    with MessageStore(tmp_path, CFG) as store:
        store.confirm_offset = store.max_offset
        for q in range(3):
            assert queue_bodies(store, q) == expected_bodies(stored, q)


def _entries(*values: int) -> bytes:
    from rocketray.broker.batch import CQ_ENTRY
    return b"".join(CQ_ENTRY.pack(v, 10, 0) for v in values)


@pytest.mark.parametrize("expected, actual, first", [
    (_entries(1, 2, 3), _entries(1, 2, 3), None),
    (_entries(1, 2, 3), _entries(1, 2), 2),          # missing entries
    (_entries(1, 2, 3), b"", 0),
    (_entries(1, 2, 3), _entries(1, 9, 3), 1),       # one entry differs
    (_entries(1, 2, 3), _entries(7, 2, 3), 0),
    (_entries(1, 2, 3), _entries(1, 2, 4), 2),
])
def test_first_mismatch(expected, actual, first):
    from rocketray.broker.queue_check import first_mismatch
    assert first_mismatch(expected, actual) == first
