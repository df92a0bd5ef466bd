"""The broker's controller loop: ReplicasManager, a thin shell over the role machine (reference §10).

Theory of operation. A broker starts *fenced* (no writes). ``start_basic_service_once`` walks the
role machine's lifecycle ``INITIAL -> FIRST_TIME_SYNC_CONTROLLER_METADATA_DONE -> REGISTER_TO_CONTROLLER_DONE ->
RUNNING``: find the controller leader, obtain the persistent broker id (``rocketray.broker.register``),
send REGISTER_BROKER (which also tells the controller a changed address), heartbeat once, and learn
the master from the registration answer or by asking for a broker-triggered election. After that,
periodic steps keep it in line with the controller: heartbeats to the leader (on the session), polling of
the replica info (the safety net behind the controller's role-change notifications), and on the
master the SyncStateSet shrink check.

Every decision about lifecycle, role, master epoch and SyncStateSet is taken by the pure
:class:`rocketray.broker.role.RoleMachine` (strictly newer epochs only; a new term instead of
resuming a term from before a restart; no stale switch; one SyncStateSet report in flight; see that
module). This shell only turns controller answers, notifications and HA events into the machine's
inputs and hands them to the one executor (:class:`rocketray.broker.executor.Executor`, which the
simulator runs too), plugging in the ports: this manager as the executor's ``ControllerPort``
(over :class:`ControllerClient`), :class:`rocketray.broker.replication_port.HAPort` (built by ``ha_factory`` once
the broker id is known, given the machine it reads role and epoch from), :class:`StorePort` and
the registrar's :class:`rocketray.broker.register.IdentityStore`. It keeps no copy of lifecycle,
role, epoch or membership; its views read the machine. Every input is applied under one lock, so
actions of one input run before the next input is decided; a SyncStateSet report (a controller
round trip) runs as a background task whose answer is a later input.

Address convention (replaces reference §18 item 9, the nameserver detour): the address a broker
registers with the controller *is its HA listening address* ``host:ha_port``. The controller's
``master_address`` is therefore directly what a slave's HA client connects to, and a broker that
restarts on another port re-registers the new address (UpdateBrokerAddressEvent).

The one-shot ``*_once`` methods let tests drive the manager deterministically; ``start()`` schedules
them on the running event loop. Periodic steps catch and log per step (this is a shell).
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any, Awaitable, Callable, Coroutine, Iterable

from rocketray.broker import executor as ex
from rocketray.broker import role as rm
from rocketray.broker.executor import BrokerNames, Executor
from rocketray.broker.register import IdentityStore, Registrar, RegisterState
from rocketray.broker.replicas_model import (ControllerCallError, ControllerClient, EpochFileView, HAFactory,
                                             ReplicasManagerConfig, Role, RoleChangeNotification, State, StorePort)
from rocketray.broker.role import MasterInfo, RoleMachine, StoreFacts
from rocketray.wire.controller_api import BrokerHeartbeatRequest, Response
from rocketray.wire.controller_codes import ResponseCode
from rocketray.wire.controller_headers import NotLeaderResponseHeader
from rocketray.broker.replication_port import HAPort
from rocketray.identity import Identity

__all__ = ["ControllerCallError", "ControllerClient", "EpochFileView", "HAPort", "ReplicasManager",
           "ReplicasManagerConfig", "Role", "RoleChangeNotification", "State", "StorePort"]

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# The shell


class ReplicasManager:
    """One broker replica's controller-facing loop. See the module docstring."""

    def __init__(self, *, cluster_name: str, broker_name: str, broker_address: str,
                 controller_client: ControllerClient, store: StorePort, identity: IdentityStore,
                 now_ms: Callable[[], int], ha_factory: HAFactory,
                 config: ReplicasManagerConfig | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 rng: random.Random | None = None,
                 controller_addresses: Iterable[str] = (), member: Identity | None = None) -> None:
        """``controller_addresses`` is accepted for old callers and unused (the client fans out);
        ``member``: the member identity the broker runs as (recorded with its registration)."""
        assert broker_address and ":" in broker_address, "broker_address must be the HA address host:port"
        self.cluster_name = cluster_name
        self.broker_name = broker_name
        self.broker_address = broker_address
        self.client = controller_client
        self.ha: HAPort | None = None
        self.ha_factory = ha_factory
        self.store = store
        self.now_ms = now_ms
        self.config = config or ReplicasManagerConfig()
        self._sleep = sleep
        self._rng = rng or random.Random()
        self.registrar = Registrar(cluster_name, broker_name, broker_address, identity, now_ms, member)
        self.machine = RoleMachine(broker_address)
        self.names = BrokerNames(cluster_name, broker_name, broker_address,
                                 self.config.controller_heartbeat_timeout_ms, self.config.broker_election_priority)
        self.executor = Executor(self.machine, self.names, controller=self, ha=None, facts=self._facts,
                                 now_ms=now_ms)
        self.controller_leader_address: str | None = None
        #: Called on the loop after every input's actions ran (and after stop): the broker shell
        #: answers the puts it held while this replica was becoming master (``promoting``).
        self.settled: Callable[[], None] = lambda: None
        self._lock = asyncio.Lock()
        self._feeding: str | None = None        # the input whose actions hold the lock (for the log)
        self._periodic: list[asyncio.Task] = []
        self._background: set[asyncio.Task] = set()

    # ---------------------------------------------------------------- views (read the machine)

    @property
    def broker_id(self) -> int | None:
        return self.machine.broker_id

    @property
    def role(self) -> Role:
        return self.machine.role

    @property
    def master_epoch(self) -> int:
        return self.machine.master_epoch

    @property
    def master_broker_id(self) -> int | None:
        return self.machine.master_broker_id

    @property
    def master_address(self) -> str:
        return self.machine.master_address

    @property
    def sync_state_set(self) -> frozenset[int]:
        return self.machine.sync_state_set

    @property
    def sync_state_set_epoch(self) -> int:
        return self.machine.sync_state_set_epoch

    @property
    def register_state(self) -> RegisterState:
        return self.registrar.state

    @property
    def state(self) -> State:
        """The lifecycle (the machine's)."""
        return self.machine.lifecycle

    @property
    def fenced(self) -> bool:
        """True until RUNNING (registered, master known) and after stop: the broker must not write."""
        return self.machine.fenced

    @property
    def writable(self) -> bool:
        return self.machine.writable

    @property
    def promoting(self) -> bool:
        """A switch to master is under way (``RoleMachine.promoting``)."""
        return self.machine.promoting

    @property
    def _tasks(self) -> list[asyncio.Task]:
        """Every task the manager runs (periodic and background)."""
        return [*self._periodic, *self._background]

    def status(self) -> dict:
        m = self.machine
        return {
            "state": self.state.name, "register_state": self.register_state.name, "fenced": self.fenced,
            "broker_id": m.broker_id, "broker_address": self.broker_address, "role": m.role.value,
            "master_broker_id": m.master_broker_id, "master_address": m.master_address,
            "master_epoch": m.master_epoch, "sync_state_set": sorted(m.sync_state_set),
            "sync_state_set_epoch": m.sync_state_set_epoch,
            "controller_leader_address": self.controller_leader_address,
            "report_in_flight": sorted(m.report_in_flight.proposal) if m.report_in_flight else None,
        }

    # ---------------------------------------------------------------- machine driving

    def _facts(self) -> StoreFacts:
        return StoreFacts(int(self.store.epoch_file.last_epoch()), int(self.store.max_offset),
                          int(self.store.confirm_offset))

    async def _feed(self, event: rm.Input) -> None:
        """Apply ``event`` and execute its actions (and the inputs they produce) under the lock. An
        input that waited for another one's actions (a controller round trip) logs how long and
        behind what: a role change must not queue behind slow work."""
        behind, queued_at = (self._feeding, self.now_ms()) if self._lock.locked() else (None, 0)
        try:
            async with self._lock:
                if behind is not None:
                    log.info("%s waited %d ms for %s to finish: group=%s broker_id=%s", type(event).__name__,
                             self.now_ms() - queued_at, behind, self.broker_name, self.broker_id)
                self._feeding = type(event).__name__
                try:
                    await self.executor.feed(event)
                finally:
                    self._feeding = None
        finally:
            self.settled()

    # ---------------------------------------------------------------- the executor's ControllerPort

    async def ask(self, request: object, then: ex.Then) -> rm.Input | None:
        """Send ``request`` to the leader and return ``then(answer)`` (None: no answer)."""
        return then(await self._answer(request))

    def ask_later(self, request: object, then: ex.Then) -> None:
        """Send ``request`` in the background; its answer is a later input (a report)."""
        async def answer_later() -> None:
            await self._feed(then(await self._answer(request)))
        self._spawn(answer_later())

    async def heartbeat(self, request: BrokerHeartbeatRequest) -> None:
        try:
            await self.client.heartbeat(request)
        except Exception as exc:  # noqa: BLE001 - the next periodic heartbeat retries
            log.info("heartbeat failed: group=%s error=%r", self.broker_name, exc)

    async def _answer(self, request: object) -> Response | None:
        """The leader's answer, or None when none came (logged; the outcome is unknown)."""
        what = type(request).__name__
        try:
            resp = await self._call(request)
        except Exception as exc:  # noqa: BLE001 - the machine treats it as no answer
            log.info("%s failed: group=%s broker_id=%s error=%r", what, self.broker_name, self.broker_id, exc)
            return None
        if not resp.ok:
            log.info("%s answered: group=%s broker_id=%s code=%s %s", what, self.broker_name, self.broker_id,
                     resp.code, resp.remark)
        return resp

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def settle(self) -> None:
        """Wait until no background work (queued inputs, the SyncStateSet report in flight) is left."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    # ---------------------------------------------------------------- controller access

    async def sync_controller_metadata_once(self) -> bool:
        """Ask the controller nodes who leads; the first non-empty answer wins."""
        for md in await self.client.metadata():
            leader = md.get("leader_address")
            if leader:
                self.controller_leader_address = leader
                return True
        return False

    async def call_controller(self, request: object) -> Response:
        """One request to the controller leader this manager follows (``_call``)."""
        return await self._call(request)

    async def _call(self, request: object) -> Response:
        """Send to the leader; follow one NOT_LEADER hint; forget the leader on transport failure."""
        if not self.controller_leader_address and not await self.sync_controller_metadata_once():
            raise ControllerCallError("no controller leader known", retriable=True)
        resp: Response | None = None
        for _ in range(2):
            try:
                resp = await self.client.call(request, address=self.controller_leader_address)
            except Exception:
                self.controller_leader_address = None
                raise
            if resp.code != ResponseCode.CONTROLLER_NOT_LEADER:
                return resp
            hint = resp.header.leader_address if isinstance(resp.header, NotLeaderResponseHeader) else None
            if not hint or hint == self.controller_leader_address:
                self.controller_leader_address = None
                return resp
            self.controller_leader_address = hint
        assert resp is not None
        return resp

    async def _poll(self) -> rm.Input | None:
        """GET_REPLICA_INFO (§10.7); the controller lost the set's metadata -> register again."""
        resp = await self._call(ex.poll_request(self.names))
        if resp.code == ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST:
            log.warning("controller lost broker-set metadata; re-registering: group=%s", self.broker_name)
            return await self._register_call()
        if not resp.ok:
            log.info("get replica info failed: group=%s code=%s %s", self.broker_name, resp.code, resp.remark)
        return ex.poll_answer(resp)

    # ---------------------------------------------------------------- registration (§9.2, §10.2)

    async def register_once(self) -> bool:
        """One pass of register(): broker id (steps 1-4) then REGISTER_BROKER (step 5)."""
        broker_id = await self.registrar.ensure_broker_id(self._call)
        if broker_id is None:
            return False
        if self.broker_id is None:
            self.ha = self.executor.ha = await self.ha_factory(broker_id, self.machine)
            self.ha.add_sss_listener(self._on_sss_proposed)
            await self._feed(rm.IdAssigned(broker_id))
        assert self.broker_id == broker_id, "a broker id never changes"
        event = await self._register_call()
        if event is None:
            return False
        await self._feed(event)
        return True

    async def _register_call(self) -> rm.Registered | None:
        assert self.broker_id is not None
        try:
            resp = await self._call(ex.register_request(self.names, self.broker_id))
        except Exception as exc:  # noqa: BLE001 - the next pass retries
            log.warning("register broker failed: group=%s broker_id=%s error=%r", self.broker_name,
                        self.broker_id, exc)
            return None
        if not resp.ok:
            log.warning("register broker refused: group=%s broker_id=%s code=%s %s", self.broker_name,
                        self.broker_id, resp.code, resp.remark)
            return None
        self.registrar.mark_registered()
        return ex.register_answer(resp)

    async def elect_once(self) -> bool:
        """brokerElect (§10.3): ask for a broker-triggered election and follow the answer."""
        assert self.broker_id is not None
        answer = await self.ask(ex.elect_request(self.names, self.broker_id), ex.elect_answer)
        assert isinstance(answer, rm.ElectAnswered)
        await self._feed(answer)
        return answer.info is not None and answer.info.names_master

    async def start_basic_service_once(self) -> bool:
        """One pass of startBasicService (§10.2); True once RUNNING (unfenced)."""
        if self.state == State.SHUTDOWN:
            return False
        if self.state == State.INITIAL:
            if not await self.sync_controller_metadata_once():
                return False
            await self._feed(rm.LeaderFound())
        bootstrap = self.state == State.REGISTER_TO_CONTROLLER_DONE
        if self.state == State.FIRST_TIME_SYNC_CONTROLLER_METADATA_DONE:
            if not await self.register_once():
                return False
            bootstrap = True
        if bootstrap:
            await self._feed(rm.Bootstrap())  # heartbeat; elect if no master is known
            if self.state != State.RUNNING:   # nobody electable yet, or the switch failed
                return False
            log.info("replicas manager running: group=%s broker_id=%s role=%s epoch=%s", self.broker_name,
                     self.broker_id, self.role.value, self.master_epoch)
        return self.state == State.RUNNING

    # ---------------------------------------------------------------- periodic steps

    def heartbeat_request(self) -> BrokerHeartbeatRequest:
        assert self.broker_id is not None
        return ex.heartbeat_request(self.names, self.broker_id, self._facts())

    async def heartbeat_once(self) -> bool:
        """Heartbeat every controller (§5.1); skipped until registration is done (isolated)."""
        if self.broker_id is None or self.state in (State.INITIAL, State.SHUTDOWN,
                                                    State.FIRST_TIME_SYNC_CONTROLLER_METADATA_DONE):
            return False
        await self.client.heartbeat(self.heartbeat_request())
        return True

    async def sync_metadata_once(self) -> None:
        """Poll the replica info (§10.7) and converge on what the controller says."""
        if self.state != State.RUNNING:
            return
        event = await self._poll()
        if event is not None:
            await self._feed(event)

    async def check_sync_state_set_once(self) -> None:
        """The master's shrink check (§10.8); waits for the report it may start."""
        if self.state != State.RUNNING or not self.machine.is_master:
            return
        assert self.ha is not None
        await self._feed(rm.ShrinkChecked(frozenset(self.ha.maybe_shrink_sync_state_set(self.now_ms()))))
        await self.settle()

    async def report_sync_state_set(self, proposed: Iterable[int]) -> bool:
        """Propose a SyncStateSet as the HA service would; True once the controller confirmed it
        and it was applied."""
        if self.state != State.RUNNING or self.broker_id is None:
            return False
        wanted = frozenset(proposed) | {self.broker_id}
        await self._feed(rm.SyncStateSetProposed(wanted))
        await self.settle()
        return self.machine.is_master and self.sync_state_set == wanted

    def _on_sss_proposed(self, proposed: Iterable[int]) -> None:
        """HA listener (expand / connection loss): a later input; never blocks the HA loop.
        Ignored once stopped (the machine is stopped too: see ``rocketray.broker.role.Stopped``)."""
        if self.state == State.SHUTDOWN:
            return
        self._spawn(self._guard("sync_state_set_proposed", self._feed,
                                rm.SyncStateSetProposed(frozenset(proposed))))

    # ---------------------------------------------------------------- role changes (§5.5)

    async def on_role_change(self, info: MasterInfo) -> bool:
        """NOTIFY_BROKER_ROLE_CHANGED (``RoleChangeNotice.notification``): the machine acts only for
        a known master and a strictly newer epoch. True if the broker switched to the notified role.
        Anything but a ``MasterInfo`` is refused with a TypeError and changes nothing."""
        if not isinstance(info, MasterInfo):
            raise TypeError(f"a role-change notification is a MasterInfo, not {type(info).__name__}")
        if self.broker_id is None:
            return False
        before = (self.master_epoch, self.master_broker_id)
        await self._feed(rm.RoleChangeNotified(info))
        return (self.master_epoch, self.master_broker_id) != before and self.master_epoch == info.master_epoch

    # ---------------------------------------------------------------- runner

    async def _guard(self, what: str, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        try:
            return await fn(*args)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a shell step: log, the next period retries
            log.info("%s failed: group=%s broker_id=%s error=%r", what, self.broker_name, self.broker_id, exc)
            return None

    async def _every(self, what: str, period_ms: int, fn: Callable[[], Awaitable[Any]]) -> None:
        while self.state != State.SHUTDOWN:
            await self._guard(what, fn)
            await self._sleep(period_ms / 1000)

    async def _bootstrap(self) -> None:
        while self.state != State.SHUTDOWN:
            if await self._guard("start_basic_service", self.start_basic_service_once):
                break
            jitter_ms = self._rng.randrange(0, max(1, self.config.start_retry_interval_ms // 2))
            await self._sleep((self.config.start_retry_interval_ms + jitter_ms) / 1000)
        c = self.config
        for what, period, fn in (("sync_metadata", c.sync_broker_metadata_period_ms, self.sync_metadata_once),
                                 ("check_sync_state_set", c.check_sync_state_set_period_ms,
                                  self.check_sync_state_set_once)):
            self._periodic.append(asyncio.get_running_loop().create_task(self._every(what, period, fn)))

    def start(self) -> None:
        """Schedule the bootstrap and the periodic steps on the running loop."""
        assert not self._periodic, "started twice"
        loop = asyncio.get_running_loop()
        c = self.config
        self._periodic.append(loop.create_task(self._every("heartbeat", c.broker_heartbeat_interval_ms,
                                                           self.heartbeat_once)))
        self._periodic.append(loop.create_task(self._every("sync_controller_metadata",
                                                           c.sync_controller_metadata_period_ms,
                                                           self.sync_controller_metadata_once)))
        self._periodic.append(loop.create_task(self._bootstrap()))

    async def stop(self) -> None:
        """Shutdown (§10.10): fence, stop reporting, cancel every task; no deregistration."""
        self.machine.step(rm.Stopped())
        self.settled()
        self.registrar.reset()
        tasks = self._tasks
        self._periodic, self._background = [], set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
