"""MessageStore basics: put, read_raw, append_raw, get_messages, confirm offset, truncate, retention."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rocketray.broker.config import FlushMode, StoreConfig
from rocketray.broker.epoch_file import EpochEntry
from rocketray.wire.message import Message, decode_record
from rocketray.broker.store import MessageStore, StoreError

SMALL = StoreConfig(segment_size_bytes=4096, background_thread=False)


def msgs(n: int, queue_id: int = 0, size: int = 100, topic: str = "T") -> list[Message]:
    return [Message(topic, queue_id, bytes([i % 251]) * size, {"TAGS": "tag"}, born_timestamp_ms=i) for i in range(n)]


def open_store(path: Path, config: StoreConfig = SMALL) -> MessageStore:
    return MessageStore(path, config)


def records_of(view: memoryview) -> list[Message]:
    out, pos = [], 0
    while pos < len(view):
        msg, size = decode_record(view, pos)
        out.append(msg)
        pos += size
    return out


def test_put_assigns_contiguous_offsets_and_rolls_segments(tmp_path: Path) -> None:
    """put_messages assigns queue offsets per queue and byte positions; segments roll without filler."""
    store = open_store(tmp_path)
    stored = store.put_messages(msgs(30, 0) + msgs(30, 1), now_ms=42)
    assert [m.queue_offset for m in stored if m.queue_id == 0] == list(range(30))
    assert [m.queue_offset for m in stored if m.queue_id == 1] == list(range(30))
    assert stored[0].physical_offset == 0 and all(m.store_timestamp_ms == 42 for m in stored)
    names = sorted(p.name for p in (tmp_path / "commitlog").iterdir())
    assert len(names) > 1 and all(len(n) == 20 for n in names)
    # every segment boundary is a record boundary and the byte space is contiguous
    starts = {m.physical_offset for m in stored}
    for name in names[1:]:
        assert int(name) in starts
    sizes = [os.path.getsize(tmp_path / "commitlog" / n) for n in names[:-1]]
    assert [int(n) for n in names[1:]] == [int(names[0]) + sum(sizes[:i + 1]) for i in range(len(sizes))]
    assert store.max_offset == stored[-1].physical_offset + len(store.read_raw(stored[-1].physical_offset, 1))
    store.close()


def test_read_raw_whole_records_at_least_one(tmp_path: Path) -> None:
    """read_raw returns whole records from an offset, at least one, within max_bytes, never past max."""
    store = open_store(tmp_path)
    stored = store.put_messages(msgs(20), now_ms=1)
    one = store.read_raw(0, 1)
    assert records_of(one) == stored[:1]
    view = store.read_raw(stored[3].physical_offset, 1000)
    got = records_of(view)
    assert got == stored[3:3 + len(got)] and len(view) <= 1000 and got
    assert len(store.read_raw(store.max_offset, 100)) == 0
    with pytest.raises(StoreError):
        store.read_raw(stored[3].physical_offset + 1, 100)
    # a walk with read_raw covers the whole log exactly
    pos, seen = 0, []
    while pos < store.max_offset:
        view = store.read_raw(pos, 700)
        seen += records_of(view)
        pos += len(view)
    assert seen == stored
    store.close()


def test_append_raw_replicates_byte_for_byte(tmp_path: Path) -> None:
    """A slave fed with read_raw chunks through append_raw holds an identical log (other segment size)."""
    master = open_store(tmp_path / "m")
    slave = open_store(tmp_path / "s", StoreConfig(segment_size_bytes=3000, background_thread=False))
    master.put_messages(msgs(25, 0) + msgs(25, 1), now_ms=5)
    pos = 0
    while pos < master.max_offset:
        chunk = master.read_raw(pos, 900)
        pos = slave.append_raw(pos, chunk)
    assert slave.max_offset == master.max_offset
    assert bytes(b"".join(bytes(slave.read_raw(o, 10**6)) for o in _starts(slave))) == \
        bytes(b"".join(bytes(master.read_raw(o, 10**6)) for o in _starts(master)))
    assert slave.next_queue_offset("T", 1) == 25
    slave.confirm_offset = slave.max_offset
    assert [m.queue_offset for m in slave.get_messages("T", 1, 10, 5)] == [10, 11, 12, 13, 14]
    master.close()
    slave.close()


def _starts(store: MessageStore) -> list[int]:
    out, pos = [], store.min_offset
    while pos < store.max_offset:
        out.append(pos)
        pos += len(store.read_raw(pos, 10**9))
    return out


def test_append_raw_refuses_bad_input(tmp_path: Path) -> None:
    """append_raw refuses a wrong offset, a torn record, a corrupt record, a misplaced record; nothing written."""
    master = open_store(tmp_path / "m")
    slave = open_store(tmp_path / "s")
    master.put_messages(msgs(5), now_ms=5)
    data = bytes(master.read_raw(0, 10**6))
    slave.append_raw(0, bytes(master.read_raw(0, 1)))
    first = slave.max_offset
    with pytest.raises(StoreError):
        slave.append_raw(first + 1, data[first:])
    with pytest.raises(StoreError):
        slave.append_raw(first, data[first:-1])
    corrupt = bytearray(data[first:])
    corrupt[-1] ^= 1
    with pytest.raises(StoreError):
        slave.append_raw(first, bytes(corrupt))
    with pytest.raises(StoreError):
        slave.append_raw(first, data[:first])  # a record whose physical offset is 0, placed at `first`
    assert slave.max_offset == first
    assert slave.append_raw(first, data[first:]) == master.max_offset
    master.close()
    slave.close()


def test_empty_store_accepts_first_append_at_any_offset(tmp_path: Path) -> None:
    """A brand-new slave starts its log where the master's transfer starts."""
    master = open_store(tmp_path / "m")
    stored = master.put_messages(msgs(30), now_ms=5)
    start = stored[12].physical_offset
    slave = open_store(tmp_path / "s")
    assert slave.append_raw(start, master.read_raw(start, 500)) > start
    assert slave.min_offset == start
    slave.close()
    reopened = open_store(tmp_path / "s")
    assert reopened.min_offset == start and reopened.confirm_offset == start
    reopened.close()
    master.close()


