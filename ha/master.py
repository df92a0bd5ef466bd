"""The master side of replication as one pure object: connections' acks, SyncStateSet, acks policy.

Theory of operation. ``MasterReplication`` owns what the master knows about its slaves: for each
live connection (a key the shell picks) the slave id and its last ack, the ``SyncStateTracker``
(confirmed set + unanswered proposals = the union view) and the ``AckPolicy``. The shell (the
asyncio ``HAService``, or the simulator) feeds it the sessions' events and store facts and gets
back decisions: proposals to report, connections to close, the confirm offset, whether a put may
start and whether a batch is acknowledged. It holds no clock, no IO and no store.

Rules (reference 13.1-13.4): a slave's ack counts only on its live connection; a second
connection of the same slave replaces the first; a caught-up ack makes the slave a candidate for
the set (``SyncStateTracker.maybe_expand``: ack >= confirm offset and >= the current epoch's
start); losing a slave's last connection proposes its removal; every ack and confirm decision is
made on the union view (``rocketray.ha.ack``).
"""

from __future__ import annotations

from typing import Callable, Hashable, Iterable

from rocketray.ha.ack import AckPolicy, batch_acked, put_admitted
from rocketray.ha.session import AckEvent
from rocketray.ha.sync_state import SyncStateTracker

__all__ = ["MasterReplication"]


class MasterReplication:
    """See the module docstring. ``key``: any hashable the shell uses for one connection."""

    def __init__(self, self_id: int, policy: AckPolicy,
                 max_time_slave_not_catchup_ms: int = 15000,
                 confirmed: Callable[[], frozenset[int]] | None = None) -> None:
        """``confirmed``: the owner of the confirmed SyncStateSet (the broker's role machine)."""
        self.policy = policy
        self.tracker = SyncStateTracker(self_id, max_time_slave_not_catchup_ms, confirmed)
        self._slave_of: dict[Hashable, int | None] = {}
        self._ack_of: dict[Hashable, int] = {}

    @property
    def self_id(self) -> int:
        return self.tracker.local_broker_id

    def rename_self(self, self_id: int) -> None:
        """The controller assigned this replica's id (before any connection or proposal)."""
        assert not self._slave_of, "the id changes only before replicating"
        self.tracker.rename(self_id)

    # -- connections -------------------------------------------------------------------------

    def opened(self, key: Hashable) -> None:
        """A connection authenticated; its slave is not known until the handshake."""
        assert key not in self._slave_of, key
        self._slave_of[key] = None
        self._ack_of[key] = -1

    def handshake(self, key: Hashable, slave_id: int) -> list[Hashable]:
        """The slave named itself; returns the keys of its older connections (close them)."""
        assert self._slave_of.get(key, None) is None, key
        self._slave_of[key] = slave_id
        return [k for k, s in self._slave_of.items() if s == slave_id and k != key]

    def acked(self, key: Hashable, event: AckEvent, confirm_offset_now: int,
              epoch_start: int) -> frozenset[int] | None:
        """An ack on connection ``key``; returns a proposal (expand) to report, or None."""
        assert self._slave_of.get(key) == event.slave_id, (key, event)
        self._ack_of[key] = max(self._ack_of[key], event.offset)
        if event.caught_up_ms is None:
            return None
        self.tracker.update_caught_up(event.slave_id, event.caught_up_ms)
        return self.tracker.maybe_expand(event.slave_id, event.offset, confirm_offset_now,
                                         epoch_start)

    def caught_up(self, key: Hashable, now_ms: int, async_learner: bool) -> None:
        """Nothing left to send on ``key``: its slave is caught up (reference 11.7)."""
        slave_id = self._slave_of.get(key)
        if slave_id is not None and not async_learner and self._ack_of[key] >= 0:
            self.tracker.update_caught_up(slave_id, now_ms)

    def closed(self, key: Hashable, still_master: bool) -> frozenset[int] | None:
        """Connection ``key`` ended; returns a removal proposal when it was its slave's last."""
        slave_id = self._slave_of.pop(key, None)
        self._ack_of.pop(key, None)
        if slave_id is None or not still_master or slave_id in self._slave_of.values():
            return None
        return self.tracker.on_disconnect(slave_id)

    def acks(self) -> dict[int, int]:
        """Each connected slave's ack on its live connection (-1: not acked yet)."""
        out: dict[int, int] = {}
        for key, slave_id in self._slave_of.items():
            if slave_id is not None:
                out[slave_id] = max(out.get(slave_id, -1), self._ack_of[key])
        return out

    # -- SyncStateSet --------------------------------------------------------------------------

    def new_term(self) -> None:
        """Became master: no proposal from an earlier term counts."""
        self.tracker.pending = ()

    def confirmed(self, ids: Iterable[int]) -> None:
        self.tracker.set_sync_state_set(ids)

    def in_flight(self, proposal: Iterable[int], confirm_offset: int,
                  epoch_start: int) -> frozenset[int] | None:
        """A SyncStateSet report is about to leave: vet ``proposal`` and count it in the union view.

        A member may *enter* the union view only if its live ack holds the confirm offset and the
        current epoch's start, the expand rule checked again now: a proposal that waited behind
        another report was made when the confirm offset was lower, and the confirm offset moved on
        without that member (found by the simulator, seed 14: member 1 re-entered the view 258
        bytes short of the confirm offset consumers had read up to, and the controller could have
        made it electable). Such members are dropped from the proposal. Returns the proposal to
        send, or None when nothing is left to change (send nothing).
        """
        view, acks = self.view(), self.acks()
        vetted = {self.self_id}
        for member in proposal:
            ack = acks.get(member, -1)
            if member in view or (ack >= confirm_offset and ack >= epoch_start):
                vetted.add(member)
        result = frozenset(vetted)
        if result == self.tracker.local:
            return None
        return self.tracker.mark_in_flight(result)

    def shrink(self, now_ms: int) -> frozenset[int]:
        return self.tracker.maybe_shrink(now_ms)

    def view(self) -> frozenset[int]:
        """The union view."""
        return self.tracker.sync_state_set()

    # -- decisions -------------------------------------------------------------------------------

    def confirm_offset(self, max_offset: int, current: int) -> int:
        return self.tracker.compute_confirm_offset(max_offset, current, self.acks(),
                                                   self.policy.all_ack_in_sync_state_set)

    def put_admitted(self) -> bool:
        return put_admitted(self.policy, self.tracker.in_sync_replicas_nums())

    def batch_acked(self, end: int) -> bool:
        return batch_acked(self.policy, self.self_id, self.view(), self.acks(), end)
