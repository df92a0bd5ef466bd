"""The timings of a simulated broker (heartbeats, polls, HA ticks, restarts), in virtual ms."""

from __future__ import annotations

from dataclasses import dataclass

from rocketray.broker.config import FlushMode

__all__ = ["BrokerTimings"]


@dataclass(frozen=True, slots=True)
class BrokerTimings:
    heartbeat_ms: int = 200
    heartbeat_timeout_ms: int = 1500
    poll_ms: int = 500
    shrink_ms: int = 500
    not_catchup_ms: int = 3000
    slave_timeout_ms: int = 1000
    ha_tick_ms: int = 20
    ha_heartbeat_ms: int = 500
    ha_housekeeping_ms: int = 3000
    rpc_timeout_ms: int = 600
    restart_min_ms: int = 300
    restart_max_ms: int = 2500
    segment_bytes: int = 4096
    flush_mode: FlushMode = FlushMode.SYNC
    flush_ms: int = 300                 # async flush period (``flush_mode`` ASYNC)
    #: how long a role switch's steps take (stopping replication, starting the epoch durably), drawn
    #: per step; production measures 8-60 ms on 2 cores. (0, 0): a switch ends in the step it starts
    #: (no window in which the replica is promoting or a master is switching away)
    switch_ms: tuple[int, int] = (0, 0)
    #: brokers hold controller sessions, so a killed process is noticed at once (production); off:
    #: the controller learns of deaths by heartbeat expiry only (a power loss, a cut link)
    controller_sessions: bool = True
    #: the product's ``ha.min_in_sync_replicas``: a put is admitted only while this many replicas are
    #: in sync (invariant 11 checks what its PUT_OK promised)
    min_in_sync_replicas: int = 1
