"""Snapshot files on disk: durable save, retention of N, newest-valid load with fallback.

Layout: `<dir>/snapshot_<index:020d>.snap`, one file per snapshot, named by the last log index
it covers. A save writes `<dir>/.tmp-<index>.snap`, fsyncs it, renames it into place and fsyncs
the directory, so a crash leaves either the old set or the old set plus one whole new file. The
newest `keep` snapshots are kept; older ones are deleted after the new one is durable.

Loading walks from the newest down. A file that fails to decode (bad CRC, truncated, wrong
magic...) is logged and set aside as `<name>.corrupt` (kept for a post-mortem, never loaded
again), and the next older one is tried.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rocketray.fs import OS_DISK, Disk, ensure_dir, read_file
from rocketray.durable import write_durably
from rocketray.snapshot.format import (SECTION_SNAPSHOT_META, SnapshotCorrupt, decode_snapshot,
                             encode_snapshot)

log = logging.getLogger(__name__)

_NAME = re.compile(r"^snapshot_(\d{20})\.snap$")


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    """Where a snapshot sits in the log and on disk."""

    index: int
    term: int
    path: Path


class SnapshotStore:
    """The snapshot directory of one controller node."""

    def __init__(self, directory: str | os.PathLike[str], keep: int = 3, disk: Disk = OS_DISK) -> None:
        assert keep >= 1, "keep must be at least 1"
        self.dir = Path(directory)
        self.keep = keep
        self.disk = disk
        ensure_dir(disk, self.dir)
        self.saves = 0
        self.loads = 0
        self.set_aside: list[Path] = []
        for name in disk.listdir(self.dir):
            if name.startswith(".tmp-"):
                disk.unlink(self.dir / name)

    def path_for(self, index: int) -> Path:
        assert index >= 0
        return self.dir / f"snapshot_{index:020d}.snap"

    def list(self) -> list[int]:
        """Indexes of the snapshot files present (not verified), oldest first."""
        found = []
        for name in self.disk.listdir(self.dir):
            match = _NAME.match(name)
            if match:
                found.append(int(match.group(1)))
        return sorted(found)

    def save(self, index: int, term: int, sections: dict[int, dict[str, Any]]) -> SnapshotMeta:
        """Encode and durably store a snapshot covering the log up to `index`."""
        sections = dict(sections)
        sections[SECTION_SNAPSHOT_META] = {"index": index, "term": term}
        return self.save_bytes(index, term, encode_snapshot(sections))

    def save_bytes(self, index: int, term: int, data: bytes) -> SnapshotMeta:
        """Store already-encoded snapshot bytes (e.g. a dump received from the leader)."""
        tmp = self.dir / f".tmp-{index}.snap"
        final = self.path_for(index)
        write_durably(final, data, tmp_name=tmp.name, disk=self.disk)
        self.saves += 1
        self._prune()
        log.info("snapshot saved index=%d term=%d bytes=%d path=%s", index, term, len(data), final)
        return SnapshotMeta(index, term, final)

    def _prune(self) -> None:
        indexes = self.list()
        for index in indexes[:-self.keep]:
            try:
                self.disk.unlink(self.path_for(index))
            except FileNotFoundError:
                pass
            log.info("snapshot deleted (retention keep=%d) index=%d", self.keep, index)

    def read(self, index: int) -> tuple[SnapshotMeta, dict[int, dict[str, Any]]]:
        """Read and verify one snapshot; raises `SnapshotCorrupt` or `OSError`."""
        path = self.path_for(index)
        sections = decode_snapshot(self.read_bytes(index))
        meta = sections.get(SECTION_SNAPSHOT_META)
        if meta is None or meta.get("index") != index:
            raise SnapshotCorrupt(f"{path.name}: meta section missing or names another index: {meta!r}")
        return SnapshotMeta(index, int(meta.get("term", 0)), path), sections

    def read_bytes(self, index: int) -> bytes:
        """The raw bytes of one snapshot file; raises ``FileNotFoundError``."""
        data = read_file(self.disk, self.path_for(index))
        if data is None:
            raise FileNotFoundError(self.path_for(index))
        return data

    def load_newest_valid(self, max_index: int | None = None) -> tuple[SnapshotMeta, dict[int, dict[str, Any]]] | None:
        """The newest snapshot that verifies, setting damaged ones aside; None if there is none."""
        for index in reversed(self.list()):
            if max_index is not None and index > max_index:
                continue
            try:
                result = self.read(index)
            except (SnapshotCorrupt, OSError) as exc:
                self._set_aside(index, exc)
                continue
            self.loads += 1
            return result
        return None

    def _set_aside(self, index: int, reason: Exception) -> None:
        path = self.path_for(index)
        target = path.with_name(path.name + ".corrupt")
        log.error("snapshot damaged, set aside index=%d path=%s reason=%s", index, path, reason)
        try:
            self.disk.rename(path, target)
            self.set_aside.append(target)
        except OSError as exc:
            log.error("could not set aside damaged snapshot %s: %s", path, exc)
