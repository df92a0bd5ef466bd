"""The master's SyncStateSet bookkeeping (reference 13.1, 13.3), pure.

Theory of operation. The controller owns the SyncStateSet (SSS). The master reads the last set the
controller confirmed (``local``) from the broker's one owner of it, the role machine
(``rocketray.broker.role``: the ``confirmed`` source; a tracker built without one, as in the unit
tests, keeps the set itself), and keeps the proposals the controller has not answered yet
(``pending``, oldest first: expands, removals on a closed connection, shrink candidates, and every
proposal the role machine says it sent, ``mark_in_flight``). Every rule that decides "is this
committed?" uses the **union view** ``local | every pending proposal`` (``rocketray.ha.ack``):
while an expand is pending the new member must already ack, while a shrink is pending the removed
member still counts. A new proposal never replaces a pending one in the view: a shrink candidate
built from ``local`` only that overwrote a pending expand would let a put be acknowledged without
the joining member the controller is about to count. A pending
proposal leaves the view only when the controller confirms a set: the confirmation drops the
proposals up to the last one equal to it (all of them when none is equal: the set came from a role
change, not from an answer).

A slave is proposed for the set when it acks at least the confirm offset and at least the start of
the master's current epoch (never an async learner); it is proposed for removal when it has not
been caught up for ``max_time_slave_not_catchup_ms`` or when its connection closes.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

from rocketray.ha.ack import confirm_offset, union_view

__all__ = ["SyncStateTracker", "MAX_PENDING"]

#: Bound on remembered proposals; beyond it the two oldest merge (a larger view is still safe).
MAX_PENDING = 16


class SyncStateTracker:
    def __init__(self, local_broker_id: int, max_time_slave_not_catchup_ms: int = 15000,
                 confirmed: Callable[[], frozenset[int]] | None = None) -> None:
        self.local_broker_id = local_broker_id
        self.max_time_slave_not_catchup_ms = max_time_slave_not_catchup_ms
        self._confirmed = confirmed
        self._local: frozenset[int] = frozenset({local_broker_id})
        self.pending: tuple[frozenset[int], ...] = ()
        self.caught_up_ms: dict[int, int] = {}

    # -- views -----------------------------------------------------------------------------------

    @property
    def local(self) -> frozenset[int]:
        """The confirmed set: the owner's (only this master before the first confirmation)."""
        if self._confirmed is None:
            return self._local
        return self._confirmed() or frozenset({self.local_broker_id})

    @local.setter
    def local(self, ids: Iterable[int]) -> None:
        assert self._confirmed is None, "the confirmed set belongs to its owner (the role machine)"
        self._local = frozenset(ids)

    def rename(self, local_broker_id: int) -> None:
        """The replica's id was assigned (before any proposal)."""
        assert not self.pending, "the id changes only before replicating"
        if self._confirmed is None:
            self._local = frozenset(local_broker_id if i == self.local_broker_id else i for i in self._local)
        self.local_broker_id = local_broker_id

    @property
    def synchronizing(self) -> bool:
        """A proposal is waiting for the controller's answer."""
        return bool(self.pending)

    @property
    def remote(self) -> frozenset[int]:
        """The union of the pending proposals (empty when none)."""
        return union_view((), self.pending)

    def latest(self) -> frozenset[int]:
        """What the set should become: the newest proposal, else the confirmed set."""
        return self.pending[-1] if self.pending else self.local

    def sync_state_set(self) -> frozenset[int]:
        """The union view: confirmed set | every pending proposal."""
        return union_view(self.local, self.pending)

    def in_sync_replicas_nums(self) -> int:
        return max([len(self.local)] + [len(p) for p in self.pending])

    # -- changes ---------------------------------------------------------------------------------

    def set_sync_state_set(self, ids: Iterable[int]) -> None:
        """The controller confirmed ``ids`` (the owner adopted them, or this tracker does when it has
        no owner): drop the proposals it answered."""
        ids = frozenset(ids)
        if self._confirmed is None:
            self._local = ids
        answered = [i for i, p in enumerate(self.pending) if p == ids]
        self.pending = self.pending[answered[-1] + 1:] if answered else ()

    def mark_in_flight(self, proposal: Iterable[int]) -> frozenset[int]:
        """A proposal is (about to be) at the controller: it counts until the controller answers."""
        p = frozenset(proposal)
        if p != self.local and p not in self.pending:
            self.pending = self.pending + (p,)
            if len(self.pending) > MAX_PENDING:
                self.pending = (self.pending[0] | self.pending[1],) + self.pending[2:]
        return p

    # Old name, kept for callers that mark a proposal themselves.
    mark_synchronizing = mark_in_flight

    def reset(self) -> None:
        """New term: forget caught-up times and proposals; only ourselves in the set (when no owner
        holds the set)."""
        if self._confirmed is None:
            self._local = frozenset({self.local_broker_id})
        self.pending = ()
        self.caught_up_ms.clear()

    def update_caught_up(self, slave_id: int, caught_up_ms: int) -> None:
        self.caught_up_ms[slave_id] = max(self.caught_up_ms.get(slave_id, 0), caught_up_ms)

    def maybe_expand(self, slave_id: int, ack: int, confirm_offset: int,
                     current_epoch_start: int) -> frozenset[int] | None:
        """Propose adding ``slave_id`` when it caught up; returns the proposal or None."""
        if slave_id in self.latest():
            return None          # already a member, or already proposed
        if ack < confirm_offset or ack < current_epoch_start:
            return None
        return self.mark_in_flight(self.latest() | {slave_id, self.local_broker_id})

    def on_disconnect(self, slave_id: int) -> frozenset[int] | None:
        """A slave's connection closed: propose removing it if it is (to be) in the set."""
        if slave_id == self.local_broker_id or slave_id not in self.latest():
            return None
        return self.mark_in_flight(self.latest() - {slave_id})

    def maybe_shrink(self, now_ms: int) -> frozenset[int]:
        """``maybeShrinkSyncStateSet``: members not caught up for too long, or never seen, leave.

        The candidate starts from the newest proposal (a pending expand stays in it) and never
        replaces a pending proposal in the union view. Returns the candidate (always containing
        the master); the caller reports it if it differs from the confirmed set.
        """
        candidate = set(self.latest())
        for slave_id in list(candidate):
            if slave_id == self.local_broker_id:
                continue
            seen = self.caught_up_ms.get(slave_id)
            if seen is None or now_ms - seen > self.max_time_slave_not_catchup_ms:
                candidate.discard(slave_id)
        candidate.add(self.local_broker_id)
        result = frozenset(candidate)
        if result != self.latest():
            self.mark_in_flight(result)
        return result

    # -- confirm offset --------------------------------------------------------------------------

    def compute_confirm_offset(self, max_offset: int, current_confirm_offset: int,
                               acks: Mapping[int, int], all_ack: bool = True) -> int:
        """The offset every member of the union view holds (``rocketray.ha.ack.confirm_offset``).

        ``acks`` maps each *connected* slave id to its last ack (-1 when it has not acked yet).
        """
        return confirm_offset(self.local_broker_id, self.sync_state_set(), max_offset,
                              current_confirm_offset, acks, all_ack)
