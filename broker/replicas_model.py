"""Plain data of the broker's controller loop: lifecycle, its settings, notifications.

Split from ``rocketray.broker.replicas_manager`` (which re-exports every name) to keep that module about
behaviour. Settings are the reference's BrokerConfig keys (§8) in snake_case with units last. The
role, its epoch and the SyncStateSet belong to ``rocketray.broker.role`` (the one ``Role`` enum is
defined there and re-exported here).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Mapping

from rocketray.broker.role import MasterInfo, Role
from rocketray.controller.api import Response

__all__ = ["State", "Role", "ControllerCallError", "ReplicasManagerConfig", "RoleChangeNotification",
           "notification_from"]


class State(enum.IntEnum):
    INITIAL = 0
    FIRST_TIME_SYNC_CONTROLLER_METADATA_DONE = 1
    REGISTER_TO_CONTROLLER_DONE = 2
    RUNNING = 3
    SHUTDOWN = 4


class ControllerCallError(Exception):
    """What a controller client raises when a call could not be made (transport failure, timeout)."""

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


RoleChangeNotification = MasterInfo
"""NOTIFY_BROKER_ROLE_CHANGED (reference §5.5) as typed data: the controller's view of the group."""


def notification_from(n: MasterInfo | Response | Mapping[str, Any]) -> MasterInfo:
    """The typed notification from what crosses the actor boundary: the record itself, an elect
    response (header + body), or the flat mapping the controller actor sends."""
    if isinstance(n, MasterInfo):
        return n
    if isinstance(n, Response):
        return MasterInfo.from_response(n)
    if isinstance(n, Mapping):
        return MasterInfo.from_parts(n, n)
    raise TypeError(f"not a role-change notification: {n!r}")
