"""ControllerNode: one replicated controller (the shell around the pure controller core).

Theory of operation. A node hosts one pysyncobj `RaftHost` ticked by a thread of its own. Every
request goes through one pipeline; decisions are taken one at a time (`_pipeline` lock), commits
overlap (controller/pipeline.py):

1. Only a *ready* leader serves: Raft leader whose own barrier (an empty batch) committed in the
   current term, so every entry of earlier terms is applied. Elsewhere the answer is
   CONTROLLER_NOT_LEADER (2007) with `leader_address` / `leader_id` in the header.
2. `decide(state, request, ctx)` runs (pure) on the *speculation*: the applied state plus the
   events of this leader's proposals still in flight, so it includes every predecessor.
3. The events are encoded into one payload and proposed; reads (and writes that produce no
   events) propose a barrier instead when `is_process_read_event` (default True): linearizable
   reads. The lock is released here: the next request decides while this one commits.
4. `handle` answers once its entry is committed *and applied on this node* (pysyncobj applies
   before it calls back): fsynced on a majority, as before.

State changes only on the tick thread, in log order (`_apply`); entries at or below the loaded
snapshot index are skipped. Liveness (heartbeat table) is local to each node, as in RocketMQ.

Consumer-group membership (`consumer_heartbeat`) is served by the ready leader from a local,
non-replicated table (`controller/consumers.py`) without entering the pipeline; a follower answers
NOT_LEADER so that clients follow the leader. The table is cleared whenever the Raft role changes.

Threading: `handle`, `trigger_elect_master`, `scan_inactive_masters` and `expire_heartbeats`
block (up to the request timeout per replication); call them from worker threads or an
executor, never from an event loop. `heartbeat`, `consumer_heartbeat` and `metadata` do not
block on Raft.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable

from rocketray.controller.api import ConsumerHeartbeatRequest, ElectMasterRequest, ElectMastersRequest, Response
from rocketray.controller.codes import ResponseCode
from rocketray.controller.config import ControllerConfig
from rocketray.controller.consumers import ConsumerGroups
from rocketray.controller.decide import (DecideContext, decide, election_answers, is_write, master_session_closed,
                                        scan_need_reelect_broker_sets)
from rocketray.controller.event_log import EventLog, EventLogError, EventLogRecord
from rocketray.controller.events import Event, broker_name_of, decode_events, encode_events
from rocketray.controller.heartbeat import HeartbeatTable
from rocketray.controller.notify import ElectionTrigger, RoleChangeNotice, role_change_notice
from rocketray.controller.pipeline import Proposal, Speculation
from rocketray.fs import OS_DISK, Disk, ensure_dir
from rocketray.controller.raft import (PayloadError, RaftHost, RecoveryRefused, SnapshotHooks, decode_payload,
                                       encode_payload, import_pysyncobj_journal, plan_recovery, sync_obj_conf)
from rocketray.controller.state import ControllerState
from rocketray.snapshot.format import SECTION_CONTROLLER_STATE, SECTION_TOPICS
from rocketray.snapshot.store import SnapshotStore

log = logging.getLogger(__name__)

_LEADER = 2  # pysyncobj's _RAFT_STATE.LEADER
MAX_BATCH_BYTES = 256 << 10           # one request's encoded events (decide bounds each field far below)
MAX_ELECTIONS_PER_ENTRY = 256         # groups one ElectMastersRequest elects (one Raft entry)
SLOW_REQUEST_S = 0.1                  # a request slower than this logs where its time went
JOURNAL_FILE = "raft.wal"             # DurableJournal (controller/journal.py), + ".meta" for term/vote
LEGACY_JOURNAL_FILE = "raft.journal"  # pysyncobj's FileJournal, imported once into JOURNAL_FILE
_ROLE_NAMES = {0: "follower", 1: "candidate", 2: "leader"}

__all__ = ["ControllerNode", "InsecureRaftBindError", "RecoveryRefused"]


class InsecureRaftBindError(ValueError):
    """Refusing to open an unauthenticated Raft port on a non-loopback address."""


class _ReplicationFailed(Exception):
    def __init__(self, code: ResponseCode, remark: str) -> None:
        super().__init__(remark)
        self.code = code
        self.remark = remark


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_of(address: str) -> str:
    return address.rsplit(":", 1)[0]


def _now_ms() -> int:
    return int(time.time() * 1000)


def _state_of(sections: dict[int, dict[str, Any]]) -> ControllerState:
    """The state a snapshot's sections hold; one written before topics existed has no topics."""
    return ControllerState.from_snapshot(sections[SECTION_CONTROLLER_STATE], sections.get(SECTION_TOPICS))


