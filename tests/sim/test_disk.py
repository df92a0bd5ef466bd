"""The simulated disk: page cache vs durable, the POSIX promises, crashes (kill, power loss), the
crash hook between IO steps, and determinism."""

from __future__ import annotations

import random

import pytest

from rocketray.fs import OS_DISK, Disk, DiskFile, ensure_dir, read_file, remove_tree
from rocketray.durable import write_durably
from rocketray.sim.disk import CrashMode, SimCrash, SimDisk


def disk(seed: int = 0) -> SimDisk:
    d = SimDisk(random.Random(seed))
    d.mkdir("/d")
    d.fsync_dir("/")
    return d


def test_implements_the_port() -> None:
    d = disk()
    assert isinstance(d, Disk)
    assert isinstance(d.open("/d/f", create=True), DiskFile)
    assert isinstance(OS_DISK, Disk)


def test_write_read_truncate_as_the_process_sees_it() -> None:
    d = disk()
    f = d.open("/d/f", create=True)
    f.pwrite(b"hello", 0)
    f.pwrite(b"XY", 8)  # a write past the end fills with zeros
    assert bytes(f.pread(0, 100)) == b"hello\0\0\0XY"
    assert f.size() == 10
    f.truncate(4)
    assert bytes(f.pread(0, 100)) == b"hell"
    f.truncate(6)
    assert bytes(f.pread(0, 100)) == b"hell\0\0"
    assert read_file(d, "/d/f") == b"hell\0\0"
    assert read_file(d, "/d/missing") is None
    with pytest.raises(FileNotFoundError):
        d.open("/d/missing")


def test_kill_keeps_the_page_cache_and_kills_handles() -> None:
    d = disk()
    f = d.open("/d/f", create=True)
    f.pwrite(b"unsynced", 0)
    d.crash(CrashMode.KILL)
    with pytest.raises(SimCrash):
        f.pread(0, 8)
    assert d.read_bytes("/d/f") == b"unsynced"
    assert d.durable_bytes("/d/f") is None  # neither content nor name was made durable


def test_fsync_makes_content_durable_but_not_the_name() -> None:
    """POSIX: fsync(file) does not make its directory entry durable; fsync(dir) does."""
    lost = 0
    for seed in range(40):
        d = disk(seed)
        f = d.open("/d/f", create=True)
        f.pwrite(b"data", 0)
        f.fsync()
        d.crash(CrashMode.POWER_LOSS)
        if not d.exists("/d/f"):
            lost += 1
        else:
            assert d.read_bytes("/d/f") == b"data"
    assert 0 < lost < 40  # the name sometimes goes, sometimes stays
    d = disk()
    f = d.open("/d/f", create=True)
    f.pwrite(b"data", 0)
    f.fsync()
    d.fsync_dir("/d")
    d.crash(CrashMode.POWER_LOSS)
    assert d.read_bytes("/d/f") == b"data"


def test_power_loss_keeps_none_all_or_a_torn_prefix_of_unsynced_writes() -> None:
    outcomes = set()
    for seed in range(200):
        d = disk(seed)
        f = d.open("/d/f", create=True)
        f.pwrite(b"base", 0)
        f.fsync()
        d.fsync_dir("/d")
        f.pwrite(b"0123456789", 4)
        d.crash(CrashMode.POWER_LOSS)
        data = d.read_bytes("/d/f")
        assert data.startswith(b"base") and b"base0123456789".startswith(data)
        outcomes.add(len(data))
    assert 4 in outcomes and 14 in outcomes  # none, all
    assert outcomes - {4, 14}  # and torn in between


def test_power_loss_after_fsync_loses_nothing() -> None:
    for seed in range(20):
        d = disk(seed)
        f = d.open("/d/f", create=True)
        f.pwrite(b"abc", 0)
        f.truncate(2)
        f.pwrite(b"Z", 5)
        f.fsync()
        d.fsync_dir("/d")
        d.crash(CrashMode.POWER_LOSS)
        assert d.read_bytes("/d/f") == b"ab\0\0\0Z"


def test_unsynced_unlinks_survive_independently_synced_ones_always() -> None:
    kept = set()
    for seed in range(64):
        d = disk(seed)
        for name in "abc":
            f = d.open(f"/d/{name}", create=True)
            f.pwrite(name.encode(), 0)
            f.fsync()
        d.fsync_dir("/d")
        d.unlink("/d/a")
        d.fsync_dir("/d")
        d.unlink("/d/c")
        d.unlink("/d/b")
        assert d.listdir("/d") == []
        d.crash(CrashMode.POWER_LOSS)
        names = tuple(d.listdir("/d"))
        assert "a" not in names
        for name in names:
            assert d.read_bytes(f"/d/{name}") == name.encode()
        kept.add(names)
    assert kept == {(), ("b",), ("c",), ("b", "c")}  # every subset of the unsynced unlinks, a hole included


