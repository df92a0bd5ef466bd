"""The fault model's precondition for damaging a replica's files: a majority of each group's in-sync
replicas stays undamaged.

Pure: no IO, no clock. ``chaos/os_nemesis.py`` asks :meth:`DamageLedger.allows` before a file fault
or a loss of unsynced writes, with the group's SyncStateSet as the controller answers it, and
records each damage it applies.

Theory of operation. The promise under test (docs/chaos.md, "File faults on real disks") is that
nothing acknowledged is lost while a majority of each group's SyncStateSet is undamaged. A
SyncStateSet of one is the whole copy of what its master acknowledged alone, and a set of two has no
majority once one member is damaged; damaging them tests what the promise does not cover (the
damaged member may be elected with what survived). A replica counts as damaged from the fault until
it is seen in the SyncStateSet again under a newer SyncStateSet epoch than the one at the fault:
the master re-admits it only after it truncated to the consistent point and caught up.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["DamageLedger"]


@dataclass
class DamageLedger:
    """Replicas damaged and not yet re-admitted to their group's SyncStateSet."""

    #: group -> broker id -> the SyncStateSet epoch when it was damaged
    pending: dict[str, dict[int, int]] = field(default_factory=dict)

    def observe(self, group: str, sync_state_set: Iterable[int], sss_epoch: int) -> None:
        """Forget the damage of every member of ``sync_state_set`` re-admitted after its fault."""
        pending = self.pending.get(group, {})
        for broker_id in set(sync_state_set):
            if broker_id in pending and sss_epoch > pending[broker_id]:
                del pending[broker_id]

    def damaged(self, group: str) -> frozenset[int]:
        return frozenset(self.pending.get(group, {}))

    def allows(self, group: str, sync_state_set: Iterable[int], sss_epoch: int, victim: int) -> bool:
        """Whether damaging ``victim`` leaves a strict majority of ``sync_state_set`` undamaged, after
        forgetting the damage of members re-admitted since (``observe``)."""
        self.observe(group, sync_state_set, sss_epoch)
        members = set(sync_state_set)
        undamaged = members - self.damaged(group) - {victim}
        return 2 * len(undamaged) > len(members)

    def record(self, group: str, victim: int, sss_epoch: int) -> None:
        self.pending.setdefault(group, {})[victim] = sss_epoch
