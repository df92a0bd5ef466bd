"""The broker's controller loop: ReplicasManager, a thin shell over the role machine (reference §10).

Theory of operation. A broker starts *fenced* (no writes). ``start_basic_service_once`` walks the
lifecycle ``INITIAL -> FIRST_TIME_SYNC_CONTROLLER_METADATA_DONE -> REGISTER_TO_CONTROLLER_DONE ->
RUNNING``: find the controller leader, obtain the persistent broker id (``rocketray.broker.register``),
send REGISTER_BROKER (which also tells the controller a changed address), heartbeat once, and learn
the master from the registration answer or by asking for a broker-triggered election. After that,
periodic steps keep it in line with the controller: heartbeats to every controller node, polling of
the replica info (the safety net behind the controller's role-change notifications), and on the
master the SyncStateSet shrink check.

Every decision about role, master epoch and SyncStateSet is taken by the pure
:class:`rocketray.broker.role.RoleMachine` (strictly newer epochs only; a new term instead of
resuming a term from before a restart; one SyncStateSet report in flight; see that module). This
shell only turns controller answers, notifications and HA events into the machine's inputs, and
executes the actions it returns, in order, on declared ports: :class:`ControllerClient`,
:class:`rocketray.ha.port.HAPort` (built by ``ha_factory`` once the broker id is known), :class:`StorePort` and the
registrar's :class:`rocketray.broker.register.IdentityStore`. It keeps no copy of role, epoch or
membership; its views read the machine. Every input is applied under one lock, so actions of one
input run before the next input is decided; a SyncStateSet report (a controller round trip) runs as
a background task whose answer is a later input.

Address convention (replaces reference §18 item 9, the nameserver detour): the address a broker
registers with the controller *is its HA listening address* ``host:ha_port``. The controller's
``master_address`` is therefore directly what a slave's HA client connects to, and a broker that
restarts on another port re-registers the new address (UpdateBrokerAddressEvent).

The one-shot ``*_once`` methods let tests drive the manager deterministically; ``start()`` schedules
them on the running event loop. Periodic steps catch and log per step (this is a shell).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from typing import Any, Awaitable, Callable, Iterable, Mapping, Protocol

from rocketray.broker import role as rm
from rocketray.broker.register import IdentityStore, Registrar, RegisterState
from rocketray.broker.replicas_model import (ControllerCallError, ReplicasManagerConfig, Role, RoleChangeNotification,
                                             State, notification_from)
from rocketray.broker.role import MasterInfo, RoleMachine, StoreFacts
from rocketray.controller.api import (
    AlterSyncStateSetRequest,
    BrokerHeartbeatRequest,
    ElectMasterRequest,
    GetReplicaInfoRequest,
    RegisterBrokerRequest,
    Response,
)
from rocketray.controller.codes import ResponseCode
from rocketray.ha.port import HAPort

__all__ = ["ControllerCallError", "ControllerClient", "EpochFileView", "HAPort", "ReplicasManager",
           "ReplicasManagerConfig", "Role", "RoleChangeNotification", "State", "StorePort"]

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# Ports


class ControllerClient(Protocol):
    """How the broker reaches the controller (``rocketray.actors.controller_client.AsyncControllerClient``)."""

    async def call(self, request: object, address: str | None = None) -> Response:
        """Send to ``address`` (the believed leader); raises on transport failure."""

    async def heartbeat(self, request: BrokerHeartbeatRequest) -> None:
        """Heartbeat every controller node (liveness is per node)."""

    async def metadata(self) -> list[Mapping[str, Any]]:
        """Every reachable controller node's metadata, each with ``"leader_address"`` (None if unknown)."""


class EpochFileView(Protocol):
    def last_epoch(self) -> int: ...


class StorePort(Protocol):
    """The store facts the manager reads (``rocketray.broker.store.MessageStore``)."""

    @property
    def max_offset(self) -> int: ...

    @property
    def confirm_offset(self) -> int: ...

    @property
    def epoch_file(self) -> EpochFileView: ...


