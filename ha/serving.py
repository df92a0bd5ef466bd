"""The master side of an ``HAService``: accepting slaves' connections and the callbacks the
connection shells (``rocketray.ha.transport.MasterConnection``) make.

Part of ``HAService`` (its base class; the service module's docstring is the theory of operation).
Every broker listens; a connection is served only while this replica is master, within the
listener's limits (``rocketray.border``), and once the peer has authenticated as a member
(``rocketray.links``) that is a registered replica of this group: its handshake may claim only its
own broker id (``rocketray.ha.peers``). A slave's handshake replaces its older connection; each ack
goes to the pure ``MasterReplication`` (acks, SyncStateSet expansion), then the confirm offset is
recomputed and waiting puts are woken; a closed connection may shrink the set the same way.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Callable

from rocketray.auth import HA_LABEL
from rocketray.border import Border
from rocketray.broker.role import Role
from rocketray.ha.peers import HAPeers, handshake_problem
from rocketray.identity import Identity
from rocketray.links import LinkRefused, MemberLinks
from rocketray.ha.session import AckEvent, HandshakeEvent
from rocketray.ha.transport import MasterConnection

if TYPE_CHECKING:
    from rocketray.broker.store import MessageStore
    from rocketray.ha.config import HAConfig
    from rocketray.ha.loop_monitor import OrderedIO
    from rocketray.ha.master import MasterReplication
    from rocketray.ha.transport import StoreLogView

__all__ = ["SlaveServing"]

log = logging.getLogger("rocketray.ha.service")


class SlaveServing:
    """Serving slaves (see the module docstring); the attributes below are the service's."""

    broker_id: int
    config: HAConfig
    links: MemberLinks
    peers: HAPeers | None
    group: str
    border: Border
    store: MessageStore
    log_view: StoreLogView
    io: OrderedIO
    reader: OrderedIO
    now_ms: Callable[[], int]
    replication: MasterReplication
    connections: set[MasterConnection]
    _conn_tasks: set[asyncio.Task]
    _closed: bool
    _rejected: int

    if TYPE_CHECKING:
        @property
        def role(self) -> Role: ...

        def _propose(self, proposal: frozenset[int] | None) -> None: ...

        def _update_confirm_offset(self) -> None: ...

        def _notify_ack_waiters(self) -> bool: ...

    async def _on_accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peername = writer.get_extra_info("peername")
        peer = "%s:%s" % peername[:2]
        if self.role != Role.MASTER or self._closed:
            self.border.log.log(logging.INFO, "not master", "ha %s: dropping connection from %s: not master",
                                self.broker_id, peer)
            self._rejected += 1
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None
        self._conn_tasks.add(task)
        try:
            try:
                member = await self.links.accept(reader, writer, HA_LABEL)
                expected = await self._expected_slave_id(member.identity)
            except LinkRefused as exc:
                self._rejected += 1
                self.border.log.log(logging.WARNING, "refused", "ha %s: dropping peer %s: %s",
                                    self.broker_id, peer, exc)
                writer.close()
                return
            if self.role != Role.MASTER:
                writer.close()
                return
            conn = MasterConnection(self, reader, writer, peer, member.leftover, expected_slave_id=expected)
            self.connections.add(conn)
            self.replication.opened(conn)
            await conn.run()
        except asyncio.CancelledError:
            pass    # closing the service; the streams callback would log a cancelled task
        finally:
            self._conn_tasks.discard(task)

    async def _expected_slave_id(self, identity: Identity | None) -> int | None:
        """The broker id the authenticated member ``identity`` may claim (None: no identity to
        check, TLS off); raises LinkRefused if it is no registered replica of this group."""
        if identity is None or self.peers is None:
            return None
        slave_id = await self.peers.slave_id_of(identity)
        if slave_id is None:
            raise LinkRefused(f"{identity} is not a registered replica of {self.group or 'this group'}")
        return slave_id

    # ------------------------------------------------------------------ ConnectionOwner (transport)
    def on_session_event(self, conn: MasterConnection, event, now_ms: int) -> None:
        """A master connection decoded a slave packet."""
        if conn.closed:
            return
        if isinstance(event, HandshakeEvent):
            problem = handshake_problem(conn.expected_slave_id, event.slave_id)
            if problem is not None:
                log.warning("ha %s: refusing the handshake from %s: %s", self.broker_id, conn.peer, problem)
                conn.close(problem)
                return
            for key in self.replication.handshake(conn, event.slave_id):
                assert isinstance(key, MasterConnection)
                key.close(f"slave {event.slave_id} reconnected")
            log.info("ha %s: slave %d handshake from %s (learner=%s, from_last_file=%s)",
                     self.broker_id, event.slave_id, conn.peer, event.async_learner,
                     event.sync_from_last_file)
            return
        assert isinstance(event, AckEvent)
        last = self.store.epoch_file.last_entry()
        epoch_start = last.start_offset if last is not None else 0
        self._propose(self.replication.acked(conn, event, self.store.confirm_offset, epoch_start))
        # The confirm offset first: its listeners (held pulls) answer in this step, so a consumer
        # wakes before the producers whose puts this ack decides send again.
        self._update_confirm_offset()
        self._notify_ack_waiters()

    def on_caught_up(self, conn: MasterConnection, now_ms: int) -> None:
        """A master connection has nothing left to send: its slave is caught up."""
        self.replication.caught_up(conn, now_ms, conn.session.async_learner)

    def connection_closed(self, conn: MasterConnection) -> None:
        """A master connection closed (any reason)."""
        self.connections.discard(conn)
        self._propose(self.replication.closed(conn, self.role == Role.MASTER))
        self._update_confirm_offset()
        self._notify_ack_waiters()
