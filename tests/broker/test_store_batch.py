"""The batch write path: a producer's encoded batch is checked and sealed in one pass, stored
byte-for-byte as the per-message encoder would store it, refused whole when malformed, and its
consume-queue entries (built while sealing or receiving) equal a rebuild from the log."""

from __future__ import annotations

import random
import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocketray.broker.config import StoreConfig
from rocketray.wire.message import (HEADER_SIZE, Message, MessageCodecError, decode_record, encode_record,
                                    verify_record)
from rocketray.wire.batch import EncodedBatch, encode_batch
from rocketray.broker.batch import index_records, seal_batch
from rocketray.broker.store import MalformedBatch, MessageStore, StoreError

SMALL = StoreConfig(segment_size_bytes=4096, background_thread=False)


def mixed(n: int, seed: int = 0) -> list[Message]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        props = rng.choice([{}, {"TAGS": "t%d" % (i % 3)}, {"pid": f"p-{i}"}, {"KEYS": "k", "TAGS": "x"}])
        out.append(Message(rng.choice(["A", "B_2"]), rng.randrange(3), rng.randbytes(rng.randrange(0, 300)), props,
                           flags=rng.randrange(4), born_timestamp_ms=1000 + i))
    return out


def log_bytes(store: MessageStore) -> bytes:
    out, pos = bytearray(), store.min_offset
    while pos < store.max_offset:
        view = store.read_raw(pos, 1 << 20)
        out += view
        pos += len(view)
    return bytes(out)


def queue_entries(store: MessageStore) -> dict:
    return {key: [(e.queue_offset, e.physical_offset, e.size, e.tag_hash) for e in cq.read(0, 1 << 20)]
            for key, cq in sorted(store.cqs.queues.items())}


def test_sealed_batch_is_byte_identical_to_the_per_message_encoding(tmp_path: Path) -> None:
    """A sealed batch stores exactly encode_record(message with its positions): the record layout
    (both CRCs included) is the one the rest of the system and the replicas read."""
    store = MessageStore(tmp_path, SMALL)
    store.put_messages(mixed(5, seed=9), now_ms=3)
    batch = mixed(40, seed=1)
    result = store.put_batch(encode_batch(batch), now_ms=77)
    assert result.count == 40 and result.end_offset == store.max_offset
    expected = b"".join(encode_record(m.with_position(qo, po, 77)) for m, (qo, po) in zip(batch, result.offsets()))
    data = log_bytes(store)
    assert data[result.start_offset:] == expected
    for m, (qo, po) in zip(batch, result.offsets()):
        got, size = decode_record(data, po)
        assert got == m.with_position(qo, po, 77)
        assert verify_record(data, po) == (size, po)


def test_queue_offsets_continue_per_queue_across_batches_and_segments(tmp_path: Path) -> None:
    """Queue offsets continue per (topic, queue id) across batches; a batch larger than the room left
    in a segment rolls at a record boundary; every record is where its physical offset says."""
    store = MessageStore(tmp_path, SMALL)
    seen: dict[tuple[str, int], list[int]] = {}
    for b in range(6):
        batch = mixed(25, seed=b)
        for m, (qo, _po) in zip(batch, store.put_batch(encode_batch(batch), now_ms=b).offsets()):
            seen.setdefault((m.topic, m.queue_id), []).append(qo)
    assert all(v == list(range(len(v))) for v in seen.values())
    assert len(store.commitlog.segments) > 3
    for seg in store.commitlog.segments:
        pos = seg.base_offset
        while pos < seg.end_offset:
            size, physical = verify_record(store.commitlog.read(pos, seg.end_offset - pos))
            assert physical == pos
            pos += size


