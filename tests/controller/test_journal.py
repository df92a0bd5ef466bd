"""DurableJournal (controller/journal.py) over the simulated disk: what a power loss keeps."""

from __future__ import annotations

import random

import pytest

from rocketray.controller.journal import MAGIC, DurableJournal, encode_entry, peek_entries, scan_entries
from rocketray.sim.disk import CrashMode, SimCrash, SimDisk

PATH = "/n/raft.wal"


def fresh(seed: int = 0) -> SimDisk:
    disk = SimDisk(random.Random(seed))
    disk.mkdir("/n")
    disk.fsync_dir("/")
    return disk


def fill(journal: DurableJournal, first: int, last: int, term: int = 1) -> None:
    for i in range(first, last + 1):
        journal.add(f"cmd-{i}".encode(), i, term)


def test_golden_frame_bytes():
    # >II (payload length, crc32) + >QQ (index, term) + command: pinned so an old journal still reads
    assert encode_entry(b"\x00", 1, 0).hex() == "00000011" "262d9a83" "0000000000000001" "0000000000000000" "00"
    assert MAGIC == b"RRJRNL01"


def test_entries_term_vote_and_commit_index_survive_a_reopen():
    disk = fresh()
    journal = DurableJournal(PATH, disk)
    fill(journal, 1, 5)
    journal.setCurrentTerm(3, "127.0.0.1:7001")
    journal.setRaftCommitIndex(4)
    journal._destroy()
    again = DurableJournal(PATH, disk)
    assert [e[1] for e in again] == [1, 2, 3, 4, 5] and again[2] == (b"cmd-3", 3, 1)
    assert (again.getCurrentTerm(), again.getVotedForNodeId(), again.getRaftCommitIndex()) == (3, "127.0.0.1:7001", 4)


@pytest.mark.parametrize("seed", range(20))
def test_power_loss_keeps_every_synced_entry_and_a_valid_prefix(seed):
    disk = fresh(seed)
    journal = DurableJournal(PATH, disk)
    fill(journal, 1, 10)
    journal.sync()
    fill(journal, 11, 15)  # written, not synced
    disk.crash(CrashMode.POWER_LOSS)
    again = DurableJournal(PATH, disk)
    indexes = [e[1] for e in again]
    assert indexes[:10] == list(range(1, 11))
    assert indexes == list(range(1, len(indexes) + 1)) and len(indexes) <= 15


def test_without_sync_a_power_loss_can_lose_entries():
    """The sync is what makes entries durable: some seed loses unsynced entries (the test above has teeth)."""
    lost = False
    for seed in range(20):
        disk = fresh(seed)
        journal = DurableJournal(PATH, disk)
        journal.sync()
        fill(journal, 1, 10)
        disk.crash(CrashMode.POWER_LOSS)
        lost |= len(DurableJournal(PATH, disk)) < 10
    assert lost


@pytest.mark.parametrize("seed", range(10))
def test_conflict_truncation_then_new_entries_never_resurrects_the_old_suffix(seed):
    disk = fresh(seed)
    journal = DurableJournal(PATH, disk)
    fill(journal, 1, 6, term=1)
    journal.sync()
    journal.deleteEntriesFrom(3)                  # drop 4..6 (term 1), the leader has others
    for i in (4, 5):
        journal.add(f"new-{i}".encode(), i, 2)   # same sizes as the old ones would be different
    disk.crash(CrashMode.POWER_LOSS)
    entries = list(DurableJournal(PATH, disk))
    assert [e[1] for e in entries][:3] == [1, 2, 3]
    terms = [e[2] for e in entries]
    assert terms == sorted(terms)                 # never old term-1 entries after new term-2 ones


def test_a_term_decreasing_or_non_contiguous_tail_is_cut():
    data = MAGIC + encode_entry(b"a", 1, 1) + encode_entry(b"b", 2, 2) + encode_entry(b"c", 3, 1)
    assert [e[1] for e in scan_entries(data)[0]] == [1, 2]
    data = MAGIC + encode_entry(b"a", 1, 1) + encode_entry(b"b", 3, 1)
    assert [e[1] for e in scan_entries(data)[0]] == [1]
    torn = MAGIC + encode_entry(b"a", 1, 1) + encode_entry(b"bbbb", 2, 1)[:-2]
    assert [e[1] for e in scan_entries(torn)[0]] == [1]


