"""HA configuration: the MessageStoreConfig HA keys of reference section 8, in snake_case."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HAConfig", "DEFAULT_TRANSFER_BATCH_SIZE"]

# Chosen by measurement (benchmarks/bench_replication.py, table in docs/ha.md): upstream's 32 KiB
# runs at about half the throughput of the 128-512 KiB plateau; 256 KiB is its middle.
DEFAULT_TRANSFER_BATCH_SIZE = 256 * 1024


@dataclass(frozen=True, slots=True)
class HAConfig:
    ha_send_heartbeat_interval_ms: int = 5000
    ha_housekeeping_interval_ms: int = 20000
    ha_transfer_batch_size: int = DEFAULT_TRANSFER_BATCH_SIZE
    ha_max_time_slave_not_catchup_ms: int = 15000
    slave_timeout_ms: int = 3000
    in_sync_replicas: int = 1
    min_in_sync_replicas: int = 1
    # rocketray default True (upstream False): a put is acknowledged only once every SyncStateSet
    # member has it, so no acknowledged message is lost when the master fails over.
    all_ack_in_sync_state_set: bool = True
    sync_from_last_file: bool = False
    async_learner: bool = False
    # rocketray additions (no upstream key)
    ha_reconnect_backoff_min_ms: int = 100      # slave reconnect backoff (upstream: fixed 5 s)
    ha_reconnect_backoff_max_ms: int = 5000
    ha_auth_timeout_ms: int = 5000              # auth exchange must finish within this
    ha_max_body_bytes: int = 64 * 1024 * 1024   # a transfer body above this is a protocol error

    def __post_init__(self) -> None:
        assert self.ha_send_heartbeat_interval_ms > 0
        assert self.ha_housekeeping_interval_ms > self.ha_send_heartbeat_interval_ms
        assert 0 < self.ha_transfer_batch_size <= self.ha_max_body_bytes
        assert self.ha_max_time_slave_not_catchup_ms > 0
        assert self.slave_timeout_ms > 0
        assert self.in_sync_replicas >= 0 and self.min_in_sync_replicas >= 1
        assert 0 < self.ha_reconnect_backoff_min_ms <= self.ha_reconnect_backoff_max_ms
