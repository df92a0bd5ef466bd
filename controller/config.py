"""ControllerConfig: the keys of reference section 7 in snake_case, plus Raft timing and snapshots.

All durations are milliseconds (units last in the name). `raft_sync_obj_conf` turns the Raft part
into pysyncobj's `SyncObjConf` keyword arguments; docs/controller.md lists every key and default
and explains the timing choices.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """Configuration of one controller node. Frozen; derive variants with `with_(...)`."""

    # -- reference section 7 (RocketMQ ControllerConfig) --------------------------------------
    scan_not_active_broker_interval_ms: int = 5000
    controller_thread_pool_nums: int = 16
    controller_request_thread_pool_queue_capacity: int = 50000
    controller_store_path: str = ""
    elect_master_max_retry_count: int = 3
    enable_elect_unclean_master: bool = False
    # RocketMQ's isProcessReadEvent (default false there). Here reads are linearizable by default:
    # each read first commits an empty batch through the log (a read barrier). False relaxes it to
    # "read the leader's applied state", which may be stale during a leader change.
    is_process_read_event: bool = True
    notify_broker_role_changed: bool = True
    scan_inactive_master_interval_ms: int = 5000
    # -- RIP-59 snapshots -----------------------------------------------------------------------
    snapshot_threshold: int = 1000
    max_snapshot_reserved_num: int = 3
    # -- event log (controller/event_log.py) ------------------------------------------------------
    event_log_segment_bytes: int = 8 << 20
    event_log_segments_kept: int = 8
    # -- request pipeline -----------------------------------------------------------------------
    request_timeout_ms: int = 5000          # RocketMQ's WAIT_TIMEOUT_OUT: commit wait per request
    elect_master_attempt_timeout_ms: int = 3000  # per controller-triggered election attempt (5.4)
    # -- Raft timing (pysyncobj) ------------------------------------------------------------------
    raft_min_timeout_ms: int = 400          # follower waits a random [min, max) without a leader
    raft_max_timeout_ms: int = 1000         # ... before it stands for election
    append_entries_period_ms: int = 5       # leader heartbeat / batch period (< min timeout / 3)
    tick_period_ms: int = 5                 # how long one tick waits for socket events
    append_entries_use_batch: bool = False  # False: send each command at once (lowest latency)
    connection_timeout_ms: int = 3500       # silence after which a peer connection is dropped
    connection_retry_ms: int = 500          # reconnect attempts to a down peer
    leader_fallback_timeout_ms: int = 3000  # leader without a majority for this long steps down
    commands_queue_size: int = 100_000

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
        if self.elect_master_max_retry_count < 1:
            problems.append("elect_master_max_retry_count must be >= 1")
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