def test_rename_is_atomic_old_or_new_never_neither() -> None:
    seen = set()
    for seed in range(64):
        d = disk(seed)
        f = d.open("/d/target", create=True)
        f.pwrite(b"old", 0)
        f.fsync()
        d.fsync_dir("/d")
        t = d.open("/d/target.tmp", create=True)
        t.pwrite(b"new", 0)
        t.fsync()
        d.rename("/d/target.tmp", "/d/target")
        assert d.read_bytes("/d/target") == b"new" and not d.exists("/d/target.tmp")
        d.crash(CrashMode.POWER_LOSS)
        content = d.read_bytes("/d/target")
        assert content in (b"old", b"new")
        if content == b"new":
            assert not d.exists("/d/target.tmp")  # the source name goes with the rename
        seen.add(content)
    assert seen == {b"old", b"new"}


def test_write_durably_over_the_sim_survives_power_loss_at_every_step() -> None:
    """rocketray.durable over the port: a crash at any IO step leaves the old or the new bytes; once
    write_durably returned, the new bytes."""
    for step in range(1, 8):
        for mode in CrashMode:
            for seed in range(6):
                d = disk(seed)
                write_durably("/d/cfg", b"old", disk=d)
                d.crash_after(step, mode)
                try:
                    write_durably("/d/cfg", b"new", disk=d)
                    finished = True
                except SimCrash:
                    finished = False
                    assert d.crashes
                if finished:
                    d.set_hook(None)
                    d.crash(mode)
                assert read_file(d, "/d/cfg") in ((b"new",) if finished else (b"old", b"new"))


def test_new_directory_needs_its_parent_fsynced() -> None:
    lost = 0
    for seed in range(32):
        d = disk(seed)
        d.mkdir("/d/sub")
        d.fsync_dir("/d/sub")
        d.crash(CrashMode.POWER_LOSS)
        lost += not d.exists("/d/sub")
    assert 0 < lost < 32
    for seed in range(8):
        d = disk(seed)
        ensure_dir(d, "/d/x/y/z")  # durable: every new name's parent is fsynced
        d.crash(CrashMode.POWER_LOSS)
        assert d.is_dir("/d/x/y/z")


def test_crash_hook_preempts_the_step_and_counts_every_mutation() -> None:
    d = disk()
    start = d.steps
    f = d.open("/d/f", create=True)          # step 1 (create)
    f.pwrite(b"a", 0)                        # 2
    f.fsync()                                # 3
    f.pread(0, 1)                            # reads are not steps
    d.fsync_dir("/d")                        # 4
    assert d.steps - start == 4
    seen = []
    d.set_hook(lambda n, op, path: seen.append((n - start, op)) or None)
    f.truncate(0)
    d.unlink("/d/f")
    assert seen == [(5, "truncate"), (6, "unlink")]
    g = d.open("/d/g", create=True)
    d.crash_after(2, CrashMode.KILL)
    g.pwrite(b"1", 0)
    with pytest.raises(SimCrash) as info:
        g.pwrite(b"2", 1)
    assert info.value.mode is CrashMode.KILL
    assert d.read_bytes("/d/g") == b"1"  # the preempted write never happened


def test_remove_tree_and_listdir() -> None:
    d = disk()
    ensure_dir(d, "/d/t/0")
    d.open("/d/t/0/f", create=True)
    assert d.listdir("/d") == ["t"] and d.is_dir("/d/t") and not d.is_dir("/d/t/0/f")
    remove_tree(d, "/d/t")
    assert d.listdir("/d") == []


def test_same_seed_same_outcome() -> None:
    def run(seed: int) -> list[bytes | None]:
        d = disk(seed)
        out = []
        for i in range(10):
            f = d.open(f"/d/{i}", create=True)
            f.pwrite(bytes(range(50)), 0)
            if i % 3 == 0:
                f.fsync()
        d.crash(CrashMode.POWER_LOSS)
        for i in range(10):
            out.append(d.read_bytes(f"/d/{i}") if d.exists(f"/d/{i}") else None)
        return out

    assert run(7) == run(7)
    assert any(run(7) != run(s) for s in range(8, 12))


def test_identity_and_epoch_files_run_over_the_sim() -> None:
    """The broker identity and the epoch file use the same port: a crash at any step of a save
    leaves the old or the new content, and a finished save survives a power loss."""
    from rocketray.broker.epoch_file import EpochFileCache
    from rocketray.broker.identity import BrokerIdentity

    old, new = BrokerIdentity("c", "b", 1), BrokerIdentity("c", "b", 2)
    for step in range(1, 10):
        for seed in range(4):
            d = disk(seed)
            old.save("/d/broker", disk=d)
            EpochFileCache("/d/broker/epochFileCheckpoint", disk=d).append(1, 0)
            d.crash_after(step, CrashMode.POWER_LOSS)
            try:
                new.save("/d/broker", disk=d)
                EpochFileCache("/d/broker/epochFileCheckpoint", disk=d).append(2, 100)
                finished = True
            except SimCrash:
                finished = False
            d.set_hook(None)
            d.crash(CrashMode.POWER_LOSS)
            loaded = BrokerIdentity.load("/d/broker", disk=d)
            epochs = [e.epoch for e in EpochFileCache("/d/broker/epochFileCheckpoint", disk=d).entries()]
            if finished:
                assert loaded == new and epochs == [1, 2]
            else:
                assert loaded in (old, new) and epochs in ([1], [1, 2])
    d = disk()
    new.save("/d/b2", disk=d)
    BrokerIdentity.clear("/d/b2", disk=d)
    d.crash(CrashMode.POWER_LOSS)
    assert BrokerIdentity.load("/d/b2", disk=d) is None