def test_term_and_vote_are_durable_when_set_current_term_returns():
    disk = fresh(1)
    journal = DurableJournal(PATH, disk)
    journal.setCurrentTerm(7, "127.0.0.1:7002")
    disk.crash(CrashMode.POWER_LOSS)
    again = DurableJournal(PATH, disk)
    assert (again.getCurrentTerm(), again.getVotedForNodeId()) == (7, "127.0.0.1:7002")


def test_compaction_writes_a_new_file_and_renames_it_at_every_crash_point():
    """A crash at any IO step of a compaction leaves the whole old journal or the whole new one."""
    for seed in range(5):
        base = fresh(seed)
        journal = DurableJournal(PATH, base)
        fill(journal, 1, 20)
        journal.sync()
        start = base.steps
        journal.deleteEntriesTo(12)   # keep 13..20
        journal.sync()
        steps = base.steps - start
        assert steps >= 4             # create temp, write, fsync, rename, fsync dir
        for crash_step in range(1, steps + 1):
            disk = fresh(seed)
            journal = DurableJournal(PATH, disk)
            fill(journal, 1, 20)
            journal.sync()
            journal.deleteEntriesTo(12)
            disk.crash_after(crash_step, CrashMode.POWER_LOSS)
            with pytest.raises(SimCrash):
                journal.sync()
            indexes = [e[1] for e in peek_entries(PATH, disk)]
            assert indexes in (list(range(1, 21)), list(range(13, 21))), (seed, crash_step, indexes)


@pytest.mark.parametrize("seed", range(10))
def test_a_duplicate_delivery_never_puts_an_acknowledged_entry_at_risk(seed):
    """pysyncobj drops every entry after prevLogIdx on a duplicate append_entries and re-adds the
    message's entries: the file is not touched (no truncate, no write), so a power loss right after
    keeps every entry synced before, even those the duplicate did not carry again."""
    disk = fresh(seed)
    journal = DurableJournal(PATH, disk)
    fill(journal, 1, 10)
    journal.sync()
    steps = disk.steps
    journal.deleteEntriesFrom(5)          # drop 6..10
    fill(journal, 6, 8)                   # the duplicate carries 6..8 again
    assert [e[1] for e in journal] == list(range(1, 9))
    journal.sync()
    assert disk.steps == steps            # nothing written, nothing to sync
    disk.crash(CrashMode.POWER_LOSS)
    assert [e[1] for e in DurableJournal(PATH, disk)] == list(range(1, 11))


def test_a_real_conflict_truncates_the_file_at_the_first_differing_entry():
    disk = fresh(0)
    journal = DurableJournal(PATH, disk)
    fill(journal, 1, 10, term=1)
    journal.sync()
    journal.deleteEntriesFrom(5)
    fill(journal, 6, 7, term=1)           # same as before
    journal.add(b"other", 8, 2)           # conflicts with the old 8 (term 1)
    journal.sync()
    disk.crash(CrashMode.POWER_LOSS)
    entries = list(DurableJournal(PATH, disk))
    assert [(e[1], e[2]) for e in entries] == [(i, 1) for i in range(1, 8)] + [(8, 2)]


def test_a_compaction_keeps_the_shadow_behind_the_log():
    disk = fresh(0)
    journal = DurableJournal(PATH, disk)
    fill(journal, 1, 10)
    journal.sync()
    journal.deleteEntriesFrom(8)          # 9, 10 in the shadow
    journal.deleteEntriesTo(3)            # compaction: keep 4..8 (+ shadow 9, 10)
    journal.sync()
    assert [e[1] for e in journal] == [4, 5, 6, 7, 8]
    fill(journal, 9, 10)                  # taken back from the shadow without a write
    journal._destroy()
    assert [e[1] for e in DurableJournal(PATH, disk)] == list(range(4, 11))