HAFactory = Callable[[int], Awaitable[HAPort]]


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
                 controller_addresses: Iterable[str] = ()) -> None:
        """``controller_addresses`` is accepted for old callers and unused (the client fans out)."""
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
        self.registrar = Registrar(cluster_name, broker_name, broker_address, identity, now_ms)
        self.machine = RoleMachine(broker_address)
        self.state = State.INITIAL
        self.controller_leader_address: str | None = None
        self._lock = asyncio.Lock()
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
    def fenced(self) -> bool:
        """True until RUNNING (registered, master known) and after stop: the broker must not write."""
        return self.state != State.RUNNING or self.machine.fenced

    @property
    def writable(self) -> bool:
        return self.state == State.RUNNING and self.machine.writable

    @property
    def _tasks(self) -> list[asyncio.Task]:
        """Every task the manager runs (periodic and background)."""
        return [*self._periodic, *self._background]

    def status(self) -> dict:
        m = self.machine
        return {
            "state": self.state.name, "register_state": self.register_state.name, "fenced": self.fenced,
            "broker_id": m.broker_id, "broker_address": self.broker_address, "role": m.role.name,
            "master_broker_id": m.master_broker_id, "master_address": m.master_address,
            "master_epoch": m.master_epoch, "sync_state_set": sorted(m.sync_state_set),
            "sync_state_set_epoch": m.sync_state_set_epoch,
            "controller_leader_address": self.controller_leader_address,
            "report_in_flight": sorted(m.report_in_flight.proposal) if m.report_in_flight else None,
        }

    # ---------------------------------------------------------------- machine driving

    def _facts(self) -> StoreFacts:
        return StoreFacts(int(self.store.epoch_file.last_epoch()), int(self.store.max_offset))

    async def _feed(self, event: rm.Input) -> None:
        """Apply ``event`` and execute its actions (and the inputs they produce) under the lock."""
        async with self._lock:
            pending: list[rm.Input] = [event]
            while pending:
                actions = self.machine.step(pending.pop(0), self._facts())
                for action in actions:
                    follow_up = await self._execute(action)
                    if follow_up is not None:
                        pending.append(follow_up)

    async def _execute(self, action: rm.Action) -> rm.Input | None:
        """One action on the ports; returns the input it produces, if any."""
        if isinstance(action, (rm.BecomeMaster, rm.BecomeSlave)):
            return await self._switch(action)
        if isinstance(action, rm.ApplySyncStateSet):
            assert self.ha is not None
            self.ha.set_sync_state_set(set(action.members))
            log.info("sync state set confirmed: group=%s set=%s epoch=%s", self.broker_name,
                     sorted(action.members), action.epoch)
            return None
        if isinstance(action, rm.ReportSyncStateSet):
            assert self.ha is not None
            vetted = self.ha.mark_in_flight(action.proposal)  # in the union view before it leaves
            if vetted is None:  # every member it would add lags the confirm offset: nothing to send
                return rm.ReportAnswered(rm.ReportOutcome.REFUSED)
            self._spawn(self._report(dataclasses.replace(action, proposal=vetted)))
            return None
        if isinstance(action, rm.SendHeartbeat):
            try:
                await self.client.heartbeat(self.heartbeat_request())
            except Exception as exc:  # noqa: BLE001 - the next periodic heartbeat retries
                log.info("heartbeat failed: group=%s error=%r", self.broker_name, exc)
            return None
        if isinstance(action, rm.RequestElection):
            return await self._elect()
        if isinstance(action, rm.RequestNewTerm):
            return await self._new_term(action.old_epoch)
        if isinstance(action, rm.SetWritable):
            log.info("writable=%s: group=%s broker_id=%s role=%s epoch=%s", action.writable, self.broker_name,
                     self.broker_id, self.role.name, self.master_epoch)
            return None
        raise TypeError(f"unknown role action {action!r}")

    async def _switch(self, action: rm.BecomeMaster | rm.BecomeSlave) -> rm.Input:
        assert self.ha is not None
        try:
            if isinstance(action, rm.BecomeMaster):
                ok = await (self.ha.change_to_master_same(action.epoch) if action.same
                            else self.ha.change_to_master(action.epoch))
            else:
                ok = await self.ha.change_to_slave(action.master_address, action.epoch)
        except BaseException:
            # the switch failed: nothing is recorded, the next notification or poll retries it
            self.machine.step(rm.SwitchDone(False), self._facts())
            raise
        if ok:
            log.info("role switch done: group=%s broker_id=%s %r", self.broker_name, self.broker_id, action)
        else:
            log.warning("HA refused role switch: group=%s broker_id=%s %r", self.broker_name, self.broker_id,
                        action)
        return rm.SwitchDone(bool(ok))

    def _spawn(self, coro: Awaitable[Any]) -> None:
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
            hint = resp.header.get("leader_address")
            if not hint or hint == self.controller_leader_address:
                self.controller_leader_address = None
                return resp
            self.controller_leader_address = hint
        assert resp is not None
        return resp

    async def _elect(self) -> rm.ElectAnswered:
        """brokerElect (§10.3): SUCCESS and MASTER_STILL_EXIST both name the master."""
        assert self.broker_id is not None
        try:
            resp = await self._call(ElectMasterRequest.of_broker_trigger(self.cluster_name, self.broker_name,
                                                                         self.broker_id))
        except Exception as exc:  # noqa: BLE001 - the next pass or poll asks again
            log.info("broker elect failed: group=%s error=%r", self.broker_name, exc)
            return rm.ElectAnswered(None)
        if resp.code not in (ResponseCode.SUCCESS, ResponseCode.CONTROLLER_MASTER_STILL_EXIST):
            log.info("broker elect: no master: group=%s code=%s %s", self.broker_name, resp.code, resp.remark)
            return rm.ElectAnswered(None)
        return rm.ElectAnswered(MasterInfo.from_response(resp))

    async def _new_term(self, old_epoch: int) -> rm.NewTermAnswered:
        assert self.broker_id is not None
        log.warning("not resuming master epoch %s from before a restart: group=%s broker_id=%s; asking for a "
                    "new term", old_epoch, self.broker_name, self.broker_id)
        try:
            facts = self._facts()   # ranked by what it holds now, not by its pre-restart heartbeats
            resp = await self._call(ElectMasterRequest.of_new_term(self.cluster_name, self.broker_name,
                                                                   self.broker_id, facts.last_epoch,
                                                                   facts.max_offset))
        except Exception as exc:  # noqa: BLE001 - the next poll asks again
            log.info("new term request failed: group=%s error=%r", self.broker_name, exc)
            return rm.NewTermAnswered(old_epoch, None)
        if resp.code != ResponseCode.SUCCESS:
            log.info("new term refused: group=%s code=%s %s", self.broker_name, resp.code, resp.remark)
            return rm.NewTermAnswered(old_epoch, None)
        return rm.NewTermAnswered(old_epoch, MasterInfo.from_response(resp))

    async def _poll(self) -> rm.Input | None:
        """GET_REPLICA_INFO (§10.7); the controller lost the set's metadata -> register again."""
        resp = await self._call(GetReplicaInfoRequest(self.broker_name))
        if resp.code == ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST:
            log.warning("controller lost broker-set metadata; re-registering: group=%s", self.broker_name)
            return await self._register_call()
        if not resp.ok:
            log.info("get replica info failed: group=%s code=%s %s", self.broker_name, resp.code, resp.remark)
            return None
        return rm.ReplicaInfoPolled(MasterInfo.from_response(resp))

    async def _report(self, action: rm.ReportSyncStateSet) -> None:
        """doReportSyncStateSetChanged: ALTER_SYNC_STATE_SET; the answer goes back to the machine."""
        assert self.broker_id is not None
        req = AlterSyncStateSetRequest(self.broker_name, self.broker_id, action.master_epoch, action.proposal,
                                       action.sync_state_set_epoch, invoke_time_ms=self.now_ms())
        try:
            resp = await self._call(req)
        except Exception as exc:  # noqa: BLE001 - outcome unknown: the machine retries it later
            log.info("alter sync state set failed: group=%s proposed=%s error=%r", self.broker_name,
                     sorted(action.proposal), exc)
            answer = rm.ReportAnswered(rm.ReportOutcome.UNKNOWN)
        else:
            if resp.ok:
                body = resp.body or {}
                answer = rm.ReportAnswered(rm.ReportOutcome.CONFIRMED,
                                           frozenset(body.get("sync_state_set") or action.proposal),
                                           int(body.get("sync_state_set_epoch",
                                                        resp.header.get("new_sync_state_set_epoch", 0))))
            else:
                log.info("alter sync state set refused: group=%s proposed=%s code=%s %s", self.broker_name,
                         sorted(action.proposal), resp.code, resp.remark)
                answer = rm.ReportAnswered(rm.ReportOutcome.REFUSED)
        await self._feed(answer)

    # ---------------------------------------------------------------- registration (§9.2, §10.2)

    async def register_once(self) -> bool:
        """One pass of register(): broker id (steps 1-4) then REGISTER_BROKER (step 5)."""
        broker_id = await self.registrar.ensure_broker_id(self._call)
        if broker_id is None:
            return False
        if self.broker_id is None:
            self.ha = await self.ha_factory(broker_id)
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
            resp = await self._call(RegisterBrokerRequest(self.cluster_name, self.broker_name, self.broker_id,
                                                          self.broker_address))
        except Exception as exc:  # noqa: BLE001 - the next pass retries
            log.warning("register broker failed: group=%s broker_id=%s error=%r", self.broker_name,
                        self.broker_id, exc)
            return None
        if not resp.ok:
            log.warning("register broker refused: group=%s broker_id=%s code=%s %s", self.broker_name,
                        self.broker_id, resp.code, resp.remark)
            return None
        self.registrar.mark_registered()
        return rm.Registered(MasterInfo.from_response(resp))

    async def elect_once(self) -> bool:
        """brokerElect (§10.3): ask for a broker-triggered election and follow the answer."""
        answer = await self._elect()
        await self._feed(answer)
        return answer.info is not None and answer.info.names_master

    async def start_basic_service_once(self) -> bool:
        """One pass of startBasicService (§10.2); True once RUNNING (unfenced)."""
        if self.state == State.SHUTDOWN:
            return False
        if self.state == State.INITIAL:
            if not await self.sync_controller_metadata_once():
                return False
            self.state = State.FIRST_TIME_SYNC_CONTROLLER_METADATA_DONE
        if self.state == State.FIRST_TIME_SYNC_CONTROLLER_METADATA_DONE:
            if not await self.register_once():
                return False
            self.state = State.REGISTER_TO_CONTROLLER_DONE
        if self.state == State.REGISTER_TO_CONTROLLER_DONE:
            await self._feed(rm.Bootstrap())  # heartbeat; elect if no master is known
            if not self.machine.running:      # nobody electable yet, or the HA service refused
                return False
            self.state = State.RUNNING
            log.info("replicas manager running: group=%s broker_id=%s role=%s epoch=%s", self.broker_name,
                     self.broker_id, self.role.name, self.master_epoch)
        return self.state == State.RUNNING

    # ---------------------------------------------------------------- periodic steps

    def heartbeat_request(self) -> BrokerHeartbeatRequest:
        assert self.broker_id is not None
        return BrokerHeartbeatRequest(
            self.cluster_name, self.broker_name, self.broker_address, self.broker_id,
            epoch=int(self.store.epoch_file.last_epoch()), max_offset=int(self.store.max_offset),
            confirm_offset=int(self.store.confirm_offset),
            heartbeat_timeout_ms=self.config.controller_heartbeat_timeout_ms,
            election_priority=self.config.broker_election_priority)

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

    async def on_role_change(self, notification: MasterInfo | Response | Mapping[str, Any]) -> bool:
        """NOTIFY_BROKER_ROLE_CHANGED: the machine acts only for a known master and a strictly newer
        epoch. True if the broker switched to the notified role."""
        info = notification_from(notification)
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
        self.state = State.SHUTDOWN
        self.machine.step(rm.Stopped())
        self.registrar.reset()
        tasks = self._tasks
        self._periodic, self._background = [], set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
