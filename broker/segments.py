"""The commit log's segments and the pure rules about them (``rocketray.broker.commitlog``).

A segment file holds ``size`` bytes of records from ``base_offset``, named by that offset; the rules
here say in which order a cut unlinks segments, which segment recovery scans first, where the run of
contiguous segments ends and how many whole records fit in a segment's room. ``CommitLog`` imports
them by name and calls them from its own namespace (the mutation check patches them there:
``rocketray.broker.commitlog:unlink_order`` and so on).
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from rocketray.wire.message import HEADER_SIZE
from rocketray.fs import DiskFile

__all__ = ["Segment", "first_gap", "first_scanned", "records_within", "recovery_scan_start", "segment_name",
           "unlink_order"]

_SIZE = struct.Struct(">I")


def segment_name(base_offset: int) -> str:
    """File name of the segment starting at ``base_offset``."""
    return f"{base_offset:020d}"


@dataclass(eq=False)
class Segment:
    """One segment file: ``size`` bytes of records starting at ``base_offset``."""

    base_offset: int
    path: Path
    file: DiskFile
    size: int = 0
    sealed: bool = False

    @property
    def end_offset(self) -> int:
        return self.base_offset + self.size

    def close(self) -> None:
        self.file.close()


def unlink_order(segments: Sequence[Segment]) -> list[Segment]:
    """The order in which a cut unlinks the segments after the cut point: newest first, so a kill
    between two unlinks leaves a contiguous log (oldest first would leave a hole below the newest)."""
    return list(reversed(segments))


def first_scanned(bases: Sequence[int], verified_offset: int) -> int:
    """Index of the first segment recovery scans: the one holding the last verified byte.  When the
    verified offset is exactly a segment base, the previous segment may have been sealed (an
    ftruncate) after that checkpoint and not synced, so it is scanned and fsynced too rather than
    trusted (``bisect_left``, not ``bisect_right``)."""
    return max(0, bisect.bisect_left(bases, verified_offset) - 1)


def recovery_scan_start(min_offset: int, verified_offset: int | None) -> int:
    """Where start-up recovery begins verifying records: the start of the log, whatever the
    checkpoint's verified offset says. The records before it were verified when written, but a bit
    can flip in a file at rest; starting at the segment holding the verified offset would serve and
    replicate a damaged record of an older segment."""
    return min_offset


def records_within(view: memoryview, pos: int, room: int) -> int:
    """Length of the longest run of whole records from ``pos`` that fits in ``room`` bytes."""
    fit = 0
    while pos + fit + HEADER_SIZE <= len(view):
        size = _SIZE.unpack_from(view, pos + fit)[0]
        if size < HEADER_SIZE or fit + size > room:
            break
        fit += size
    return fit


def first_gap(segments: Sequence[Segment]) -> int | None:
    """Index of the first segment that does not start where the previous one ends (a hole), or
    None when the segments are contiguous; recovery keeps only the run before it, so the log it
    serves has no hole."""
    for i in range(1, len(segments)):
        if segments[i].base_offset != segments[i - 1].end_offset:
            return i
    return None