class ControllerNode:
    """One controller replica. See the module docstring for the pipeline and threading."""

    def __init__(self, self_address: str, peer_addresses: list[str] | tuple[str, ...],
                 store_dir: str | Path, config: ControllerConfig | None = None,
                 secret: str | None = None, *, clock_ms: Callable[[], int] = _now_ms,
                 on_role_changed: Callable[[RoleChangeNotice], None] | None = None,
                 alive: Callable[[str, int], bool] | None = None, disk: Disk = OS_DISK,
                 journal_fsync: bool = True) -> None:
        """``disk`` carries the Raft journal, its term/vote meta and the snapshots (the real disk by
        default; the power-loss tests pass the simulated one). ``journal_fsync=False`` only for
        the benchmark's same-run baseline: it gives up durability on power loss."""
        self.config = config or ControllerConfig()
        self.config.validate()
        if not secret and not _is_loopback(_host_of(self_address)):
            raise InsecureRaftBindError(
                f"refusing to bind the controller Raft port on {self_address} without a cluster secret: "
                "pysyncobj unpickles whatever arrives on that port, so an unauthenticated non-loopback "
                "port is remote code execution. Pass secret=... (the same on every controller).")
        self.self_address = self_address
        self.members = sorted(set(peer_addresses) | {self_address})
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
        conf = sync_obj_conf(self.config, secret, str(journal_file), str(dump_file), self._hooks,
                             self._on_raft_state_changed)
        others = [a for a in self.members if a != self_address]
        self._raft = RaftHost(self_address, others, conf, self._apply, journal_file, disk, journal_fsync)
        self._hooks.host = self._raft
        self.max_tick_ms = 0.0
        self.max_snapshot_tick_ms = 0.0
        self._stop = threading.Event()
        self._tick_thread = threading.Thread(target=self._tick_loop, name=f"raft-tick-{self_address}",
                                             daemon=True)
        self._tick_thread.start()
        log.info("controller node started self=%s members=%s snapshot_index=%d journal=%s",
                 self_address, self.members, self.loaded_snapshot_index, plan.journal)

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
        with self._state_lock:
            try:
                self.event_log.sync()  # every entry the snapshot covers is durable in the event log
            except OSError:
                self.event_log_errors += 1
                log.exception("event log sync failed self=%s", self.self_address)
            return self.applied_index, {SECTION_CONTROLLER_STATE: self.state.to_snapshot(),
                                        SECTION_TOPICS: self.state.topics_to_snapshot()}

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

    def _become_ready(self, elected_at: float) -> None:
        """A new leader commits a barrier before it serves (reference 3.3); retried while leader."""
        while not self._closed and self._raft._isLeader():
            with self._pipeline:
                if self._ensure_ready() is not None:
                    log.info("controller leader ready self=%s term=%d barrier_ms=%.1f", self.self_address,
                             self._raft.raftCurrentTerm, (time.monotonic() - elected_at) * 1000)
                    return
            time.sleep(self.config.append_entries_period_ms / 1000)

    # -- replication ------------------------------------------------------------------------------
    def _propose(self, payload: bytes, events: list[Event] | None = None) -> Proposal:
        """Pipeline lock held: hand one payload to Raft (a batch of ``events`` also goes into the
        speculation first). A synchronous refusal (queue full) raises here, before anyone decides
        on the speculation."""
        proposal = Proposal()
        if events:
            self._spec.add(events, payload)
        self._raft.apply_batch(payload, callback=proposal)
        if proposal.done and not proposal.ok:
            self._failed()
            raise _ReplicationFailed(ResponseCode.SYSTEM_ERROR,
                                     f"not proposed (pysyncobj reason {proposal.error})")
        if events:
            self._spec.last = proposal
        return proposal

    def _await(self, proposal: Proposal, timeout_s: float) -> None:
        """Wait until ``proposal`` committed and this node applied it; raise _ReplicationFailed."""
        if not proposal.wait(timeout_s):
            self._failed()  # outcome unknown: the next request re-barriers first
            raise _ReplicationFailed(ResponseCode.SYSTEM_ERROR,
                                     f"not committed within {timeout_s * 1000:.0f} ms; outcome unknown")
        if not proposal.ok:
            self._failed()
            raise _ReplicationFailed(ResponseCode.CONTROLLER_NOT_LEADER,
                                     f"append failed (pysyncobj reason {proposal.error}, result {proposal.result}); "
                                     "leader changed")

    def _failed(self) -> None:
        self._ready_term = None
        self._spec.invalidate("a proposal failed or its outcome is unknown")

    def _replicate(self, term: int, body: bytes, timeout_s: float) -> None:
        """Commit one payload and wait until this node applied it; raise _ReplicationFailed."""
        self._await(self._propose(encode_payload(term, body, self._clock_ms())), timeout_s)

    def _ensure_ready(self, timeout_s: float | None = None) -> int | None:
        """Under the pipeline lock: the term in which this node is a ready leader (its barrier
        committed and applied in that term), or None. Decisions are stamped with this term, so an
        entry that ends up in a later term is fenced at apply time."""
        if not self._raft._isLeader():
            return None
        term = self._raft.raftCurrentTerm
        if self._ready_term == term and self._spec.valid_for(term):
            return term
        try:
            self._replicate(term, b"", self.config.request_timeout_ms / 1000 if timeout_s is None else timeout_s)
        except _ReplicationFailed as exc:
            log.warning("leader barrier failed self=%s term=%d: %s", self.self_address, term, exc.remark)
            return None
        if self._raft._isLeader() and self._raft.raftCurrentTerm == term:
            with self._state_lock:  # the barrier applied behind every earlier proposal
                self._spec.reset(term, self.state)
            self._ready_term = term
            with self._applied:
                self._applied.notify_all()  # wakes wait_ready_leader
            return term
        return None

    def is_leader(self) -> bool:
        """Raft leader whose barrier of the current term committed (RocketMQ's isLeaderState)."""
        return self._raft._isLeader() and self._ready_term == self._raft.raftCurrentTerm

    def _not_leader(self) -> Response:
        leader = self._raft.leader_address()
        header = {"leader_address": leader, "leader_id": self._member_id(leader)}
        return Response.error(ResponseCode.CONTROLLER_NOT_LEADER, "The controller is not in leader state", header)

    def _member_id(self, address: str | None) -> str | None:
        return None if address not in self.members else f"n{self.members.index(address)}"

    # -- public API ---------------------------------------------------------------------------------
    def handle(self, request: Any, timeout_ms: int | None = None, term: int | None = None) -> Response:
        """Serve one controller request through the leader pipeline.

        One overall deadline, ``timeout_ms`` (default ``request_timeout_ms``) from now, bounds the
        whole request: waiting for the pipeline, the leader barrier, the read barrier and the
        commit of its events each get only what is left of it, so a caller whose own timeout is
        longer than this one always gets the answer (``actors/controller_client.py``).

        ``term`` fences the request: it is decided only if this node is the ready leader of exactly
        that term, else NOT_LEADER without effect. A client that gave the request up for a ready
        leader of a later term (``controller/leadership.py``) can then never see it take effect late."""
        if self._closed:
            return Response.error(ResponseCode.CONTROLLER_NOT_LEADER, "controller node closed")
        if isinstance(request, ConsumerHeartbeatRequest):
            return self.consumer_heartbeat(request)  # leader-local, never through Raft
        deadline = time.monotonic() + (timeout_ms or self.config.request_timeout_ms) / 1000

        def left() -> float:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _ReplicationFailed(ResponseCode.SYSTEM_ERROR, "request deadline passed")
            return remaining

        t0 = time.monotonic()
        if not self._pipeline.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return Response.error(ResponseCode.SYSTEM_ERROR, "controller busy: request queue timeout")
        t1 = t2 = t3 = time.monotonic()
        try:
            try:
                ready = self._ensure_ready(left())
                t2 = time.monotonic()
                if ready is None or (term is not None and ready != term):
                    return self._not_leader()
                response, proposal = self._decide(request, ready)
                t3 = time.monotonic()
            finally:
                self._pipeline.release()  # the next request decides while this one commits
            if proposal is not None:
                self._await(proposal, left())
            t4 = time.monotonic()
            if t4 - t0 > SLOW_REQUEST_S:
                log.info("slow request %s took_ms=%.1f lock_ms=%.1f ready_ms=%.1f decide_ms=%.1f commit_ms=%.1f",
                         type(request).__name__, (t4 - t0) * 1000, (t1 - t0) * 1000, (t2 - t1) * 1000,
                         (t3 - t2) * 1000, (t4 - t3) * 1000)
        except _ReplicationFailed as exc:
            if not self._raft._isLeader():
                return self._not_leader()
            return Response.error(exc.code, exc.remark)
        if isinstance(request, ElectMasterRequest) and response.ok and not request.is_controller_trigger:
            self._notify(response, ElectionTrigger.of(request))  # controller triggers: trigger_elect_master
        return response

    def _decide(self, request: Any, term: int) -> tuple[Response, Proposal | None]:
        """Pipeline lock held: decide ``request`` and propose what it needs; the answer may be
        given once the returned proposal (if any) committed and applied here.

        Writes decide on the speculation (applied state + proposals in flight); their events go
        into one entry. A read, or a write without events, waits for a barrier entry behind
        everything it saw (``is_process_read_event``); relaxed (false), a read decides on the
        applied state and waits for nothing, an event-less write waits for the newest proposal
        it saw."""
        write = is_write(request)
        if not write and not self.config.is_process_read_event:
            with self._state_lock:
                return decide(self.state, request, self._context())[0], None
        assert self._spec.state is not None
        with self._state_lock:  # the heartbeat table
            response, events = decide(self._spec.state, request, self._context())
        if events:
            body = encode_events(events)
            if len(body) > MAX_BATCH_BYTES:
                return Response.error(ResponseCode.CONTROLLER_INVALID_REQUEST,
                                      f"the request's events encode to {len(body)} bytes, over {MAX_BATCH_BYTES}"), None
            return response, self._propose(encode_payload(term, body, self._clock_ms()), events)
        if self.config.is_process_read_event:
            return response, self._propose(encode_payload(term, b"", self._clock_ms()))
        return response, self._spec.last

    def _context(self) -> DecideContext:
        now_ms = self._clock_ms()
        alive = self._alive_override or self.heartbeats.alive_predicate(now_ms)
        return DecideContext(alive, self.heartbeats.live_info, self.config.enable_elect_unclean_master)

    def heartbeat(self, request: Any) -> Response:
        """Record a broker heartbeat in this node's local liveness table (never blocks on Raft)."""
        with self._state_lock:
            return self.heartbeats.on_heartbeat(request, self._clock_ms())

    def forget_broker(self, broker_name: str, broker_id: int) -> None:
        """Drop a broker's heartbeat row without acting on it: its session moved to another
        controller with a bye (``SessionServer``), so its liveness is that node's to keep."""
        with self._state_lock:
            self.heartbeats.remove(broker_name, broker_id)

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

    def expire_heartbeats(self) -> list[tuple[str, str, int]]:
        """Drop expired heartbeat rows; on the leader, a dead master triggers an election (5.4).

        Returns the expired `(cluster_name, broker_name, broker_id)`. Call on a timer every
        `scan_not_active_broker_interval_ms`, in a worker thread.
        """
        with self._state_lock:
            expired = self.heartbeats.expire(self._clock_ms())
        with self._consumers_lock:
            self._consumer_table().expire(self._clock_ms())
        if expired and self.is_leader():
            with self._state_lock:
                dead = [(name, bid) for _cluster, name, bid in expired if master_session_closed(self.state, name, bid)]
            for name, broker_id in dead:
                log.info("master inactive, electing group=%s broker_id=%d", name, broker_id)
            if dead:
                self.trigger_elect_masters([name for name, _ in dead])
        return expired

    def on_broker_session_closed(self, broker_name: str, broker_id: int) -> Response | None:
        """A broker's session connection closed without a bye: its process is gone (RocketMQ's
        ``onBrokerChannelClose``). Its heartbeat row goes now instead of at expiry, and on the ready
        leader a group whose master it was is re-elected at once (``trigger_elect_masters``, the same
        path as expiry), batched with the other groups whose masters' sessions closed meanwhile.
        Returns the election's answer, or None when none was needed or another caller's batch
        carries it. Blocks on Raft: call from a worker thread (``SessionServer`` does)."""
        with self._state_lock:
            self.heartbeats.remove(broker_name, broker_id)
            elect = master_session_closed(self.state, broker_name, broker_id)
        if not elect or not self.is_leader():
            return None
        log.info("master session closed, electing group=%s broker_id=%d", broker_name, broker_id)
        return self._elect_coalesced(broker_name)

    def _elect_coalesced(self, broker_name: str) -> Response | None:
        """One batch of elections at a time: a call while a batch commits adds its group to the next
        batch and returns None at once (the running caller elects it after its batch), so a machine
        that held dozens of masters costs a few Raft round trips, not one per group."""
        with self._elect_lock:
            self._elect_pending[broker_name] = None
            if self._electing:
                return None
            self._electing = True
        answer: Response | None = None
        try:
            while True:
                with self._elect_lock:
                    names = list(self._elect_pending)
                    self._elect_pending.clear()
                    if not names:
                        self._electing = False
                        return answer
                answer = self.trigger_elect_masters(names).get(broker_name, answer)
        except BaseException:
            with self._elect_lock:
                self._electing = False
            raise

    def scan_inactive_masters(self) -> list[tuple[str, Response]]:
        """Leader only: re-elect every set whose master is dead but some replica lives (3.3).

        Call on a timer every `scan_inactive_master_interval_ms`, in a worker thread.
        """
        if not self.is_leader():
            return []
        with self._state_lock:
            names = scan_need_reelect_broker_sets(self.state, self._context().alive)
        return list(self.trigger_elect_masters(names).items()) if names else []

    def trigger_elect_master(self, broker_name: str) -> Response:
        """Controller-triggered election with up to `elect_master_max_retry_count` attempts (5.4)."""
        response = Response.error(ResponseCode.CONTROLLER_NOT_LEADER, "not attempted")
        for attempt in range(self.config.elect_master_max_retry_count):
            response = self.handle(ElectMasterRequest.of_controller_trigger(broker_name),
                                   self.config.elect_master_attempt_timeout_ms)
            log.info("controller-triggered election group=%s attempt=%d code=%s", broker_name, attempt + 1,
                     response.code.name)
            if response.ok:
                self._notify(response, ElectionTrigger.CONTROLLER)
                break
            if response.code == ResponseCode.CONTROLLER_NOT_LEADER:
                break
        return response

    def trigger_elect_masters(self, broker_names: list[str]) -> dict[str, Response]:
        """``trigger_elect_master`` for many groups: each attempt decides every group still without an
        answer as one ``ElectMastersRequest`` (one Raft entry per ``MAX_ELECTIONS_PER_ENTRY``
        groups), up to ``elect_master_max_retry_count`` attempts; each group elected is notified."""
        answers: dict[str, Response] = {}
        pending = list(dict.fromkeys(broker_names))
        for attempt in range(self.config.elect_master_max_retry_count):
            retry: list[str] = []
            for start in range(0, len(pending), MAX_ELECTIONS_PER_ENTRY):
                chunk = pending[start:start + MAX_ELECTIONS_PER_ENTRY]
                started = time.monotonic()
                batch = self.handle(ElectMastersRequest(tuple(chunk)), self.config.elect_master_attempt_timeout_ms)
                took_ms = (time.monotonic() - started) * 1000
                got = election_answers(batch)
                for name in chunk:
                    answers[name] = response = got.get(name, batch)
                    if response.ok:
                        self._notify(response, ElectionTrigger.CONTROLLER)
                    elif response.code != ResponseCode.CONTROLLER_NOT_LEADER:
                        retry.append(name)
                log.info("controller-triggered elections groups=%d attempt=%d code=%s elected=%d took_ms=%.1f",
                         len(chunk), attempt + 1, batch.code.name, sum(answers[n].ok for n in chunk), took_ms)
            if not retry or any(a.code == ResponseCode.CONTROLLER_NOT_LEADER for a in answers.values()):
                break
            pending = retry
        return answers

    def _notify(self, response: Response, trigger: ElectionTrigger) -> None:
        """Hand one successful election to ``on_role_changed``, once, with its live members."""
        if self._on_role_changed is None or not self.config.notify_broker_role_changed:
            return
        notice = role_change_notice(response, trigger, self._context().alive)
        if notice is None:
            return
        try:
            self._on_role_changed(notice)
        except Exception:
            log.exception("role-change notification failed")

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
        }
        return status

    def snapshot_state(self) -> dict[str, Any]:
        """A copy of the replicated tables (for tests and admin): ``ControllerState.to_snapshot()``
        plus ``"topics"``, the rows of ``topics_to_snapshot()``."""
        with self._state_lock:
            return {**self.state.to_snapshot(), "topics": self.state.topics_to_snapshot()["topics"]}

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

