"""The controller actor: one Raft controller node plus its timers and notifications.

A plain class (Ray options are applied in ``actors/remote.py``). It hosts a
:class:`rocketray.controller.node.ControllerNode` on the Raft port fixed in the cluster
spec, so a restart by Ray recovers the node from its own snapshot + journal on
the same address. Ray runs it as a threaded actor: requests call the node's
blocking pipeline on Ray's worker threads, while one daemon thread runs the
leader-only services of reference 5.2-5.5: the heartbeat expiry scan, the
inactive-master scan, elections with retries, and role-change notifications to
the live members of a group (a ``role`` frame on the member's session with this
node, else a fire-and-forget Ray call; brokers also poll, so a lost notification
only costs time).
"""

from __future__ import annotations

import logging
import os
import threading
import time

import ray

from rocketray.controller import config_update
from rocketray.config import load_config
from rocketray.actors.metrics import ControllerMetrics, configure_actor_logging
from rocketray.actors.priority import set_process_niceness
from rocketray.actors.views import ControllerMetadata, MasterView
from rocketray.spec import ClusterSpec
from rocketray.wire.controller_api import (AlterSyncStateSetRequest, CleanBrokerDataRequest, ConsumerHeartbeatRequest,
                                           CreateTopicRequest, DeleteTopicRequest, ElectMasterRequest, Response)
from rocketray.wire.controller_codes import ResponseCode
from rocketray.wire.controller_headers import (AlterSyncStateSetResponseHeader, ControllerConfigResponseHeader,
                                               CreateTopicResponseHeader, ElectMasterResponseHeader)
from rocketray.controller.leadership import LeaderStatus
from rocketray.controller.node import ControllerNode
from rocketray.controller.session import Hello, LeaderSessionGrace, hello_problem, masters_without_session
from rocketray.credentials import member_credentials
from rocketray.identity import Identity
from rocketray.links import MemberLinks
from rocketray.tls import MemberCredentials
from rocketray.controller.session_server import SessionServer
from rocketray.controller.notify import ElectionTrigger, RoleChangeNotice

log = logging.getLogger("rocketray.controller")

METRICS_PERIOD_MS = 1000
# Ray concurrency group of the calls that never block on Raft (heartbeats, status): their own
# threads, so requests blocked on a commit (up to request_timeout_ms each) cannot starve liveness.
# Declared with its size in actors/remote.py.
NONBLOCKING_GROUP = "heartbeat"
NONBLOCKING_THREADS = 4
# Clients' long polls for a group's next master (``watch_master``): one thread each while they
# wait, apart from requests and heartbeats. A client holds one per group it writes to.
WATCH_GROUP = "watch"
WATCH_THREADS = 32
WATCH_MAX_S = 30.0
# A new leader gives brokers this many of their heartbeat intervals to reopen their sessions to it;
# then a master without one is dead (rocketray.controller.session.LeaderSessionGrace).
SESSION_GRACE_HEARTBEATS = 2
# ... but not on a node up for less than this many intervals: its heartbeat table may not hold every
# live replica yet, and an election then could only depose the master.
SESSION_GRACE_WARM_UP_HEARTBEATS = 5


def now_ms() -> int:
    return int(time.time() * 1000)


