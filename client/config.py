"""The client's settings: the ``client`` section of ``rocketray.config``.

A producer or consumer takes its defaults from the cluster's configuration (the profile, the
``--config`` file and ``--set client.key=value`` given to ``rocketray start``), and each can be
overridden per instance by the keyword argument of the same name.
"""

from __future__ import annotations

from dataclasses import dataclass

from rocketray.schema import KIB, MIB, key

__all__ = ["ClientConfig"]


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """The ``client`` section (Kafka's producer and consumer settings, in rocketray's names)."""

    linger_ms: int = key(0, "send_async: how long a queue's batch waits for more messages (Kafka linger.ms; 0: "
                                 "sent when its queue is idle, later messages batch while one is in flight)")
    batch_bytes: int = key(256 * KIB, "send_async: a queue's batch is sent once it holds this many bytes "
                                      "(Kafka batch.size)")
    max_batch_messages: int = key(1024, "send_async: most messages in one batch")
    max_message_bytes: int = key(4 * MIB, "largest message body plus properties (RocketMQ maxMessageSize)")
    send_timeout_ms: int = key(60_000, "a send retries refused attempts (no master, failover) until this passes")
    request_timeout_ms: int = key(8_000, "one attempt (put, commit, committed offsets) waits at most this")
    sender_threads: int = key(16, "producer threads sending batches (one batch in flight per queue)")
    poll_max_messages: int = key(512, "consumer: most messages one pull of one queue returns")
    poll_max_bytes: int = key(4 * MIB, "consumer: most bytes one pull of one queue returns")
    consumer_heartbeat_interval_ms: int = key(1000, "consumer: heartbeat to the controller (group membership) "
                                                    "and rebalance check", 300)
