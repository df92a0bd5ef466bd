"""The lost-unsynced-writes nemesis on a real disk (``rocketray.fs_undo.UndoDisk``): after it, every
file is exactly as it was at its last fsync (names as at their directory's last fsync), and a
store reopened on them holds what it flushed and nothing after it; triggered from outside, the
process SIGKILLs itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from rocketray.broker.config import FlushMode, StoreConfig
from rocketray.wire.message import Message
from rocketray.broker.store import MessageStore
from rocketray.fs_undo import LOST_REPORT, TRIGGER, UNDO_DIR, UndoDisk
from rocketray.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]


def tree(root: Path) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if rel.split(os.sep)[0] == UNDO_DIR:
            continue
        for d in dirnames:
            out[os.path.join(rel, d)] = None
        for f in filenames:
            if f not in (LOST_REPORT,):
                out[os.path.join(rel, f)] = (Path(dirpath) / f).read_bytes()
    out.pop(os.path.join(".", UNDO_DIR), None)
    return out


def test_undo_leaves_exactly_what_was_fsynced(tmp_path: Path) -> None:
    lost: list[bool] = []
    disk = UndoDisk(tmp_path, watch=False, on_lost=lambda: lost.append(True))
    disk.mkdir(tmp_path / "d")
    disk.fsync_dir(tmp_path)
    a = disk.open(tmp_path / "d" / "a", create=True)
    a.pwrite(b"hello world", 0)
    a.fsync()
    b = disk.open(tmp_path / "d" / "b", create=True)
    b.truncate(4096)
    b.pwrite(b"kept", 100)
    b.fsync()
    disk.fsync_dir(tmp_path / "d")
    synced = tree(tmp_path)
    # everything below is never fsynced: a power loss takes it
    a.pwrite(b"HELLO", 0)
    a.pwrite(b"!" * 20, 9)                     # overwrites and extends
    b.truncate(50)                              # cuts "kept"
    c = disk.open(tmp_path / "d" / "c", create=True)
    c.pwrite(b"new", 0)
    c.fsync()                                   # its data is synced, its name is not
    tmp = disk.open(tmp_path / "d" / "a.tmp", create=True)
    tmp.pwrite(b"replacement", 0)
    tmp.fsync()
    disk.rename(tmp_path / "d" / "a.tmp", tmp_path / "d" / "a")
    disk.unlink(tmp_path / "d" / "b")
    disk.mkdir(tmp_path / "e")
    assert tree(tmp_path) != synced
    report = disk.lose_unsynced()
    assert lost == [True] and report["records"] > 0
    assert tree(tmp_path) == synced
    assert json.loads((tmp_path / LOST_REPORT).read_text())["bytes"] == report["bytes"] > 0


def messages(start: int, n: int) -> list[Message]:
    return [Message("T", i % 2, f"m{i}".encode() * 20) for i in range(start, start + n)]


def test_a_store_keeps_what_it_flushed_and_nothing_after(tmp_path: Path) -> None:
    cfg = StoreConfig(segment_size_bytes=4096, flush_mode=FlushMode.ASYNC, background_thread=False)
    disk = UndoDisk(tmp_path, watch=False, on_lost=lambda: None)
    store = MessageStore(tmp_path, cfg, disk=disk)
    store.put_messages(messages(0, 30), now_ms=1)
    store.confirm_offset = store.max_offset
    store.flush()
    flushed = store.max_offset
    store.put_messages(messages(30, 30), now_ms=2)   # rolls segments, never fsynced
    store.confirm_offset = store.max_offset
    assert disk.pending > 0
    disk.lose_unsynced()
    store.abandon()
    with MessageStore(tmp_path, StoreConfig(segment_size_bytes=4096, background_thread=False)) as again:
        assert again.max_offset == flushed and again.recovered_cut_bytes == 0
        again.confirm_offset = again.max_offset
        got = [m.body for q in (0, 1) for m in again.get_messages("T", q, 0, 100)]
        assert sorted(got) == sorted(m.body for m in messages(0, 30))


CHILD = textwrap.dedent("""
    import sys, time
    from rocketray.broker.config import StoreConfig
    from rocketray.wire.message import Message
    from rocketray.broker.store import MessageStore
    store = MessageStore(sys.argv[1], StoreConfig(segment_size_bytes=4096, track_unsynced=True,
                                                  flush_interval_ms=60_000))
    store.put_messages([Message("T", 0, b"synced" * 30) for _ in range(20)], now_ms=1)
    store.confirm_offset = store.max_offset
    store.flush()
    print(store.max_offset, flush=True)
    store.put_messages([Message("T", 0, b"lost" * 30) for _ in range(20)], now_ms=2)
    store.confirm_offset = store.max_offset
    print("ready", flush=True)
    time.sleep(60)
""")


def test_the_trigger_file_makes_the_process_lose_its_unsynced_writes_and_die(tmp_path: Path) -> None:
    root = tmp_path / "store"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(root)], stdout=subprocess.PIPE, text=True,
                             cwd=REPO)
    try:
        flushed = int(child.stdout.readline())
        assert child.stdout.readline().strip() == "ready"
        (root / TRIGGER).touch()
        wait_for(lambda: child.poll() is not None, 10, "the store's process killed itself")
        assert child.returncode == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
    assert json.loads((root / LOST_REPORT).read_text())["bytes"] > 0
    with MessageStore(root, StoreConfig(segment_size_bytes=4096, background_thread=False)) as store:
        assert store.max_offset == flushed
