"""The controller in the simulated world: the real core behind a model of a replicated log.

Theory of operation. The controller's own Raft is proven by its Jepsen-style test; here it is a
linearizable log with unknown outcomes (SIMULATION.md section 4). A write request is decided by the
real ``decide`` on the current state with liveness from the real ``HeartbeatTable``; its events are
applied (committed) at once, or, when the seed says the leader died at that moment, either never
(lost before commit) or without an answer (committed, caller sees a timeout: unknown). A leader
change is a seeded event; every node waits one heartbeat timeout after its start before its
dead-master scan, like the real node (the nodes start with the run). Elections triggered by the
scan or by a broker notify the live members of the group; a notification can be lost, so brokers
converge by polling. Brokers hold session connections (the real ``SessionTable``): a killed
broker's session close reaches the controller (unless the link is cut) and, if it was the master,
the group is re-elected at once, as ``ControllerNode`` does; a power loss closes nothing.

With sessions (``heartbeats_on_sessions``, production), a broker's heartbeats ride its session: the
controller takes one only on the broker's current session with the current leader
(``session_heartbeat``), and the newest one arrives with every hello. So a new leader starts with no
sessions *and no heartbeat rows* (its table is the brokers that reopened their sessions with it);
its dead-master scan waits ``session_grace_ms`` in every leadership, as ``ControllerService``'s scan
does; and ``session_grace_ms`` after it took over, the real ``LeaderSessionGrace`` rule names each
master that has not reopened its session while another replica of its group has, and it is treated
as a closed session (heartbeat row dropped, group re-elected). Without sessions (a cluster whose
controllers have no session port), brokers heartbeat every controller, so a new leader's table is
warm and its scan waits for nothing but the node's start-up grace.
"""

from __future__ import annotations

from typing import Callable

from rocketray.broker.role import MasterInfo
from rocketray.wire.controller_api import (ApplyBrokerIdRequest, BrokerHeartbeatRequest, ElectMasterRequest,
                                           ElectMastersRequest, GetReplicaInfoRequest, Response)
from rocketray.controller.decide import (DecideContext, decide, decide_elect_master, decide_elect_masters,
                                         is_write, master_session_closed, scan_need_reelect_broker_sets)
from rocketray.controller.events import ElectMasterEvent
from rocketray.controller.heartbeat import HeartbeatTable
from rocketray.controller.session import Hello, LeaderSessionGrace, SessionTable, masters_without_session
from rocketray.controller.state import ControllerState
from rocketray.sim.net import Network
from rocketray.sim.world import World

__all__ = ["SimController", "CONTROLLER", "SESSION_GRACE_MS", "SESSION_WARM_UP_MS"]

CONTROLLER = "controller"
#: ``ControllerService``'s rule with the simulated brokers' 200 ms heartbeat interval: 2 intervals of
#: grace, 5 of warm-up (the nodes start with the run)
SESSION_GRACE_MS = 400
SESSION_WARM_UP_MS = 1000