def corruptions(data: bytes) -> list[tuple[str, bytes, int]]:
    """(what, bad batch bytes, claimed count) for a valid batch of records ``data``."""
    size = struct.unpack_from(">I", data)[0]

    def patched(off: int, fmt: str, value) -> bytes:
        out = bytearray(data)
        struct.pack_into(fmt, out, off, value)
        return bytes(out)

    body_flip = bytearray(data)
    body_flip[size - 1] ^= 0xFF
    bad_props = Message("T", 0, b"x", {"a": "b"})
    raw = bytearray(encode_record(bad_props))
    raw[HEADER_SIZE + 1 + 1] = 0x02  # 'a' 0x02 'b' 0x02: a name without a value separator
    bad_topic = bytearray(encode_record(Message("T", 0, b"x")))
    bad_topic[HEADER_SIZE] = ord("/")
    non_utf8 = bytearray(encode_record(Message("T", 0, b"x", {"a": "b"})))
    non_utf8[HEADER_SIZE + 1 + 2] = 0xFF
    return [
        ("bad magic", patched(4, ">I", 0x12345678), 0),
        ("total too large", patched(0, ">I", size + 1), 0),
        ("total too small", patched(0, ">I", 10), 0),
        ("body CRC", bytes(body_flip), 0),
        ("truncated", data[:-3], 0),
        ("trailing bytes", data + b"\0" * 10, 0),
        ("bad properties", data + bytes(raw), 1),
        ("bad topic", data + bytes(bad_topic), 1),
        ("properties not UTF-8", data + bytes(non_utf8), 1),
        ("count mismatch", data, 1),
    ]


@pytest.mark.parametrize("case", range(10))
def test_malformed_batch_is_refused_whole_and_writes_nothing(tmp_path: Path, case: int) -> None:
    """Every kind of malformed batch raises MalformedBatch (a StoreError and a MessageCodecError)
    and leaves the log, the queue table and the queues exactly as they were."""
    store = MessageStore(tmp_path, SMALL)
    store.put_messages(mixed(7), now_ms=1)
    good = encode_batch(mixed(4, seed=3))
    what, bad, extra = corruptions(good.data)[case]
    before = (log_bytes(store), store.max_offset, store.next_queue_offset("A", 0), store.next_queue_offset("T", 0))
    with pytest.raises(MalformedBatch) as info:
        store.put_batch(EncodedBatch(bad, good.count + extra), now_ms=2)
    assert isinstance(info.value, StoreError) and isinstance(info.value, MessageCodecError), what
    after = (log_bytes(store), store.max_offset, store.next_queue_offset("A", 0), store.next_queue_offset("T", 0))
    assert after == before, what
    assert store.put_batch(good, now_ms=3).count == 4  # the store still works


def test_oversized_record_in_a_batch_is_refused(tmp_path: Path) -> None:
    """A record larger than a segment is refused before anything is written."""
    store = MessageStore(tmp_path, SMALL)
    batch = encode_batch([Message("T", 0, b"a"), Message("T", 0, b"b" * 5000)])
    with pytest.raises(MalformedBatch, match="exceeds"):
        store.put_batch(batch, now_ms=0)
    assert store.max_offset == 0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), min_size=1, max_size=3))
def test_a_corrupted_batch_is_refused_or_stored_readable(tmp_path_factory, flips) -> None:
    """Any byte corruption of a batch is either refused (nothing written) or stores only records that
    verify and decode: the master never writes a record a reader, a slave or recovery would reject."""
    store = MessageStore(tmp_path_factory.mktemp("s"), SMALL)
    batch = encode_batch(mixed(6, seed=5))
    data = bytearray(batch.data)
    for pos, x in flips:
        data[pos % len(data)] ^= x
    try:
        result = store.put_batch(EncodedBatch(bytes(data), batch.count), now_ms=1)
    except MalformedBatch:
        assert store.max_offset == 0
        return
    stored = log_bytes(store)
    assert len(stored) == result.end_offset
    pos = 0
    while pos < len(stored):
        msg, size = decode_record(stored, pos)
        assert msg.physical_offset == pos
        pos += size
    assert index_records(stored, 0, verify=True).count == batch.count


def test_seal_does_not_touch_the_producers_bytes() -> None:
    """seal_batch works on a copy: the producer's batch can be sent again (a retry) unchanged."""
    batch = encode_batch(mixed(5))
    copy = bytes(batch.data)
    sealed = seal_batch(batch, 100, {}, 5, 1 << 20)
    assert batch.data == copy and sealed.data != copy and len(sealed.data) == len(copy)


