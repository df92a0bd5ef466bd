"""ControllerNode: one replicated controller (the shell around the pure controller core).

Theory of operation. A node hosts one pysyncobj `RaftHost` ticked by a thread of its own. Every
request goes through one pipeline (`LeaderPipeline`, controller/leader_pipeline.py); decisions are
taken one at a time (`_pipeline` lock), commits overlap (controller/pipeline.py):

1. Only a *ready* leader serves: Raft leader whose own barrier (an empty batch) committed in the
   current term, so every entry of earlier terms is applied. Elsewhere the answer is
   CONTROLLER_NOT_LEADER (2007) with `leader_address` / `leader_id` in the header.
2. `decide(state, request, ctx)` runs (pure) on the *speculation*: the applied state plus the
   events of this leader's proposals still in flight, so it includes every predecessor.
3. The events are encoded into one payload and proposed; reads (and writes that produce no
   events) propose a barrier instead when `is_process_read_event` (default True): linearizable
   reads. The lock is released here: the next request decides while this one commits.
4. `handle` answers once its entry is committed *and applied on this node* (pysyncobj applies
   before it calls back), so an answered write is fsynced on a majority.

State changes only on the tick thread, in log order (`_apply`); entries at or below the loaded
snapshot index are skipped. Liveness (heartbeat table) is local to each node, as in RocketMQ.

Consumer-group membership (`consumer_heartbeat`) is served by the ready leader from a local,
non-replicated table (`controller/consumers.py`) without entering the pipeline; a follower answers
NOT_LEADER so that clients follow the leader. The table is cleared whenever the Raft role changes.

The controller's own elections (a dead master found by heartbeat expiry, a closed session or the
inactive-master scan) are `ElectionTriggers` (controller/triggers.py).

Threading: `handle`, `trigger_elect_master`, `scan_inactive_masters` and `expire_heartbeats`
block (up to the request timeout per replication); call them from worker threads or an
executor, never from an event loop. `heartbeat`, `consumer_heartbeat` and `metadata` do not
block on Raft.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

from rocketray.wire.controller_api import ConsumerHeartbeatRequest, GetAuthTableRequest, Response
from rocketray.wire.controller_codes import ResponseCode
from rocketray.controller.config import ControllerConfig
from rocketray.controller.consumers import ConsumerGroups
from rocketray.controller.event_log import EventLog, EventLogError, EventLogRecord
from rocketray.controller.events import Event, broker_name_of, decode_events
from rocketray.wire.controller_headers import NotLeaderResponseHeader
from rocketray.controller.heartbeat import HeartbeatTable
from rocketray.controller.leader_pipeline import LeaderPipeline
from rocketray.controller.notify import RoleChangeNotice
from rocketray.controller.pipeline import Speculation
from rocketray.controller.triggers import ElectionTriggers
from rocketray.controller.users import decide_get_auth_table
from rocketray.fs import OS_DISK, Disk, ensure_dir
from rocketray.controller.raft import PayloadError, RaftHost, decode_payload, sync_obj_conf
from rocketray.controller.raft_admission import PortLimits
from rocketray.controller.raft_members import InsecureRaftBindError, port_settings
from rocketray.controller.raft_snapshots import (RecoveryRefused, SnapshotHooks, import_pysyncobj_journal,
                                                 plan_recovery)
from rocketray.controller.state import ControllerState
from rocketray.snapshot.format import SECTION_AUTH, SECTION_CONTROLLER_STATE, SECTION_TOPICS
from rocketray.snapshot.store import SnapshotStore
from rocketray.tls import MemberCredentials

log = logging.getLogger(__name__)

_LEADER = 2  # pysyncobj's _RAFT_STATE.LEADER
JOURNAL_FILE = "raft.wal"             # DurableJournal (controller/journal.py), + ".meta" for term/vote
LEGACY_JOURNAL_FILE = "raft.journal"  # pysyncobj's FileJournal, imported once into JOURNAL_FILE
_ROLE_NAMES = {0: "follower", 1: "candidate", 2: "leader"}

__all__ = ["ControllerNode", "InsecureRaftBindError", "RecoveryRefused"]


def _now_ms() -> int:
    return int(time.time() * 1000)


def _state_of(sections: dict[int, dict[str, Any]]) -> ControllerState:
    """The state a snapshot's sections hold; one written before topics (or users) existed has none."""
    return ControllerState.from_snapshot(sections[SECTION_CONTROLLER_STATE], sections.get(SECTION_TOPICS),
                                         sections.get(SECTION_AUTH))


