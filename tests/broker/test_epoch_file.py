"""Epoch file (reference 12.1, 12.2, 16.5): checkpoint format, .bak fallback, cache operations."""

from __future__ import annotations

from pathlib import Path

import pytest

from rocketray.broker.epoch_file import (MAX_END_OFFSET, EpochEntry, EpochFileCache, EpochFileError, decode_entries,
                               encode_entries, entries_crc)
from rocketray.ha.truncation import EpochRange, find_consistent_point


@pytest.fixture
def cache(tmp_path: Path) -> EpochFileCache:
    c = EpochFileCache(tmp_path / "epochFileCheckpoint")
    assert c.append(EpochEntry(1, 100))
    assert c.append(EpochEntry(2, 300))
    assert c.append(EpochEntry(3, 500))
    return c


# ---------------------------------------------------------------- 12.1 checkpoint file format
def test_crc_examples_of_the_reference() -> None:
    """12.1: the masked CRC32 of the examples is exactly 773307083 and 453994644."""
    assert entries_crc([(7, 7000), (8, 8000)]) == 773307083
    assert entries_crc([(1, 100), (2, 300), (3, 500)]) == 453994644
    assert encode_entries([(7, 7000), (8, 8000)]) == b"2\n773307083\n7-7000\n8-8000\n"


def test_file_on_disk_is_the_reference_text(cache: EpochFileCache) -> None:
    """The file holds count, masked CRC and epoch-startOffset lines, and a .bak copy."""
    text = b"3\n453994644\n1-100\n2-300\n3-500\n"
    assert cache.path is not None
    assert cache.path.read_bytes() == text
    assert cache.path.with_name(cache.path.name + ".bak").read_bytes() == text


def test_decode_rejects_count_and_crc_mismatch() -> None:
    """Count mismatch or CRC mismatch is an error; CRC 0 means unchecked; odd lines are ignored."""
    with pytest.raises(EpochFileError):
        decode_entries(b"3\n773307083\n7-7000\n8-8000\n")
    with pytest.raises(EpochFileError):
        decode_entries(b"2\n773307084\n7-7000\n8-8000\n")
    with pytest.raises(EpochFileError):
        decode_entries(b"garbage")
    assert decode_entries(b"2\n0\n7-7000\n8-8000\n") == [(7, 7000), (8, 8000)]
    assert decode_entries(b"2\n773307083\n7-7000\nnot an entry\n8-8000\n") == [(7, 7000), (8, 8000)]


def test_checkpoint_file_write_read(tmp_path: Path) -> None:
    """CheckpointFileTest: write [(7,7000),(8,8000)], read back equal; write again, equal."""
    path = tmp_path / "cp"
    EpochFileCache(path, [EpochEntry(7, 7000), EpochEntry(8, 8000)])
    assert [(e.epoch, e.start_offset) for e in EpochFileCache(path).entries()] == [(7, 7000), (8, 8000)]
    EpochFileCache(path, [EpochEntry(7, 7000), EpochEntry(8, 8000)])
    assert [(e.epoch, e.start_offset) for e in EpochFileCache(path).entries()] == [(7, 7000), (8, 8000)]


def test_checkpoint_file_abnormal_falls_back_to_bak(tmp_path: Path) -> None:
    """CheckpointFileTest abnormal: write, delete the main file, read -> equal (from .bak); write, read."""
    path = tmp_path / "cp"
    EpochFileCache(path, [EpochEntry(7, 7000), EpochEntry(8, 8000)])
    path.unlink()
    assert [(e.epoch, e.start_offset) for e in EpochFileCache(path).entries()] == [(7, 7000), (8, 8000)]
    EpochFileCache(path, [EpochEntry(7, 7000), EpochEntry(8, 8000)])
    assert [(e.epoch, e.start_offset) for e in EpochFileCache(path).entries()] == [(7, 7000), (8, 8000)]


