"""The broker's controller loop: ReplicasManager (reference §10, with §5.5 and §9.2).

Theory of operation. A broker starts *fenced* (no writes). ``start_basic_service_once`` walks the
lifecycle ``INITIAL -> FIRST_TIME_SYNC_CONTROLLER_METADATA_DONE -> REGISTER_TO_CONTROLLER_DONE ->
RUNNING``: find the controller leader, obtain the persistent broker id (``rocketray.broker.register``), send
REGISTER_BROKER (which also tells the controller a changed address), heartbeat once, and then learn
the master from the registration answer or by asking for a broker-triggered election. Only in
RUNNING is the broker unfenced. After that, periodic steps keep it in line with the controller:
heartbeats to every controller node, polling of the replica info (the safety net behind the
controller's role-change notifications), and on the master the SyncStateSet shrink check.

Role changes obey one rule: a change is acted on only for a master epoch *strictly* greater than
the one the broker has (reference §19). And a broker never resumes a master term that is already in
its own epoch file: that term began before this process started (the broker was killed and restarted
before the controller noticed). Resuming it would continue a log the slaves may have diverged from
(a crash can lose an unflushed tail they hold) and skip the election that picks the replica with the
most data. Instead it heartbeats its progress and asks for a *new term* (``ElectMasterRequest.
of_new_term``): the controller elects among the live SyncStateSet by (epoch, offset, priority) with no
preference for the old master, and the winner, possibly this broker, starts a new epoch. SyncStateSet changes proposed by the HA service are reported
to the controller and applied to the HA service only once the controller confirmed them, with the
SSS epoch the controller returned (and again only if newer).

Address convention (replaces reference §18 item 9, the nameserver detour): the address a broker
registers with the controller *is its HA listening address* ``host:ha_port``. The controller's
``master_address`` is therefore directly what a slave's HA client connects to, and a broker that
restarts on another port re-registers the new address (UpdateBrokerAddressEvent).

Everything is injected: controller client, HA facade, store, identity files, clock and sleep. The
one-shot ``*_once`` methods let tests drive the manager deterministically; ``start()`` schedules
them on the running event loop. Step methods catch and log per step (this is a shell) except where
a test wants to see the exception.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
from typing import Any, Awaitable, Callable, Iterable, Mapping

from rocketray.broker.register import IdentityStore, Registrar, RegisterState
from rocketray.broker.replicas_model import (ControllerCallError, ReplicasManagerConfig, Role, RoleChangeNotification,
                                   State)
from rocketray.controller.api import (
    AlterSyncStateSetRequest,
    BrokerHeartbeatRequest,
    ElectMasterRequest,
    GetReplicaInfoRequest,
    RegisterBrokerRequest,
    Response,
)
from rocketray.controller.codes import ResponseCode

__all__ = ["ControllerCallError", "ReplicasManager", "ReplicasManagerConfig", "Role", "RoleChangeNotification",
           "State"]

log = logging.getLogger(__name__)


async def _maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


def _attr(obj: Any, name: str) -> Any:
    """A store/epoch-file value that may be a property or a zero-argument method."""
    v = getattr(obj, name)
    return v() if callable(v) else v


class ReplicasManager:
    """One broker replica's controller-facing loop. See the module docstring.

    Collaborators:
      * ``controller_client``: ``async call(request, address=None) -> Response`` (raises an exception
        carrying ``retriable`` on transport failure); ``async heartbeat(request)`` (to every controller
        node, errors swallowed or raised - both are fine); and either ``async metadata(address) -> dict``
        (asked for each of ``controller_addresses``) or ``async metadata() -> list[dict]`` (one dict
        per reachable node), each dict with ``"leader_address"`` (None or "" if no leader known).
      * ``ha`` (``rocketray.ha.service.HAService``): ``change_to_master(epoch)``, ``change_to_master_same(epoch)``,
        ``change_to_slave(master_ha_address, epoch)`` (each may return False = refused, then the epoch
        is not recorded and the next poll retries), ``set_sync_state_set(ids)``, ``add_sss_listener(cb)``,
        ``maybe_shrink_sync_state_set(now_ms) -> set``; each may be sync or async. The HA service
        needs the broker id, which is known only after registration: pass ``ha_factory(broker_id)``
        (sync or async, returns the started service) instead of ``ha`` and it is called once, before
        REGISTER_BROKER; or pass ``ha`` with an optional ``set_broker_id(id)``.
      * ``store``: ``max_offset``, ``confirm_offset`` and ``epoch_file.last_epoch`` (attribute or method).
      * ``identity``: an :class:`rocketray.broker.register.IdentityStore`.
    """

    def __init__(self, *, cluster_name: str, broker_name: str, broker_address: str,
                 controller_client: Any, store: Any, identity: IdentityStore, now_ms: Callable[[], int],
                 ha: Any = None, ha_factory: Callable[[int], Any] | None = None,
                 controller_addresses: Iterable[str] = (),
                 config: ReplicasManagerConfig | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 rng: random.Random | None = None) -> None:
        assert broker_address and ":" in broker_address, "broker_address must be the HA address host:port"
        self.cluster_name = cluster_name
        self.broker_name = broker_name
        self.broker_address = broker_address
        self.controller_addresses = list(controller_addresses)  # for a per-address metadata(address)
        self.client = controller_client
        assert (ha is None) != (ha_factory is None), "give exactly one of ha and ha_factory"
        self.ha = ha
        self.ha_factory = ha_factory
        self.store = store
        self.now_ms = now_ms
        self.config = config or ReplicasManagerConfig()
        self._sleep = sleep
        self._rng = rng or random.Random()
        self.registrar = Registrar(cluster_name, broker_name, broker_address, identity, now_ms)

        self.state = State.INITIAL
        self.role = Role.SLAVE
        self.broker_id: int | None = None
        self.master_broker_id: int | None = None
        self.master_address = ""
        self.master_epoch = 0
        self.sync_state_set: frozenset[int] = frozenset()
        self.sync_state_set_epoch = 0
        self.controller_leader_address: str | None = None

        self._role_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task] = []
        self._listener_added = False

    # ---------------------------------------------------------------- views

    @property
    def register_state(self) -> RegisterState:
        return self.registrar.state

    @property
    def fenced(self) -> bool:
        """True until the manager is RUNNING (registered, master known): the broker must not write."""
        return self.state != State.RUNNING

    @property
    def writable(self) -> bool:
        return not self.fenced and self.role == Role.SYNC_MASTER

    def status(self) -> dict:
        return {
            "state": self.state.name, "register_state": self.register_state.name, "fenced": self.fenced,
            "broker_id": self.broker_id, "broker_address": self.broker_address, "role": self.role.name,
            "master_broker_id": self.master_broker_id, "master_address": self.master_address,
            "master_epoch": self.master_epoch, "sync_state_set": sorted(self.sync_state_set),
            "sync_state_set_epoch": self.sync_state_set_epoch,
            "controller_leader_address": self.controller_leader_address,
        }

    # ---------------------------------------------------------------- controller access

    async def _controller_metadata(self) -> list[Mapping]:
        """Every reachable node's metadata: ``metadata(address)`` per node, or one ``metadata()``
        returning a list (a client that fans out itself, like actors.controller_client)."""
        fn = self.client.metadata
        try:
            per_address = bool(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            per_address = True
        if not per_address:
            got = await fn()
            return [got] if isinstance(got, Mapping) else [md for md in (got or []) if md]
        out = []
        for address in self.controller_addresses:
            try:
                md = await fn(address)
            except Exception as exc:
                log.info("controller metadata failed: address=%s error=%r", address, exc)
                continue
            if md:
                out.append(md)
        return out

    async def sync_controller_metadata_once(self) -> bool:
        """Ask the controller nodes who leads; the first non-empty answer wins."""
        for md in await self._controller_metadata():
            leader = md.get("leader_address") or md.get("controller_leader_address")
            if leader:
                self.controller_leader_address = leader
                return True
        return False

    async def _call(self, request: object) -> Response:
        """Send to the leader; follow one NOT_LEADER hint; forget the leader on transport failure."""
        if not self.controller_leader_address and not await self.sync_controller_metadata_once():
            raise ControllerCallError("no controller leader known", retriable=True)
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
        return resp

    # ---------------------------------------------------------------- registration (§9.2, §10.2)

    async def register_once(self) -> bool:
        """One pass of register(): broker id (steps 1-4) then REGISTER_BROKER (step 5)."""
        broker_id = await self.registrar.ensure_broker_id(self._call)
        if broker_id is None:
            return False
        if self.broker_id != broker_id:
            assert self.broker_id is None, "a broker id never changes"
            if self.ha is None:
                assert self.ha_factory is not None
                self.ha = await _maybe_await(self.ha_factory(broker_id))
            elif hasattr(self.ha, "set_broker_id"):
                await _maybe_await(self.ha.set_broker_id(broker_id))
            self.broker_id = broker_id
            self._add_sss_listener_once()
        return await self._register_broker()

    async def _register_broker(self) -> bool:
        assert self.broker_id is not None
        try:
            resp = await self._call(RegisterBrokerRequest(self.cluster_name, self.broker_name, self.broker_id,
                                                          self.broker_address))
        except Exception as exc:
            log.warning("register broker failed: group=%s broker_id=%s error=%r", self.broker_name,
                        self.broker_id, exc)
            return False
        if not resp.ok:
            log.warning("register broker refused: group=%s broker_id=%s code=%s %s", self.broker_name,
                        self.broker_id, resp.code, resp.remark)
            return False
        await self._follow(resp.header, resp.body)
        self.registrar.mark_registered()
        return True

    async def _follow(self, header: Mapping, body: Mapping | None) -> bool:
        """Adopt the master an answer names (if any); True if the answer named one."""
        master_id = header.get("master_broker_id")
        address = header.get("master_address")
        if master_id is None or not address:
            return False
        epoch = int(header.get("master_epoch") or 0)
        if master_id == self.broker_id and self._is_term_from_before_restart(epoch):
            return await self._request_new_term(epoch)
        if master_id == self.broker_id:
            sss = frozenset((body or {}).get("sync_state_set") or ())
            await self.change_to_master(epoch, int(header.get("sync_state_set_epoch") or 0), sss)
        else:
            await self.change_to_slave(address, epoch, int(master_id))
        return True

    async def elect_once(self) -> bool:
        """brokerElect (§10.3): ask for a broker-triggered election and follow the answer."""
        assert self.broker_id is not None
        resp = await self._call(ElectMasterRequest.of_broker_trigger(self.cluster_name, self.broker_name,
                                                                     self.broker_id))
        if resp.code not in (ResponseCode.SUCCESS, ResponseCode.CONTROLLER_MASTER_STILL_EXIST):
            log.info("broker elect: no master: group=%s code=%s %s", self.broker_name, resp.code, resp.remark)
            return False
        return await self._follow(resp.header, resp.body)

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
            await self.heartbeat_once()
            if self.master_broker_id is None:
                try:
                    await self.elect_once()
                except Exception as exc:
                    log.info("broker elect failed: group=%s error=%r", self.broker_name, exc)
                if self.master_broker_id is None:  # nobody electable yet, or the HA service refused
                    return False
            self.state = State.RUNNING
            log.info("replicas manager running: group=%s broker_id=%s role=%s epoch=%s", self.broker_name,
                     self.broker_id, self.role.name, self.master_epoch)
        self._add_sss_listener_once()
        return self.state == State.RUNNING

    # ---------------------------------------------------------------- periodic steps

    def heartbeat_request(self) -> BrokerHeartbeatRequest:
        assert self.broker_id is not None
        epoch_file = getattr(self.store, "epoch_file", None)
        epoch = _attr(epoch_file, "last_epoch") if epoch_file is not None else -1
        return BrokerHeartbeatRequest(
            self.cluster_name, self.broker_name, self.broker_address, self.broker_id,
            epoch=-1 if epoch is None else int(epoch), max_offset=int(_attr(self.store, "max_offset")),
            confirm_offset=int(_attr(self.store, "confirm_offset")),
            heartbeat_timeout_ms=self.config.controller_heartbeat_timeout_ms,
            election_priority=self.config.broker_election_priority)

    async def heartbeat_once(self) -> bool:
        """Heartbeat every controller (§5.1); skipped while no broker id is registered (isolated)."""
        if self.broker_id is None or self.state in (State.INITIAL, State.SHUTDOWN):
            return False
        if self.state == State.FIRST_TIME_SYNC_CONTROLLER_METADATA_DONE:
            return False
        await self.client.heartbeat(self.heartbeat_request())
        return True

    async def sync_metadata_once(self) -> None:
        """Poll the replica info (§10.7) and converge on what the controller says."""
        if self.state != State.RUNNING:
            return
        resp = await self._call(GetReplicaInfoRequest(self.broker_name))
        if resp.code == ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST:
            log.warning("controller lost broker-set metadata; re-registering: group=%s", self.broker_name)
            await self._register_broker()
            return
        if not resp.ok:
            log.info("get replica info failed: group=%s code=%s %s", self.broker_name, resp.code, resp.remark)
            return
        h, body = resp.header, resp.body or {}
        epoch = int(h.get("master_epoch") or 0)
        if epoch > self.master_epoch:
            if h.get("master_address") and h.get("master_broker_id") is not None:
                hdr = {**h, "sync_state_set_epoch": body.get("sync_state_set_epoch", 0)}
                await self._follow(hdr, body)
            else:
                await self.elect_once()
        elif epoch == self.master_epoch and self.role == Role.SYNC_MASTER:
            await self._change_sync_state_set(frozenset(body.get("sync_state_set") or ()),
                                              int(body.get("sync_state_set_epoch") or 0), epoch)


    async def check_sync_state_set_once(self) -> None:
        """The master's shrink check (§10.8): report the shrunk set if it differs from the recorded one."""
        if self.state != State.RUNNING or self.role != Role.SYNC_MASTER:
            return
        shrunk = await _maybe_await(self.ha.maybe_shrink_sync_state_set(self.now_ms()))
        assert self.broker_id is not None
        candidate = frozenset(shrunk or ()) | {self.broker_id}
        if candidate != self.sync_state_set:
            await self.report_sync_state_set(candidate)

    async def report_sync_state_set(self, proposed: Iterable[int]) -> bool:
        """doReportSyncStateSetChanged: ALTER_SYNC_STATE_SET; apply locally only on SUCCESS."""
        if self.state != State.RUNNING or self.role != Role.SYNC_MASTER or self.broker_id is None:
            return False
        epoch, sss_epoch = self.master_epoch, self.sync_state_set_epoch
        req = AlterSyncStateSetRequest(self.broker_name, self.broker_id, epoch, frozenset(proposed), sss_epoch,
                                       invoke_time_ms=self.now_ms())
        resp = await self._call(req)
        if not resp.ok:
            log.info("alter sync state set refused: group=%s proposed=%s code=%s %s", self.broker_name,
                     sorted(req.new_sync_state_set), resp.code, resp.remark)
            return False
        body = resp.body or {}
        new_epoch = int(body.get("sync_state_set_epoch", resp.header.get("new_sync_state_set_epoch", 0)))
        return await self._change_sync_state_set(frozenset(body.get("sync_state_set") or req.new_sync_state_set),
                                                 new_epoch, epoch)

    def _on_sss_proposed(self, proposed: Iterable[int]) -> None:
        """HA listener (expand / connection loss): report in the background, never block the HA loop.

        Ignored once stopped: closing the HA service on shutdown drops every slave connection, and
        reporting that shrink would leave the dying master alone in its SyncStateSet, so nobody
        could be elected after it.
        """
        if self.state == State.SHUTDOWN:
            return
        task = asyncio.get_running_loop().create_task(self._guard("report_sync_state_set",
                                                                  self.report_sync_state_set, set(proposed)))
        self._tasks.append(task)
        self._tasks = [t for t in self._tasks if not t.done()]

    def _add_sss_listener_once(self) -> None:
        if not self._listener_added and self.ha is not None:  # Java re-registers on every retry; once is enough
            self.ha.add_sss_listener(self._on_sss_proposed)
            self._listener_added = True

    # ---------------------------------------------------------------- role changes (§10.4-10.6, §5.5)

    async def on_role_change(self, notification: Any) -> bool:
        """NOTIFY_BROKER_ROLE_CHANGED: act only for a known master and a strictly newer epoch."""
        n = RoleChangeNotification.coerce(notification)
        if n.master_broker_id is None or self.broker_id is None or n.master_epoch <= self.master_epoch:
            return False
        if n.master_broker_id == self.broker_id:
            return await self.change_to_master(n.master_epoch, n.sync_state_set_epoch, n.sync_state_set)
        if not n.master_address:
            return False
        return await self.change_to_slave(n.master_address, n.master_epoch, n.master_broker_id)

    async def change_to_master(self, new_epoch: int, sss_epoch: int, sss: Iterable[int]) -> bool:
        async with self._role_lock:
            if new_epoch <= self.master_epoch:
                return False
            assert self.broker_id is not None
            same = self.role == Role.SYNC_MASTER and self.master_broker_id == self.broker_id
            if not same and new_epoch <= self._local_last_epoch():
                log.warning("refusing master epoch %s: not newer than the local epoch file (last %s): group=%s",
                            new_epoch, self._local_last_epoch(), self.broker_name)
                return False
            if same:
                took = await _maybe_await(self.ha.change_to_master_same(new_epoch))
            else:
                took = await _maybe_await(self.ha.change_to_master(new_epoch))
            if took is False:  # stale against the local epoch file: keep the old view, retry later
                log.warning("HA refused master epoch %s: group=%s broker_id=%s", new_epoch, self.broker_name,
                            self.broker_id)
                return False
            # Record the new epoch only once the HA service took it (a refusal or an error is retried).
            self.master_epoch = new_epoch
            self.role = Role.SYNC_MASTER
            self.master_broker_id = self.broker_id
            self.master_address = self.broker_address
            await self._change_sync_state_set_locked(frozenset(sss), sss_epoch)
        log.info("changed to master: group=%s broker_id=%s epoch=%s same=%s", self.broker_name, self.broker_id,
                 new_epoch, same)
        return True

    def _local_last_epoch(self) -> int:
        epoch_file = getattr(self.store, "epoch_file", None)
        last = _attr(epoch_file, "last_epoch") if epoch_file is not None else -1
        return -1 if last is None else int(last)

    def _is_term_from_before_restart(self, epoch: int) -> bool:
        """The controller names me master of ``epoch``, a term already in my epoch file that this
        process does not hold: I held it before a restart (see the module docstring)."""
        sitting = self.role == Role.SYNC_MASTER and self.master_broker_id == self.broker_id
        return not sitting and epoch <= self._local_last_epoch()

    async def _request_new_term(self, old_epoch: int) -> bool:
        """Ask the controller for a fresh election instead of resuming ``old_epoch``; follow the answer."""
        assert self.broker_id is not None
        log.warning("not resuming master epoch %s from before a restart: group=%s broker_id=%s; asking for a new term",
                    old_epoch, self.broker_name, self.broker_id)
        try:
            await self.client.heartbeat(self.heartbeat_request())  # the election ranks by fresh progress
        except Exception as exc:  # noqa: BLE001 - the election may still proceed on older live info
            log.info("heartbeat before new-term request failed: group=%s %s", self.broker_name, exc)
        resp = await self._call(ElectMasterRequest.of_new_term(self.cluster_name, self.broker_name, self.broker_id))
        if resp.code != ResponseCode.SUCCESS:
            log.info("new term refused: group=%s code=%s %s", self.broker_name, resp.code, resp.remark)
            return False
        if int(resp.header.get("master_epoch") or 0) <= old_epoch:
            return False
        return await self._follow(resp.header, resp.body)

    async def change_to_slave(self, master_address: str, new_epoch: int, master_id: int) -> bool:
        async with self._role_lock:
            if new_epoch <= self.master_epoch:
                return False
            same = (self.role == Role.SLAVE and master_id == self.master_broker_id
                    and master_address == self.master_address)
            if not same and await _maybe_await(self.ha.change_to_slave(master_address, new_epoch)) is False:
                log.warning("HA refused slave epoch %s: group=%s broker_id=%s", new_epoch, self.broker_name,
                            self.broker_id)
                return False
            self.master_epoch = new_epoch
            self.role = Role.SLAVE
            self.master_broker_id = master_id
            self.master_address = master_address
        log.info("changed to slave: group=%s broker_id=%s master=%s@%s epoch=%s", self.broker_name, self.broker_id,
                 master_id, master_address, new_epoch)
        return True

    async def _change_sync_state_set(self, sss: frozenset[int], sss_epoch: int, master_epoch: int) -> bool:
        """Adopt a confirmed SSS, if this broker is still the master of ``master_epoch`` (the term the
        answer belongs to; a role change may have happened while the request was in flight)."""
        async with self._role_lock:
            if self.role != Role.SYNC_MASTER or self.master_epoch != master_epoch:
                return False
            return await self._change_sync_state_set_locked(sss, sss_epoch)

    async def _change_sync_state_set_locked(self, sss: frozenset[int], sss_epoch: int) -> bool:
        if sss_epoch <= self.sync_state_set_epoch:
            return False
        await _maybe_await(self.ha.set_sync_state_set(set(sss)))
        self.sync_state_set, self.sync_state_set_epoch = sss, sss_epoch
        return True

    # ---------------------------------------------------------------- runner

    async def _guard(self, what: str, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        try:
            return await fn(*args)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            level = logging.INFO if getattr(exc, "retriable", False) else logging.WARNING
            log.log(level, "%s failed: group=%s broker_id=%s error=%r", what, self.broker_name, self.broker_id, exc)
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
            self._tasks.append(asyncio.get_running_loop().create_task(self._every(what, period, fn)))

    def start(self) -> None:
        """Schedule the bootstrap and the periodic steps on the running loop."""
        assert not self._tasks, "started twice"
        loop = asyncio.get_running_loop()
        c = self.config
        self._tasks.append(loop.create_task(self._every("heartbeat", c.broker_heartbeat_interval_ms,
                                                        self.heartbeat_once)))
        self._tasks.append(loop.create_task(self._every("sync_controller_metadata",
                                                        c.sync_controller_metadata_period_ms,
                                                        self.sync_controller_metadata_once)))
        self._tasks.append(loop.create_task(self._bootstrap()))

    async def stop(self) -> None:
        """Shutdown (§10.10): fence, cancel every task; no deregistration."""
        self.state = State.SHUTDOWN
        self.registrar.reset()
        tasks, self._tasks = self._tasks, []
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
