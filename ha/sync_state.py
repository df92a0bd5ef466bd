"""The master's SyncStateSet bookkeeping and confirm offset (reference 13.1, 13.3), pure.

Theory of operation. The controller owns the SyncStateSet (SSS); the master keeps the last set the
controller confirmed (``local``) and, while a change it proposed is in flight, the proposal
(``remote``). Every rule that decides "is this committed?" uses the union of the two
(apache/rocketmq#5663): while an expand is pending the new member must already ack; while a shrink
is pending the removed member still counts. A slave is proposed for the set when it acks at least
the confirm offset and at least the start of the master's current epoch (never an async learner);
it is proposed for removal when it has not been caught up for ``max_time_slave_not_catchup_ms`` or
when its connection closes.

Confirm offset (quirk 13, decided): the minimum ack over the connected members of the union set
and the master's own max offset. If a member other than the master is not connected, or is
connected but has not acked yet, nothing proves how far it got, so the confirm offset stays where
it was (upstream freezes in the first case but *ignores* members whose ack is 0, which lets the
confirm offset run past a member that holds nothing; we count an ack of 0 as 0). Within a term the
confirm offset never goes backwards and never exceeds the max offset.
"""

from __future__ import annotations

from typing import Iterable, Mapping

__all__ = ["SyncStateTracker"]


class SyncStateTracker:
    def __init__(self, local_broker_id: int, max_time_slave_not_catchup_ms: int = 15000) -> None:
        self.local_broker_id = local_broker_id
        self.max_time_slave_not_catchup_ms = max_time_slave_not_catchup_ms
        self.local: frozenset[int] = frozenset({local_broker_id})
        self.remote: frozenset[int] = frozenset()
        self.synchronizing = False
        self.caught_up_ms: dict[int, int] = {}

    # -- views -----------------------------------------------------------------------------------

    def sync_state_set(self) -> frozenset[int]:
        """Union of confirmed and proposed while a change is in flight, else the confirmed set."""
        return self.local | self.remote if self.synchronizing else self.local

    def in_sync_replicas_nums(self) -> int:
        if self.synchronizing:
            return max(len(self.local), len(self.remote))
        return len(self.local)

    # -- changes ---------------------------------------------------------------------------------

    def set_sync_state_set(self, ids: Iterable[int]) -> None:
        """The controller confirmed ``ids``: adopt them and end any pending proposal."""
        self.local = frozenset(ids)
        self.remote = frozenset()
        self.synchronizing = False

    def mark_synchronizing(self, proposal: Iterable[int]) -> frozenset[int]:
        self.remote = frozenset(proposal)
        self.synchronizing = True
        return self.remote

    def reset(self) -> None:
        """New term: forget caught-up times and proposals; only ourselves in the set."""
        self.local = frozenset({self.local_broker_id})
        self.remote = frozenset()
        self.synchronizing = False
        self.caught_up_ms.clear()

    def update_caught_up(self, slave_id: int, caught_up_ms: int) -> None:
        self.caught_up_ms[slave_id] = max(self.caught_up_ms.get(slave_id, 0), caught_up_ms)

    def maybe_expand(self, slave_id: int, ack: int, confirm_offset: int,
                     current_epoch_start: int) -> frozenset[int] | None:
        """Propose adding ``slave_id`` when it caught up; returns the proposal or None."""
        if slave_id in self.local:
            return None
        if ack < confirm_offset or ack < current_epoch_start:
            return None
        if self.synchronizing and slave_id in self.remote:
            return None          # already proposed, waiting for the controller
        base = self.remote if self.synchronizing else self.local
        return self.mark_synchronizing(base | {slave_id, self.local_broker_id})

    def on_disconnect(self, slave_id: int) -> frozenset[int] | None:
        """A slave's connection closed: propose removing it if it is in the set."""
        if slave_id not in self.local or slave_id == self.local_broker_id:
            return None
        base = self.remote if self.synchronizing else self.local
        return self.mark_synchronizing(base - {slave_id})

    def maybe_shrink(self, now_ms: int, connected: Iterable[int] = ()) -> frozenset[int]:
        """``maybeShrinkSyncStateSet``: members not caught up for too long, or never seen, leave.

        Returns the resulting candidate set (always containing the master).
        """
        candidate = set(self.local)
        for slave_id in list(candidate):
            if slave_id == self.local_broker_id:
                continue
            seen = self.caught_up_ms.get(slave_id)
            if seen is None or now_ms - seen > self.max_time_slave_not_catchup_ms:
                candidate.discard(slave_id)
        candidate.add(self.local_broker_id)
        result = frozenset(candidate)
        if result != self.local:
            self.mark_synchronizing(result)
        return result

    # -- confirm offset --------------------------------------------------------------------------

    def compute_confirm_offset(self, max_offset: int, current_confirm_offset: int,
                               acks: Mapping[int, int]) -> int:
        """The offset every member of the (union) set holds.

        ``acks`` maps each *connected* slave id to its last ack (-1 when it has not acked yet).
        """
        floor = min(max(current_confirm_offset, 0), max_offset)
        result = max_offset
        for member in self.sync_state_set():
            if member == self.local_broker_id:
                continue
            ack = acks.get(member, -1)
            if ack < 0:
                return floor       # disconnected or silent member: cannot prove progress
            result = min(result, ack)
        return max(result, floor)
