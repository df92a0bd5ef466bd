"""The HA service as the broker's role machine and ReplicasManager see it: a declared port.

``rocketray.ha.service.HAService`` implements it over real sockets; the simulator's broker and the
test fakes implement the same methods. The one executor of the role machine's actions
(``rocketray.broker.executor``) drives it: ``BecomeMaster`` -> ``stop_replication`` (a promotion)
and ``start_epoch``, ``BecomeSlave`` -> ``stop_replication`` (another master), the committed role
-> ``serve_as_master`` / ``follow``, ``ApplySyncStateSet`` -> ``set_sync_state_set``,
``ReportSyncStateSet`` -> ``mark_in_flight`` (before the request leaves); the shell's periodic
shrink check -> ``maybe_shrink_sync_state_set``; proposals come back through the listener. The
port keeps no role or epoch: the role machine holds them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable, Protocol, Sequence

from rocketray.wire.put_result import PutResult

if TYPE_CHECKING:
    from rocketray.wire.batch import EncodedBatch

__all__ = ["HAPort", "WritePort"]


class HAPort(Protocol):
    """Role switch steps and SyncStateSet bookkeeping (reference 12.5, 13.1, 13.3)."""

    async def stop_replication(self, reason: str) -> None:
        """Stop the slave link and close every slave's connection."""

    async def start_epoch(self, epoch: int, cut_torn_tail: bool) -> None:
        """Durably start ``epoch`` at the max offset, after cutting a torn last record to the last
        whole message if ``cut_torn_tail`` (a promotion)."""

    def serve_as_master(self, new_term: bool) -> None:
        """The role machine committed the master role: serve slaves (``new_term``: no proposal of
        an earlier term counts), recompute the confirm offset, wake waiting puts."""

    def follow(self, master_address: str | None, epoch: int) -> None:
        """The role machine committed the slave role: replicate from ``master_address``
        ("host:port"; None: no link) at the controller's ``epoch`` (a master whose handshake
        names another epoch is refused); the link to that same master only learns the epoch."""

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
        see ``rocketray.wire.put_result.PutResult``."""
