"""Store recovery: torn tails, corrupt records, lost checkpoints, crash-safe truncation (kill -9)."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rocketray.broker.checkpoint import CHECKPOINT_FILE
from rocketray.broker.config import StoreConfig
from rocketray.wire.message import Message, decode_record
from rocketray.broker.store import MessageStore

SEG = 4096
CFG = StoreConfig(segment_size_bytes=SEG, background_thread=False)
REPO = Path(__file__).resolve().parents[2]


def msgs(n: int, size: int = 150) -> list[Message]:
    return [Message("T", i % 3, bytes([(i % 250) + 1]) * size, {"TAGS": "t"}) for i in range(n)]


def segment_files(root: Path) -> list[Path]:
    return sorted((root / "commitlog").iterdir())


def all_messages(store: MessageStore) -> list[Message]:
    out, pos = [], store.min_offset
    while pos < store.max_offset:
        view = store.read_raw(pos, 10**9)
        rel = 0
        while rel < len(view):
            msg, size = decode_record(view, rel)
            out.append(msg)
            rel += size
        pos += len(view)
    return out


@pytest.fixture
def written(tmp_path: Path) -> tuple[Path, list[Message]]:
    """A closed store whose last segment ends with a known final record."""
    root = tmp_path / "base"
    store = MessageStore(root, CFG)
    stored = store.put_messages(msgs(60), now_ms=7)
    store.confirm_offset = store.max_offset
    store.close()
    return root, stored


def _final_record(root: Path, stored: list[Message]) -> tuple[Path, int, int]:
    last = segment_files(root)[-1]
    base = int(last.name)
    start = stored[-1].physical_offset - base
    end = start + len(bytes(MessageStore(root, CFG).read_raw(stored[-1].physical_offset, 1)))
    return last, start, end


def test_torn_tail_cut_at_every_byte_of_final_record(written, tmp_path: Path) -> None:
    """Cutting the last segment file at every byte of its final record: recovery keeps exactly the whole
    records before it, reports the cut bytes, and the store accepts appends again."""
    root, stored = written
    last, start, end = _final_record(root, stored)
    for cut in range(start, end):
        case = tmp_path / f"cut{cut}"
        shutil.copytree(root, case)
        seg = case / "commitlog" / last.name
        partial = seg.read_bytes()[start:cut]
        os.truncate(seg, cut)
        store = MessageStore(case, CFG)
        assert store.max_offset == stored[-1].physical_offset, cut
        assert store.recovered_cut_bytes == len(partial.rstrip(b"\0")), cut
        assert all_messages(store) == stored[:-1]
        assert store.confirm_offset == store.max_offset  # clamped to the recovered end
        assert store.get_messages("T", stored[-1].queue_id, stored[-1].queue_offset, 1) == []
        again = store.put_messages(msgs(1), now_ms=8)[0]
        assert again.physical_offset == stored[-1].physical_offset
        store.close()
        shutil.rmtree(case)


def test_torn_tail_with_zeros_in_preallocated_file(written, tmp_path: Path) -> None:
    """A record whose tail never reached the disk (zeros, file keeps its size) is cut on recovery."""
    root, stored = written
    last, start, end = _final_record(root, stored)
    for cut in random.Random(5).sample(range(start, end), 25):
        case = tmp_path / f"zero{cut}"
        shutil.copytree(root, case)
        seg = case / "commitlog" / last.name
        with open(seg, "r+b") as f:
            f.seek(cut)
            f.write(bytes(end - cut))
        store = MessageStore(case, CFG)
        assert store.max_offset == stored[-1].physical_offset, cut
        assert all_messages(store) == stored[:-1]
        store.close()
        shutil.rmtree(case)


def test_corrupt_byte_in_final_record_is_cut(written, tmp_path: Path) -> None:
    """A flipped byte anywhere in the final record (CRC failure) cuts exactly that record."""
    root, stored = written
    last, start, end = _final_record(root, stored)
    for pos in random.Random(9).sample(range(start, end), 20):
        case = tmp_path / f"flip{pos}"
        shutil.copytree(root, case)
        seg = case / "commitlog" / last.name
        data = bytearray(seg.read_bytes())
        data[pos] ^= 0xFF
        seg.write_bytes(bytes(data))
        store = MessageStore(case, CFG)
        assert store.max_offset == stored[-1].physical_offset
        assert store.recovered_cut_bytes > 0
        store.close()
        shutil.rmtree(case)


def test_lost_checkpoint_rescans_everything_and_rebuilds_queues(written, tmp_path: Path) -> None:
    """Without a checkpoint, a corrupt record in a middle segment cuts the log there (later segments
    deleted) and consume queues are rebuilt from the commit log."""
    root, stored = written
    files = segment_files(root)
    assert len(files) >= 3
    victim = files[1]
    base = int(victim.name)
    inside = [m for m in stored if base <= m.physical_offset < int(files[2].name)]
    target = inside[len(inside) // 2]
    data = bytearray(victim.read_bytes())
    data[target.physical_offset - base + 100] ^= 1
    victim.write_bytes(bytes(data))
    (root / CHECKPOINT_FILE).unlink()
    shutil.rmtree(root / "consumequeue")
    store = MessageStore(root, CFG)
    assert store.max_offset == target.physical_offset
    assert [p.name for p in segment_files(root)] == [f.name for f in files[:2]]
    before = [m for m in stored if m.physical_offset < target.physical_offset]
    assert all_messages(store) == before
    store.confirm_offset = store.max_offset
    for qid in range(3):
        assert store.get_messages("T", qid, 0, 1000) == [m for m in before if m.queue_id == qid]
    store.close()


def test_queues_rebuilt_after_crash_without_checkpoint_update(tmp_path: Path) -> None:
    """Messages dispatched after the last checkpoint are re-dispatched on restart (no loss, no dupes);
    the confirm offset comes back as last persisted (at the flush), never beyond it."""
    store = MessageStore(tmp_path, CFG)
    store.put_messages(msgs(20), now_ms=1)
    store.confirm_offset = store.max_offset
    store.flush()
    more = store.put_messages(msgs(20), now_ms=2)
    store.confirm_offset = store.max_offset
    store.abandon()  # no checkpoint for the second half
    store = MessageStore(tmp_path, CFG)
    assert store.confirm_offset == more[0].physical_offset
    assert store.get_messages("T", 0, 0, 1000)[-1].physical_offset < more[0].physical_offset
    store.confirm_offset = store.max_offset
    got = store.get_messages("T", 0, 0, 1000)
    assert [m.queue_offset for m in got] == list(range(len(got)))
    assert got[-1] == [m for m in more if m.queue_id == 0][-1]
    store.close()


def test_truncate_then_crash_in_process(tmp_path: Path) -> None:
    """truncate, then drop the store without close: reopening never brings cut data back."""
    store = MessageStore(tmp_path, CFG)
    stored = store.put_messages(msgs(60), now_ms=1)
    store.confirm_offset = store.max_offset
    store.flush()
    p = stored[20].physical_offset
    store.truncate(p)
    store.abandon()
    store = MessageStore(tmp_path, CFG)
    assert store.max_offset == p and store.recovered_cut_bytes == 0
    assert all_messages(store) == stored[:20]
    assert store.confirm_offset == p
    store.close()


WRITER = textwrap.dedent("""
    import sys
    from rocketray.broker.config import StoreConfig
    from rocketray.wire.message import Message
    from rocketray.broker.store import MessageStore
    root, mode = sys.argv[1], sys.argv[2]
    store = MessageStore(root, StoreConfig(segment_size_bytes=4096, flush_interval_ms=5))
    msgs = [Message("T", i % 3, bytes([i % 250 + 1]) * 150) for i in range(60)]
    if mode == "truncate":
        stored = store.put_messages(msgs, now_ms=1)
        store.confirm_offset = store.max_offset
        store.flush()
        store.truncate(stored[20].physical_offset)
        print("TRUNCATED", stored[20].physical_offset, flush=True)
    else:
        i = 0
        while True:
            store.put_messages(msgs[i % 60:i % 60 + 1] * 3, now_ms=i)
            store.confirm_offset = store.max_offset
            print("PUT", store.max_offset, flush=True)
            i += 1
    sys.stdin.read()
