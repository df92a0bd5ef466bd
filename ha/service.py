"""HAService: one replica's replication endpoint, role switches, SyncStateSet and put acks.

Theory of operation. The service lives on the broker's event loop and owns: a listening server
(every broker listens; connections are served only while master), the master connections (one
per slave), the slave client (while slave), and the pure ``MasterReplication`` (acks, union view).
It keeps no role, epoch or confirmed SyncStateSet of its own: it reads them from the broker's role
machine (``roles``, ``rocketray.broker.role``), whose actions the one executor
(``rocketray.broker.executor``) carries out on this service's ``HAPort`` steps (stop replicating,
start an epoch, serve as master, follow a master, adopt or report a SyncStateSet:
``rocketray.ha.switch_steps``, a base class). Writes go through ``put``/``put_start``: the put gate
and the ack waits (reference 13.4) are the pure ``PutGate``'s (``rocketray.ha.put_gate``), which the
simulator runs too; this service writes what it admits, arms its timers and delivers its answers.
Expand/shrink proposals go up through listeners; nothing here talks to the controller.

A service built without ``roles`` is a standalone endpoint (HA tests, benchmarks, a slave process):
it owns a role machine of its own, and ``change_to_master``/``change_to_master_same``/
``change_to_slave``/``set_sync_state_set`` order that machine (``SwitchOrdered``) and run its
actions through the same executor, with the same preconditions as in a broker.

Every ack and confirm-offset decision is the pure core's (``rocketray.ha.ack``) over the tracker's
union view (confirmed set | proposals the controller has not answered), so a joining member counts
from the moment it is proposed and a leaving one until the controller confirms it gone. The confirm
offset is written into the store's ``confirm_offset`` whenever it moves, which is what consumers and
the transfer headers read.
``put`` answers a typed ``PutResult``: a batch written before the role changed is MASTER_CHANGED
with ``written=UNKNOWN``, never NOT_MASTER (it may survive on the next master, so a client must
not take it for a refusal). The connection shells (``ha/transport.py``) call
back only through the public ``ConnectionOwner`` methods (``rocketray.ha.serving``, a base class);
the put path's IO (writing, timers, answers) is the ``PutShell`` (``rocketray.ha.put_shell``) the
simulator runs too, over this service's ports: ``LoopTimers`` (the event loop's clock and timers)
and the service itself (``ReplicaPort``: the endpoint up, the bytes just appended sent at once).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Callable, Sequence

from rocketray.border import Border, LimitsConfig, install_accept_error_filter
from rocketray.wire.batch import EncodedBatch
from rocketray.wire.message import Message
from rocketray.broker.role import Role, RoleMachine, StoreFacts
from rocketray.wire.put_result import PutResult
from rocketray.ha.ack import AckPolicy
from rocketray.ha.config import HAConfig
from rocketray.ha.loop_monitor import OrderedIO
from rocketray.ha.master import MasterReplication
from rocketray.ha.promotion_hold import PromotionHold
from rocketray.ha.put_gate import PutGate
from rocketray.ha.put_shell import PutShell, Reply, ReplicaPort, Timers
from rocketray.broker.replication_port import HAPort, WritePort
from rocketray.ha.serving import SlaveServing
from rocketray.ha.standalone import StandaloneSwitches, standalone_machine
from rocketray.ha.switch_steps import SwitchSteps
from rocketray.ha.peers import HAPeers
from rocketray.ha.sync_state import SyncStateTracker
from rocketray.ha.slave_client import SlaveClient
from rocketray.ha.transport import STREAM_LIMIT, ConnectionOwner, MasterConnection, StoreLogView
from rocketray.links import MemberLinks
from rocketray.listener import start_listener

__all__ = ["HAService", "LoopTimers", "Role"]

log = logging.getLogger(__name__)


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


class LoopTimers:
    """The put shell's ``Timers`` on an event loop: the loop's clock (``time.monotonic``) in ms.
    ``loop_of`` gives the loop when a timer is armed (the service learns its loop when it starts)."""

    def __init__(self, loop_of: Callable[[], asyncio.AbstractEventLoop]) -> None:
        self._loop_of = loop_of

    def now_ms(self) -> int:
        return int(time.monotonic() * 1000)

    def call_at(self, at_ms: int, fn: Callable[[], object]) -> asyncio.TimerHandle:
        return self._loop_of().call_later(max(0, at_ms - self.now_ms()) / 1000, fn)


class HAService(SlaveServing, SwitchSteps, StandaloneSwitches):
    """See the module docstring. Coroutine methods must run on the service's event loop."""

    def __init__(self, store, broker_id: int, config: HAConfig | None = None, *,
                 links: MemberLinks, peers: HAPeers | None = None, group: str = "",
                 limits: LimitsConfig = LimitsConfig(), loop: asyncio.AbstractEventLoop | None = None,
                 clock_ms: Callable[[], int] = wall_clock_ms, io: OrderedIO | None = None,
                 roles: RoleMachine | None = None, hold: PromotionHold | None = None) -> None:
        """``links``: how this member authenticates peers (``rocketray.links``); ``peers`` and
        ``group``: who may replicate with it (``rocketray.ha.peers``; None admits any member, as a
        standalone endpoint does). ``roles``: the broker's role machine (the owner of role, epoch
        and SyncStateSet); None for a standalone endpoint, which then owns one. ``hold``: where puts wait while this replica becomes
        master (``put_start(..., may_hold=True)``); None refuses them NOT_MASTER."""
        self.store = store
        self.broker_id = broker_id
        self.config = config or HAConfig()
        self.links = links
        self.peers = peers
        self.group = group
        self.border = Border(f"ha {broker_id}", limits, log)
        self.loop = loop
        self.now_ms = clock_ms
        # Blocking store work (slave appends, truncation, epoch-file syncs) runs on this ordered
        # IO thread, never on the event loop; shared with the broker actor when it passes one.
        self.io = io if io is not None else OrderedIO(f"ha-{broker_id}")
        self._owns_io = io is None
        # A catch-up's log is read into the page cache here before the event loop sends it (a backlog
        # no longer cached would otherwise make the loop wait for the disk); never the IO thread,
        # whose puts must not queue behind a read.
        self.reader = OrderedIO(f"ha-read-{broker_id}")
        self.standalone = roles is None
        self.roles = roles if roles is not None else standalone_machine(broker_id)
        # Every replication decision (acks, SyncStateSet, confirm offset) is this pure core's; the
        # confirmed set it counts is the role machine's.
        self.replication = MasterReplication(broker_id, AckPolicy.from_config(self.config),
                                             self.config.ha_max_time_slave_not_catchup_ms,
                                             confirmed=lambda: self.roles.sync_state_set)
        self.log_view = StoreLogView(store, lambda: self.store.confirm_offset)
        self.connections: set[MasterConnection] = set()
        self._conn_tasks: set[asyncio.Task] = set()
        self._client: SlaveClient | None = None
        self._server: asyncio.AbstractServer | None = None
        self._listeners: list[Callable[[frozenset[int]], object]] = []
        # the put gate, the puts held during a promotion and the ack waits (pure, ha/put_gate.py)
        self.gate: PutGate[EncodedBatch, Reply] = PutGate(self.roles, self.replication, self.config.slave_timeout_ms,
                                                          hold)
        # the put path's IO, shared with the simulator (ha/put_shell.py)
        self.puts = PutShell(self.gate, store, LoopTimers(lambda: self.loop or asyncio.get_running_loop()), self,
                             clock_ms, label=f"{broker_id} group={group}")
        self._confirm_listeners: list[Callable[[int], object]] = []
        self._closed = False
        self._rejected = 0            # refused after TLS: not master, not a member, not of this group

    @property
    def rejected_connections(self) -> int:
        """Connections refused: over a limit, TLS failed, or refused after it."""
        return self._rejected + self.border.refused + self.border.handshake_failures

    # ------------------------------------------------------------------ views of the role machine
    @property
    def role(self) -> Role:
        """The broker's role (the role machine's)."""
        return self.roles.role

    @property
    def epoch(self) -> int:
        """The master epoch of the role held (-1 before the first switch)."""
        return self.roles.master_epoch if self.roles.role != Role.NONE else -1

    @property
    def _switching(self) -> bool:
        return self.roles.switching is not None

    def _facts(self) -> StoreFacts:
        return StoreFacts(int(self.store.epoch_file.last_epoch()), int(self.store.max_offset),
                          int(self.store.confirm_offset))

    @property
    def tracker(self) -> SyncStateTracker:
        """The SyncStateSet bookkeeping (read it; change it through the service)."""
        return self.replication.tracker

    def set_broker_id(self, broker_id: int) -> None:
        """The controller assigned this replica's id (before any role change)."""
        assert self.standalone and self.role == Role.NONE, "broker id changes only before the first role change"
        self.broker_id = broker_id
        self.roles = standalone_machine(broker_id)
        self.gate.roles = self.roles
        self.puts.label = f"{broker_id} group={self.group}"
        self.replication.rename_self(broker_id)

    # ------------------------------------------------------------------ lifecycle
    async def start(self, listen_host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen for slaves on ``listen_host:port`` (0 = any free port); returns the port."""
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
        install_accept_error_filter(self.loop, self.border.limits.log_interval_ms, log)
        self._server = await start_listener(self._on_accept, listen_host, port, border=self.border,
                                            ssl_context=self.links.server_context,
                                            handshake_timeout_s=self.links.preauth_timeout_ms / 1000,
                                            limit=STREAM_LIMIT)
        bound = self._server.sockets[0].getsockname()[1]
        log.info("ha %s: listening on %s:%d", self.broker_id, listen_host, bound)
        return bound

    async def close(self) -> None:
        """Stop the client, close every connection and the listener (the store stays open)."""
        self._closed = True
        await self._stop_client()
        await self._close_connections("service closed")
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        self._notify_ack_waiters()
        self.puts.cancel_timers()
        self.reader.close()
        if self._owns_io:
            self.io.close()

    # ------------------------------------------------------------------ puts (ha/put_shell.py)
    async def put(self, msgs: EncodedBatch | Sequence[Message], now_ms: int) -> PutResult:
        """Append ``msgs`` (a producer's encoded batch, or messages encoded here) as master and wait
        for the replica acks the policy asks for (``put_start``'s result, awaited).

        Refusals (NOT_MASTER, FENCED, IN_SYNC_REPLICAS_NOT_ENOUGH, MESSAGE_ILLEGAL) write nothing;
        after the write the answer is PUT_OK, FLUSH_SLAVE_TIMEOUT (written, not acked in time) or
        MASTER_CHANGED (written, then the role or term changed during the wait: outcome unknown).
        """
        fut: asyncio.Future[PutResult] = asyncio.get_running_loop().create_future()
        refusal = self.put_start(msgs, now_ms, lambda result: fut.done() or fut.set_result(result))
        return refusal if refusal is not None else await fut

    def put_start(self, msgs: EncodedBatch | Sequence[Message], now_ms: int, done: Reply,
                  may_hold: bool = False) -> PutResult | None:
        """``put`` without a task: a refusal at once (nothing written), or None and ``done(result)``
        once, later, on the loop (``PutShell.put_start``)."""
        return self.puts.put_start(msgs, now_ms, done, may_hold)

    def release_held(self) -> None:
        """Once no switch to master runs: answer the held puts in arrival order (the broker calls it
        after every role input; ``PutShell.release_held``)."""
        self.puts.release_held()

    def _notify_ack_waiters(self) -> bool:
        """Answer the waiting puts now decided; True when none is left waiting."""
        return self.puts.settle()

    def endpoint_up(self) -> bool:
        """ReplicaPort: puts are admitted and waits kept while the service is not closed."""
        return not self._closed

    def appended(self) -> None:
        """ReplicaPort: a put was just written: every slave connection sends it in this step, then the
        confirm offset moves."""
        for conn in self.connections:
            conn.send_now()
        self._update_confirm_offset()

    # ------------------------------------------------------------------ confirm offset
    def acks(self) -> dict[int, int]:
        """Each connected slave's last ack on its live connection (-1: not acked yet)."""
        return self.replication.acks()

    def compute_confirm_offset(self) -> int:
        return self.replication.confirm_offset(self.store.max_offset, self.store.confirm_offset)

    def _update_confirm_offset(self) -> None:
        if self.role != Role.MASTER:
            return
        value = self.compute_confirm_offset()
        if value != self.store.confirm_offset:
            self.store.confirm_offset = value
            self._nudge_writers()       # each slave's writer sends the new confirm offset when due
            for listener in self._confirm_listeners:
                listener(value)         # e.g. consumers' held pulls (on this loop)

    def add_confirm_listener(self, cb: Callable[[int], object]) -> None:
        """Call ``cb(confirm_offset)`` on the event loop whenever the master's confirm offset moves."""
        self._confirm_listeners.append(cb)

    def _notify_writers(self) -> None:
        for conn in self.connections:
            conn.wake.set()

    def _nudge_writers(self) -> None:
        for conn in self.connections:
            conn.nudge()

    def notify_new_data(self) -> None:
        """Call after writing to the store outside ``put`` so connections stream it now."""
        self._update_confirm_offset()
        self._notify_writers()

    # ------------------------------------------------------------------ status
    def status(self) -> dict:
        client = self._client
        return {
            "broker_id": self.broker_id,
            "role": self.role.value,
            "epoch": self.epoch,
            "max_offset": self.store.max_offset,
            "confirm_offset": self.store.confirm_offset,
            "epoch_entries": [[e.epoch, e.start_offset] for e in self.store.epoch_file.entries()],
            "sync_state_set": sorted(self.tracker.local),
            "sync_state_set_view": sorted(self.tracker.sync_state_set()),
            "pending_proposals": [sorted(p) for p in self.tracker.pending],
            "synchronizing": self.tracker.synchronizing,
            "connections": [{"slave_id": c.slave_id, "peer": c.peer, "ack_offset": c.ack_offset,
                             "async_learner": c.session.async_learner,
                             "state": c.session.state.name}
                            for c in self.connections],
            "master_address": "%s:%d" % client.master_address if client else None,
            "slave_connected": bool(client and client.connected),
            "slave_last_error": client.last_error if client else "",
            "rejected_connections": self.rejected_connections,
        }


if TYPE_CHECKING:
    def _implements_the_ports(ha: HAService, timers: LoopTimers) -> tuple[HAPort, WritePort, ConnectionOwner,
                                                                            ReplicaPort, Timers]:
        """mypy checks here that HAService implements the ports it is used through."""
        return ha, ha, ha, ha, timers
