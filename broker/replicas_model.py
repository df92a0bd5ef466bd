"""Plain data of the broker's controller loop: lifecycle, role, its settings, notifications.

Split from ``rocketray.broker.replicas_manager`` (which re-exports every name) to keep that module about
behaviour. Settings are the reference's BrokerConfig keys (§8) in snake_case with units last.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Mapping

from rocketray.controller.api import Response


class State(enum.IntEnum):
    INITIAL = 0
    FIRST_TIME_SYNC_CONTROLLER_METADATA_DONE = 1
    REGISTER_TO_CONTROLLER_DONE = 2
    RUNNING = 3
    SHUTDOWN = 4


class Role(enum.IntEnum):
    SLAVE = 0
    SYNC_MASTER = 1


class ControllerCallError(Exception):
    """What a controller client raises when a call could not be made (transport failure, timeout).

    Any exception with a ``retriable`` attribute is treated the same way.
    """

    def __init__(self, message: str, retriable: bool = True) -> None:
        super().__init__(message)
        self.retriable = retriable


@dataclass(frozen=True, slots=True)
class ReplicasManagerConfig:
    """The broker settings this loop reads (reference §8, snake_case, defaults of the reference)."""

    sync_broker_metadata_period_ms: int = 5000
    check_sync_state_set_period_ms: int = 5000
    sync_controller_metadata_period_ms: int = 10000
    broker_heartbeat_interval_ms: int = 1000
    controller_heartbeat_timeout_ms: int = 10000
    broker_election_priority: int = 2**31 - 1
    start_retry_interval_ms: int = 1000  # between passes of start_basic_service (Java: 5 s, inner retries)

    @classmethod
    def from_section(cls, section: Any) -> "ReplicasManagerConfig":
        """Pick this loop's keys out of any object with those attributes (e.g. rocketray.config.BrokerConfig)."""
        names = cls.__dataclass_fields__
        return cls(**{n: getattr(section, n) for n in names if hasattr(section, n)})


@dataclass(frozen=True, slots=True)
class RoleChangeNotification:
    """NOTIFY_BROKER_ROLE_CHANGED (reference §5.5) as plain data."""

    master_broker_id: int | None
    master_address: str | None
    master_epoch: int
    sync_state_set_epoch: int
    sync_state_set: frozenset[int]

    @classmethod
    def from_response(cls, resp: Response) -> "RoleChangeNotification":
        """From a successful elect response (header + body), as the controller's notifier builds it."""
        body = resp.body or {}
        return cls(resp.header.get("master_broker_id"), resp.header.get("master_address"),
                   int(resp.header.get("master_epoch") or 0), int(resp.header.get("sync_state_set_epoch") or 0),
                   frozenset(body.get("sync_state_set") or ()))

    @classmethod
    def coerce(cls, n: Any) -> "RoleChangeNotification":
        if isinstance(n, cls):
            return n
        if isinstance(n, Response):
            return cls.from_response(n)
        if isinstance(n, Mapping):
            return cls(n.get("master_broker_id"), n.get("master_address"), int(n.get("master_epoch") or 0),
                       int(n.get("sync_state_set_epoch") or 0), frozenset(n.get("sync_state_set") or ()))
        raise TypeError(f"not a role-change notification: {n!r}")