@pytest.mark.parametrize("backlog_max", [1 << 20, 3, 0])
def test_dispatch_from_the_backlog_equals_a_rebuild(tmp_path: Path, backlog_max: int) -> None:
    """Consume-queue entries built while appending, dispatched as the confirm offset moves to every
    record boundary (mid-batch included), equal the queues rebuilt from the log; also when the
    in-memory backlog is capped (3 entries) or off (0) and the dispatcher scans the log instead."""
    store = MessageStore(tmp_path / "m", SMALL)
    store.dispatcher.pending.max_entries = backlog_max
    rng = random.Random(backlog_max)
    boundaries = []
    for b in range(8):
        batch = mixed(rng.randrange(1, 12), seed=b)
        result = store.put_batch(encode_batch(batch), now_ms=b)
        boundaries += [po for _qo, po in result.offsets()] + [result.end_offset]
    for target in sorted(set(rng.sample(boundaries, 10))) + [store.max_offset]:
        store.confirm_offset = target
        assert store.dispatched_offset == target
    incremental = queue_entries(store)
    store.rebuild_consume_queues()
    assert queue_entries(store) == incremental
    assert sum(len(v) for v in incremental.values()) == len(boundaries) - 8


def test_reopened_store_dispatches_its_unconfirmed_tail_without_scanning_the_log(tmp_path: Path) -> None:
    """Start-up indexes the records beyond the confirm offset into the backlog: raising the confirm
    offset later (a new master's event loop) takes their runs and reads no log. The old rule scanned
    the log there (260 ms for 256 MiB read from disk, on the loop). Queue offsets continue too."""
    store = MessageStore(tmp_path, SMALL)
    for b in range(6):
        store.put_batch(encode_batch(mixed(9, seed=b)), now_ms=b)
    store.confirm_offset = store.read_raw(0, 1000).nbytes      # somewhere in the first segment
    store.close()
    store = MessageStore(tmp_path, SMALL)
    confirmed = store.confirm_offset
    assert 0 < confirmed < store.max_offset
    next_offsets = {key: store.next_queue_offset(*key) for key in [("A", q) for q in range(3)]}

    def no_scan(*_args):
        raise AssertionError("the log was scanned")

    store.commitlog.index_range = no_scan
    store.confirm_offset = store.max_offset
    assert store.dispatched_offset == store.max_offset
    assert {key: store.next_queue_offset(*key) for key in next_offsets} == next_offsets
    dispatched = queue_entries(store)
    del store.commitlog.index_range
    store.rebuild_consume_queues()
    assert queue_entries(store) == dispatched
    store.close()


def test_slave_append_raw_builds_the_same_queues_and_log(tmp_path: Path) -> None:
    """A slave appending the master's bytes in arbitrary whole-record chunks ends byte-identical,
    with the same consume queues once the confirm offset covers them."""
    master = MessageStore(tmp_path / "m", SMALL)
    slave = MessageStore(tmp_path / "s", SMALL)
    for b in range(5):
        master.put_batch(encode_batch(mixed(15, seed=b)), now_ms=b)
    rng = random.Random(1)
    pos = 0
    while pos < master.max_offset:
        chunk = master.read_raw(pos, rng.randrange(1, 1500))
        assert slave.append_raw(pos, chunk) == pos + len(chunk)
        pos += len(chunk)
        slave.confirm_offset = rng.choice([slave.confirm_offset, pos])
    master.confirm_offset = slave.confirm_offset = master.max_offset
    assert log_bytes(slave) == log_bytes(master)
    assert queue_entries(slave) == queue_entries(master)


def test_append_raw_refuses_a_corrupt_record_and_writes_nothing(tmp_path: Path) -> None:
    """A received chunk with one bad record (body CRC, or a wrong physical offset) is refused whole."""
    master = MessageStore(tmp_path / "m", SMALL)
    master.put_batch(encode_batch(mixed(3)), now_ms=1)
    data = bytearray(master.read_raw(0, 1 << 20))
    slave = MessageStore(tmp_path / "s", SMALL)
    data[-1] ^= 1
    with pytest.raises(StoreError, match="body CRC"):
        slave.append_raw(0, bytes(data))
    assert slave.max_offset == 0
    with pytest.raises(StoreError, match="physical offset"):
        slave.append_raw(64, master.read_raw(0, 1 << 20))  # an empty store restarts only on success
    assert (slave.min_offset, slave.max_offset) == (0, 0)