""")


def _spawn(root: Path, mode: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-c", WRITER, str(root), mode], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)


def test_truncate_then_kill_9_never_resurrects(tmp_path: Path) -> None:
    """A writer process truncates and is killed -9 right after: the reopened store ends at the cut."""
    proc = _spawn(tmp_path, "truncate")
    try:
        line = proc.stdout.readline()
        assert line.startswith("TRUNCATED"), line
        p = int(line.split()[1])
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    store = MessageStore(tmp_path, CFG)
    assert store.max_offset == p
    assert len(all_messages(store)) == 20
    assert store.confirm_offset == p
    store.close()


def test_kill_9_during_appends_recovers_whole_records(tmp_path: Path) -> None:
    """A writer killed -9 mid-stream: every acknowledged batch survives and the log is whole records."""
    proc = _spawn(tmp_path, "append")
    acked = 0
    try:
        for _ in range(150):
            line = proc.stdout.readline()
            assert line.startswith("PUT"), line
            acked = int(line.split()[1])
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    store = MessageStore(tmp_path, CFG)
    assert store.max_offset >= acked
    got = all_messages(store)
    assert sum(len(bytes(store.read_raw(m.physical_offset, 1))) for m in got) == store.max_offset - store.min_offset
    for qid in range(3):
        offsets = [m.queue_offset for m in got if m.queue_id == qid]
        assert offsets == list(range(len(offsets)))
    store.close()


def test_consume_queues_rebuilt_when_directory_lost_or_on_demand(written) -> None:
    """A deleted consumequeue directory (checkpoint intact) is rebuilt on open; rebuild_consume_queues()
    gives the same queues."""
    root, stored = written
    shutil.rmtree(root / "consumequeue")
    store = MessageStore(root, CFG)
    expected = {q: [m for m in stored if m.queue_id == q] for q in range(3)}
    assert {q: store.get_messages("T", q, 0, 1000) for q in range(3)} == expected
    store.rebuild_consume_queues()
    assert {q: store.get_messages("T", q, 0, 1000) for q in range(3)} == expected
    assert store.next_queue_offset("T", 0) == len(expected[0])
    store.close()