class SimController:
    def __init__(self, world: World, net: Network, *, cluster: str, heartbeat_timeout_ms: int,
                 scan_interval_ms: int, commit_fault_p: float = 0.0, session_grace_ms: int = SESSION_GRACE_MS,
                 session_warm_up_ms: int = SESSION_WARM_UP_MS, heartbeats_on_sessions: bool = True) -> None:
        self.world, self.net = world, net
        self.cluster = cluster
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        self.scan_interval_ms = scan_interval_ms
        self.commit_fault_p = commit_fault_p
        self.state = ControllerState()
        self.heartbeats = HeartbeatTable()
        self.notify_to: Callable[[str, int, MasterInfo], None] | None = None
        self.elections: list[tuple[str, int, int | None]] = []   # (group, epoch, master)
        # a scripted scenario's fault: a write request this returns True for is committed and its
        # answer lost (the caller sees a timeout), as a dying leader would
        self.answer_lost: Callable[[object], bool] | None = None
        # and a write request this returns True for is lost before commit (the caller times out)
        self.request_lost: Callable[[object], bool] | None = None
        self.sessions = SessionTable()
        self.on_leader_change: Callable[[], None] | None = None   # brokers open their sessions again
        self.session_elections = 0
        self.grace = LeaderSessionGrace(session_grace_ms, started_ms=0, warm_up_ms=session_warm_up_ms)
        self.term = 0
        self.grace_deaths = 0
        self.heartbeats_on_sessions = heartbeats_on_sessions
        self.session_grace_ms = session_grace_ms
        self.leading_since_ms = 0       # when the current leader took over (its scan waits the grace)

    # -- setup --------------------------------------------------------------------------------------
    def assign_ids(self, group: str, ids: list[int]) -> None:
        """What the registrars' GetNextBrokerId/ApplyBrokerId achieve, done before the run."""
        for bid in ids:
            resp, events = decide(self.state, ApplyBrokerIdRequest(self.cluster, group, bid, f"{group}-{bid}"),
                                  DecideContext())
            assert resp.ok, resp
            self.state.apply_all(events)

    def start(self) -> None:
        self.world.at(self.scan_interval_ms, self._scan, owner=self, what="controller scan")

    # -- faults ---------------------------------------------------------------------------------------
    def change_leader(self) -> None:
        """A new Raft leader: no sessions; with heartbeats on the sessions, no heartbeat rows either
        (else brokers heartbeat every controller and its table is warm)."""
        self.sessions = SessionTable()
        if self.heartbeats_on_sessions:
            self.heartbeats = HeartbeatTable()
        self.leading_since_ms = self.world.now_ms
        self.term += 1
        self.world.note(f"controller leader changed term={self.term}")
        self.grace.due(self.world.now_ms, self.term)         # its window starts now
        deadline = self.grace.deadline_ms()
        if deadline is not None:
            term = self.term
            self.world.at(max(0, deadline - self.world.now_ms), lambda: self._grace_check(term), owner=self,
                          what="controller session grace")
        if self.on_leader_change is not None:
            self.on_leader_change()

    def _grace_check(self, term: int) -> None:
        """The leader-change rule's tick at the end of ``term``'s window (``ControllerService``)."""
        if term != self.term or not self.grace.due(self.world.now_ms, term):
            return
        masters = {group: sync.master_broker_id for group, sync in self.state.sync_state.items()}
        for group, broker_id in masters_without_session(masters, self.sessions.keys()):
            self.world.note(f"controller: master {group}-{broker_id} did not reopen its session, treated as dead")
            self.grace_deaths += 1
            self._session_gone(group, broker_id)

    # -- requests -------------------------------------------------------------------------------------
    def handle(self, request: object) -> Response | None:
        """One request at the leader; None when the answer is lost with a dying leader."""
        now = self.world.now_ms
        if isinstance(request, BrokerHeartbeatRequest):
            return self.heartbeats.on_heartbeat(request, now)
        ctx = DecideContext.from_heartbeats(self.heartbeats, now)
        resp, events = decide(self.state, request, ctx)
        if not is_write(request) or not events:
            return resp
        if self.request_lost is not None and self.request_lost(request):
            self.world.note(f"controller lost {type(request).__name__} before commit (scripted)")
            return None
        if self.answer_lost is not None and self.answer_lost(request):
            self._apply(events)
            self.world.note(f"controller committed {type(request).__name__}, answer lost (scripted)")
            return None
        fault = self.world.rng.random() < self.commit_fault_p
        if fault and self.world.rng.random() < 0.5:
            self.world.note(f"controller lost {type(request).__name__} before commit")
            self.change_leader()
            return None
        self._apply(events)
        if fault:
            self.world.note(f"controller committed {type(request).__name__}, answer lost")
            self.change_leader()
            return None
        return resp

    def session_opened(self, hello: Hello) -> tuple[SessionTable, int]:
        return self.sessions, self.sessions.opened(hello)

    def session_heartbeat(self, hello: Hello, token: tuple[SessionTable, int],
                          request: BrokerHeartbeatRequest) -> Response | None:
        """A heartbeat on a session (``SessionServer``): recorded only if that session is the broker's
        current one with the current leader (else it went to a controller that no longer leads)."""
        table, number = token
        if table is not self.sessions or not table.is_current(hello, number):
            return None
        return self.heartbeats.on_heartbeat(request, self.world.now_ms)

    def session_closed(self, hello: Hello, token: tuple[SessionTable, int]) -> None:
        """A broker's session ended without a bye (``ControllerNode.on_broker_session_closed``)."""
        table, number = token
        if table is not self.sessions or table.closed(hello, number, said_bye=False) is None:
            return  # a session with an earlier leader, or an older one of this broker
        self._session_gone(*hello.key)

    def _session_gone(self, group: str, broker_id: int) -> None:
        """``ControllerNode.on_broker_session_closed``: the row goes; a master's group is re-elected."""
        self.heartbeats.remove(group, broker_id)
        if not master_session_closed(self.state, group, broker_id):
            return
        self.world.note(f"controller: master {group}-{broker_id} session closed, electing")
        self.session_elections += 1
        ctx = DecideContext.from_heartbeats(self.heartbeats, self.world.now_ms)
        _resp, events = decide_elect_master(self.state, ElectMasterRequest.of_controller_trigger(group), ctx)
        if events:
            self._apply(events)

    def _apply(self, events: list) -> None:
        self.state.apply_all(events)
        for ev in events:
            if isinstance(ev, ElectMasterEvent) and ev.new_master_elected:
                group = ev.broker_name
                sync = self.state.sync_state[group]
                self.elections.append((group, sync.master_epoch, sync.master_broker_id))
                self.world.note(f"elected {group} master={sync.master_broker_id} epoch={sync.master_epoch}")
                self._notify(group)

    def master_info(self, group: str) -> MasterInfo:
        resp, _ = decide(self.state, GetReplicaInfoRequest(group), DecideContext())
        return MasterInfo.from_response(resp)

    def _notify(self, group: str) -> None:
        if self.notify_to is None:
            return
        info = self.master_info(group)
        now = self.world.now_ms
        for bid in sorted(self.state.replica_info[group].broker_id_info):
            if self.heartbeats.is_alive(group, bid, now):
                self.notify_to(group, bid, info)

    def _scan(self) -> None:
        now = self.world.now_ms
        self.heartbeats.expire(now)
        settled = not self.heartbeats_on_sessions or now >= self.leading_since_ms + self.session_grace_ms
        if now >= self.heartbeat_timeout_ms and settled:  # the start-up and leadership graces (ControllerService)
            alive = self.heartbeats.alive_predicate(now)
            groups = scan_need_reelect_broker_sets(self.state, alive)
            if groups:  # one batch, one log entry, as ControllerNode.trigger_elect_masters
                ctx = DecideContext.from_heartbeats(self.heartbeats, now)
                _resp, events = decide_elect_masters(self.state, ElectMastersRequest(tuple(groups)), ctx)
                if events:
                    self._apply(events)
        self.world.at(self.scan_interval_ms, self._scan, owner=self)

    # -- views for the invariants ---------------------------------------------------------------------
    def sync_state_set(self, group: str) -> frozenset[int]:
        return frozenset(self.state.sync_state[group].sync_state_set)

    def master_of(self, group: str) -> tuple[int | None, int]:
        sync = self.state.sync_state[group]
        return sync.master_broker_id, sync.master_epoch