def test_consume_queue_never_beyond_confirm(tmp_path: Path) -> None:
    """Dispatch and get_messages stop at the confirm offset; raising it dispatches."""
    store = open_store(tmp_path)
    stored = store.put_messages(msgs(10), now_ms=1)
    assert store.get_messages("T", 0, 0, 100) == [] and store.queue_max_offset("T", 0) == 0
    store.confirm_offset = stored[4].physical_offset + 1  # mid-record: only whole records before it
    assert [m.queue_offset for m in store.get_messages("T", 0, 0, 100)] == [0, 1, 2, 3]
    store.confirm_offset = store.max_offset
    assert store.get_messages("T", 0, 0, 100) == stored
    store.confirm_offset = stored[2].physical_offset  # lowered: already-dispatched entries are hidden
    assert store.get_messages("T", 0, 0, 100) == stored[:2]
    assert store.get_messages("T", 0, 1, 1) == stored[1:2]
    assert store.get_messages("nope", 0, 0, 10) == []
    store.close()


def test_queue_positions_report_what_consumers_can_read(tmp_path: Path) -> None:
    """visible_offset counts only entries whose record ends at or before the confirm offset, so it
    matches get_messages; max_offset counts every dispatched entry; one row per queue."""
    store = open_store(tmp_path)
    stored = store.put_messages(msgs(10) + msgs(3, queue_id=1), now_ms=1)
    assert store.queue_positions() == []  # nothing dispatched before a confirm offset
    store.confirm_offset = stored[4].physical_offset + 1
    assert store.queue_positions() == [{"topic": "T", "queue_id": 0, "min_offset": 0, "max_offset": 4,
                                        "visible_offset": 4}]
    store.confirm_offset = store.max_offset
    assert [(q["queue_id"], q["max_offset"], q["visible_offset"]) for q in store.queue_positions()] == [
        (0, 10, 10), (1, 3, 3)]
    store.confirm_offset = stored[2].physical_offset + 5  # lowered, mid-record: entries 0 and 1 stay visible
    q0 = store.queue_positions()[0]
    assert (q0["max_offset"], q0["visible_offset"]) == (10, 2) == (10, len(store.get_messages("T", 0, 0, 100)))
    store.close()


def test_read_uncommitted_dispatches_everything(tmp_path: Path) -> None:
    """With read_uncommitted, consumers see messages beyond the confirm offset."""
    store = open_store(tmp_path, StoreConfig(segment_size_bytes=4096, background_thread=False, read_uncommitted=True))
    stored = store.put_messages(msgs(5), now_ms=1)
    assert store.get_messages("T", 0, 0, 10) == stored
    store.close()


def test_confirm_offset_persisted_and_clamped(tmp_path: Path) -> None:
    """The confirm offset survives a restart and is clamped into [min, max]."""
    store = open_store(tmp_path)
    stored = store.put_messages(msgs(10), now_ms=1)
    store.confirm_offset = stored[6].physical_offset
    store.confirm_offset = 10**12
    assert store.confirm_offset == store.max_offset
    store.confirm_offset = stored[6].physical_offset
    store.close()
    store = open_store(tmp_path)
    assert store.confirm_offset == stored[6].physical_offset
    assert store.get_messages("T", 0, 0, 100) == stored[:6]
    store.truncate(stored[3].physical_offset)
    assert store.confirm_offset == stored[3].physical_offset
    store.close()


