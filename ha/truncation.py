"""Where a slave's log stops agreeing with its master's (reference 12.3), as pure functions.

Theory of operation. Every replica keeps an epoch file: ascending ``(epoch, start_offset)`` points,
each epoch's range ending where the next starts and the last one at the replica's max offset. Bytes
of one epoch were all written by that epoch's single master, so two replicas that hold the same
epoch *starting at the same offset* hold the same bytes for it up to the shorter of their two
ranges. Walking the slave's epochs from the newest down, the first epoch the master also has with
the same start gives the consistent point ``min(local end, master end)``: everything before it is
shared, and the slave must cut everything after it. No such epoch means the logs share nothing
provable (a fresh slave is the separate "empty epoch file" case).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

__all__ = ["EpochRange", "ranges_from_points", "find_consistent_point", "TruncationDecision",
           "decide_truncation"]


@dataclass(frozen=True, slots=True)
class EpochRange:
    epoch: int
    start_offset: int
    end_offset: int


def ranges_from_points(points: Sequence[tuple[int, int]], max_offset: int) -> list[EpochRange]:
    """Turn ascending ``(epoch, start)`` points into ranges; the last one ends at ``max_offset``."""
    out: list[EpochRange] = []
    for i, (epoch, start) in enumerate(points):
        end = points[i + 1][1] if i + 1 < len(points) else max(max_offset, start)
        assert end >= start, (points, max_offset)
        out.append(EpochRange(epoch, start, end))
    return out


def find_consistent_point(local: Sequence[EpochRange], master: Sequence[EpochRange]) -> int | None:
    """``EpochFileCache.findConsistentPoint``: the offset up to which both logs agree, or None."""
    by_epoch = {r.epoch: r for r in master}
    for mine in reversed(local):
        theirs = by_epoch.get(mine.epoch)
        if theirs is not None and theirs.start_offset == mine.start_offset:
            return min(mine.end_offset, theirs.end_offset)
    return None


@dataclass(frozen=True, slots=True)
class TruncationDecision:
    """What a slave does after the master's handshake reply.

    ``truncate_to``: cut the commit log (and the epoch file suffix) at this offset, or None.
    ``resume_offset``: the slave's max offset once that is done (its first ack).
    ``failure``: no consistent point exists; the connection is dropped and retried.
    """

    truncate_to: int | None
    resume_offset: int
    failure: str | None = None


def decide_truncation(local_points: Sequence[tuple[int, int]], local_min_offset: int,
                      local_max_offset: int, master_points: Sequence[tuple[int, int]],
                      master_max_offset: int) -> TruncationDecision:
    """The slave side of the handshake (``doTruncate``), with the empty-epoch-file case made safe.

    A slave with no epoch entries is brand new: upstream keeps whatever bytes it has; we drop
    them (they are attributed to no epoch, so nothing proves they match) and start empty.
    """
    assert 0 <= local_min_offset <= local_max_offset
    # Entries starting at or after the local max hold no bytes (a promotion with no writes after
    # it). They prove nothing and would block recording the master's entry at the same offset,
    # so they are dropped (a Truncate at the local max removes only epoch entries).
    with_data = [p for p in local_points if p[1] < local_max_offset]
    dataless = len(with_data) < len(local_points)
    if not with_data:
        if local_max_offset > local_min_offset:
            return TruncationDecision(local_min_offset, local_min_offset)
        return TruncationDecision(local_max_offset if dataless else None, local_max_offset)
    local = ranges_from_points(with_data, local_max_offset)
    master = ranges_from_points(master_points, master_max_offset)
    point = find_consistent_point(local, master)
    if point is None and master_points and with_data[0][1] == master_points[0][1] \
            and with_data[0][1] <= local_min_offset:
        # Both histories begin at the same offset in different epochs (e.g. an unclean election
        # of a replica that never saw the old epoch): they share nothing after that offset.
        # Upstream fails here forever; the answer is provable, so take it.
        point = with_data[0][1]
    if point is None:
        return TruncationDecision(None, local_max_offset,
                                  failure=f"no consistent point between local epochs "
                                          f"{list(local_points)} and master epochs "
                                          f"{list(master_points)}")
    if point < local_max_offset:
        return TruncationDecision(point, point)
    return TruncationDecision(local_max_offset if dataless else None, local_max_offset)
