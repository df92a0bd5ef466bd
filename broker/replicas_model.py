"""Plain data and ports of the broker's controller loop: lifecycle, its settings, notifications, and
the interfaces it is given (controller client, store, HA factory).

Split from ``rocketray.broker.replicas_manager`` (which re-exports every name) to keep that module about
behaviour. Settings are the reference's BrokerConfig keys (§8) in snake_case with units last. The
lifecycle, the role, its epoch and the SyncStateSet belong to ``rocketray.broker.role`` (the one
``Role`` and ``Lifecycle`` enums are defined there and re-exported here; ``State`` is ``Lifecycle``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping, Protocol

from rocketray.broker.role import Lifecycle, MasterInfo, Role, RoleMachine
from rocketray.wire.controller_api import BrokerHeartbeatRequest, Response
from rocketray.broker.replication_port import HAPort
from rocketray.schema import INT_MAX, key, niceness_key, niceness_problem

__all__ = ["State", "Role", "ControllerCallError", "ControllerClient", "EpochFileView", "HAFactory",
           "ReplicasManagerConfig", "RoleChangeNotification", "StorePort"]


State = Lifecycle
"""The broker's lifecycle (reference 10.2): the role machine's, its one owner (re-exported)."""


class ControllerCallError(Exception):
    """What a controller client raises when a call could not be made (transport failure, timeout)."""

    def __init__(self, message: str, retriable: bool = True) -> None:
        super().__init__(message)
        self.retriable = retriable


@dataclass(frozen=True, slots=True)
class ReplicasManagerConfig:
    """The broker settings this loop reads and the ``broker`` section of ``rocketray.config``
    (reference §8, snake_case, defaults of the reference)."""

    sync_broker_metadata_period_ms: int = key(5000, "poll the controller for replica info", 500)
    check_sync_state_set_period_ms: int = key(5000, "master's SyncStateSet shrink check", 500)
    sync_controller_metadata_period_ms: int = key(10000, "refresh the controller leader address", 500)
    controller_heartbeat_timeout_ms: int = key(10000, "timeout the controller applies to this broker", 1500)
    broker_heartbeat_interval_ms: int = key(1000, "heartbeat period to every controller", 200)
    broker_election_priority: int = key(INT_MAX, "election tie-break, lower is preferred")
    # Java: 5 s, with inner retries
    start_retry_interval_ms: int = key(1000, "between attempts to register and find a master", 200)
    # the process (actors/priority.py)
    process_niceness: int | None = niceness_key("broker")

    def __post_init__(self) -> None:
        if (problem := niceness_problem(self.process_niceness)) is not None:
            raise ValueError(problem)


RoleChangeNotification = MasterInfo
"""NOTIFY_BROKER_ROLE_CHANGED (reference §5.5): the controller's view of the group, the one shape a
notification has (``rocketray.controller.notify.RoleChangeNotice.notification``)."""


# ---------------------------------------------------------------------------------------------
# Ports


class ControllerClient(Protocol):
    """How the broker reaches the controller (``rocketray.actors.controller_client.AsyncControllerClient``)."""

    async def call(self, request: object, address: str | None = None) -> Response:
        """Send to ``address`` (the believed leader); raises on transport failure."""

    async def heartbeat(self, request: BrokerHeartbeatRequest) -> None:
        """Heartbeat the controller leader on the broker's session (``ControllerSession.heartbeat``),
        or every controller node through Ray when the controllers have no session port."""

    async def metadata(self) -> list[Mapping[str, Any]]:
        """Every reachable controller node's metadata, each with ``"leader_address"`` (None if unknown)."""


class EpochFileView(Protocol):
    def last_epoch(self) -> int: ...


class StorePort(Protocol):
    """The store facts the manager reads (``rocketray.broker.store.MessageStore``)."""

    @property
    def max_offset(self) -> int: ...

    @property
    def confirm_offset(self) -> int: ...

    @property
    def epoch_file(self) -> EpochFileView: ...


HAFactory = Callable[[int, RoleMachine], Awaitable[HAPort]]
"""Builds the HA service for the broker id, reading role, epoch and SyncStateSet from the machine."""
