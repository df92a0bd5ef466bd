"""The ``HAPort`` side of an ``HAService``: the role switch steps the one executor runs and the
SyncStateSet the role machine adopts and reports.

Part of ``HAService`` (its base class; the service module's docstring is the theory of operation).
The executor (``rocketray.broker.executor``) carries out the role machine's actions through these
steps (reference 12.5): a promotion stops replication, then starts its epoch durably on the IO
thread (a torn last record cut first); the committed role then serves slaves (``serve_as_master``)
or follows a master (``follow``). The role machine's confirmed SyncStateSet reaches the pure
``MasterReplication`` here (``set_sync_state_set``), a report's proposal is vetted before it leaves
(``mark_in_flight``), and the expands and shrinks the core proposes go up to the listeners; nothing
here talks to the controller. After each step that can move them, the confirm offset is recomputed
and the waiting puts are settled (the service's methods).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Callable, Iterable, cast

from rocketray.ha.standalone import parse_address
from rocketray.ha.slave_client import SlaveClient
from rocketray.ha.transport import ConnectionOwner

if TYPE_CHECKING:
    from rocketray.broker.role import RoleMachine
    from rocketray.broker.store import MessageStore
    from rocketray.ha.loop_monitor import OrderedIO
    from rocketray.ha.master import MasterReplication
    from rocketray.ha.transport import MasterConnection

__all__ = ["SwitchSteps"]

log = logging.getLogger("rocketray.ha.service")


def _log_backup_failure(done: "asyncio.Future[None]") -> None:
    if not done.cancelled() and done.exception() is not None:
        log.error("epoch file backup copy not written (the main copy is durable): %r", done.exception())


class SwitchSteps:
    """The ``HAPort`` steps (see the module docstring); the attributes below are the service's."""

    broker_id: int
    store: MessageStore
    io: OrderedIO
    roles: RoleMachine
    standalone: bool
    replication: MasterReplication
    connections: set[MasterConnection]
    _conn_tasks: set[asyncio.Task]
    _client: SlaveClient | None
    _listeners: list[Callable[[frozenset[int]], object]]

    if TYPE_CHECKING:
        @property
        def epoch(self) -> int: ...

        def _update_confirm_offset(self) -> None: ...

        def _notify_writers(self) -> None: ...

        def _notify_ack_waiters(self) -> bool: ...

        def _order_sync_state_set(self, ids: Iterable[int]) -> None: ...

    # ------------------------------------------------------------------ role switch steps (12.5)
    async def stop_replication(self, reason: str) -> None:
        """HAPort: stop the slave client and close every slave's connection."""
        await self._stop_client()
        await self._close_connections(reason)

    async def start_epoch(self, epoch: int, cut_torn_tail: bool) -> None:
        """HAPort: on the IO thread, (cut a torn tail, then) start ``epoch`` at the max offset. The
        switch goes on once the epoch file's main copy is durable; its ``.bak`` copy is the IO
        thread's next job (``EpochFileCache.write_backup``), off the failover's path."""
        await self.io.run(self._start_master_epoch, epoch, cut_torn_tail)
        self.io.submit(self.store.epoch_file.write_backup).add_done_callback(_log_backup_failure)

    def _start_master_epoch(self, epoch: int, cut_torn_tail: bool) -> None:
        """IO thread: (cut a torn tail to the last whole message, then) start ``epoch`` durably at
        the max offset."""
        ef = self.store.epoch_file
        if cut_torn_tail:
            cut = self.store.truncate_invalid_tail()
            if cut >= 0:
                ef.truncate_suffix_by_offset(cut)
        ef.start_epoch(epoch, self.store.max_offset, backup_later=True)

    def serve_as_master(self, new_term: bool) -> None:
        """HAPort: the role machine made this broker master: serve slaves, confirm, wake puts."""
        if new_term:
            self.replication.new_term()
        self._update_confirm_offset()
        self._notify_writers()
        self._notify_ack_waiters()
        log.info("ha %s: master of epoch %d at offset %d", self.broker_id, self.epoch, self.store.max_offset)

    def follow(self, master_address: str | None, epoch: int) -> None:
        """HAPort: the role machine made this broker a slave of ``master_address`` at ``epoch``."""
        address = parse_address(master_address) if master_address is not None else None
        client = self._client
        if client is not None and address is not None and client.master_address == address:
            client.expect_epoch(epoch)       # checked at the next handshake
            return
        assert client is None, "the slave link is stopped before a switch to another master"
        self._notify_ack_waiters()
        if address is not None:
            # the service is the client's ConnectionOwner (service.py's _implements_the_ports checks it)
            self._client = SlaveClient(cast(ConnectionOwner, self), address, expected_epoch=epoch)
            self._client.start()
        log.info("ha %s: slave of %s at epoch %d", self.broker_id, master_address, epoch)

    async def _stop_client(self) -> None:
        if self._client is not None:
            await self._client.stop()
            self._client = None

    async def _close_connections(self, reason: str) -> None:
        for conn in list(self.connections):
            conn.close(reason)
        tasks = list(self._conn_tasks)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=2.0)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    # ------------------------------------------------------------------ SyncStateSet
    def set_sync_state_set(self, ids: Iterable[int]) -> None:
        """HAPort: the role machine adopted this confirmed SyncStateSet. Standalone: order the
        machine to adopt it (there is no controller)."""
        if self.standalone and frozenset(ids) != self.roles.sync_state_set:
            self._order_sync_state_set(ids)
            return
        self.replication.confirmed(ids)
        self._update_confirm_offset()
        self._notify_ack_waiters()

    def mark_in_flight(self, proposal: Iterable[int]) -> frozenset[int] | None:
        """A SyncStateSet report carrying ``proposal`` is about to be sent (the role machine's
        ``ReportSyncStateSet``): returns the vetted proposal (``MasterReplication.in_flight``), which
        counts in the union view until the controller answers, or None (send nothing)."""
        last = self.store.epoch_file.last_entry()
        vetted = self.replication.in_flight(proposal, self.store.confirm_offset,
                                            last.start_offset if last is not None else 0)
        self._update_confirm_offset()
        return vetted

    def add_sss_listener(self, cb: Callable[[frozenset[int]], object]) -> None:
        """``cb(proposed_set)`` is called when the master proposes an expand or a shrink."""
        self._listeners.append(cb)

    def maybe_shrink_sync_state_set(self, now_ms: int) -> set[int]:
        """Members not caught up within ``ha_max_time_slave_not_catchup_ms`` leave; returns the
        candidate set (the caller reports it if it differs from the confirmed one)."""
        candidate = set(self.replication.shrink(now_ms))
        self._update_confirm_offset()
        return candidate

    def sync_state_set(self) -> frozenset[int]:
        """The union view (confirmed set | pending proposals)."""
        return self.replication.view()

    def _propose(self, proposal: frozenset[int] | None) -> None:
        if proposal is None:
            return
        log.info("ha %s: proposing SyncStateSet %s", self.broker_id, sorted(proposal))
        self._update_confirm_offset()
        for cb in list(self._listeners):
            try:
                cb(frozenset(proposal))
            except Exception:  # noqa: BLE001 - a listener failure must not stop replication
                log.exception("ha %s: SyncStateSet listener failed", self.broker_id)