@pytest.mark.parametrize("damage", [b"", b"2\n1\n7-7000\n8-8000\n", b"\xff\xfe"])
def test_bak_fallback_on_empty_or_corrupt_main(tmp_path: Path, damage: bytes) -> None:
    """A zero-length, CRC-failing or undecodable main file falls back to .bak."""
    path = tmp_path / "cp"
    EpochFileCache(path, [EpochEntry(7, 7000), EpochEntry(8, 8000)])
    path.write_bytes(damage)
    assert [(e.epoch, e.start_offset) for e in EpochFileCache(path).entries()] == [(7, 7000), (8, 8000)]


def test_quirk_18_8_fixed_empty_list_is_written_and_sticks(cache: EpochFileCache) -> None:
    """Quirk 18.8 fixed: truncating every entry writes an empty list; a reload stays empty, and a valid
    empty main file is believed even if a stale .bak still had entries."""
    assert cache.path is not None
    bak = cache.path.with_name(cache.path.name + ".bak")
    stale = bak.read_bytes()
    cache.truncate_suffix_by_offset(0)
    assert cache.entries() == []
    assert cache.path.read_bytes() == b"0\n0\n"
    assert EpochFileCache(cache.path).entries() == []
    bak.write_bytes(stale)  # a crash between the main and the .bak write
    assert EpochFileCache(cache.path).entries() == []


def test_writes_are_atomic_no_temp_left(cache: EpochFileCache) -> None:
    """Writes go through a temp file that is renamed away."""
    assert cache.path is not None
    assert sorted(p.name for p in cache.path.parent.iterdir()) == ["epochFileCheckpoint", "epochFileCheckpoint.bak"]


# ---------------------------------------------------------------- 16.5 EpochFileCacheTest
def test_append_setup(cache: EpochFileCache) -> None:
    """Setup rows: three appends succeed; entry 2 = (2, 300, 500)."""
    assert cache.get_entry(2) == EpochEntry(2, 300, 500)
    assert cache.last_entry() == EpochEntry(3, 500, MAX_END_OFFSET)
    assert cache.first_entry() == EpochEntry(1, 100, 300)
    assert cache.last_epoch() == 3


def test_init_from_file(cache: EpochFileCache) -> None:
    """testInitFromFile: re-init from the file gives entry 2 = (2, 300, 500)."""
    again = EpochFileCache(cache.path)
    assert again.get_entry(2) == EpochEntry(2, 300, 500)
    assert again.entries() == cache.entries()


def test_truncate(cache: EpochFileCache) -> None:
    """testTruncate: truncateSuffixByOffset(150) keeps entry 1, drops 2 and 3 (persisted)."""
    cache.truncate_suffix_by_offset(150)
    assert cache.entries() == [EpochEntry(1, 100, MAX_END_OFFSET)]
    assert EpochFileCache(cache.path).entries() == [EpochEntry(1, 100, MAX_END_OFFSET)]


def test_find_epoch_entry_by_offset(cache: EpochFileCache) -> None:
    """testFindEpochEntryByOffset: offset 350 -> (2, 300, 500)."""
    assert cache.find_by_offset(350) == EpochEntry(2, 300, 500)
    assert cache.find_by_offset(99) is None


def _ranges(cache: EpochFileCache) -> list[EpochRange]:
    return [EpochRange(e.epoch, e.start_offset, e.end_offset) for e in cache.entries()]


# findConsistentPoint lives once, in rocketray.ha.truncation; the reference's samples over epoch caches:
def test_find_consistent_point_sample1(cache: EpochFileCache) -> None:
    """Sample1: other (1,100),(2,300),(3,450) -> 450."""
    other = EpochFileCache.scratch([(1, 100), (2, 300), (3, 450)])
    assert find_consistent_point(_ranges(cache), _ranges(other)) == 450


def test_find_consistent_point_sample2(cache: EpochFileCache) -> None:
    """Sample2: same entries; local last end 700, other last end 600 -> 600."""
    other = EpochFileCache.scratch([(1, 100), (2, 300), (3, 500)])
    cache.set_last_entry_end_offset(700)
    other.set_last_entry_end_offset(600)
    assert find_consistent_point(_ranges(cache), _ranges(other)) == 600


def test_find_consistent_point_sample3(cache: EpochFileCache) -> None:
    """Sample3: other (1,200),(2,500) -> none."""
    assert find_consistent_point(_ranges(cache), _ranges(EpochFileCache.scratch([(1, 200), (2, 500)]))) is None


