"""The HA service as the broker's role machine and ReplicasManager see it: a declared port.

``rocketray.ha.service.HAService`` implements it over real sockets; a simulator or a test fake
implements the same methods. The manager executes the role machine's actions on it:
``BecomeMaster`` -> ``change_to_master``/``change_to_master_same``, ``BecomeSlave`` ->
``change_to_slave``, ``ApplySyncStateSet`` -> ``set_sync_state_set``, ``ReportSyncStateSet`` ->
``mark_in_flight`` (before the request leaves), the periodic shrink check ->
``maybe_shrink_sync_state_set``; proposals come back through the listener.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable, Protocol, Sequence

from rocketray.ha.ack import PutResult

if TYPE_CHECKING:
    from rocketray.broker.batch import EncodedBatch

__all__ = ["HAPort", "WritePort"]


class HAPort(Protocol):
    """Role switches and SyncStateSet bookkeeping (reference 12.5, 13.1, 13.3)."""

    async def change_to_master(self, epoch: int) -> bool:
        """Become master of ``epoch``: cut a torn tail to the last whole message, start the
        epoch at the max offset, serve slaves. False (nothing changed) if the epoch is stale."""

    async def change_to_master_same(self, epoch: int) -> bool:
        """Already master: only start ``epoch``. False if stale."""

    async def change_to_slave(self, master_ha_address: str, epoch: int) -> bool:
        """Replicate from ``master_ha_address`` ("host:port") at the controller's ``epoch``: a
        master whose handshake names another epoch is refused (the connection closes and is
        retried). Same master: only the expected epoch moves. False if stale."""

    def set_sync_state_set(self, ids: Iterable[int]) -> None:
        """The controller confirmed this SyncStateSet (drops the proposals it answered)."""

    def mark_in_flight(self, proposal: Iterable[int]) -> frozenset[int] | None:
        """A SyncStateSet report carrying ``proposal`` is about to be sent: returns the vetted
        proposal to send (members whose ack does not hold the confirm offset are dropped), which
        counts in the union view (acks, confirm offset) until the controller confirms a set, or
        None when nothing is left to report."""

    def add_sss_listener(self, cb: Callable[[frozenset[int]], object]) -> None:
        """``cb(proposal)`` on an expand or a member's connection loss."""

    def maybe_shrink_sync_state_set(self, now_ms: int) -> Iterable[int]:
        """The shrink check's candidate set (built from the newest proposal, master included)."""


class WritePort(Protocol):
    """The write path of a master (the broker actor calls it)."""

    async def put(self, msgs: "EncodedBatch | Sequence", now_ms: int) -> PutResult:
        """Append as master (a producer's encoded batch, or messages) and wait for the ack policy;
        see ``rocketray.ha.ack.PutResult``."""