class ControllerNode(LeaderPipeline, ElectionTriggers):
    """One controller replica. See the module docstring for the pipeline and threading; the request
    path is ``LeaderPipeline`` (``controller/leader_pipeline.py``), the controller's own elections
    ``ElectionTriggers`` (``controller/triggers.py``)."""

    def __init__(self, controllers: Mapping[int, str], store_dir: str | Path, config: ControllerConfig | None = None,
                 *, credentials: MemberCredentials, tls: bool = True, dial: Mapping[int, str] | None = None,
                 clock_ms: Callable[[], int] = _now_ms,
                 on_role_changed: Callable[[RoleChangeNotice], None] | None = None,
                 alive: Callable[[str, int], bool] | None = None, disk: Disk = OS_DISK,
                 journal_fsync: bool = True) -> None:
        """Controller ``credentials.identity.index`` of the group ``controllers`` (index -> Raft address,
        from the cluster spec). Its Raft port binds that address only and admits only the other
        controllers: mutual TLS with the members' certificates, or with ``tls=False`` (development)
        the members' secret; missing credentials raise ``InsecureRaftBindError`` before anything
        binds (``controller/raft_members.py``). ``dial`` maps an index to where this node reaches that
        controller when not at its Raft address (the chaos runner's proxies). ``disk`` carries the
        Raft journal, its term/vote meta and the snapshots (the real disk by default; the power-loss
        tests pass the simulated one). ``journal_fsync=False`` only for the benchmark's same-run
        baseline: it gives up durability on power loss."""
        self.config = config or ControllerConfig()
        self.config.validate()
        port = port_settings(credentials, tls, controllers, dial, PortLimits.from_config(self.config))
        self_address = port.bind_address
        others = list(port.peer_index)
        self.self_address = self_address
        self.tls = tls
        self.members = sorted(set(others) | {self_address})
        self.store_dir = Path(store_dir)
        self.store_dir.mkdir(parents=True, exist_ok=True)
        ensure_dir(disk, self.store_dir)
        self._clock_ms = clock_ms
        self._on_role_changed = on_role_changed
        self._alive_override = alive

        self._state_lock = threading.Lock()   # state, applied index, heartbeat table
        self._applied = threading.Condition(self._state_lock)  # notified whenever the state moved
        self._pipeline = threading.Lock()     # one decision at a time (controller/pipeline.py)
        self._spec = Speculation()            # applied state + this leader's proposals in flight
        self.state = ControllerState()
        self.heartbeats = HeartbeatTable()
        self._consumers_lock = threading.Lock()
        self.consumers = ConsumerGroups(self.config.consumer_heartbeat_timeout_ms)
        self.applied_index = 0
        self.fenced_batches = 0
        self.failed_batches = 0
        self._ready_term: int | None = None
        self._closed = False
        self._elect_lock = threading.Lock()   # groups waiting for the next batch of elections
        self._elect_pending: dict[str, None] = {}
        self._electing = False

        self.snapshots = SnapshotStore(self.store_dir / "snapshots", keep=self.config.max_snapshot_reserved_num,
                                       disk=disk)
        journal_file = self.store_dir / JOURNAL_FILE
        dump_file = self.store_dir / "raft.dump"
        import_pysyncobj_journal(self.store_dir / LEGACY_JOURNAL_FILE, journal_file, disk)
        plan = plan_recovery(self.snapshots, journal_file, dump_file)
        if plan.snapshot is not None:
            self.state = _state_of(plan.state_sections)
            self.applied_index = plan.snapshot.index
        self.loaded_snapshot_index = plan.snapshot.index if plan.snapshot else 0
        self.event_log = EventLog(self.store_dir / "events", self.config.event_log_segment_bytes,
                                  self.config.event_log_segments_kept)
        self.event_log_errors = 0
        self._note_unlogged(self.applied_index)
        self._hooks = SnapshotHooks(self.snapshots, dump_file, self._capture, self._install,
                                    plan.startup_entries)
        self._hooks.last_snapshot_index = self.loaded_snapshot_index
        conf = sync_obj_conf(self.config, None if tls else credentials.secret, str(journal_file), str(dump_file),
                             self._hooks, self._on_raft_state_changed, self_address)
        self._raft = RaftHost(self_address, others, conf, self._apply, journal_file, port, disk, journal_fsync)
        self._hooks.host = self._raft
        self.max_tick_ms = 0.0
        self.max_snapshot_tick_ms = 0.0
        self._stop = threading.Event()
        self._tick_thread = threading.Thread(target=self._tick_loop, name=f"raft-tick-{self_address}",
                                             daemon=True)
        self._tick_thread.start()
        log.info("controller node started self=%s members=%s tls=%s snapshot_index=%d journal=%s",
                 self_address, self.members, tls, self.loaded_snapshot_index, plan.journal)
        if not tls:
            log.warning("controller %s: TLS is OFF on the Raft port (development mode): frames are authenticated "
                        "with the members' secret, not encrypted with certificates", self_address)

    # -- tick thread ------------------------------------------------------------------------------
    def _tick_loop(self) -> None:
        period_s = self.config.tick_period_ms / 1000
        while not self._stop.is_set():
            started = time.monotonic()
            serializations = self._hooks.serialize_calls
            try:
                self._raft.doTick(period_s)
            except Exception:
                log.exception("raft tick failed self=%s", self.self_address)
                time.sleep(period_s)
            elapsed_ms = (time.monotonic() - started) * 1000
            if elapsed_ms > self.max_tick_ms:
                self.max_tick_ms = elapsed_ms
            if self._hooks.serialize_calls != serializations and elapsed_ms > self.max_snapshot_tick_ms:
                self.max_snapshot_tick_ms = elapsed_ms  # the whole tick that took a snapshot

    def _apply(self, index: int, entry_term: int, payload: bytes) -> bool | None:
        """Apply one committed entry (tick thread). True applied, False fenced, None skipped."""
        if index <= self.applied_index:
            return None
        try:
            decided_term, decided_ms, body = decode_payload(payload)
            events = decode_events(body) if body else []
        except (PayloadError, ValueError) as exc:
            log.error("undecodable log entry index=%d skipped: %s", index, exc)
            self.applied_index = index
            return False
        if decided_term != entry_term:
            log.warning("fenced batch index=%d decided_term=%d entry_term=%d events=%d",
                        index, decided_term, entry_term, len(events))
            self.fenced_batches += 1
            self.applied_index = index
            self._spec.applied(payload, False)
            return False
        with self._state_lock:  # logged under the lock: a snapshot never covers an unlogged entry
            try:
                records = self._apply_events(index, entry_term, decided_ms, events)
            except Exception:
                # Deterministic on every replica: the batch is rolled back as a whole
                # (ControllerState.apply_batch) and the index advances, so one bad entry can
                # never wedge the tick loop (it would be re-applied forever otherwise).
                log.exception("batch index=%d failed to apply; skipped on every replica", index)
                self.failed_batches += 1
                records = []
            self._spec.applied(payload, bool(records))
            if records and index > self.event_log.last_index:
                self._log_events(records)
            self.applied_index = index
            if records:
                self._applied.notify_all()
        if index - self._hooks.last_snapshot_index >= self.config.snapshot_threshold:
            self._raft.forceLogCompaction()
        return True

    def _apply_events(self, index: int, term: int, decided_ms: int | None,
                      events: list[Event]) -> list[EventLogRecord]:
        """Apply a batch (state lock held) and describe each event with its group's state after it."""
        records: list[EventLogRecord] = []

        def describe(event: Event) -> None:
            seq = len(records)
            name = broker_name_of(event)
            info = self.state.sync_state.get(name) if name is not None else None
            if info is None:
                records.append(EventLogRecord(index, seq, term, decided_ms, event))
            else:
                records.append(EventLogRecord(index, seq, term, decided_ms, event, info.master_broker_id,
                                              info.master_epoch, tuple(sorted(info.sync_state_set)),
                                              info.sync_state_set_epoch))

        self.state.apply_batch(events, describe)  # all or nothing (rolled back if an event raises)
        return records

    def _log_events(self, records: list[EventLogRecord]) -> None:
        """Log an applied batch; a batch the log cannot hold (IO error, a record over the frame
        limit) becomes a gap record, never an exception into the tick loop."""
        try:
            self.event_log.append(records)
        except (OSError, EventLogError):
            self.event_log_errors += 1
            log.exception("event log append failed index=%d self=%s", records[0].index, self.self_address)
            try:
                self.event_log.note_gap(records[0].index, records[0].index)
            except OSError:
                log.exception("event log gap record failed self=%s", self.self_address)

    def events(self, after_index: int = 0, limit: int = 10_000) -> dict[str, Any]:
        """A page of this node's event log (``EventLog.read``) as JSON-ready dicts."""
        page = self.event_log.read(after_index, limit)
        page["events"] = [r.to_json() for r in page["events"]]
        page["gaps"] = [[g.first_index, g.last_index] for g in page["gaps"]]
        page["last_index"] = self.event_log.last_index
        return page

    def _capture(self) -> tuple[int, dict[int, dict[str, Any]]]:
        """Copy the applied index and state under the state lock, then fsync the event log outside
        it (every covered entry was logged under the lock first; heartbeats never wait for the disk)."""
        with self._state_lock:
            captured = self.applied_index, {SECTION_CONTROLLER_STATE: self.state.to_snapshot(),
                                            SECTION_TOPICS: self.state.topics_to_snapshot(),
                                            SECTION_AUTH: self.state.auth_to_snapshot()}
        try:
            self.event_log.sync()
        except OSError:
            self.event_log_errors += 1
            log.exception("event log sync failed self=%s", self.self_address)
        return captured

    def _install(self, index: int, sections: dict[int, dict[str, Any]]) -> None:
        state = _state_of(sections)
        with self._state_lock:
            self.state = state
            self.applied_index = index
            self._applied.notify_all()
        self._note_unlogged(index)

    def _note_unlogged(self, index: int) -> None:
        """The state jumped to ``index`` without applying entries one by one: log a gap."""
        try:
            self.event_log.note_gap(self.event_log.last_index + 1, index)
        except OSError:
            self.event_log_errors += 1
            log.exception("event log gap record failed self=%s", self.self_address)

    def _on_raft_state_changed(self, old: int, new: int) -> None:
        log.info("raft role %s -> %s self=%s term=%d", _ROLE_NAMES.get(old), _ROLE_NAMES.get(new),
                 self.self_address, self._raft.raftCurrentTerm if hasattr(self, "_raft") else -1)
        self._ready_term = None
        with self._consumers_lock:  # members re-register with whoever leads next
            self.consumers.clear()
        if new == _LEADER:
            threading.Thread(target=self._become_ready, args=(time.monotonic(),), name="controller-leader-noop",
                             daemon=True).start()

    def is_leader(self) -> bool:
        """Raft leader whose barrier of the current term committed (RocketMQ's isLeaderState)."""
        return self._raft._isLeader() and self._ready_term == self._raft.raftCurrentTerm

    def _not_leader(self) -> Response:
        leader = self._raft.leader_address()
        header = NotLeaderResponseHeader(leader, self._member_id(leader))
        return Response.error(ResponseCode.CONTROLLER_NOT_LEADER, "The controller is not in leader state", header)

    def _member_id(self, address: str | None) -> str | None:
        return None if address not in self.members else f"n{self.members.index(address)}"

    def heartbeat(self, request: Any) -> Response:
        """Record a broker heartbeat in this node's local liveness table (never blocks on Raft)."""
        with self._state_lock:
            return self.heartbeats.on_heartbeat(request, self._clock_ms())

    def forget_broker(self, broker_name: str, broker_id: int) -> None:
        """Drop a broker's heartbeat row without acting on it: its session moved to another
        controller with a bye (``SessionServer``), so its liveness is that node's to keep."""
        with self._state_lock:
            self.heartbeats.remove(broker_name, broker_id)

    def registration(self, broker_name: str, broker_id: int) -> tuple[str, str] | None:
        """``(address, register check code)`` of broker ``broker_id`` of ``broker_name`` (applied
        state; None if it is not registered)."""
        with self._state_lock:
            replica = self.state.replica_info.get(broker_name)
            return None if replica is None else replica.broker_id_info.get(broker_id)

    def consumer_heartbeat(self, request: Any) -> Response:
        """A consumer group member's heartbeat (``ConsumerHeartbeatRequest``): on the ready leader,
        refresh it in the local membership table and answer the group's live members; elsewhere
        NOT_LEADER with the leader's identity. Not replicated; never blocks on Raft."""
        if not isinstance(request, ConsumerHeartbeatRequest):
            return Response.error(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                  f"not a consumer heartbeat: {type(request).__name__}")
        if self._closed or not self.is_leader():
            return self._not_leader()
        with self._consumers_lock:
            return self._consumer_table().on_heartbeat(request, self._clock_ms())

    def consumer_groups(self) -> dict[str, list[str]]:
        """group -> live member client ids in this node's table (empty on a follower)."""
        with self._consumers_lock:
            return self._consumer_table().groups(self._clock_ms())

    def _consumer_table(self) -> ConsumerGroups:
        """The membership table with the current timeout (update-controller-config applies at once)."""
        self.consumers.timeout_ms = self.config.consumer_heartbeat_timeout_ms
        return self.consumers

    def wait_master_change(self, broker_name: str, known_epoch: int, timeout_s: float) -> dict[str, Any]:
        """Long poll: block until this node has applied a master epoch of ``broker_name`` above
        ``known_epoch`` (or ``timeout_s`` passed, or the node closed), then return the group's
        ``master_epoch``, ``master_broker_id`` and ``master_address`` as applied here. Applied state
        is committed state, so any node, leader or not, answers; a lagging follower only answers
        later. Clients hold one such watch per group to learn a new master when it is elected
        instead of polling (``rocketray.client.transport.RayTransport``). Blocks: call from a thread."""
        deadline = time.monotonic() + timeout_s
        with self._applied:
            while True:
                info = self.state.sync_state.get(broker_name)
                epoch = -1 if info is None else info.master_epoch
                left = deadline - time.monotonic()
                if epoch > known_epoch or left <= 0 or self._closed:
                    break
                self._applied.wait(left)
            master = None if info is None else info.master_broker_id
            replica = self.state.replica_info.get(broker_name)
            address = None if master is None or replica is None else replica.address_of(master)
        return {"master_epoch": epoch, "master_broker_id": master, "master_address": address}

    def wait_ready_leader(self, known_term: int, timeout_s: float) -> dict[str, Any]:
        """Long poll: block until this node is the ready leader of a term above ``known_term`` (or
        ``timeout_s`` passed, or the node closed); returns ``{"term", "is_leader"}`` as they stand.
        Controller clients hold one per controller to follow leadership the moment a new leader
        can serve (``controller/leadership.py``). Blocks: call from a thread."""
        deadline = time.monotonic() + timeout_s
        with self._applied:
            while True:
                term = self._raft.raftCurrentTerm
                ready = self.is_leader()
                left = deadline - time.monotonic()
                if (ready and term > known_term) or left <= 0 or self._closed:
                    return {"term": term, "is_leader": ready}
                self._applied.wait(left)

    def metadata(self) -> dict[str, Any]:
        """Leader identity and Raft status (RocketMQ's getControllerMetadata; never blocks)."""
        leader = self._raft.leader_address()
        status = {
            "self_address": self.self_address,
            "self_id": self._member_id(self.self_address),
            "leader_address": leader,
            "leader_id": self._member_id(leader),
            "is_leader": self.is_leader(),
            "raft_role": "leader" if self._raft._isLeader() else ("follower" if leader else "candidate"),
            "term": self._raft.raftCurrentTerm,
            "peers": list(self.members),
            "commit_index": self._raft.raftCommitIndex,
            "last_applied": self._raft.raftLastApplied,
            "applied_index": self.applied_index,
            "journal_first_index": self._raft.journal_first_index(),
            "journal_len": self._raft.journal_len(),
            "journal_syncs": self._raft.journal.syncs if self._raft.journal else 0,
            "journal_rewrites": self._raft.journal.rewrites if self._raft.journal else 0,
            "snapshot_loaded_index": self.loaded_snapshot_index,
            "snapshot_last_index": self._hooks.last_snapshot_index,
            "snapshots_saved": self._hooks.snapshots_taken,
            "snapshots_loaded": self.snapshots.loads,
            "snapshots_kept": self.snapshots.list(),
            "dumps_installed": self._hooks.dumps_installed,
            "fenced_batches": self.fenced_batches,
            "pipeline_in_flight": self._spec.in_flight,
            "speculation_rebuilds": self._spec.rebuilds,
            "speculation_invalidations": self._spec.invalidations,
            "failed_batches": self.failed_batches,
            "event_log_last_index": self.event_log.last_index,
            "event_log_errors": self.event_log_errors,
            "max_tick_ms": round(self.max_tick_ms, 3),
            "max_snapshot_ms": round(self._hooks.max_snapshot_ms, 3),
            "max_snapshot_tick_ms": round(self.max_snapshot_tick_ms, 3),
            "raft_port": self._raft.port_stats(),
        }
        return status

    def snapshot_state(self) -> dict[str, Any]:
        """A copy of the replicated tables (for tests and admin): ``ControllerState.to_snapshot()``
        plus ``"topics"``, the rows of ``topics_to_snapshot()``, and ``"auth"``, the users and ACL
        table without its keys (``AuthTable.public_view``)."""
        with self._state_lock:
            return {**self.state.to_snapshot(), "topics": self.state.topics_to_snapshot()["topics"],
                    "auth": self.state.auth.public_view()}

    def auth_table(self, since_version: int) -> Response:
        """``GetAuthTableRequest(since_version)`` answered from this node's applied state, without a
        Raft round trip: any node answers, and one that has not applied a version above
        ``since_version`` answers "unchanged", so a member never goes back to an older table.
        Never blocks on Raft."""
        with self._state_lock:
            return decide_get_auth_table(self.state, GetAuthTableRequest(since_version))[0]

    def close(self) -> None:
        """Stop ticking, close sockets and the journal. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        with self._applied:
            self._applied.notify_all()  # release the watches
        if self._tick_thread is not threading.current_thread():
            self._tick_thread.join(timeout=5)
        self._hooks.wait_idle()
        try:
            self._raft.destroy()
        except Exception:
            log.exception("error while closing raft host")
        self.event_log.close()

