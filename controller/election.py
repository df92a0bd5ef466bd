"""Master election policy (reference section 4.3), pure.

``elect`` picks a new master among the SyncStateSet first and, only when unclean election is
enabled and nobody in the SyncStateSet qualifies, among all registered replicas. Within a
candidate set: keep only alive replicas; keep the old master if it is still a candidate (unless
another id is designated); an admin-designated id wins only if it is a candidate, otherwise
nobody from this set; else order by live info: epoch DESC, max offset DESC, election priority ASC.

Deliberate fix (reference section 18, quirk 4, FIXED): the comparison is an exact integer
comparison (no 32-bit truncation of offset gaps) and ties are broken by the lowest broker id,
so the outcome never depends on set iteration order. Candidates without live info rank after
all candidates with live info (RocketMQ would throw); with no live-info source at all the lowest
alive id wins.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional

from rocketray.controller.heartbeat import BrokerLiveInfo

AlivePredicate = Callable[[int], bool]
LiveInfoGetter = Callable[[int], Optional[BrokerLiveInfo]]


def rank_key(broker_id: int, info: BrokerLiveInfo | None) -> tuple[int, int, int, int, int]:
    """Sort key: better candidates sort first. Exact ints, deterministic on ties (lowest id)."""
    if info is None:
        return (1, 0, 0, 0, broker_id)
    return (0, -info.epoch, -info.max_offset, info.election_priority, broker_id)


def try_elect(candidates: Iterable[int], old_master: int | None, prefer_id: int | None,
              alive: AlivePredicate | None, live_info: LiveInfoGetter | None) -> int | None:
    """One round of the policy over one candidate set (see module docstring)."""
    pool = sorted(c for c in candidates if alive is None or alive(c))
    if not pool:
        return None
    if old_master is not None and old_master in pool and (prefer_id is None or prefer_id == old_master):
        return old_master
    if prefer_id is not None:
        return prefer_id if prefer_id in pool else None
    if live_info is None:
        return pool[0]
    return min(pool, key=lambda c: rank_key(c, live_info(c)))


def contains_log(candidate: BrokerLiveInfo | None, of: BrokerLiveInfo | None) -> bool:
    """Whether ``candidate``'s log provably holds all of ``of``'s: both last wrote in the same
    epoch and ``candidate`` has more bytes. Within one epoch a single master writes, every replica
    that reached it was first truncated to that master's log, and a restarted master never writes
    again in a term it held before the restart (broker/role.py ``is_term_from_before_restart``): so
    two logs ending in the same epoch are prefixes of one sequence, and the longer holds the
    shorter."""
    return (candidate is not None and of is not None and of.epoch >= 0 and candidate.epoch == of.epoch
            and candidate.max_offset > of.max_offset)


def elect(sync_state_set: Iterable[int], all_ids: Iterable[int] | None, old_master: int | None,
          prefer_id: int | None, alive: AlivePredicate | None = None,
          live_info: LiveInfoGetter | None = None) -> int | None:
    """Pick a new master, or None if nobody qualifies. ``all_ids`` is given only when unclean
    election is enabled; it is tried only if the SyncStateSet yields nobody."""
    result = try_elect(sync_state_set, old_master, prefer_id, alive, live_info)
    if result is None and all_ids is not None:
        result = try_elect(all_ids, old_master, prefer_id, alive, live_info)
    return result