def test_truncate_cuts_log_queues_and_epochs(tmp_path: Path) -> None:
    """truncate(p) cuts the log, the queues, clamps confirm and drops epoch entries starting after p."""
    store = open_store(tmp_path)
    stored = store.put_messages(msgs(40), now_ms=1)
    store.confirm_offset = store.max_offset
    p = stored[25].physical_offset
    store.epoch_file.append(EpochEntry(1, 0))
    store.epoch_file.append(EpochEntry(2, stored[30].physical_offset))
    store.truncate(p)
    assert store.max_offset == p and store.confirm_offset == p
    assert store.queue_max_offset("T", 0) == 25 and store.next_queue_offset("T", 0) == 25
    assert store.epoch_file.last_epoch() == 1
    again = store.put_messages(msgs(1), now_ms=2)
    assert again[0].queue_offset == 25 and again[0].physical_offset == p
    store.truncate(store.max_offset + 100)  # beyond the end: no-op
    assert store.max_offset == p + len(store.read_raw(p, 1))
    store.close()


def test_truncate_refuses_non_boundary_and_changes_nothing(tmp_path: Path) -> None:
    """A non-boundary (or below min) truncation raises StoreError and leaves the store unchanged."""
    store = open_store(tmp_path)
    stored = store.put_messages(msgs(20), now_ms=1)
    store.confirm_offset = store.max_offset
    before = (store.max_offset, store.confirm_offset, bytes(store.read_raw(0, 10**6)))
    for bad in (1, stored[5].physical_offset + 7, stored[5].physical_offset - 1):
        with pytest.raises(StoreError, match="not a record boundary"):
            store.truncate(bad)
    with pytest.raises(StoreError):
        store.truncate(-1)
    assert (store.max_offset, store.confirm_offset, bytes(store.read_raw(0, 10**6))) == before
    store.close()


def test_truncate_to_segment_base_and_to_zero(tmp_path: Path) -> None:
    """Truncating exactly at a segment base, and at 0, works and new appends follow."""
    store = open_store(tmp_path)
    store.put_messages(msgs(60), now_ms=1)
    bases = sorted(int(p.name) for p in (tmp_path / "commitlog").iterdir())
    store.truncate(bases[1])
    assert store.max_offset == bases[1]
    assert sorted(int(p.name) for p in (tmp_path / "commitlog").iterdir()) == bases[:2]
    store.put_messages(msgs(60), now_ms=1)
    store.truncate(0)
    assert store.max_offset == 0 and store.next_queue_offset("T", 0) == 0
    assert store.put_messages(msgs(1), now_ms=1)[0].queue_offset == 0
    store.close()


def test_retention_by_size_moves_min_offset(tmp_path: Path) -> None:
    """Retention deletes whole old segments; min offset moves; epoch prefix and queue reads follow."""
    cfg = StoreConfig(segment_size_bytes=4096, background_thread=False, retention_max_bytes=9000, retention_ms=None)
    store = open_store(tmp_path, cfg)
    stored = store.put_messages(msgs(100), now_ms=1)
    store.confirm_offset = store.max_offset
    store.epoch_file.append(EpochEntry(1, 0))
    store.epoch_file.append(EpochEntry(2, 5000))
    deleted = store.delete_expired_segments(now_ms=0)
    assert deleted > 0
    assert store.max_offset - store.min_offset <= 9000 + 4096
    assert store.min_offset > 5000
    assert [e.epoch for e in store.epoch_file.entries()] == [2]
    got = store.get_messages("T", 0, 0, 1000)
    assert got == [m for m in stored if m.physical_offset >= store.min_offset]
    assert store.queue_min_offset("T", 0) == got[0].queue_offset
    (q,) = store.queue_positions()
    assert (q["min_offset"], q["visible_offset"]) == (got[0].queue_offset, 100)
    with pytest.raises(StoreError):
        store.read_raw(0, 10)
    store.close()
    store = open_store(tmp_path, cfg)
    assert store.get_messages("T", 0, 0, 1000) == got
    store.close()


def test_retention_by_age(tmp_path: Path) -> None:
    """Segments older than retention_ms go (never the active one, never unconfirmed records)."""
    cfg = StoreConfig(segment_size_bytes=4096, background_thread=False, retention_ms=1000)
    store = open_store(tmp_path, cfg)
    store.put_messages(msgs(100), now_ms=1)
    assert store.delete_expired_segments() == 0
    far_future_ms = 10**13
    assert store.delete_expired_segments(now_ms=far_future_ms) == 0  # nothing confirmed: nothing deleted
    store.confirm_offset = store.max_offset
    assert store.delete_expired_segments(now_ms=far_future_ms) > 0
    assert len(list((tmp_path / "commitlog").iterdir())) == 1
    assert store.min_offset == store.last_segment_base_offset()
    store.close()


