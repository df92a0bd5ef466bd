"""HA configuration: the MessageStoreConfig HA keys of reference section 8, in snake_case."""

from __future__ import annotations

from dataclasses import dataclass

from rocketray.schema import MIB, key

__all__ = ["HAConfig", "DEFAULT_TRANSFER_BATCH_SIZE"]

# Chosen by measurement (benchmarks/bench_replication.py, table in docs/ha.md): with the slave's
# zero-copy receive 1-2 MiB batches are the plateau, ~1.3x 256 KiB and ~1.5x 128 KiB.
DEFAULT_TRANSFER_BATCH_SIZE = 1024 * 1024


@dataclass(frozen=True, slots=True)
class HAConfig:
    """The HA service's settings and the ``ha`` section of ``rocketray.config`` (reference §8
    MessageStoreConfig, HA part; each key with its meaning and fast-profile value)."""

    ha_send_heartbeat_interval_ms: int = key(5000, "idle heartbeat / offset report interval", 200)
    ha_housekeeping_interval_ms: int = key(20000, "connection dead after this long without reads", 3000)
    ha_transfer_batch_size: int = key(DEFAULT_TRANSFER_BATCH_SIZE, "max body per transfer packet (upstream "
                                      "32 KiB; 1 MiB measured faster here, docs/ha.md)")
    ha_confirm_push_delay_ms: int = key(3, "a moved confirm offset reaches idle slaves this long after the "
                                        "last transfer (rocketray: a busy master's next transfer carries it)")
    ha_max_time_slave_not_catchup_ms: int = key(15000, "SyncStateSet shrink threshold", 3000)
    slave_timeout_ms: int = key(3000, "bound on the replica-ack wait of a put", 1000)
    in_sync_replicas: int = key(1, "acks needed including the master when all-ack is off")
    min_in_sync_replicas: int = key(1, "minimum SyncStateSet size to accept writes")
    # rocketray default True (upstream False): a put is acknowledged only once every SyncStateSet
    # member has it, so no acknowledged message is lost when the master fails over.
    all_ack_in_sync_state_set: bool = key(True, "wait for every SyncStateSet member before acking a put "
                                                "(rocketray default; upstream false)")
    sync_from_last_file: bool = key(False, "an empty slave starts copying from the master's last segment")
    async_learner: bool = key(False, "this replica never joins the SyncStateSet")
    # rocketray additions (no upstream key)
    ha_reconnect_backoff_min_ms: int = key(100, "slave reconnect backoff, lower bound (upstream: fixed 5 s)")
    ha_reconnect_backoff_max_ms: int = key(5000, "slave reconnect backoff, upper bound", 1000)
    ha_auth_timeout_ms: int = key(5000, "the HA connection's auth exchange must finish within this")
    ha_max_body_bytes: int = key(64 * MIB, "a transfer body above this is a protocol error")

    def __post_init__(self) -> None:
        assert self.ha_send_heartbeat_interval_ms > 0
        assert self.ha_housekeeping_interval_ms > self.ha_send_heartbeat_interval_ms
        assert 0 <= self.ha_confirm_push_delay_ms <= self.ha_send_heartbeat_interval_ms
        assert 0 < self.ha_transfer_batch_size <= self.ha_max_body_bytes
        assert self.ha_max_time_slave_not_catchup_ms > 0
        assert self.slave_timeout_ms > 0
        assert self.in_sync_replicas >= 0 and self.min_in_sync_replicas >= 1
        assert 0 < self.ha_reconnect_backoff_min_ms <= self.ha_reconnect_backoff_max_ms
