"""One broker replica in the simulated world: the real cores, a simulated shell.

Theory of operation. A ``SimBroker`` is one broker process: the real ``MessageStore`` over its own
``SimDisk``, the real ``RoleMachine`` (lifecycle, role, epoch, SyncStateSet: their one owner; the
``ha_role``/``ha_epoch`` here are views of it), the real HA sessions (``SlaveSession`` /
``MasterSession``) and the real master-side core (``MasterReplication``: acks, union view, confirm
offset), the product's put gate and ack waits (``PutGate``) and the product's put shell around them
(``PutShell``: the write, the timers, the answers; the one ``HAService`` runs). The role machine's
actions run through the production executor (``rocketray.broker.executor``: the same switch steps,
controller requests and answer parsing as ``ReplicasManager``), for which this class is both ports,
simulated: ``ControllerPort`` over the simulated network (an answer is fed when it arrives) and
``HAPort`` over simulated connections and the simulated disk. What is left here is IO for virtual
time: timers, HA bytes over simulated connections; the put shell's ports, the master side's
connections and the committed-offset queries are in ``sim/broker_master.py`` (a base class). Every
decision that decides whether data survives is made by the cores, and every put is written and
answered by the product's shell, so a rule reverted in either is seen here. A crash (kill or power loss, or a crash the disk raises between two IO steps) ends the
process: timers die with its generation, connections break, pending puts are never answered, and
a new process recovers from the disk after a restart delay.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Coroutine, Iterable

from rocketray.broker import executor as ex
from rocketray.broker import role as rm
from rocketray.broker.config import FlushMode, StoreConfig
from rocketray.wire.message import Message
from rocketray.wire.batch import EncodedBatch
from rocketray.broker.offsets import OffsetTable
from rocketray.broker.role import MasterInfo, Role, RoleMachine, StoreFacts
from rocketray.broker.store import MessageStore
from rocketray.broker.executor import BrokerNames, Executor, run_now
from rocketray.wire.controller_api import BrokerHeartbeatRequest, Response
from rocketray.controller.session import Hello
from rocketray.ha.ack import AckPolicy
from rocketray.ha.master import MasterReplication
from rocketray.ha.promotion_hold import PromotionHold
from rocketray.ha.put_gate import PutGate
from rocketray.ha.put_shell import PutShell
from rocketray.ha.session import MasterSession
from rocketray.ha.transport import StoreLogView
from rocketray.sim.controller import CONTROLLER, SimController
from rocketray.sim.disk import CrashMode, SimCrash, SimDisk
from rocketray.sim import offsets
from rocketray.sim.net import Connection, Network
from rocketray.sim.broker_master import Query, Reply, SimMasterSide, SimTimers
from rocketray.sim.slave import SimSlave
from rocketray.sim.timings import BrokerTimings
from rocketray.sim.world import World

__all__ = ["SimBroker", "BrokerTimings", "TOPIC"]

TOPIC = "sim"


class _Pause:
    """What a simulated port awaits to take virtual time: ``feed`` resumes the executor ``ms`` later."""

    __slots__ = ("ms",)

    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __await__(self):
        yield self


class SimBroker(SimMasterSide):
    def __init__(self, world: World, net: Network, controller: SimController, *, cluster: str, group: str,
                 broker_id: int, timings: BrokerTimings, disk_seed: int) -> None:
        self.world, self.net, self.controller = world, net, controller
        self.cluster, self.group, self.id = cluster, group, broker_id
        self.name = f"{group}-{broker_id}"
        self.t = timings
        self.disk = SimDisk(random.Random(disk_seed), clock_ms=lambda: world.now_ms)
        self.store_config = StoreConfig(segment_size_bytes=timings.segment_bytes, flush_mode=timings.flush_mode,
                                        retention_ms=None, background_thread=False)
        self.up = False
        self.restarts = 0
        self.power_losses = 0       # crashes that dropped the page cache
        self.end_before_power_loss = 0
        self.flushed_end = 0
        self.rewrites = 0           # truncations of this process's log (the checker's cache key)
        self.epochs_seen: list[int] = []      # the role machine's master epochs, this process
        self.store: MessageStore | None = None
        self.peers: dict[str, SimBroker] = {}   # every broker of the group by name (set by the world)
        self.session: tuple[Hello, tuple] | None = None   # this process's controller session (hello, token)
        self.latest_heartbeat: BrokerHeartbeatRequest | None = None   # sent with every hello (sessions)
        self.answers: list[offsets.OffsetAnswer] = []     # committed-offset answers given (the checker drains it)
        self._offsets: tuple[tuple[int, int], int, OffsetTable] | None = None
        self.names = BrokerNames(cluster, group, self.name, heartbeat_timeout_ms=timings.heartbeat_timeout_ms)

    # views of the role machine (the one owner of role and epoch)
    @property
    def ha_role(self) -> Role:
        return self.machine.role

    @property
    def ha_epoch(self) -> int:
        return self.machine.master_epoch if self.machine.role != Role.NONE else -1

    @property
    def registered(self) -> bool:
        return self.machine.registered

    # ================================================================== process lifecycle
    def boot(self) -> None:
        """A new process: recover the store from the disk and start the controller loop."""
        self.world.bump(self)
        self.net.set_down(self.name, False)
        self.up = True
        self.machine = RoleMachine(broker_address=self.name)
        self.master = MasterReplication(self.id, AckPolicy(True, min_in_sync_replicas=self.t.min_in_sync_replicas),
                                        self.t.not_catchup_ms, confirmed=lambda: self.machine.sync_state_set)
        self.executor = Executor(self.machine, self.names, controller=self, ha=self, facts=self.facts,
                                 now_ms=lambda: self.world.now_ms, alive=lambda: self.up,
                                 stepped=self._record_epoch)
        self.sessions: dict[int, tuple[Connection, MasterSession]] = {}
        self.slave: SimSlave | None = None
        # the product's put gate, hold and ack waits (ha/put_gate.py), over this process's cores; the
        # product's put shell over them once the store is open (_open_store)
        self.gate: PutGate[EncodedBatch, Reply] = PutGate(self.machine, self.master, self.t.slave_timeout_ms,
                                                          PromotionHold())
        self.queries: list[Query] = []
        self._feeding: Coroutine[Any, Any, None] | None = None   # the executor's feed, suspended in a switch step
        self._queued: list[rm.Input] = []       # inputs that arrived meanwhile (fed in order after it)
        self.epochs_seen = []
        self.session = None
        self.latest_heartbeat = None
        self.world.note(f"{self.name} boots (restart {self.restarts})")
        self.guard(self._open_store)
        if not self.up:
            return
        self.feed(rm.IdAssigned(self.id))
        self.open_session()
        self._register()
        self._every(self.t.heartbeat_ms, self._heartbeat)
        self._every(self.t.poll_ms, self._poll)
        self._every(self.t.shrink_ms, self._shrink_check)
        self._every(self.t.ha_tick_ms, self._ha_tick)
        if self.t.flush_mode is FlushMode.ASYNC:
            self._every(self.t.flush_ms, self._flush)

    def open_session(self) -> None:
        """Open this process's session connection to the controller leader (its hello arrives after
        a network delay, unless the link is cut or the process dies first), with the newest
        heartbeat (``ControllerSession``)."""
        if not self.t.controller_sessions:
            return
        hello = Hello(self.cluster, self.group, self.id, self.name)
        latest = self.latest_heartbeat

        def opened() -> None:
            self.session = (hello, self.controller.session_opened(hello))
            if latest is not None:
                self.controller.session_heartbeat(hello, self.session[1], latest)
        self.net.signal(self.name, CONTROLLER, opened, owner=self)

    def _close_session(self) -> None:
        if self.session is not None:
            hello, token = self.session
            self.session = None
            self.net.signal(self.name, CONTROLLER, lambda: self.controller.session_closed(hello, token),
                            owner=self.controller)

    def _open_store(self) -> None:
        self.store = MessageStore(f"/{self.name}/store", self.store_config, disk=self.disk)
        self.log_view = StoreLogView(self.store, lambda: self.store.confirm_offset)
        self.put_shell = PutShell(self.gate, self.store, SimTimers(self), self, lambda: self.world.now_ms,
                                  label=self.name)

    def _flush(self) -> None:
        if self.store is not None:
            end = self.store.max_offset
            self.store.flush()
            self.flushed_end = end          # async flush: the log is durable up to here

    def crash(self, mode: CrashMode) -> None:
        """Kill (page cache kept) or power loss (unsynced bytes dropped) now."""
        if not self.up:
            return
        self.disk.set_hook(None)
        self.disk.crash(mode)
        self._down(mode)

    def _down(self, mode: CrashMode) -> None:
        self.disk.set_hook(None)
        self.world.note(f"{self.name} crashed ({mode.name})")
        if mode is CrashMode.KILL:
            self._close_session()           # the kernel closes a killed process's sockets; power loss: nothing
        if mode is CrashMode.POWER_LOSS:
            self.power_losses += 1
            self.end_before_power_loss = self.store.max_offset if self.store is not None else 0
        feeding, self._feeding, self._queued = self._feeding, None, []
        if feeding is not None:
            feeding.close()                 # a switch step in progress dies with the process (its store still open)
        self.up = False
        self.world.bump(self)
        self.net.set_down(self.name, True)
        self.gate.drop()                    # never answered: the clients time out (unknown)
        self.queries = []
        self.store = None
        self.restarts += 1
        delay = self.world.rng.randint(self.t.restart_min_ms, self.t.restart_max_ms)
        self.world.at(delay, self.boot, what=f"{self.name} restart", scope=self)

    def guard(self, fn: Callable[[], None]) -> None:
        """Run one step of this process; a crash the disk raises mid-step ends the process."""
        if not self.up:
            return
        try:
            fn()
        except SimCrash as crash:
            self._down(crash.mode)

    def _every(self, period_ms: int, fn: Callable[[], None]) -> None:
        def tick() -> None:
            self.guard(fn)
            self.world.at(period_ms, tick, owner=self)
        self.world.at(self.world.rng.randint(1, period_ms), tick, owner=self)

    def _later(self, delay_ms: int, fn: Callable[[], None], what: str = "") -> None:
        self.world.at(delay_ms, lambda: self.guard(fn), owner=self, what=what)

    # ================================================================== role machine
    def facts(self) -> StoreFacts:
        assert self.store is not None
        return StoreFacts(int(self.store.epoch_file.last_epoch()), int(self.store.max_offset),
                          int(self.store.confirm_offset))

    def feed(self, event: rm.Input | None) -> None:
        """Apply one input through the executor, one input at a time (as ``ReplicasManager``'s lock
        does): an input that arrives while a switch step takes its time (``BrokerTimings.switch_ms``)
        is fed after it. After each input, the puts held while this replica became master are
        answered if its switch ended (``ReplicasManager.settled``)."""
        if event is None:
            return
        if self._feeding is not None:
            self._queued.append(event)
            return
        self._drive(self.executor.feed(event))

    def _drive(self, feed: Coroutine[Any, Any, None]) -> None:
        try:
            pause = feed.send(None)
        except StopIteration:
            self._feeding = None
            if self.gate.held:
                self.put_shell.release_held()
            if self._queued:
                self.feed(self._queued.pop(0))
            return
        except BaseException:
            self._feeding = None
            raise
        assert isinstance(pause, _Pause), pause
        self._feeding = feed
        self._later(pause.ms, lambda: self._drive(feed), what=f"{self.name} switch step")

    def _switch_step(self) -> _Pause | None:
        low, high = self.t.switch_ms
        return _Pause(self.world.rng.randint(low, high)) if high > 0 else None

    def _record_epoch(self) -> None:
        if self.machine.is_master and (not self.epochs_seen or self.epochs_seen[-1] != self.machine.master_epoch):
            self.epochs_seen.append(self.machine.master_epoch)

    # ================================================================== ControllerPort (simulated)
    async def ask(self, request: object, then: ex.Then) -> rm.Input | None:
        """The answer arrives after a network delay (or never: ``None`` at the timeout)."""
        self._call(request, lambda resp: self.feed(then(resp)))
        return None

    def ask_later(self, request: object, then: ex.Then) -> None:
        self._call(request, lambda resp: self.feed(then(resp)))

    async def heartbeat(self, request: BrokerHeartbeatRequest) -> None:
        """With sessions, on the session (kept for the next hello when none is held); else a call
        (the Ray path to every controller)."""
        if not self.t.controller_sessions:
            self.net.call(self.name, CONTROLLER, lambda: self.controller.handle(request), lambda _r: None,
                          owner=self, timeout_ms=self.t.rpc_timeout_ms)
            return
        self.latest_heartbeat = request
        if self.session is None:
            return
        hello, token = self.session
        self.net.call(self.name, CONTROLLER, lambda: self.controller.session_heartbeat(hello, token, request),
                      lambda _r: None, owner=self, timeout_ms=self.t.rpc_timeout_ms)

    def _call(self, request: object, on_answer: Callable[[Response | None], None]) -> None:
        self.net.call(self.name, CONTROLLER, lambda: self.controller.handle(request),
                      lambda resp: self.guard(lambda: on_answer(resp)), owner=self,
                      timeout_ms=self.t.rpc_timeout_ms)

    # ================================================================== the shell's own steps
    def _register(self) -> None:
        def answered(resp: Response | None) -> None:
            event = ex.register_answer(resp)
            if event is None:
                self._later(self.t.poll_ms, self._register)
                return
            self.feed(event)
            self.feed(rm.Bootstrap())
        self._call(ex.register_request(self.names, self.id), answered)

    def _heartbeat(self) -> None:
        if self.t.controller_sessions and (self.session is None or self.session[1][0] is not self.controller.sessions):
            self.open_session()     # its hello was lost (a cut link): the session retries, as ControllerSession does
        if not self.registered or self.store is None:
            return
        run_now(self.heartbeat(ex.heartbeat_request(self.names, self.id, self.facts())))

    def _poll(self) -> None:
        if not self.registered:
            return
        if not self.machine.running:
            self.feed(rm.Bootstrap())
            return
        self._call(ex.poll_request(self.names), lambda resp: self.feed(ex.poll_answer(resp)))

    def notified(self, info: MasterInfo) -> None:
        """A role-change notification from the controller arrived."""
        self.guard(lambda: self.feed(rm.RoleChangeNotified(info)) if self.registered else None)

    def _shrink_check(self) -> None:
        if self.machine.running and self.machine.is_master:
            self.feed(rm.ShrinkChecked(self.maybe_shrink_sync_state_set(self.world.now_ms)))

    def _propose(self, proposal: frozenset[int] | None) -> None:
        if proposal is not None:
            self._update_confirm()
            self.feed(rm.SyncStateSetProposed(frozenset(proposal)))

    # ================================================================== HAPort (simulated)
    async def stop_replication(self, reason: str) -> None:
        self._stop_slave()
        self._close_sessions(reason)
        pause = self._switch_step()      # the connections' tasks end
        if pause is not None:
            await pause

    async def start_epoch(self, epoch: int, cut_torn_tail: bool) -> None:
        pause = self._switch_step()      # the IO thread's turn and the epoch file's fsync
        if pause is not None:
            await pause
        store = self.store
        assert store is not None
        if cut_torn_tail:
            cut = store.truncate_invalid_tail()
            if cut >= 0:
                self.rewrites += 1
                store.epoch_file.truncate_suffix_by_offset(cut)
        store.epoch_file.start_epoch(epoch, store.max_offset)

    def serve_as_master(self, new_term: bool) -> None:
        if new_term:
            self.master.new_term()
            self._update_confirm()
        self._settle()

    def follow(self, master_address: str | None, epoch: int) -> None:
        if self.slave is not None and self.slave.master == master_address:
            self.slave.expect(epoch)
            return
        assert self.slave is None and master_address is not None
        self._settle()
        self.slave = SimSlave(self, master_address, epoch)
        self._slave_connect()

    def set_sync_state_set(self, ids: Iterable[int]) -> None:
        self.master.confirmed(ids)
        self._update_confirm()
        self._settle()

    def mark_in_flight(self, proposal: Iterable[int]) -> frozenset[int] | None:
        assert self.store is not None
        last = self.store.epoch_file.last_entry()
        vetted = self.master.in_flight(proposal, self.store.confirm_offset,
                                       last.start_offset if last is not None else 0)
        self._update_confirm()
        return vetted

    def add_sss_listener(self, cb: Callable[[frozenset[int]], object]) -> None:
        raise NotImplementedError("the simulated broker feeds its proposals itself (_propose)")

    def maybe_shrink_sync_state_set(self, now_ms: int) -> frozenset[int]:
        candidate = self.master.shrink(now_ms)
        self._update_confirm()
        return frozenset(candidate)

    def _stop_slave(self) -> None:
        if self.slave is not None:
            self.slave.stop()
        self.slave = None

    # ================================================================== committed offsets
    def offset_table(self) -> OffsetTable:
        """The committed offsets as this process reads them: the fold of the system queue's records
        its store serves (``offsets.fold_confirmed``), kept while its log only grows (same process,
        no truncation) and advanced when the confirm offset moves."""
        assert self.store is not None
        key = (self.restarts, self.rewrites)
        if self._offsets is None or self._offsets[0] != key:
            self._offsets = (key, -1, OffsetTable())
        _key, folded_at, table = self._offsets
        confirm = self.store.confirm_offset
        if confirm != folded_at:
            offsets.fold_confirmed(self.store, table)
            self._offsets = (key, confirm, table)
        return table

    # ================================================================== HA: slave side
    def retry_slave_connect(self) -> None:
        """Connect the current slave link again in 50-300 ms (whichever link is current then)."""
        self._later(self.world.rng.randint(50, 300), self._slave_connect)

    def _slave_connect(self) -> None:
        if self.slave is not None:
            self.slave.connect()

    def _ha_tick(self) -> None:
        now = self.world.now_ms
        for key, (conn, session) in list(self.sessions.items()):
            if session.expired(now):
                conn.reset("slave silent")
                self._session_closed(key)
            else:
                self._pump(key)
        if self.slave is not None:
            self.slave.tick(now)
        self._check_queries()

    # ================================================================== reads
    def read(self, queue_offset: int, max_count: int) -> list[Message]:
        """A consumer's pull: what the store serves (never beyond its confirm offset)."""
        if not self.up or self.store is None:
            return []
        out: list[Message] = []
        self.guard(lambda: out.extend(self.store.get_messages(TOPIC, 0, queue_offset, max_count)))
        return out