def test_sync_flush_mode_and_background_flusher(tmp_path: Path, wait) -> None:
    """Sync mode works; the async background flusher writes the checkpoint by itself."""
    store = open_store(tmp_path / "s", StoreConfig(segment_size_bytes=4096, flush_mode=FlushMode.SYNC,
                                                   background_thread=False))
    store.put_messages(msgs(10), now_ms=1)
    store.close()
    store = MessageStore(tmp_path / "a", StoreConfig(segment_size_bytes=4096, flush_interval_ms=10))
    store.put_messages(msgs(10), now_ms=1)
    store.confirm_offset = store.max_offset
    from rocketray.broker.checkpoint import load_checkpoint
    wait(lambda: (c := load_checkpoint(tmp_path / "a")) is not None and c.confirm_offset == store.max_offset,
         timeout_s=10, what="background checkpoint with the confirm offset")
    store.close()


def test_oversized_message_refused_without_change(tmp_path: Path) -> None:
    """A message larger than a segment is refused and nothing of its batch is written."""
    store = open_store(tmp_path)
    with pytest.raises(StoreError):
        store.put_messages(msgs(2) + [Message("T", 0, b"x" * 5000)], now_ms=1)
    assert store.max_offset == 0 and store.next_queue_offset("T", 0) == 0
    store.close()


def test_closed_store_refuses(tmp_path: Path) -> None:
    """Operations on a closed store raise StoreError; close is idempotent."""
    store = open_store(tmp_path)
    store.close()
    store.close()
    with pytest.raises(StoreError):
        store.put_messages(msgs(1), now_ms=1)


def test_truncate_invalid_tail(tmp_path: Path) -> None:
    """truncate_invalid_tail returns -1 for a whole tail and cuts at the first bad record otherwise."""
    store = open_store(tmp_path)
    stored = store.put_messages(msgs(10), now_ms=1)
    assert store.truncate_invalid_tail() == -1
    store.flush()
    more = store.put_messages(msgs(10), now_ms=2)
    victim = more[4]
    seg = store.commitlog.segment_for(victim.physical_offset)
    assert seg is not None
    seg.file.pwrite(b"\xff\xff", victim.physical_offset - seg.base_offset + 80)  # damage after the checkpoint
    assert store.truncate_invalid_tail() == victim.physical_offset
    assert store.max_offset == victim.physical_offset
    assert store.truncate_invalid_tail() == -1
    assert stored[0] == records_of(store.read_raw(0, 1))[0]
    store.close()


def test_concurrent_puts_reads_and_background_flush(tmp_path: Path) -> None:
    """Writers, readers, confirm moves and the background flusher run concurrently without errors."""
    import threading
    store = MessageStore(tmp_path, StoreConfig(segment_size_bytes=8192, flush_interval_ms=1))
    errors: list[BaseException] = []

    def writer(qid: int) -> None:
        try:
            for i in range(100):
                store.put_messages(msgs(3, qid), now_ms=i)
                store.confirm_offset = store.max_offset
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def reader() -> None:
        try:
            for _ in range(200):
                for qid in range(3):
                    got = store.get_messages("T", qid, 0, 1000)
                    assert [m.queue_offset for m in got] == list(range(len(got)))
                pos = 0
                while pos < store.confirm_offset:
                    view = store.read_raw(pos, 4096)
                    records_of(view)
                    pos += len(view)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(q,)) for q in range(3)] + [threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    # Each writer read max_offset, then set the confirm offset: a slower writer's stale value could
    # land last (a race of this test, which the master's single event loop does not have), and the
    # reopen below serves only what was confirmed. Confirm the whole log once, after the race.
    store.confirm_offset = store.max_offset
    assert all(store.queue_max_offset("T", q) == 300 for q in range(3))
    store.close()
    store = open_store(tmp_path, StoreConfig(segment_size_bytes=8192, background_thread=False))
    assert all(len(store.get_messages("T", q, 0, 1000)) == 300 for q in range(3))
    store.close()


def test_truncate_across_sealed_segments_larger_than_a_page(tmp_path: Path) -> None:
    """Truncating across segments sealed in this session (maps longer than their files) is safe."""
    cfg = StoreConfig(segment_size_bytes=64 * 1024, background_thread=False)
    store = open_store(tmp_path, cfg)
    # 6000-byte bodies leave more than a page unused at the end of each sealed segment
    stored = store.put_messages(msgs(60, size=6000), now_ms=1)
    assert len(list((tmp_path / "commitlog").iterdir())) > 4
    p = stored[3].physical_offset
    store.truncate(p)
    assert store.max_offset == p
    assert len(list((tmp_path / "commitlog").iterdir())) == 1
    store.put_messages(msgs(10, size=6000), now_ms=2)
    store.close()
    store = open_store(tmp_path, cfg)
    assert store.next_queue_offset("T", 0) == 13
    store.close()
