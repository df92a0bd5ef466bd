"""File faults on a controller's Raft journal: a flipped bit in a durable frame or a cut tail of
durable frames is *damage* (entries the node may have acknowledged are gone) and the node refuses
to start, instead of cutting them away silently and then voting with a shorter log (which can elect
a leader without a committed entry); a torn tail of frames never synced is still cut. Real files."""

from __future__ import annotations

from pathlib import Path

import pytest

from rocketray.controller.journal import DurableJournal, JournalDamaged, journal_verdict, scan_entries


def write_journal(path: Path, last: int, *, meta_saved: bool = True) -> DurableJournal:
    journal = DurableJournal(path)
    for i in range(1, last + 1):
        journal.add(f"cmd-{i}".encode() * 4, i, 1)
        journal.sync()
    if meta_saved:
        journal.onOneSecondTimer()   # the meta (term, vote, commit hint, last synced entry) is saved
    return journal


def frame_offsets(path: Path) -> list[int]:
    return scan_entries(path.read_bytes())[1]


@pytest.mark.parametrize("last, synced, cut, verdict", [
    (10, 10, 0, "clean"),
    (10, 8, 0, "clean"),          # the meta lags the file: never a false alarm
    (10, 10, 17, "torn-tail"),    # invalid bytes after every synced entry: a write never acknowledged
    (7, 10, 40, "damaged"),       # the valid frames stop before the last synced entry
    (7, 10, 0, "damaged"),        # cut at a frame boundary: nothing invalid left, entries still gone
    (0, 3, 90, "damaged"),
    (0, 0, 0, "clean"),
])
def test_journal_verdict(last, synced, cut, verdict):
    assert journal_verdict(last, synced, cut) == verdict


def test_flipped_bit_in_a_durable_frame_refuses_to_start(tmp_path: Path) -> None:
    """The old journal cut everything from the damaged frame on and started: the node then voted
    as if it never had entries 4-10."""
    path = tmp_path / "raft.wal"
    write_journal(path, 10)._destroy()
    data = bytearray(path.read_bytes())
    data[frame_offsets(path)[3] + 20] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(JournalDamaged, match="entries up to 10 were durable"):
        DurableJournal(path)
    assert path.read_bytes() == bytes(data), "the evidence is left as it was"


def test_cut_tail_of_durable_frames_refuses_to_start(tmp_path: Path) -> None:
    path = tmp_path / "raft.wal"
    write_journal(path, 10)._destroy()
    with open(path, "r+b") as fh:
        fh.truncate(frame_offsets(path)[8])      # entries 9 and 10 gone, on a frame boundary
    with pytest.raises(JournalDamaged):
        DurableJournal(path)


def test_torn_tail_after_the_last_synced_entry_is_cut(tmp_path: Path) -> None:
    path = tmp_path / "raft.wal"
    write_journal(path, 5)._destroy()
    with open(path, "ab") as fh:
        fh.write(b"\x00\x00\x00\x30garbage")      # half a frame never synced
    journal = DurableJournal(path)
    assert [e[1] for e in journal] == [1, 2, 3, 4, 5] and journal.truncated_bytes == 11


def test_a_conflict_truncation_and_a_clear_are_not_taken_for_damage(tmp_path: Path) -> None:
    path = tmp_path / "raft.wal"
    journal = write_journal(path, 8)
    journal.deleteEntriesFrom(5)                  # entries 6.. become the shadow
    journal.add(b"other", 6, 2)                   # a real conflict: the file is cut at entry 6
    journal.sync()
    journal._destroy()
    again = DurableJournal(path)
    assert [e[1] for e in again] == [1, 2, 3, 4, 5, 6] and again[5] == (b"other", 6, 2)
    again.clear()
    again.sync()
    again._destroy()
    assert len(DurableJournal(path)) == 0
