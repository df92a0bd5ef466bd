"""What the actors answer their callers: frozen dataclasses instead of dicts read with ``.get``.

A broker's ``status()`` is a :class:`BrokerStatus` (its HA part a nested :class:`HAStatus`), its
``get_messages`` a list of :class:`StoredMessage`; a controller's ``metadata()`` is a
:class:`ControllerMetadata` and its ``watch_master`` answer a :class:`MasterView`. Roles are the
broker's one :class:`~rocketray.broker.role.Role` enum, so a replica with no role yet reads ``NONE``
(not ``slave``). These types cross Ray by pickle and stay inside the cluster; what leaves it as JSON
(``rocketray status --json``, analytics records) goes through :func:`to_json`, which keeps the
field names as keys and writes enums by name (``MASTER``, ``SLAVE``, ``NONE``).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple

from rocketray.broker.role import Role

__all__ = ["BrokerStatus", "ControllerMetadata", "EpochEntry", "HAConnection", "HAStatus", "MasterView",
           "QueuePosition", "Role", "StoredMessage", "to_json"]


class EpochEntry(NamedTuple):
    """One epoch-file entry: ``[epoch, start_offset, end_offset]`` in JSON (a list: the documented
    ``--json`` shape)."""

    epoch: int
    start_offset: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class QueuePosition:
    """One consume queue's positions (``MessageStore.queue_positions``)."""

    topic: str
    queue_id: int
    min_offset: int
    max_offset: int
    visible_offset: int


@dataclass(frozen=True, slots=True)
class HAConnection:
    """One slave connected to this master's HA service."""

    slave_id: int | None
    peer: str
    ack_offset: int
    async_learner: bool
    state: str


@dataclass(frozen=True, slots=True)
class HAStatus:
    """The HA service's view (``HAService.status()``); ``epoch_entries`` are ``(epoch, start)`` pairs."""

    broker_id: int
    role: Role
    epoch: int
    max_offset: int
    confirm_offset: int
    epoch_entries: tuple[tuple[int, int], ...]
    sync_state_set: tuple[int, ...]
    sync_state_set_view: tuple[int, ...]
    pending_proposals: tuple[tuple[int, ...], ...]
    synchronizing: bool
    connections: tuple[HAConnection, ...]
    master_address: str | None
    slave_connected: bool
    slave_last_error: str
    rejected_connections: int

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> HAStatus:
        """From ``HAService.status()`` (a dict the HA module keeps); every key is required."""
        return cls(
            broker_id=d["broker_id"], role=Role(d["role"]), epoch=d["epoch"], max_offset=d["max_offset"],
            confirm_offset=d["confirm_offset"], epoch_entries=tuple((e[0], e[1]) for e in d["epoch_entries"]),
            sync_state_set=tuple(d["sync_state_set"]), sync_state_set_view=tuple(d["sync_state_set_view"]),
            pending_proposals=tuple(tuple(p) for p in d["pending_proposals"]),
            synchronizing=bool(d["synchronizing"]),
            connections=tuple(HAConnection(c["slave_id"], c["peer"], c["ack_offset"], c["async_learner"],
                                           c["state"]) for c in d["connections"]),
            master_address=d["master_address"], slave_connected=d["slave_connected"],
            slave_last_error=d["slave_last_error"], rejected_connections=d["rejected_connections"])


