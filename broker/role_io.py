"""The vocabulary of the broker's role machine (``rocketray.broker.role``): its inputs, its actions
and the two views it reads (the controller's ``MasterInfo`` and the store's ``StoreFacts``).

Plain frozen dataclasses, no behaviour beyond parsing a controller answer; the rules live in
``role.py``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Mapping, Union

__all__ = [
    "Role", "StoreFacts", "MasterInfo", "ReportOutcome",
    "IdAssigned", "Registered", "Bootstrap", "ElectAnswered", "NewTermAnswered", "ReplicaInfoPolled",
    "RoleChangeNotified", "SwitchDone", "SyncStateSetProposed", "ShrinkChecked", "ReportAnswered",
    "Stopped", "Input",
    "BecomeMaster", "BecomeSlave", "ApplySyncStateSet", "ReportSyncStateSet", "SendHeartbeat",
    "RequestElection", "RequestNewTerm", "SetWritable", "Action",
]


class Role(str, enum.Enum):
    """The one Role enum of a broker (the HA service and the manager share it)."""

    NONE = "none"          # no role yet: before the first switch
    SLAVE = "slave"
    MASTER = "master"
    SYNC_MASTER = "master"  # the reference's name; an alias of MASTER


# ---------------------------------------------------------------------------------------------
# Inputs


@dataclass(frozen=True, slots=True)
class StoreFacts:
    """What the store says now: the last epoch of its epoch file (-1 if empty) and its max offset."""

    last_epoch: int = -1
    max_offset: int = 0


@dataclass(frozen=True, slots=True)
class MasterInfo:
    """The controller's view of the group: who is master at which epoch, and the SyncStateSet."""

    master_broker_id: int | None
    master_address: str | None
    master_epoch: int
    sync_state_set_epoch: int = 0
    sync_state_set: frozenset[int] = frozenset()

    @property
    def names_master(self) -> bool:
        return self.master_broker_id is not None and bool(self.master_address)

    @classmethod
    def from_parts(cls, header: Mapping[str, Any], body: Mapping[str, Any] | None) -> "MasterInfo":
        """From a controller answer or notification: header (master_*) and body (sync_state_set*)."""
        body = body or {}
        sss_epoch = body.get("sync_state_set_epoch")
        if sss_epoch is None:
            sss_epoch = header.get("sync_state_set_epoch")
        master_id = header.get("master_broker_id")
        return cls(None if master_id is None else int(master_id), header.get("master_address") or None,
                   int(header.get("master_epoch") or 0), int(sss_epoch or 0),
                   frozenset(int(i) for i in body.get("sync_state_set") or ()))

    @classmethod
    def from_response(cls, resp: Any) -> "MasterInfo":
        """From a ``rocketray.controller.api.Response`` (header + body)."""
        return cls.from_parts(resp.header or {}, resp.body)


class ReportOutcome(enum.Enum):
    CONFIRMED = "confirmed"  # the controller applied a SyncStateSet (given in the answer)
    REFUSED = "refused"      # the controller answered with an error: nothing changed there
    UNKNOWN = "unknown"      # transport failure or timeout: it may or may not have been applied


@dataclass(frozen=True, slots=True)
class IdAssigned:
    """The registrar made the broker id durable."""

    broker_id: int


@dataclass(frozen=True, slots=True)
class Registered:
    """REGISTER_BROKER succeeded; ``info`` is its answer (it may name no master)."""

    info: MasterInfo


@dataclass(frozen=True, slots=True)
class Bootstrap:
    """The shell's start pass after registration: heartbeat, and elect if no master is known."""


@dataclass(frozen=True, slots=True)
class ElectAnswered:
    """A broker-triggered election answered SUCCESS or MASTER_STILL_EXIST (``info``), or not (None)."""

    info: MasterInfo | None


@dataclass(frozen=True, slots=True)
class NewTermAnswered:
    """The answer to ``RequestNewTerm(old_epoch)``: the elected view on SUCCESS, else None."""

    old_epoch: int
    info: MasterInfo | None


@dataclass(frozen=True, slots=True)
class ReplicaInfoPolled:
    """GET_REPLICA_INFO answered (reference 10.7)."""

    info: MasterInfo


@dataclass(frozen=True, slots=True)
class RoleChangeNotified:
    """NOTIFY_BROKER_ROLE_CHANGED (reference 5.5)."""

    info: MasterInfo


@dataclass(frozen=True, slots=True)
class SwitchDone:
    """The HA service executed the pending ``BecomeMaster``/``BecomeSlave`` (ok) or refused/failed."""

    ok: bool


@dataclass(frozen=True, slots=True)
class SyncStateSetProposed:
    """The HA service proposes a SyncStateSet (an expand, or a member's connection closed)."""

    proposal: frozenset[int]


@dataclass(frozen=True, slots=True)
class ShrinkChecked:
    """The periodic shrink check's candidate set (reference 10.8)."""

    candidate: frozenset[int]


@dataclass(frozen=True, slots=True)
class ReportAnswered:
    """The answer to the ``ReportSyncStateSet`` in flight."""

    outcome: ReportOutcome
    sync_state_set: frozenset[int] = frozenset()
    sync_state_set_epoch: int = 0


@dataclass(frozen=True, slots=True)
class Stopped:
    """Shutdown: fence; no more reports (closing the HA service drops every slave, and reporting
    that shrink would leave a dying master alone in its SyncStateSet)."""


Input = Union[IdAssigned, Registered, Bootstrap, ElectAnswered, NewTermAnswered, ReplicaInfoPolled,
              RoleChangeNotified, SwitchDone, SyncStateSetProposed, ShrinkChecked, ReportAnswered,
              Stopped]


# ---------------------------------------------------------------------------------------------
# Actions


@dataclass(frozen=True, slots=True)
class BecomeMaster:
    """Switch the HA service to master of ``epoch`` (``same``: already master, only a new epoch
    entry). Answer with ``SwitchDone``."""

    epoch: int
    same: bool
    sync_state_set: frozenset[int]
    sync_state_set_epoch: int


@dataclass(frozen=True, slots=True)
class BecomeSlave:
    """Switch the HA service to replicate from ``master_address`` at ``epoch`` (the controller's
    epoch: the HA client refuses a master handshake at another one). Answer with ``SwitchDone``."""

    master_address: str
    epoch: int
    master_broker_id: int
    same: bool


@dataclass(frozen=True, slots=True)
class ApplySyncStateSet:
    """The controller confirmed this set: hand it to the HA service."""

    members: frozenset[int]
    epoch: int


@dataclass(frozen=True, slots=True)
class ReportSyncStateSet:
    """ALTER_SYNC_STATE_SET(proposal) as master of ``master_epoch``; answer with ``ReportAnswered``."""

    proposal: frozenset[int]
    master_epoch: int
    sync_state_set_epoch: int


@dataclass(frozen=True, slots=True)
class SendHeartbeat:
    """Heartbeat every controller now with the store's current progress."""


@dataclass(frozen=True, slots=True)
class RequestElection:
    """A broker-triggered CONTROLLER_ELECT_MASTER; answer with ``ElectAnswered``."""


@dataclass(frozen=True, slots=True)
class RequestNewTerm:
    """Ask for a new-term election instead of resuming ``old_epoch``; answer with ``NewTermAnswered``."""

    old_epoch: int


@dataclass(frozen=True, slots=True)
class SetWritable:
    """Writes are (no longer) accepted on this broker."""

    writable: bool


Action = Union[BecomeMaster, BecomeSlave, ApplySyncStateSet, ReportSyncStateSet, SendHeartbeat,
               RequestElection, RequestNewTerm, SetWritable]
