"""ControllerConfig: the keys of reference section 7 in snake_case, plus Raft timing and snapshots.

All durations are milliseconds (units last in the name). `raft_sync_obj_conf` turns the Raft part
into pysyncobj's `SyncObjConf` keyword arguments; docs/controller.md lists every key and default
and explains the timing choices.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from rocketray.controller.raft_wire import WORST_MESSAGE_BYTES
from rocketray.schema import MIB, key, niceness_key, niceness_problem


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """Configuration of one controller node and the ``controller`` section of ``rocketray.config``.

    Frozen; derive variants with `with_(...)`. Each key carries its meaning and fast-profile value
    (``rocketray.schema.key``)."""

    # -- reference section 7 (RocketMQ ControllerConfig) --------------------------------------
    scan_not_active_broker_interval_ms: int = key(5000, "heartbeat-expiry scan period", 300)
    scan_inactive_master_interval_ms: int = key(5000, "leader's scan for dead masters", 500)
    elect_master_max_retry_count: int = key(3, "controller-triggered election attempts")
    enable_elect_unclean_master: bool = key(False, "allow electing a master outside the SyncStateSet")
    # RocketMQ's isProcessReadEvent (default false there). Here reads are linearizable by default:
    # each read first commits an empty batch through the log (a read barrier). False relaxes it to
    # "read the leader's applied state", which may be stale during a leader change.
    is_process_read_event: bool = key(True, "reads pass a Raft read barrier (reference default false: "
                                            "linearizable reads chosen on purpose)")
    notify_broker_role_changed: bool = key(True, "push role-change notifications to brokers")
    # -- RIP-59 snapshots -----------------------------------------------------------------------
    snapshot_threshold: int = key(1000, "committed entries between controller snapshots (RIP-59)")
    max_snapshot_reserved_num: int = key(3, "controller snapshots kept (RIP-59)")
    # -- event log (controller/event_log.py) ------------------------------------------------------
    event_log_segment_bytes: int = key(8 * MIB, "controller event-log segment size in bytes")
    event_log_segments_kept: int = key(8, "controller event-log segments kept (bounds its disk use)")
    # -- consumer groups (controller/consumers.py) -------------------------------------------------
    consumer_heartbeat_timeout_ms: int = key(10000, "a consumer group member without a heartbeat this long "
                                                    "leaves its group", 1500)
    # -- request pipeline -----------------------------------------------------------------------
    # RocketMQ's WAIT_TIMEOUT_OUT: commit wait per request
    request_timeout_ms: int = key(5000, "wait for a write's commit before failing the request", 3000)
    elect_master_attempt_timeout_ms: int = key(3000, "per controller-triggered election attempt", 2000)
    # -- Raft timing (pysyncobj) ------------------------------------------------------------------
    # a follower waits a random [min, max) without a leader before it stands for election
    raft_min_timeout_ms: int = key(400, "Raft election timeout, lower bound", 200)
    raft_max_timeout_ms: int = key(1000, "Raft election timeout, upper bound", 450)
    # leader heartbeat / batch period (< min timeout / 3)
    append_entries_period_ms: int = key(30, "Raft leader heartbeat / batch period", 15)
    tick_period_ms: int = key(15, "how long one Raft tick waits for socket events")
    append_entries_use_batch: bool = key(False, "batch commands per append (False: lowest latency)")
    connection_timeout_ms: int = key(3500, "silence after which a Raft peer connection is dropped", 1000)
    connection_retry_ms: int = key(500, "reconnect period to a down Raft peer", 100)
    leader_fallback_timeout_ms: int = key(3000, "a leader without a majority this long steps down", 1500)
    commands_queue_size: int = key(100_000, "Raft commands queue bound")
    # -- the Raft port (controller/raft_port.py, docs/security.md) ---------------------------------
    raft_max_frame_bytes: int = key(2 * MIB, "largest Raft message a peer may send, checked at its length prefix "
                                             f"(at least {WORST_MESSAGE_BYTES}, the largest pysyncobj sends)")
    raft_handshake_timeout_ms: int = key(5000, "a Raft connection's TLS handshake and address claim complete "
                                               "within this (and connection_timeout_ms), or it is closed")
    raft_max_connections: int = key(64, "open connections on the Raft listener")
    raft_max_connections_per_address: int = key(8, "open Raft listener connections from one peer host")
    # -- the process (actors/priority.py) ------------------------------------------------------------
    process_niceness: int | None = niceness_key("controller")

    def with_(self, **changes: Any) -> ControllerConfig:
        return replace(self, **changes)

    def validate(self) -> None:
        """Raise ValueError on inconsistent settings (pysyncobj asserts the same relations)."""
        problems = []
        if self.snapshot_threshold < 2:
            problems.append("snapshot_threshold must be >= 2")
        if self.max_snapshot_reserved_num < 1:
            problems.append("max_snapshot_reserved_num must be >= 1")
        if self.event_log_segment_bytes < 4096 or self.event_log_segments_kept < 1:
            problems.append("event_log_segment_bytes must be >= 4096 and event_log_segments_kept >= 1")
        if self.raft_min_timeout_ms <= 3 * self.append_entries_period_ms:
            problems.append("raft_min_timeout_ms must exceed 3 * append_entries_period_ms")
        if self.raft_max_timeout_ms <= self.raft_min_timeout_ms:
            problems.append("raft_max_timeout_ms must exceed raft_min_timeout_ms")
        if self.connection_timeout_ms < self.raft_max_timeout_ms:
            problems.append("connection_timeout_ms must be >= raft_max_timeout_ms")
        if self.leader_fallback_timeout_ms <= self.append_entries_period_ms:
            problems.append("leader_fallback_timeout_ms must exceed append_entries_period_ms")
        if self.tick_period_ms <= 0 or self.request_timeout_ms <= 0:
            problems.append("tick_period_ms and request_timeout_ms must be positive")
        if self.consumer_heartbeat_timeout_ms <= 0:
            problems.append("consumer_heartbeat_timeout_ms must be positive")
        if self.elect_master_max_retry_count < 1:
            problems.append("elect_master_max_retry_count must be >= 1")
        if self.raft_max_frame_bytes < WORST_MESSAGE_BYTES:
            problems.append(f"raft_max_frame_bytes must be >= {WORST_MESSAGE_BYTES} (the largest Raft message)")
        if self.raft_handshake_timeout_ms <= 0:
            problems.append("raft_handshake_timeout_ms must be positive")
        if not 1 <= self.raft_max_connections_per_address <= self.raft_max_connections:
            problems.append("raft_max_connections_per_address must be within 1..raft_max_connections")
        if (problem := niceness_problem(self.process_niceness)) is not None:
            problems.append(problem)
        if problems:
            raise ValueError("invalid ControllerConfig: " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def for_tests(cls, **changes: Any) -> ControllerConfig:
        """Tight timing for loopback tests: elections in a few hundred ms, fast reconnects."""
        base = cls(raft_min_timeout_ms=300, raft_max_timeout_ms=700, connection_timeout_ms=1500,
                   connection_retry_ms=100, leader_fallback_timeout_ms=2000, request_timeout_ms=3000,
                   elect_master_attempt_timeout_ms=2000, scan_inactive_master_interval_ms=1000)
        return replace(base, **changes)
