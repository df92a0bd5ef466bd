"""Replicated controller tables (reference section 3.1) and ``apply(event)`` (section 3.4).

Two tables keyed by broker name, exactly as RocketMQ's ReplicasInfoManager keeps them:

- ``replica_info``: per broker-set, the cluster name, the next broker id to hand out and the map
  broker id -> (address, register check code);
- ``sync_state``: per broker-set, the master id (or None), the master epoch, the SyncStateSet and
  the SyncStateSet epoch.

and rocketray's own third table (there is no nameserver):

- ``topics``: topic name -> the broker group of each queue (index = queue id). It names groups,
  never replicas, so a master switch inside a group leaves every route as it is;
- ``auth``: the users and ACL table with its version (``rocketray.controller.auth_table``), an
  immutable value that each user or ACL event replaces.

A broker-set "exists" only when it is present in both tables. State changes only through
``apply``, which is deterministic, has no clock or randomness, and never raises for a well-typed
event: events that refer to missing sets are ignored as the reference does. Applying the same
event sequence to a fresh state therefore yields equal tables, which is what lets every Raft node
(and a snapshot + journal replay) agree. ``to_snapshot``/``from_snapshot`` turn the tables into
plain lists/dicts (msgpack-encodable, no int map keys) and back; the topic table and the users and
ACL table travel in their own snapshot sections (``topics_to_snapshot``, ``auth_to_snapshot``), so
a snapshot written before either existed still loads.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable, NewType

from rocketray.controller.auth_table import AuthTable
from rocketray.controller.events import (AUTH_EVENTS, AlterSyncStateSetEvent, ApplyBrokerIdEvent, CleanBrokerDataEvent,
                                         CreateTopicEvent, DeleteTopicEvent, ElectMasterEvent, Event, ReadEvent,
                                         UpdateBrokerAddressEvent, broker_name_of)

BrokerId = NewType("BrokerId", int)
Epoch = NewType("Epoch", int)
Offset = NewType("Offset", int)

FIRST_BROKER_CONTROLLER_ID = 1
SNAPSHOT_VERSION = 1
TOPICS_SNAPSHOT_VERSION = 1


@dataclass(slots=True)
class BrokerReplicaInfo:
    """Registered replicas of one broker-set. ``next_assign_broker_id`` = number of adds + 1."""

    cluster_name: str
    broker_name: str
    next_assign_broker_id: int = FIRST_BROKER_CONTROLLER_ID
    broker_id_info: dict[int, tuple[str, str]] = field(default_factory=dict)

    def add_broker(self, broker_id: int, address: str, register_check_code: str) -> None:
        self.broker_id_info[broker_id] = (address, register_check_code)
        self.next_assign_broker_id += 1

    def address_of(self, broker_id: int | None) -> str | None:
        if broker_id is None or broker_id not in self.broker_id_info:
            return None
        return self.broker_id_info[broker_id][0]


@dataclass(slots=True)
class SyncStateInfo:
    """Master and SyncStateSet of one broker-set, each with its epoch."""

    cluster_name: str
    broker_name: str
    master_broker_id: int | None = None
    master_epoch: int = 0
    sync_state_set: set[int] = field(default_factory=set)
    sync_state_set_epoch: int = 0

    @property
    def is_first_time_for_elect(self) -> bool:
        return self.master_epoch == 0

    def update_master_info(self, master_broker_id: int | None) -> None:
        self.master_broker_id = master_broker_id
        self.master_epoch += 1

    def update_sync_state_set(self, new_set: set[int] | frozenset[int]) -> None:
        self.sync_state_set = set(new_set)
        self.sync_state_set_epoch += 1


def _copy_replica(row: BrokerReplicaInfo | None) -> BrokerReplicaInfo | None:
    """A copy ``apply`` cannot change (what ``copy.deepcopy`` gave, at a tenth of its cost: the
    rows' only mutable fields are the id map and the set; ids, strings and tuples are immutable)."""
    if row is None:
        return None
    return BrokerReplicaInfo(row.cluster_name, row.broker_name, row.next_assign_broker_id, dict(row.broker_id_info))


def _copy_sync(row: SyncStateInfo | None) -> SyncStateInfo | None:
    if row is None:
        return None
    return SyncStateInfo(row.cluster_name, row.broker_name, row.master_broker_id, row.master_epoch,
                         set(row.sync_state_set), row.sync_state_set_epoch)


class ControllerState:
    """The replicated tables plus ``apply``. Compare with ``==`` (tables only)."""

    __slots__ = ("replica_info", "sync_state", "topics", "auth")

    def __init__(self) -> None:
        self.replica_info: dict[str, BrokerReplicaInfo] = {}
        self.sync_state: dict[str, SyncStateInfo] = {}
        self.topics: dict[str, tuple[str, ...]] = {}
        self.auth = AuthTable()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ControllerState):
            return NotImplemented
        return (self.replica_info == other.replica_info and self.sync_state == other.sync_state
                and self.topics == other.topics and self.auth == other.auth)

    def __repr__(self) -> str:
        return f"ControllerState({self.to_snapshot()!r}, topics={self.topics!r}, auth={self.auth!r})"

    # -- queries ----------------------------------------------------------------------------
    def contains(self, broker_name: str) -> bool:
        """The reference's ``isContainsBroker``: present in both tables."""
        return broker_name in self.replica_info and broker_name in self.sync_state

    def broker_names(self) -> list[str]:
        return sorted(n for n in self.replica_info if n in self.sync_state)

    # -- apply ------------------------------------------------------------------------------
    def apply(self, event: Event) -> None:
        """Apply one committed event with the semantics of reference section 3.4."""
        if isinstance(event, AlterSyncStateSetEvent):
            self._apply_alter(event)
        elif isinstance(event, ApplyBrokerIdEvent):
            self._apply_broker_id(event)
        elif isinstance(event, ElectMasterEvent):
            self._apply_elect(event)
        elif isinstance(event, CleanBrokerDataEvent):
            self._apply_clean(event)
        elif isinstance(event, UpdateBrokerAddressEvent):
            self._apply_update_address(event)
        elif isinstance(event, CreateTopicEvent):
            if event.broker_names:  # a topic without queues is malformed: ignored
                self.topics[event.topic] = tuple(event.broker_names)
        elif isinstance(event, DeleteTopicEvent):
            self.topics.pop(event.topic, None)
        elif isinstance(event, AUTH_EVENTS):
            self.auth = self.auth.applied(event)
        elif isinstance(event, ReadEvent):
            return
        else:
            raise TypeError(f"not a controller event: {event!r}")

    def apply_all(self, events: list[Event]) -> None:
        for event in events:
            self.apply(event)

    def apply_batch(self, events: list[Event], after_each: Callable[[Event], None] | None = None) -> None:
        """Apply a committed batch all or nothing: if an event raises, the rows the batch touched
        are put back as they were and the exception propagates. ``apply`` is deterministic, so
        every replica fails the same batch the same way and ends in the same state."""
        names = {n for n in map(broker_name_of, events) if n is not None}
        saved = {n: (_copy_replica(self.replica_info.get(n)), _copy_sync(self.sync_state.get(n))) for n in names}
        saved_topics = {e.topic: self.topics.get(e.topic) for e in events
                        if isinstance(e, (CreateTopicEvent, DeleteTopicEvent))}
        saved_auth = self.auth  # immutable: keeping the reference is the copy
        try:
            for event in events:
                self.apply(event)
                if after_each is not None:
                    after_each(event)
        except Exception:
            for name, (replica, sync) in saved.items():
                for table, row in ((self.replica_info, replica), (self.sync_state, sync)):
                    if row is None:
                        table.pop(name, None)
                    else:
                        table[name] = row  # type: ignore[index,assignment]  # the pair is (table, its own row type)
            for topic, assignment in saved_topics.items():
                if assignment is None:
                    self.topics.pop(topic, None)
                else:
                    self.topics[topic] = assignment
            self.auth = saved_auth
            raise

    def _apply_alter(self, event: AlterSyncStateSetEvent) -> None:
        if self.contains(event.broker_name):
            self.sync_state[event.broker_name].update_sync_state_set(event.new_sync_state_set)

    def _apply_broker_id(self, event: ApplyBrokerIdEvent) -> None:
        name = event.broker_name
        if self.contains(name):
            replica = self.replica_info[name]
            if event.new_broker_id not in replica.broker_id_info:
                replica.add_broker(event.new_broker_id, event.broker_address, event.register_check_code)
            return
        replica = BrokerReplicaInfo(event.cluster_name, name)
        replica.add_broker(event.new_broker_id, event.broker_address, event.register_check_code)
        self.replica_info[name] = replica
        self.sync_state[name] = SyncStateInfo(event.cluster_name, name)

    def _apply_elect(self, event: ElectMasterEvent) -> None:
        if not self.contains(event.broker_name):
            return  # the reference logs an error and ignores it
        info = self.sync_state[event.broker_name]
        if not event.new_master_elected:
            info.update_master_info(None)
        elif event.new_master_broker_id is not None:  # "elected nobody" is malformed: ignored
            info.update_master_info(event.new_master_broker_id)
            info.update_sync_state_set({event.new_master_broker_id})

    def _apply_clean(self, event: CleanBrokerDataEvent) -> None:
        name = event.broker_name
        if not event.broker_id_set_to_clean:
            self.replica_info.pop(name, None)
            self.sync_state.pop(name, None)
            return
        if not self.contains(name):
            return
        replica, sync = self.replica_info[name], self.sync_state[name]
        for broker_id in event.broker_id_set_to_clean:
            replica.broker_id_info.pop(broker_id, None)
            sync.sync_state_set.discard(broker_id)
        if not replica.broker_id_info:
            del self.replica_info[name]
        if not sync.sync_state_set:
            del self.sync_state[name]

    def _apply_update_address(self, event: UpdateBrokerAddressEvent) -> None:
        replica = self.replica_info.get(event.broker_name)
        if replica is None or event.broker_id not in replica.broker_id_info:
            return
        _, check_code = replica.broker_id_info[event.broker_id]
        replica.broker_id_info[event.broker_id] = (event.broker_address, check_code)

    # -- snapshot ---------------------------------------------------------------------------
    def to_snapshot(self) -> dict[str, Any]:
        """Plain msgpack-encodable form (string keys only, sorted lists of rows)."""
        replicas = [[r.broker_name, r.cluster_name, r.next_assign_broker_id,
                     [[bid, addr, code] for bid, (addr, code) in sorted(r.broker_id_info.items())]]
                    for _, r in sorted(self.replica_info.items())]
        syncs = [[s.broker_name, s.cluster_name, s.master_broker_id, s.master_epoch,
                  sorted(s.sync_state_set), s.sync_state_set_epoch]
                 for _, s in sorted(self.sync_state.items())]
        return {"version": SNAPSHOT_VERSION, "replica_info": replicas, "sync_state": syncs}

    def topics_to_snapshot(self) -> dict[str, Any]:
        """The topic table as its own snapshot section: ``{"version": 1, "topics": [[name, [broker
        names by queue id]], ...]}`` sorted by name."""
        return {"version": TOPICS_SNAPSHOT_VERSION,
                "topics": [[name, list(groups)] for name, groups in sorted(self.topics.items())]}

    def auth_to_snapshot(self) -> dict[str, Any]:
        """The users and ACL table as its own snapshot section (``AuthTable.to_plain``)."""
        return self.auth.to_plain()

    @staticmethod
    def _topics_from_snapshot(data: Any) -> dict[str, tuple[str, ...]]:
        if not isinstance(data, dict) or data.get("version") != TOPICS_SNAPSHOT_VERSION:
            raise ValueError("unsupported topics snapshot section")
        topics: dict[str, tuple[str, ...]] = {}
        for row in data.get("topics", ()):
            if (not isinstance(row, (list, tuple)) or len(row) != 2 or not isinstance(row[0], str)
                    or not isinstance(row[1], (list, tuple)) or not row[1]
                    or not all(isinstance(g, str) for g in row[1])):
                raise ValueError(f"malformed topics snapshot row: {row!r:.80}")
            topics[row[0]] = tuple(row[1])
        return topics

    @classmethod
    def from_snapshot(cls, data: dict[str, Any], topics: dict[str, Any] | None = None,
                      auth: dict[str, Any] | None = None) -> ControllerState:
        """Inverse of ``to_snapshot`` (and of ``topics_to_snapshot`` / ``auth_to_snapshot`` when
        ``topics`` / ``auth`` is given; a snapshot without a section has no topics, or no users).
        Raises ``ValueError`` on a malformed snapshot."""
        if not isinstance(data, dict) or data.get("version") != SNAPSHOT_VERSION:
            raise ValueError("unsupported controller snapshot")
        state = cls()
        if topics is not None:
            state.topics = cls._topics_from_snapshot(topics)
        if auth is not None:
            state.auth = AuthTable.from_plain(auth)
        try:
            for name, cluster, next_id, ids in data["replica_info"]:
                info = BrokerReplicaInfo(str(cluster), str(name), int(next_id))
                info.broker_id_info = {int(b): (str(a), str(c)) for b, a, c in ids}
                state.replica_info[info.broker_name] = info
            for name, cluster, master, m_epoch, sss, s_epoch in data["sync_state"]:
                state.sync_state[str(name)] = SyncStateInfo(
                    str(cluster), str(name), None if master is None else int(master), int(m_epoch),
                    {int(b) for b in sss}, int(s_epoch))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed controller snapshot: {exc}") from exc
        return state
