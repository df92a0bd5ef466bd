"""The store's filtered queue reads and its offset search by store time, over a real store."""

from __future__ import annotations

from pathlib import Path

import pytest

from rocketray.broker.config import StoreConfig
from rocketray.wire.message import Message, decode_record
from rocketray.broker.store import MessageStore
from rocketray.broker.tag_filter import parse_expression

SMALL = StoreConfig(segment_size_bytes=4096, background_thread=False)
TAGS = ("paid", "created", None, "refunded", "created", "created")    # by queue offset mod 6


def tagged(n: int, start: int = 0) -> list[Message]:
    out = []
    for i in range(start, start + n):
        tag = TAGS[i % len(TAGS)]
        out.append(Message("T", 0, f"m{i}".encode(), {"TAGS": tag} if tag else {}, born_timestamp_ms=i))
    return out


def offsets(records: bytes, count: int) -> list[int]:
    out, pos = [], 0
    for _ in range(count):
        msg, size = decode_record(records, pos)
        out.append(msg.queue_offset)
        pos += size
    return out


@pytest.fixture
def store(tmp_path: Path):
    s = MessageStore(tmp_path, SMALL)
    yield s
    s.close()


WANTED = parse_expression("paid || refunded").codes


def test_a_filtered_read_returns_only_wanted_records_and_passes_the_rest(store):
    """Entries whose tag code is not subscribed are skipped; the next offset is past all looked at."""
    store.put_messages(tagged(30), now_ms=1)
    store.confirm_offset = store.max_offset
    records, count, first, passed, end = store.read_queue_filtered("T", 0, 0, 100, 1 << 20, WANTED)
    assert offsets(records, count) == [i for i in range(30) if i % 6 in (0, 3)]
    assert (first, passed, end) == (0, 30, 30)
    records, count, first, passed, _ = store.read_queue_filtered("T", 0, 1, 3, 1 << 20, WANTED)
    assert offsets(records, count) == [3, 6, 9] and (first, passed) == (1, 10)   # stops at max_count


def test_an_unwanted_record_is_never_read(store, monkeypatch):
    """The filter works on the consume queue: only wanted records are read from the commit log."""
    stored = store.put_messages(tagged(12), now_ms=1)
    store.confirm_offset = store.max_offset
    read: list[int] = []
    real = store.commitlog.read
    monkeypatch.setattr(store.commitlog, "read", lambda off, n: (read.append(off), real(off, n))[1])
    store.read_queue_filtered("T", 0, 0, 100, 1 << 20, WANTED)
    assert read == [m.physical_offset for m in stored if m.queue_offset % 6 in (0, 3)]


def test_a_filtered_read_stops_at_the_confirm_offset_and_its_scan_bound(store):
    """Never past the confirm offset (not even past an unwanted entry); at most max_scan entries."""
    stored = store.put_messages(tagged(30), now_ms=1)
    store.confirm_offset = stored[8].physical_offset      # entries 0..7 visible
    records, count, _, passed, _ = store.read_queue_filtered("T", 0, 0, 100, 1 << 20, WANTED)
    assert offsets(records, count) == [0, 3, 6] and passed == 8
    store.confirm_offset = store.max_offset
    records, count, _, passed, _ = store.read_queue_filtered("T", 0, 7, 100, 1 << 20, WANTED, max_scan=5)
    assert offsets(records, count) == [9] and passed == 12
    records, count, _, passed, _ = store.read_queue_filtered("T", 0, 4, 100, 1 << 20, WANTED, max_scan=2)
    assert count == 0 and passed == 6                      # nothing wanted in the bound: still passed


def test_a_filtered_read_keeps_max_bytes_but_returns_at_least_one(store):
    """max_bytes bounds the wanted records' bytes (the first one always goes); what follows the
    last one kept is passed only up to the next wanted entry, which the next pull starts at."""
    store.put_messages(tagged(12), now_ms=1)
    store.confirm_offset = store.max_offset
    size = {q: len(store.read_queue("T", 0, q, 1, 1 << 20)[0]) for q in (0, 3)}
    records, count, _, passed, _ = store.read_queue_filtered("T", 0, 0, 100, 1, WANTED)
    assert offsets(records, count) == [0] and passed == 3
    records, count, _, passed, _ = store.read_queue_filtered("T", 0, 0, 100, size[0] + size[3], WANTED)
    assert offsets(records, count) == [0, 3] and passed == 6


def test_search_offset_finds_the_first_record_stored_at_or_after_a_time(store):
    """RocketMQ's searchOffset: a binary search of the queue by store time."""
    for t in range(10):
        store.put_messages(tagged(3, start=3 * t), now_ms=1000 + 100 * t)   # offsets 3t..3t+2 at 1000+100t
    store.confirm_offset = store.max_offset
    assert store.search_offset("T", 0, 0) == 0
    assert store.search_offset("T", 0, 1000) == 0
    assert store.search_offset("T", 0, 1001) == 3
    assert store.search_offset("T", 0, 1450) == 15
    assert store.search_offset("T", 0, 1500) == 15
    assert store.search_offset("T", 0, 1900) == 27
    assert store.search_offset("T", 0, 1901) == 30           # after every record: the queue's end
    assert store.search_offset("nope", 0, 1500) == 0


def test_search_offset_starts_at_what_retention_kept(tmp_path: Path):
    cfg = StoreConfig(segment_size_bytes=4096, background_thread=False, retention_max_bytes=9000, retention_ms=None)
    store = MessageStore(tmp_path, cfg)
    for t in range(100):
        store.put_messages([Message("T", 0, b"x" * 100, born_timestamp_ms=t)], now_ms=1000 + t)
    store.confirm_offset = store.max_offset
    assert store.delete_expired_segments(now_ms=0) > 0
    first = store.queue_min_offset("T", 0)
    assert first > 0
    assert store.search_offset("T", 0, 0) == first
    assert store.search_offset("T", 0, 1000 + first + 5) == first + 5
    store.close()


def test_a_read_below_a_rebased_queue_starts_at_its_first_entry(tmp_path: Path):
    """A slave whose log starts mid-queue (its first transfer from the master's min offset) has a
    consume queue based past 0: a pull from 0, filtered or not, answers from the base and says so,
    so the next pull continues after what it returned."""
    master = MessageStore(tmp_path / "m", SMALL)
    stored = master.put_messages(tagged(30), now_ms=5)
    start = stored[12].physical_offset
    slave = MessageStore(tmp_path / "s", SMALL)
    slave.append_raw(start, master.read_raw(start, 1 << 20))
    slave.confirm_offset = slave.max_offset
    records, count, first, end = slave.read_queue("T", 0, 0, 5, 1 << 20)
    assert offsets(records, count) == [12, 13, 14, 15, 16] and first == 12 and end == 30
    records, count, first, passed, _ = slave.read_queue_filtered("T", 0, 0, 100, 1 << 20, WANTED)
    assert offsets(records, count) == [12, 15, 18, 21, 24, 27] and (first, passed) == (12, 30)
    slave.close()
    master.close()