@dataclass(frozen=True, slots=True)
class BrokerStatus:
    """One replica as its broker actor sees it (``BrokerService.status()``).

    ``running``: the lifecycle reached RUNNING; ``role``: MASTER only once the switch to master is
    done (``is_running_master`` is what a writer waits for); ``ha`` is None until the controller gave
    this replica its broker id and the HA service started."""

    group: str
    replica: int
    ha_address: str
    broker_id: int | None
    state: str
    running: bool
    role: Role
    fenced: bool
    master_broker_id: int | None
    master_address: str | None
    master_epoch: int
    sync_state_set: tuple[int, ...]
    sync_state_set_epoch: int
    min_offset: int
    max_offset: int
    confirm_offset: int
    epoch_entries: tuple[EpochEntry, ...]
    queues: tuple[QueuePosition, ...]
    ha: HAStatus | None
    pid: int
    controller_session: str | None
    max_loop_stall_ms: float
    #: acknowledged bytes the store's start-up recovery did not find (``MessageStore.lost_confirmed_bytes``)
    lost_confirmed_bytes: int = 0

    @property
    def is_master(self) -> bool:
        return self.role == Role.MASTER

    @property
    def is_running_master(self) -> bool:
        return self.running and self.role == Role.MASTER

    @property
    def is_running_slave(self) -> bool:
        return self.running and self.role == Role.SLAVE


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """One message as a replica stores it (``BrokerService.get_messages``); ``broker_id`` is the
    answering replica's (None before it has one)."""

    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    body: bytes
    properties: Mapping[str, str]
    store_timestamp_ms: int
    broker_id: int | None


@dataclass(frozen=True, slots=True)
class ControllerMetadata:
    """One controller's word about itself (``ControllerService.metadata()``): identity, Raft role and
    progress typed; ``raft`` holds the node's other counters (journal, snapshots kept, speculation,
    timings: ``ControllerNode.metadata()``) under their own keys, which JSON writes alongside."""

    index: int
    self_address: str
    self_id: str | None
    leader_address: str | None
    leader_id: str | None
    is_leader: bool
    raft_role: str
    term: int
    peers: tuple[str, ...]
    commit_index: int
    applied_index: int
    snapshot_last_index: int
    snapshots_saved: int
    broker_sessions: int | None
    session_grace_deaths: int
    raft: Mapping[str, Any]

    @classmethod
    def from_node(cls, index: int, md: Mapping[str, Any], broker_sessions: int | None,
                  session_grace_deaths: int) -> ControllerMetadata:
        """From ``ControllerNode.metadata()`` (every typed key required) and the actor's own counters."""
        typed = {f.name for f in dataclasses.fields(cls)} - {"index", "broker_sessions", "session_grace_deaths",
                                                             "raft"}
        return cls(index=index, self_address=md["self_address"], self_id=md["self_id"],
                   leader_address=md["leader_address"], leader_id=md["leader_id"], is_leader=bool(md["is_leader"]),
                   raft_role=md["raft_role"], term=int(md["term"]), peers=tuple(md["peers"]),
                   commit_index=int(md["commit_index"]), applied_index=int(md["applied_index"]),
                   snapshot_last_index=int(md["snapshot_last_index"] or 0),
                   snapshots_saved=int(md["snapshots_saved"] or 0), broker_sessions=broker_sessions,
                   session_grace_deaths=session_grace_deaths,
                   raft={k: v for k, v in md.items() if k not in typed})

    def to_json_dict(self) -> dict[str, Any]:
        """The flat JSON object ``rocketray status --json`` prints per controller (documented keys)."""
        out = {f.name: to_json(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "raft"}
        return {**to_json(self.raft), **out}


@dataclass(frozen=True, slots=True)
class MasterView:
    """One group's master as a controller applied it (``ControllerService.watch_master``): epoch -1 and
    no master when the group is unknown there."""

    master_epoch: int
    master_broker_id: int | None
    master_address: str | None


def _json_value(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, Mapping):
        return {k: _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    return value


def to_json(view: Any) -> Any:
    """A view as JSON-ready data: field names as keys, enums by name, tuples as lists."""
    if isinstance(view, ControllerMetadata):
        return view.to_json_dict()
    if dataclasses.is_dataclass(view) and not isinstance(view, type):
        return {f.name: to_json(getattr(view, f.name)) for f in dataclasses.fields(view)}
    if isinstance(view, tuple) and hasattr(view, "_fields"):  # EpochEntry: a list, the documented shape
        return [to_json(v) for v in view]
    if isinstance(view, (list, tuple)):
        return [to_json(v) for v in view]
    if isinstance(view, Mapping):
        return {k: to_json(v) for k, v in view.items()}
    return _json_value(view)