def test_truncate_drops_the_backlog_of_cut_records(tmp_path: Path) -> None:
    """Records cut by a truncation never reach a consume queue, and records appended after it do."""
    store = MessageStore(tmp_path, SMALL)
    first = store.put_batch(encode_batch(mixed(4)), now_ms=1)
    cut = store.put_batch(encode_batch(mixed(4, seed=2)), now_ms=2)
    store.truncate(cut.start_offset)
    again = store.put_batch(encode_batch(mixed(3, seed=3)), now_ms=3)
    store.confirm_offset = store.max_offset
    entries = queue_entries(store)
    ends = {po + size for v in entries.values() for _qo, po, size, _t in v}
    assert max(ends) == again.end_offset == store.max_offset
    physicals = sorted(po for v in entries.values() for _qo, po, _s, _t in v)
    assert physicals == sorted([po for _q, po in first.offsets()] + [po for _q, po in again.offsets()])
    store.rebuild_consume_queues()
    assert queue_entries(store) == entries


def test_read_uncommitted_dispatches_at_append(tmp_path: Path) -> None:
    """With read_uncommitted the entries are dispatched as part of the append."""
    store = MessageStore(tmp_path, StoreConfig(segment_size_bytes=4096, background_thread=False,
                                               read_uncommitted=True))
    store.put_batch(encode_batch(mixed(9)), now_ms=1)
    assert store.dispatched_offset == store.max_offset
    assert sum(len(v) for v in queue_entries(store).values()) == 9


def test_properties_tag_hash_matches_the_decoder() -> None:
    """The tag hash the sealer computes is the one decode_index computes (CRC32 of TAGS)."""
    batch = encode_batch([Message("T", 0, b"x", {"TAGS": "hello", "k": "v"}), Message("T", 0, b"y")])
    sealed = seal_batch(batch, 0, {}, 0, 1 << 20)
    entries = sealed.index.runs[0].entries
    tags = [struct.unpack_from(">qIQ", entries, i * 20)[2] for i in range(2)]
    assert tags == [zlib.crc32(b"hello"), 0]


def test_background_flush_outside_the_lock_keeps_checkpoints_true(tmp_path: Path) -> None:
    """The flusher fsyncs outside the store lock while puts, confirm moves and truncations run: after
    a kill at any point the reopened store's log verifies and its queues equal a rebuild (the
    checkpoint never vouches for queue entries or log bytes that were not synced or were cut)."""
    config = StoreConfig(segment_size_bytes=8192, flush_interval_ms=1, background_thread=True)
    rng = random.Random(4)
    for round_ in range(3):
        store = MessageStore(tmp_path / f"r{round_}", config)
        boundaries = [0]
        for step in range(150):
            result = store.put_batch(encode_batch(mixed(rng.randrange(1, 6), seed=step)), now_ms=step)
            boundaries += [po for _q, po in result.offsets()][1:] + [result.end_offset]
            if rng.random() < 0.5:
                store.confirm_offset = rng.choice(boundaries[-8:])
            if rng.random() < 0.05:
                cut = rng.choice([b for b in boundaries if b >= store.min_offset])
                store.truncate(cut)
                boundaries = [b for b in boundaries if b <= cut]
        store.abandon()
        reopened = MessageStore(tmp_path / f"r{round_}", StoreConfig(segment_size_bytes=8192, background_thread=False))
        assert reopened.commitlog.first_invalid(reopened.min_offset) is None
        entries = queue_entries(reopened)
        reopened.rebuild_consume_queues()
        assert queue_entries(reopened) == entries
        reopened.close()


