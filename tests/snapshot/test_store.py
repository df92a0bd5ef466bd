"""SnapshotStore: durable save, keep-N retention, newest-valid load with fallback."""

from __future__ import annotations

from rocketray.snapshot.format import SECTION_CONTROLLER_STATE
from rocketray.snapshot.store import SnapshotStore


def _save(store, index):
    return store.save(index, 1, {SECTION_CONTROLLER_STATE: {"n": index}})


def test_keeps_newest_n(tmp_path):
    """After five saves with keep=3, only the three newest files remain."""
    store = SnapshotStore(tmp_path, keep=3)
    for index in (10, 20, 30, 40, 50):
        _save(store, index)
    assert store.list() == [30, 40, 50]
    assert store.saves == 5
    assert not list(tmp_path.glob(".tmp-*"))


def test_load_newest_valid(tmp_path):
    """The newest snapshot is loaded with its meta."""
    store = SnapshotStore(tmp_path)
    _save(store, 10)
    _save(store, 20)
    meta, sections = store.load_newest_valid()
    assert (meta.index, meta.term) == (20, 1)
    assert sections[SECTION_CONTROLLER_STATE] == {"n": 20}
    assert store.loads == 1


def test_damaged_newest_falls_back_and_is_set_aside(tmp_path):
    """A flipped byte in the newest file: it is renamed *.corrupt and the previous one loads."""
    store = SnapshotStore(tmp_path)
    _save(store, 10)
    meta20 = _save(store, 20)
    blob = bytearray(meta20.path.read_bytes())
    blob[-3] ^= 0x40
    meta20.path.write_bytes(bytes(blob))
    meta, sections = store.load_newest_valid()
    assert meta.index == 10 and sections[SECTION_CONTROLLER_STATE] == {"n": 10}
    assert store.list() == [10]
    assert (tmp_path / (meta20.path.name + ".corrupt")).exists()


def test_all_damaged_returns_none(tmp_path):
    """Truncated and empty files are all set aside; nothing valid -> None."""
    store = SnapshotStore(tmp_path)
    a = _save(store, 10)
    b = _save(store, 20)
    a.path.write_bytes(a.path.read_bytes()[:-1])
    b.path.write_bytes(b"")
    assert store.load_newest_valid() is None
    assert store.list() == []


def test_meta_must_match_file_name(tmp_path):
    """A valid file renamed to another index is not trusted."""
    store = SnapshotStore(tmp_path)
    meta = _save(store, 10)
    meta.path.rename(store.path_for(99))
    result = store.load_newest_valid()
    assert result is None