def test_find_consistent_point_sample4(cache: EpochFileCache) -> None:
    """Sample4: other (1,100),(2,300),(3,500),(4,800); local last end 700; from the other side -> 700."""
    other = EpochFileCache.scratch([(1, 100), (2, 300), (3, 500), (4, 800)])
    cache.set_last_entry_end_offset(700)
    assert find_consistent_point(_ranges(other), _ranges(cache)) == 700


def test_epoch_file_cache_has_no_second_consistent_point() -> None:
    """The rule exists once (ha/truncation.py); the cache no longer carries a copy."""
    assert not hasattr(EpochFileCache, "find_consistent_point")


# ---------------------------------------------------------------- other 12.2 operations
def test_append_refuses_non_increasing(cache: EpochFileCache) -> None:
    """appendEntry refuses an epoch or start offset that does not strictly increase."""
    assert not cache.append(EpochEntry(3, 600))
    assert not cache.append(EpochEntry(4, 500))
    assert not cache.append(2, 700)
    assert cache.append(4, 600)
    assert cache.get_entry(3) == EpochEntry(3, 500, 600)


def test_next_entry_and_truncate_by_epoch(cache: EpochFileCache) -> None:
    """nextEntry gives the smallest greater epoch; truncateSuffixByEpoch drops >= k and reopens the end."""
    assert cache.next_entry(1) == EpochEntry(2, 300, 500)
    assert cache.next_entry(3) is None
    cache.truncate_suffix_by_epoch(3)
    assert cache.entries() == [EpochEntry(1, 100, 300), EpochEntry(2, 300, MAX_END_OFFSET)]


def test_truncate_prefix_by_offset(cache: EpochFileCache) -> None:
    """truncatePrefixByOffset removes entries that end at or before the offset (persisted)."""
    cache.truncate_prefix_by_offset(300)
    assert [e.epoch for e in cache.entries()] == [2, 3]
    cache.truncate_prefix_by_offset(499)
    assert [e.epoch for e in EpochFileCache(cache.path).entries()] == [2, 3]


def test_set_last_end_offset_is_memory_only(cache: EpochFileCache) -> None:
    """setLastEpochEntryEndOffset applies only when last.start <= x, and is not persisted."""
    cache.set_last_entry_end_offset(400)
    assert cache.last_entry() == EpochEntry(3, 500, MAX_END_OFFSET)
    cache.set_last_entry_end_offset(900)
    assert cache.last_entry() == EpochEntry(3, 500, 900)
    assert EpochFileCache(cache.path).last_entry() == EpochEntry(3, 500, MAX_END_OFFSET)


def test_scratch_cache_does_no_io(tmp_path: Path) -> None:
    """A cache with path None never touches the disk."""
    c = EpochFileCache(None)
    assert c.append(1, 0) and c.append(2, 10)
    c.truncate_suffix_by_epoch(2)
    assert c.entries() == [EpochEntry(1, 0, MAX_END_OFFSET)] and c.last_epoch() == 1
    assert EpochFileCache(None).last_epoch() == -1
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- a promotion's deferred .bak copy
def _promoted(seed: int, crash_at: int | None):
    """A cache of epochs 1, 2 on a simulated disk; a promotion starts epoch 3 with the ``.bak`` copy
    left for later, then the backup is written; a power loss strikes at IO step ``crash_at`` of the
    promotion (None: after it). Returns (the disk, the path, what ``start_epoch`` had finished:
    "none" / "main" / "backup")."""
    import random

    from rocketray.sim.disk import CrashMode, SimCrash, SimDisk

    disk = SimDisk(random.Random(seed))
    path = "/b/epochFileCheckpoint"
    cache = EpochFileCache(path, disk=disk)
    assert cache.append(1, 100) and cache.append(2, 300)
    done = "none"
    if crash_at is not None:
        disk.crash_after(crash_at, CrashMode.POWER_LOSS)
    try:
        cache.start_epoch(3, 500, backup_later=True)
        done = "main"
        assert cache.backup_due
        cache.write_backup()
        done = "backup"
        assert not cache.backup_due
    except SimCrash:
        pass
    if crash_at is None:
        disk.crash(CrashMode.POWER_LOSS)
    return disk, path, done