class _SyncLog:
    """The real disk, recording which files were fsynced (by name, through their duplicates too)."""

    def __init__(self) -> None:
        from rocketray.fs import OS_DISK
        self.disk = OS_DISK
        self.synced: list[str] = []

    def __getattr__(self, name: str):
        return getattr(self.disk, name)

    def open(self, path, *args, **kwargs):
        return _SyncLogFile(self, Path(path).name, self.disk.open(path, *args, **kwargs))


class _SyncLogFile:
    def __init__(self, log: _SyncLog, name: str, inner) -> None:
        self._log, self._name, self._inner = log, name, inner

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def fsync(self) -> None:
        self._log.synced.append(self._name)
        self._inner.fsync()

    def dup(self) -> "_SyncLogFile":
        return _SyncLogFile(self._log, self._name, self._inner.dup())


def test_async_flush_syncs_the_log_early_after_flush_least_bytes(tmp_path: Path) -> None:
    """Async mode with a one-minute interval: a few bytes alone wait for the interval; once
    FLUSH_LEAST_BYTES were appended the flusher fsyncs the log within a tick (small fsyncs keep
    writers' pwrites from waiting long) and leaves the queues and the checkpoint to the periodic
    flush; that one then covers everything."""
    import time

    from rocketray.broker import store as store_module
    from rocketray.broker.checkpoint import load_checkpoint

    disk = _SyncLog()
    config = StoreConfig(segment_size_bytes=1 << 24, flush_interval_ms=60_000)
    store = MessageStore(tmp_path, config, disk=disk)   # type: ignore[arg-type]
    disk.synced.clear()                                     # what opening synced
    try:
        store.put_batch(encode_batch(mixed(3)), now_ms=0)
        small_end = store.max_offset
        time.sleep(5 * store_module.FLUSH_TICK_MS / 1000)
        assert not disk.synced
        body = bytes(4096)
        while store.max_offset - small_end < store_module.FLUSH_LEAST_BYTES:
            store.put_batch(encode_batch(Message("T", 0, body) for _ in range(64)), now_ms=1)
        end = store.max_offset
        segment = f"{0:020d}"
        deadline = time.monotonic() + 10
        while segment not in disk.synced:
            assert time.monotonic() < deadline, "no early flush"
            time.sleep(0.01)
        time.sleep(5 * store_module.FLUSH_TICK_MS / 1000)
        assert set(disk.synced) == {segment}, disk.synced       # the log alone
        assert load_checkpoint(tmp_path).verified_offset < end
        store._flush_in_background()                            # the periodic flush
        assert load_checkpoint(tmp_path).verified_offset == end
        assert len(set(disk.synced)) > 1                        # the queues too
    finally:
        store.close()


def test_the_properties_check_is_the_grammar() -> None:
    """properties_tag_hash accepts exactly ``(name 0x01 value 0x02)*`` with non-empty names (the
    grammar as a regular expression, the old check) on UTF-8 bytes: random strings over an
    alphabet rich in separators, and the malformed shapes by name."""
    import re

    from rocketray.wire.batch import properties_tag_hash
    from rocketray.wire.message import MessageCodecError

    grammar = re.compile(rb"(?:[^\x01\x02]+\x01[^\x01\x02]*\x02)*")

    def accepted(raw: bytes) -> bool:
        try:
            properties_tag_hash(raw)
            return True
        except MessageCodecError:
            return False

    rng = random.Random(7)
    alphabet = [b"\x01", b"\x02", b"a", b"TAGS", b"k"]
    samples = [b"", b"\x01\x02", b"a\x01\x02", b"a\x01b", b"a\x01b\x02\x01c\x02", b"a\x01\x01b\x02",
               b"a\x02", b"a\x01b\x02c", b"a\x01b\x02c\x01d\x02", b"TAGS\x01t\x02"]
    samples += [b"".join(rng.choice(alphabet) for _ in range(rng.randrange(8))) for _ in range(5000)]
    for raw in samples:
        assert accepted(raw) == bool(grammar.fullmatch(raw)), raw
    assert not accepted(b"a\x01\xff\xfe\x02")                        # not UTF-8
    assert properties_tag_hash(b"k\x01v\x02TAGS\x01hello\x02") == zlib.crc32(b"hello")