class ControllerService:
    def __init__(self, spec: dict, index: int, credentials: MemberCredentials):
        configure_actor_logging()
        self._spec = ClusterSpec.from_dict(spec)
        self._index = index
        self._config = load_config(self._spec.profile, dict(self._spec.config_overrides))
        credentials = member_credentials(credentials, self._config.tls, self._spec.controller_actor_name(index))
        links = MemberLinks(credentials, tls=self._config.tls.enabled,
                            preauth_timeout_ms=self._config.limits.preauth_timeout_ms)
        me = self._spec.controllers[index]
        self._properties = os.path.join(me.store_dir, config_update.PROPERTIES_FILE)
        os.makedirs(me.store_dir, exist_ok=True)
        self._updates = config_update.load_properties(self._properties)  # admin updates survive restarts
        node_config, skipped = config_update.apply_persisted(self._config.controller_node_config(), self._updates)
        if skipped:
            log.warning("controller ignored persisted config keys=%s file=%s", ";".join(skipped), self._properties)
        # Ray started this process at nice 15: a server's every hand-off would wait, and so would the
        # journal's replay below (actors/priority.py); the threads started from here on inherit it
        set_process_niceness(node_config.process_niceness, f"controller {index}")
        self._metrics = ControllerMetrics(self._spec.name, index, on_error=lambda name, exc: log.warning(
            "metrics disabled after error metric=%s error=%r", name, exc))
        self._node = ControllerNode({c.index: c.raft_address for c in self._spec.controllers}, me.store_dir,
                                    node_config, credentials=credentials, tls=self._config.tls.enabled,
                                    on_role_changed=self._on_role_changed)
        # Brokers' session connections: a broker whose process dies is noticed when the kernel
        # closes its connection, not a heartbeat timeout later (rocketray.controller.session).
        self._sessions: SessionServer | None = None
        if me.session_port is not None:
            try:
                # heartbeats ride the sessions (acked on them): a node's rows are its sessions' brokers
                self._sessions = SessionServer(me.host, me.session_port, links,
                                               self._node.on_broker_session_closed,
                                               on_heartbeat=self._node.heartbeat,
                                               on_moved=self._node.forget_broker,
                                               hello_problem=self._hello_problem,
                                               limits=self._config.limits).start()
            except OSError as exc:  # not fatal: heartbeat expiry still finds dead brokers
                log.error("controller session listener not started index=%d port=%d: %r", index,
                          me.session_port, exc)
        self._config_lock = threading.Lock()
        self._stop = threading.Event()
        self._broker_handles: dict[str, object] = {}
        self._scanner = threading.Thread(target=self._scan_loop, name="controller-scans", daemon=True)
        self._scanner.start()
        self.session_grace_deaths = 0
        threading.Thread(target=self._resolve_broker_handles, name="controller-broker-handles", daemon=True).start()
        if self._sessions is not None:
            threading.Thread(target=self._session_grace_loop, name="controller-session-grace", daemon=True).start()
        log.info("controller started index=%d raft=%s pid=%d", index, me.raft_address, os.getpid())

    def _hello_problem(self, hello: Hello, peer: Identity | None) -> str | None:
        """Why ``peer`` may not open ``hello``'s session (``session.hello_problem`` on this node's
        applied registrations), or None."""
        return hello_problem(hello, peer, self._spec.cluster_name, self._node.registration)

    # --- API called through Ray ----------------------------------------------------------
    def handle(self, request, term: int | None = None) -> Response:
        """One controller request through the leader pipeline; a consumer heartbeat is answered from
        the leader's local membership table instead (``consumer_heartbeat``), so the leader-following
        clients (``controller_client``) send it like any other request. ``term``: decided only by
        the ready leader of that term (``ControllerNode.handle``)."""
        if isinstance(request, ConsumerHeartbeatRequest):
            return self._node.consumer_heartbeat(request)
        response = self._node.handle(request, term=term)
        if isinstance(request, ElectMasterRequest):
            # counted here under the request's trigger; the node notifies (once) via _on_role_changed
            self._log_election(request.broker_name, ElectionTrigger.of(request).value, request.broker_id, response)
        elif isinstance(request, AlterSyncStateSetRequest) and response.code != ResponseCode.CONTROLLER_NOT_LEADER:
            log.info("sync state set change group=%s broker_id=%d epoch=%d sync_state_set=%s sss_epoch=%s code=%s",
                     request.broker_name, request.master_broker_id, request.master_epoch,
                     ";".join(str(i) for i in sorted(request.new_sync_state_set)),
                     response.header.new_sync_state_set_epoch
                     if isinstance(response.header, AlterSyncStateSetResponseHeader) else None, response.code.name)
        elif isinstance(request, CleanBrokerDataRequest) and response.code != ResponseCode.CONTROLLER_NOT_LEADER:
            log.info("clean broker data group=%s broker_ids=%s clean_living=%s code=%s", request.broker_name,
                     request.broker_controller_ids_to_clean, request.clean_living_broker, response.code.name)
        elif isinstance(request, (CreateTopicRequest, DeleteTopicRequest)) \
                and response.code != ResponseCode.CONTROLLER_NOT_LEADER:
            route = response.header if isinstance(response.header, CreateTopicResponseHeader) else None
            log.info("%s topic=%s queues=%s created=%s code=%s remark=%s",
                     "create topic" if isinstance(request, CreateTopicRequest) else "delete topic", request.topic,
                     None if route is None else len(route.queues), None if route is None else route.created,
                     response.code.name, response.remark)
        return response

    def get_config(self) -> Response:
        """GET_CONTROLLER_CONFIG: this node's configuration (reference 6.1), ``body["config"]``."""
        view = config_update.config_view(self._node.config, self._spec.controllers[self._index].store_dir)
        return Response(ResponseCode.SUCCESS, ControllerConfigResponseHeader(self._node.self_address), {"config": view})

    def update_config(self, key: str, value: str) -> Response:
        """UPDATE_CONTROLLER_CONFIG of one key on this node; persisted so a restart keeps it."""
        with self._config_lock:
            try:
                new, name, typed = config_update.apply_update(self._node.config, key, value)
            except config_update.ConfigUpdateError as exc:
                log.info("controller config update refused key=%s code=%s remark=%s", key, exc.code.name, exc.remark)
                return Response.error(exc.code, exc.remark, ControllerConfigResponseHeader(self._node.self_address))
            updates = dict(self._updates, **{name: typed})
            try:
                config_update.save_properties(self._properties, updates)
            except OSError as exc:
                return Response.error(ResponseCode.SYSTEM_ERROR, f"cannot persist config: {exc}")
            self._updates = updates
            self._node.config = new  # the node and the scan loop read their keys on every use
        live = name in config_update.LIVE_KEYS
        log.info("controller config updated key=%s value=%s applies=%s controller=%d", name, typed,
                 "now" if live else "after restart", self._index)
        return Response(ResponseCode.SUCCESS, ControllerConfigResponseHeader(self._node.self_address),
                        {"key": name, "value": typed, "applies": "now" if live else "after restart"})

    @ray.method(concurrency_group=NONBLOCKING_GROUP)
    def heartbeat(self, request) -> Response:
        return self._node.heartbeat(request)

    @ray.method(concurrency_group=NONBLOCKING_GROUP)
    def consumer_heartbeat(self, request) -> Response:
        """A consumer group member's heartbeat: the leader answers the group's live members from its
        local table (not replicated); a follower answers CONTROLLER_NOT_LEADER."""
        return self._node.consumer_heartbeat(request)

    @ray.method(concurrency_group=NONBLOCKING_GROUP)
    def metadata(self) -> ControllerMetadata:
        """This controller's identity, Raft role and progress (``actors/views.py``; never blocks)."""
        return self._metadata()

    def _metadata(self) -> ControllerMetadata:
        return ControllerMetadata.from_node(
            self._index, self._node.metadata(),
            None if self._sessions is None else self._sessions.open_sessions, self.session_grace_deaths)

    def state_snapshot(self) -> dict:
        """This node's replicated tables (``ControllerState.to_snapshot`` shape), for admin and tests."""
        return self._node.snapshot_state()

    def events(self, after_index: int = 0, limit: int = 10_000) -> dict:
        """A page of this controller's event log (applied events with Raft index and decision
        time, ``ControllerNode.events``); follow ``next_index`` while ``more``."""
        return self._node.events(after_index, limit)

    @ray.method(concurrency_group=WATCH_GROUP)
    def watch_master(self, broker_name: str, known_epoch: int, timeout_s: float = WATCH_MAX_S) -> MasterView:
        """Answers when this node applied a master epoch of ``broker_name`` above ``known_epoch``, or
        after ``timeout_s`` (at most ``WATCH_MAX_S``) with the current one (``ControllerNode.wait_master_change``)."""
        view = self._node.wait_master_change(broker_name, known_epoch, min(float(timeout_s), WATCH_MAX_S))
        return MasterView(view["master_epoch"], view["master_broker_id"], view["master_address"])

    @ray.method(concurrency_group=NONBLOCKING_GROUP)
    def applied_master(self, broker_name: str) -> MasterView:
        """``broker_name``'s master as this node has applied it, now: no Raft read, so it answers
        during an election too (clients route by it: a master just deposed refuses or is gone, and
        their watch names the next; ``rocketray.client.transport``)."""
        return self.watch_master(broker_name, 1 << 62, 0.0)

    @ray.method(concurrency_group=NONBLOCKING_GROUP)
    def applied_auth_table(self, since_version: int) -> Response:
        """The users and ACL table as this node has applied it (``GetAuthTableRequest(since_version)``
        without a Raft round trip, like ``applied_master``): "unchanged" unless its version is above
        ``since_version``; read it with ``rocketray.controller.users.auth_table_of``. The table holds
        every user's SCRAM keys: for members (brokers) only."""
        return self._node.auth_table(int(since_version))

    @ray.method(concurrency_group=NONBLOCKING_GROUP)
    def leader_status(self) -> LeaderStatus:
        """This node's word about itself: its term and whether it is that term's ready leader."""
        return self._leader_status(self._node.wait_ready_leader(1 << 62, 0.0))

    @ray.method(concurrency_group=WATCH_GROUP)
    def watch_leader(self, known_term: int, timeout_s: float = WATCH_MAX_S) -> LeaderStatus:
        """Answers when this node is the ready leader of a term above ``known_term``, or after
        ``timeout_s`` (at most ``WATCH_MAX_S``) with its status as it stands
        (``ControllerNode.wait_ready_leader``)."""
        return self._leader_status(
            self._node.wait_ready_leader(int(known_term), min(float(timeout_s), WATCH_MAX_S)))

    def _leader_status(self, status: dict) -> LeaderStatus:
        return LeaderStatus(self._index, int(status["term"]), bool(status["is_leader"]))

    @ray.method(concurrency_group=NONBLOCKING_GROUP)
    def pid(self) -> int:
        return os.getpid()

    def shutdown(self) -> None:
        self._stop.set()
        if self._sessions is not None:
            self._sessions.close()
        self._node.close()

    # --- leader services -----------------------------------------------------------------
    def _scan_loop(self) -> None:
        cfg = self._node.config  # re-read every round: update-controller-config may change the periods
        next_expiry = time.monotonic() + cfg.scan_not_active_broker_interval_ms / 1000.0
        next_master_scan = time.monotonic() + cfg.scan_inactive_master_interval_ms / 1000.0
        next_metrics = time.monotonic()
        # Liveness is local to each node, so a node that just started (e.g. after every controller
        # restarted) knows no heartbeats yet: scanning for dead masters right away would depose live
        # ones. Like RocketMQ's jRaftScanWaitTimeoutMs, it waits one broker heartbeat timeout, counted
        # from the node's start, not from its leadership: brokers heartbeat every node, so a node up
        # that long knows every live broker when it becomes leader (a master lost together with the
        # old leader is then replaced at its heartbeat expiry, not one timeout after the election).
        grace_s = self._config.broker.controller_heartbeat_timeout_ms / 1000.0
        started = time.monotonic()
        # With heartbeats on the sessions (every broker's liveness goes to the leader it follows), a
        # new leader's table fills as the brokers reopen their sessions with it: before the session
        # grace of this leadership has passed, a master that has not reopened yet would look dead
        # to the scan while its slaves look alive. The scan waits for that window in every
        # leadership (``_leading_since``); the leader-change rule acts at its end.
        lead: tuple[int | None, float] = (None, started)
        while not self._stop.wait(min(cfg.scan_not_active_broker_interval_ms, cfg.scan_inactive_master_interval_ms,
                                      METRICS_PERIOD_MS) / 4000.0):
            cfg = self._node.config
            now = time.monotonic()
            try:
                if now >= next_expiry:  # a dead master found here is re-elected by the node
                    next_expiry = now + cfg.scan_not_active_broker_interval_ms / 1000.0
                    self._node.expire_heartbeats()
                lead = self._leading_since(lead, now)
                if now >= next_master_scan and now - started >= grace_s and lead[0] is not None \
                        and now - lead[1] >= self._session_grace_s():
                    next_master_scan = now + cfg.scan_inactive_master_interval_ms / 1000.0
                    self._node.scan_inactive_masters()
            except Exception:  # noqa: BLE001 - a scan failure must not kill the timer
                log.exception("controller scan failed index=%d", self._index)
            if now >= next_metrics:
                next_metrics = now + METRICS_PERIOD_MS / 1000.0
                self._sample_metrics()

    def _session_grace_s(self) -> float:
        """How long a new leader waits for the brokers to reopen their sessions (0 without a session
        listener: brokers then heartbeat every controller through Ray, and its table is warm)."""
        if self._sessions is None:
            return 0.0
        return SESSION_GRACE_HEARTBEATS * self._config.broker.broker_heartbeat_interval_ms / 1000.0

    def _leading_since(self, lead: tuple[int | None, float], now: float) -> tuple[int | None, float]:
        """``(term, since)``: the term in which this node is the ready leader (None: it is not) and
        when this loop first saw it lead in that term."""
        status = self._node.wait_ready_leader(1 << 62, 0.0)
        term = status["term"] if status["is_leader"] else None
        return lead if term == lead[0] else (term, now)

    def _session_grace_loop(self) -> None:
        """The leader-change rule: once per leadership, ``SESSION_GRACE_HEARTBEATS`` broker heartbeat
        intervals after this node became the ready leader, each master without a session here is
        treated as a closed session (``ControllerNode.on_broker_session_closed``)."""
        broker = self._config.broker
        grace = LeaderSessionGrace(SESSION_GRACE_HEARTBEATS * broker.broker_heartbeat_interval_ms,
                                   started_ms=now_ms(),
                                   warm_up_ms=SESSION_GRACE_WARM_UP_HEARTBEATS * broker.broker_heartbeat_interval_ms)
        known = -1
        while not self._stop.is_set():
            try:
                deadline = grace.deadline_ms()
                if deadline is None:  # wake the moment this node becomes the ready leader of a new term
                    status = self._node.wait_ready_leader(known, 1.0)
                else:
                    self._stop.wait(max(0.0, (deadline - now_ms()) / 1000.0))
                    status = self._node.wait_ready_leader(1 << 62, 0.0)
                term = status["term"] if status["is_leader"] else None
                known = known if term is None else term
                if not grace.due(now_ms(), term):
                    continue
                assert self._sessions is not None
                state = self._node.snapshot_state()
                masters = {row[0]: row[2] for row in state["sync_state"]}
                dead = masters_without_session(masters, self._sessions.session_keys())
                for group, broker_id in dead:
                    log.info("master has no session with the new leader, treating it as dead group=%s "
                             "broker_id=%d term=%s", group, broker_id, term)
                    self.session_grace_deaths += 1
                    self._node.on_broker_session_closed(group, broker_id)
            except Exception:  # noqa: BLE001 - the rule must not kill its thread; expiry still covers it
                log.exception("controller session grace check failed index=%d", self._index)
                self._stop.wait(0.1)

    def _sample_metrics(self) -> None:
        try:
            md = self._metadata()
            state = self._node.snapshot_state() if md.is_leader else None
            for line in self._metrics.observe(md, state):
                log.info(line)
        except Exception:  # noqa: BLE001 - observability must not kill the timer
            log.exception("controller metrics sample failed index=%d", self._index)

    def _log_election(self, group: str, trigger: str, broker_id: int, response: Response) -> None:
        if response.code == ResponseCode.CONTROLLER_NOT_LEADER:
            return
        header = response.header
        if not isinstance(header, ElectMasterResponseHeader):
            header = ElectMasterResponseHeader()
        log.info("election group=%s trigger=%s requested_broker_id=%d broker_id=%s epoch=%s sss_epoch=%s code=%s",
                 group, trigger, broker_id, header.master_broker_id, header.master_epoch,
                 header.sync_state_set_epoch, response.code.name)
        self._metrics.election(group, trigger, response.code.name)

    def _on_role_changed(self, notice: RoleChangeNotice) -> None:
        """The node's callback, once per successful election. Elections requested through
        ``handle`` (broker, admin) were counted there; the controller's own are counted here."""
        started = time.monotonic()
        by_session, by_ray = self._notify(notice)      # first: the new master waits for it
        notified = time.monotonic()
        if notice.trigger is ElectionTrigger.CONTROLLER:
            self._metrics.election(notice.broker_name, notice.trigger.value, ResponseCode.SUCCESS.name)
        log.info("role change notified group=%s epoch=%s targets=%d session=%d ray=%d notify_ms=%.1f count_ms=%.1f",
                 notice.broker_name, notice.master_epoch, len(notice.targets), by_session, by_ray,
                 (notified - started) * 1000, (time.monotonic() - notified) * 1000)

    def _resolve_broker_handles(self) -> None:
        """Look every broker actor up once, in the background, so that a role-change notification is
        sent at once: ``ray.get_actor`` takes 170-650 ms per broker on a new leader that has never
        notified them (measured when a node holding the controller leader and a master is lost), and
        the new master would wait for it."""
        missing = [self._spec.broker_actor_name(b.group, b.replica) for b in self._spec.brokers]
        while missing and not self._stop.is_set():
            for name in list(missing):
                if name in self._broker_handles:
                    missing.remove(name)
                    continue
                try:
                    self._broker_handles[name] = ray.get_actor(name, namespace=self._spec.namespace)
                    missing.remove(name)
                except (ValueError, ray.exceptions.RayError):
                    pass  # not created yet: try again
            self._stop.wait(1.0)

    def _notify(self, notice: RoleChangeNotice) -> tuple[int, int]:
        """Push the new role to the group's live members (reference 5.5), fire-and-forget: a ``role``
        frame on the member's session if this node holds it (a write on an open connection), else a
        Ray call (its session is with another node or not open yet). Returns how many went each way."""
        notification = notice.notification()
        by_session = by_ray = 0
        for broker_id, address in notice.targets:
            if self._sessions is not None and self._sessions.notify(notice.broker_name, broker_id, notification):
                by_session += 1
                continue
            b = self._spec.broker_by_ha_address(address)
            if b is None:
                continue
            name = self._spec.broker_actor_name(b.group, b.replica)
            try:
                handle = self._broker_handles.get(name) or ray.get_actor(name, namespace=self._spec.namespace)
                self._broker_handles[name] = handle
                handle.on_role_change.remote(notification)
                by_ray += 1
            except (ValueError, ray.exceptions.RayError):
                self._broker_handles.pop(name, None)
        return by_session, by_ray
