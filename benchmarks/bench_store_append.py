"""Append throughput of the message store vs writing the same bytes to a plain file.

Measured in one run, on the same file system (a temp dir, or ``--dir``):

* ``store_async``: ``MessageStore.put_batch`` of 1 KiB messages in batches of ``--batch``, async
  flush (background fsync every 500 ms; the final flush is not timed, as the plain baseline has
  none).  The batches are encoded before the clock starts, as a producer does in its own process
  (``encode_batch``); the store checks every record (sizes, topic, properties, body CRC), fills in
  queue offset, physical offset and store timestamp, recomputes the header CRC, builds the
  consume-queue entries and writes the batch with one ``pwrite``;
* ``store_async_dispatch``: the same, raising the confirm offset to the end after every put (what
  a master alone in its SyncStateSet does), so the consume-queue writes are timed too;
* ``plain``: ``os.write`` of the very same stored record bytes, batch by batch, to one file;
* ``store_sync``: ``store_async`` with ``FlushMode.SYNC`` (fsync before each put returns), fewer batches;
* ``plain_sync``: ``os.write`` + ``os.fsync`` of the same batch sizes.

``store_async`` and ``plain`` alternate ``--rounds`` times (default 3), each after an ``os.sync``
so neither pays for the other's writeback, and their medians are compared.

``ratio`` = store/plain **throughput** = plain_time / store_async_time (higher is better; 1.0 would
be "free"; the target is ``target_ratio`` = 0.3); ``ratio_with_dispatch`` the same for
``store_async_dispatch``; ``sync_ratio`` = plain_sync_time / store_sync_time.  ``records`` names the
record loops the store ran (``c+isal``: the C extension ``rocketray.wire._records`` with ISA-L's
CRC-32; ``python+...``: the pure-Python loops, when the extension was not built).

Usage: ``python benchmarks/run.py store-append [--json] [--messages N] [--batch B] [--size BYTES]
[--sync-batches M] [--dir PATH]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from rocketray.broker.config import FlushMode, StoreConfig
from rocketray.wire.message import Message
from rocketray.wire.batch import RECORDS_IMPLEMENTATION, EncodedBatch, encode_batch
from rocketray.broker.store import MessageStore

TARGET_RATIO = 0.3


def _batches(count: int, batch: int, size: int) -> list[EncodedBatch]:
    body = bytes(range(256)) * (size // 256 + 1)
    msgs = [Message("BenchTopic", i % 8, body[i % 256:i % 256 + size], {"TAGS": "bench"}, born_timestamp_ms=i)
            for i in range(count)]
    return [encode_batch(msgs[i:i + batch]) for i in range(0, count, batch)]


def _time_store(root: Path, batches: list[EncodedBatch], mode: FlushMode,
                dispatch: bool = False) -> tuple[float, list[bytes]]:
    store = MessageStore(root, StoreConfig(flush_mode=mode))
    encoded: list[bytes] = []
    start = time.perf_counter()
    for i, batch in enumerate(batches):
        store.put_batch(batch, now_ms=i)
        if dispatch:
            store.confirm_offset = store.max_offset
    elapsed = time.perf_counter() - start
    if dispatch:
        assert store.dispatched_offset == store.max_offset
    pos = store.min_offset
    while pos < store.max_offset:  # the exact bytes the store wrote, batch-sized for the baseline
        view = store.read_raw(pos, 1 << 20)
        encoded.append(bytes(view))
        pos += len(view)
    store.close()
    return elapsed, encoded


def _time_plain(path: Path, chunks: list[bytes], fsync: bool) -> float:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    start = time.perf_counter()
    for chunk in chunks:
        os.write(fd, chunk)
        if fsync:
            os.fsync(fd)
    elapsed = time.perf_counter() - start
    os.close(fd)
    return elapsed


def _rechunk(blobs: list[bytes], batches: list[EncodedBatch]) -> list[bytes]:
    """Split the store's bytes into the same batch sizes the store wrote."""
    data = b"".join(blobs)
    out, pos = [], 0
    for batch in batches:
        n = len(batch.data)
        out.append(data[pos:pos + n])
        pos += n
    assert pos == len(data)
    return out


#: ``benchmarks/run.py store-append --smoke``: a size that finishes in seconds (CI runs it).
SMOKE_ARGS = ["--messages", "2000", "--sync-batches", "10", "--rounds", "1"]


def run(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(prog="store-append")
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--sync-batches", type=int, default=300)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench-store-", dir=args.dir))
    try:
        batches = _batches(args.messages, args.batch, args.size)
        stores, plains = [], []
        for i in range(args.rounds):  # alternated, each after a sync: medians are compared
            os.sync()
            store_s, blobs = _time_store(tmp / f"async-{i}", batches, FlushMode.ASYNC)
            chunks = _rechunk(blobs, batches)
            os.sync()
            plains.append(_time_plain(tmp / f"plain-{i}", chunks, fsync=False))
            stores.append(store_s)
            shutil.rmtree(tmp / f"async-{i}")
            os.unlink(tmp / f"plain-{i}")
        store_s, plain_s = statistics.median(stores), statistics.median(plains)
        total = sum(len(c) for c in chunks)
        os.sync()
        dispatch_s, _ = _time_store(tmp / "async-dispatch", batches, FlushMode.ASYNC, dispatch=True)
        sync_batches = batches[:args.sync_batches]
        sync_s, _ = _time_store(tmp / "sync", sync_batches, FlushMode.SYNC)
        sync_chunks = chunks[:len(sync_batches)]
        sync_total = sum(len(c) for c in sync_chunks)
        plain_sync_s = _time_plain(tmp / "plain-sync", sync_chunks, fsync=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    mb = 1024 * 1024
    n_sync = sum(b.count for b in sync_batches)
    return {
        "messages": args.messages, "batch": args.batch, "message_bytes": args.size, "bytes": total,
        "store_async_s": round(store_s, 4), "plain_s": round(plain_s, 4), "rounds": args.rounds,
        "store_async_s_each": [round(x, 4) for x in stores], "plain_s_each": [round(x, 4) for x in plains],
        "store_async_mb_s": round(total / mb / store_s, 1), "plain_mb_s": round(total / mb / plain_s, 1),
        "store_async_msgs_s": round(args.messages / store_s), "plain_msgs_s": round(args.messages / plain_s),
        "sync_batches": len(sync_batches), "store_sync_s": round(sync_s, 4), "plain_sync_s": round(plain_sync_s, 4),
        "store_sync_mb_s": round(sync_total / mb / sync_s, 1), "plain_sync_mb_s": round(sync_total / mb / plain_sync_s, 1),
        "store_sync_msgs_s": round(n_sync / sync_s), "plain_sync_msgs_s": round(n_sync / plain_sync_s),
        "store_async_dispatch_s": round(dispatch_s, 4),
        "store_async_dispatch_msgs_s": round(args.messages / dispatch_s),
        "ratio": round(plain_s / store_s, 3),
        "ratio_meaning": "store/plain throughput = plain_s / store_async_s (higher is better)",
        "target_ratio": TARGET_RATIO,
        "records": RECORDS_IMPLEMENTATION,
        "ratio_with_dispatch": round(plain_s / dispatch_s, 3),
        "sync_ratio": round(plain_sync_s / sync_s, 3),
    }
