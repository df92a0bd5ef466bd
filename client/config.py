"""The client's settings: the ``client`` section of ``rocketray.config``.

A producer or consumer takes its defaults from the cluster's configuration (the profile, the
``--config`` file and ``--set client.key=value`` given to ``rocketray start``), and each can be
overridden per instance by the keyword argument of the same name. A value out of range is refused
when the section is built (``ValueError`` naming the key; the producer and consumer turn it into
``InvalidRequest`` at construction), never later in the middle of a poll or a send.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Callable

from rocketray.wire.pull_result import MAX_PULL_BYTES, MAX_PULL_COUNT
from rocketray.client.errors import InvalidRequest
from rocketray.client.retry import DEFAULT_RETRY_DELAYS, FAST_RETRY_DELAYS, delays_problem
from rocketray.schema import KIB, MIB, key

__all__ = ["ClientConfig", "client_config", "settings_problem"]


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """The ``client`` section (Kafka's producer and consumer settings, in rocketray's names)."""

    linger_ms: int = key(0, "send_async: how long a queue's batch waits for more messages (Kafka linger.ms; 0: "
                                 "sent when its queue is idle, later messages batch while one is in flight)")
    batch_bytes: int = key(256 * KIB, "send_async: a queue's batch is sent once it holds this many bytes "
                                      "(Kafka batch.size)")
    max_batch_messages: int = key(1024, "send_async: most messages in one batch")
    max_message_bytes: int = key(4 * MIB, "largest message body plus properties (RocketMQ maxMessageSize)")
    send_timeout_ms: int = key(60_000, "a send is acknowledged or fails within this of its send_async or send "
                                       "call; refused attempts (no master, failover) are retried until then")
    request_timeout_ms: int = key(8_000, "one attempt (put, commit, committed offsets) waits at most this")
    sender_threads: int = key(16, "producer threads sending batches (one batch in flight per queue)")
    buffer_bytes: int = key(32 * MIB, "producer: bytes of messages queued or in flight; send_async waits for room "
                                      "(Kafka buffer.memory)")
    max_block_ms: int = key(60_000, "producer: how long send_async waits for room in the buffer, then raises "
                                    "BufferFull (Kafka max.block.ms)")
    poll_max_messages: int = key(512, f"consumer: most messages one pull of one queue returns (1..{MAX_PULL_COUNT})")
    poll_max_bytes: int = key(4 * MIB, "consumer: most bytes one pull of one queue returns")
    consumer_heartbeat_interval_ms: int = key(1000, "consumer: heartbeat to the controller (group membership) "
                                                    "and rebalance check", 300)
    route_refresh_ms: int = key(5_000, "topic routes are asked of the controller again after this: a consumer "
                                       "group reads a queue added to its topic within this plus a heartbeat", 1_000)
    max_poll_interval_ms: int = key(300_000, "consumer: a member that does not call poll for this long leaves its "
                                             "group (its queues go to the others) until its next poll "
                                             "(Kafka max.poll.interval.ms)")
    max_deliveries: int = key(16, "consumer: a message nacked at its max_deliveries-th delivery (the first counts) "
                                  "goes to the group's dead-letter topic (%DLQ% + the group name) instead of its "
                                  "retry topic (JetStream max_deliver; RocketMQ maxReconsumeTimes counts retries)")
    retry_delays: str = key(DEFAULT_RETRY_DELAYS, "consumer: how long a nacked message waits before its next "
                                                  "delivery, by its failed deliveries (1, 2, ...; the last delay "
                                                  "repeats); the group's retry topic (%RETRY% + the group name) "
                                                  "has one queue per delay (RocketMQ messageDelayLevel format: "
                                                  "ms, s, m, h, d)", FAST_RETRY_DELAYS)

    def __post_init__(self) -> None:
        problem = settings_problem(self)
        if problem is not None:
            raise ValueError(problem)


#: (key, lowest, highest) of every setting; None: no upper bound.
_RANGES: tuple[tuple[str, int, int | None], ...] = (
    ("linger_ms", 0, None), ("batch_bytes", 1, None), ("max_batch_messages", 1, None), ("max_message_bytes", 1, None),
    ("send_timeout_ms", 1, None), ("request_timeout_ms", 1, None), ("sender_threads", 1, 1024),
    ("buffer_bytes", 1, None), ("max_block_ms", 0, None), ("poll_max_messages", 1, MAX_PULL_COUNT),
    ("poll_max_bytes", 1, MAX_PULL_BYTES), ("consumer_heartbeat_interval_ms", 10, None),
    ("route_refresh_ms", 10, None), ("max_poll_interval_ms", 1, None), ("max_deliveries", 1, None))
#: settings that are text, and what checks each
_TEXT: tuple[tuple[str, Callable[[str], str | None]], ...] = (("retry_delays", delays_problem),)


def settings_problem(config: ClientConfig) -> str | None:
    """Why ``config`` cannot be used, naming the key, or None."""
    assert {name for name, _, _ in _RANGES} | {name for name, _ in _TEXT} == {f.name for f in fields(config)}
    for name, check in _TEXT:
        problem = check(getattr(config, name))
        if problem is not None:
            return problem
    for name, low, high in _RANGES:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int):
            return f"client setting {name} must be an int, not {value!r}"
        if value < low or (high is not None and value > high):
            bound = f">= {low}" if high is None else f"within {low}..{high}"
            return f"client setting {name} must be {bound}, not {value}"
    if config.buffer_bytes < config.max_message_bytes:
        return (f"client setting buffer_bytes ({config.buffer_bytes}) must hold one largest message "
                f"(max_message_bytes {config.max_message_bytes})")
    if config.max_poll_interval_ms < config.consumer_heartbeat_interval_ms:
        return "client setting max_poll_interval_ms must be at least consumer_heartbeat_interval_ms"
    return None


def client_config(transport: Any, settings: dict[str, Any]) -> ClientConfig:
    """The cluster's ``client`` section with ``settings`` applied; InvalidRequest naming an unknown
    or out-of-range setting."""
    try:
        base = transport.config().client
    except Exception:  # noqa: BLE001 - a transport without the cluster's config: the defaults
        base = ClientConfig()
    unknown = set(settings) - set(ClientConfig.__dataclass_fields__)
    if unknown:
        raise InvalidRequest(f"unknown client setting(s): {', '.join(sorted(unknown))}")
    try:
        return replace(base, **settings)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