@pytest.mark.parametrize("crash_at", [None, *range(0, 12)])
@pytest.mark.parametrize("seed", range(3))
def test_a_promotion_is_durable_once_start_epoch_returns_and_the_backup_catches_up(seed, crash_at):
    """Whatever IO step a power loss strikes: once ``start_epoch(backup_later=True)`` returned, a
    restart reads epoch 3 (the main copy is durable); before it returned, epochs 1-2 or 1-3; after
    ``write_backup`` the ``.bak`` copy holds epoch 3 too, and before it at worst the previous list."""
    disk, path, done = _promoted(seed, crash_at)
    reread = [(e.epoch, e.start_offset) for e in EpochFileCache(path, disk=disk).entries()]
    before, after = [(1, 100), (2, 300)], [(1, 100), (2, 300), (3, 500)]
    assert reread == after if done != "none" else reread in (before, after), (done, reread)
    bak = disk.durable_bytes(path + ".bak")
    assert bak is not None and decode_entries(bak) in ((before, after) if done != "backup" else (after,)), done


def test_a_later_write_carries_the_backup_that_was_due(tmp_path: Path) -> None:
    """A backup left due is written by the next ordinary write (its newest content), or by
    ``write_backup``; the main file is never behind the .bak copy."""
    cache = EpochFileCache(tmp_path / "cp")
    assert cache.append(1, 100)
    cache.start_epoch(2, 300, backup_later=True)
    bak = tmp_path / "cp.bak"
    assert decode_entries(bak.read_bytes()) == [(1, 100)] and cache.backup_due
    assert decode_entries((tmp_path / "cp").read_bytes()) == [(1, 100), (2, 300)]
    cache.truncate_prefix_by_offset(300)                 # epoch 1 ends at 300: dropped
    assert not cache.backup_due and decode_entries(bak.read_bytes()) == [(2, 300)]
    cache.write_backup()                                  # nothing due: no write
    assert decode_entries(bak.read_bytes()) == [(2, 300)]
    cache.start_epoch(3, 500)                             # the default writes both at once
    assert decode_entries(bak.read_bytes()) == [(2, 300), (3, 500)] and not cache.backup_due


def test_readers_never_wait_for_a_write_in_progress() -> None:
    """The new master's event loop reads the epoch map (its facts, every put's epoch check) while
    its IO thread writes the ``.bak`` copy: the readers take the map without the write's lock, so
    they do not wait for its fsyncs (they waited 15 ms in a traced failover before this)."""
    import random
    import threading

    from rocketray.sim.disk import SimDisk

    disk = SimDisk(random.Random(0))
    cache = EpochFileCache("/b/epochFileCheckpoint", disk=disk)
    assert cache.append(1, 100)
    cache.start_epoch(2, 300, backup_later=True)
    in_fsync, release = threading.Event(), threading.Event()

    def hook(_step: int, op: str, _path: str) -> None:
        if op == "fsync":
            in_fsync.set()
            release.wait(10)
        return None

    disk.set_hook(hook)
    writer = threading.Thread(target=cache.write_backup)
    writer.start()
    try:
        assert in_fsync.wait(5), "the backup write did not reach its fsync"
        seen: dict = {}
        reader = threading.Thread(target=lambda: seen.update(
            last=cache.last_epoch(), entries=len(cache.entries()), at=cache.find_by_offset(350),
            first=cache.first_entry(), next=cache.next_entry(1), epoch=cache.get_entry(2)))
        reader.start()
        reader.join(5)
        finished = not reader.is_alive()
    finally:
        release.set()
        writer.join(10)
        disk.set_hook(None)
    assert finished, "a reader waited for the backup write"
    assert seen == {"last": 2, "entries": 2, "at": EpochEntry(2, 300), "first": EpochEntry(1, 100, 300),
                    "next": EpochEntry(2, 300), "epoch": EpochEntry(2, 300)}
    assert not cache.backup_due
