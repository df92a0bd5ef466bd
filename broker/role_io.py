"""The vocabulary of the broker's role machine (``rocketray.broker.role``): its inputs, its actions
and the two views it reads (the controller's ``MasterInfo`` and the store's ``StoreFacts``).

Plain frozen dataclasses; the rules live in ``role.py``. ``MasterInfo`` is the controller API's
(``rocketray.wire.controller_api``: it is what the controller notifies and answers), re-exported here.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Union

from rocketray.wire.controller_api import MasterInfo

__all__ = [
    "Role", "Lifecycle", "StoreFacts", "MasterInfo", "ReportOutcome",
    "IdAssigned", "LeaderFound", "Registered", "Bootstrap", "ElectAnswered", "NewTermAnswered",
    "ReplicaInfoPolled", "RoleChangeNotified", "SwitchDone", "SyncStateSetProposed", "ShrinkChecked",
    "ReportAnswered", "Stopped", "SwitchOrdered", "SyncStateSetOrdered", "Input",
    "BecomeMaster", "BecomeSlave", "ServeAsMaster", "FollowMaster", "ApplySyncStateSet",
    "ReportSyncStateSet", "SendHeartbeat", "RequestElection", "RequestNewTerm", "SetWritable", "Action",
]


class Role(enum.StrEnum):
    """The one Role enum of a broker (the HA service and the manager share it).

    A role has one spelling wherever it is written (status answers, ``--json`` output, logs, metrics,
    chaos run files): its name, upper case as RocketMQ writes broker roles. Each value equals its name,
    so ``role``, ``role.value``, ``role.name`` and ``f"{role}"`` all give it; there are no aliases.
    """

    NONE = "NONE"      # no role yet: before the first switch
    SLAVE = "SLAVE"
    MASTER = "MASTER"


class Lifecycle(enum.IntEnum):
    """Where the broker is in its start (reference 10.2): it accepts writes only while RUNNING."""

    INITIAL = 0
    FIRST_TIME_SYNC_CONTROLLER_METADATA_DONE = 1   # a controller leader is known
    REGISTER_TO_CONTROLLER_DONE = 2                # REGISTER_BROKER answered
    RUNNING = 3                                    # registered and a master known (possibly me)
    SHUTDOWN = 4


# ---------------------------------------------------------------------------------------------
# Inputs


@dataclass(frozen=True, slots=True)
class StoreFacts:
    """What the store says now: the last epoch of its epoch file (-1 if empty), its max offset and
    its confirm offset."""

    last_epoch: int = -1
    max_offset: int = 0
    confirm_offset: int = 0


class ReportOutcome(enum.Enum):
    CONFIRMED = "confirmed"  # the controller applied a SyncStateSet (given in the answer)
    REFUSED = "refused"      # the controller answered with an error: nothing changed there
    UNKNOWN = "unknown"      # transport failure or timeout: it may or may not have been applied


@dataclass(frozen=True, slots=True)
class IdAssigned:
    """The registrar made the broker id durable."""

    broker_id: int


@dataclass(frozen=True, slots=True)
class LeaderFound:
    """The shell found the controller leader (INITIAL -> FIRST_TIME_SYNC_CONTROLLER_METADATA_DONE)."""


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


@dataclass(frozen=True, slots=True)
class SwitchOrdered:
    """A standalone HA endpoint (no controller: HA tests, benchmarks, a slave process) is ordered to
    switch: ``switch`` is the ``BecomeMaster``/``BecomeSlave`` to run if the HA preconditions hold."""

    switch: "BecomeMaster | BecomeSlave"


@dataclass(frozen=True, slots=True)
class SyncStateSetOrdered:
    """A standalone HA endpoint is given its SyncStateSet (no controller to confirm one)."""

    members: frozenset[int]


Input = Union[IdAssigned, LeaderFound, Registered, Bootstrap, ElectAnswered, NewTermAnswered,
              ReplicaInfoPolled, RoleChangeNotified, SwitchDone, SyncStateSetProposed, ShrinkChecked,
              ReportAnswered, Stopped, SwitchOrdered, SyncStateSetOrdered]


# ---------------------------------------------------------------------------------------------
# Actions


@dataclass(frozen=True, slots=True)
class BecomeMaster:
    """Switch the HA service to master of ``epoch`` (``same``: already master, only a new epoch
    entry): stop replicating (unless ``same``), cut a torn tail (``cut_torn_tail``) and start the
    epoch at the max offset. Answer with ``SwitchDone``; the role is taken at ``ServeAsMaster``."""

    epoch: int
    same: bool
    sync_state_set: frozenset[int]
    sync_state_set_epoch: int

    @property
    def cut_torn_tail(self) -> bool:
        """A promotion cuts a torn last record before its epoch starts, so the new epoch never
        begins inside a record its slaves would refuse; the same master only adds an epoch entry."""
        return not self.same

    @property
    def new_term(self) -> bool:
        """A promotion starts a new term: no SyncStateSet proposal of an earlier term counts."""
        return not self.same


@dataclass(frozen=True, slots=True)
class BecomeSlave:
    """Switch the HA service to replicate from ``master_address`` at ``epoch`` (the controller's
    epoch: the HA client refuses a master handshake at another one): stop replicating unless
    ``same`` (the same master). Answer with ``SwitchDone``; the link starts at ``FollowMaster``.
    ``master_broker_id`` is None only for a standalone endpoint ordered to follow an address."""

    master_address: str | None
    epoch: int
    master_broker_id: int | None
    same: bool


@dataclass(frozen=True, slots=True)
class ServeAsMaster:
    """The switch to master of ``epoch`` is committed: serve slaves (``new_term``: forget the
    proposals of an earlier term), recompute the confirm offset, wake waiting puts."""

    epoch: int
    new_term: bool


@dataclass(frozen=True, slots=True)
class FollowMaster:
    """The switch to slave of ``master_address`` at ``epoch`` is committed: start the HA link (or
    tell the running one the new epoch), answer waiting puts."""

    master_address: str | None
    epoch: int


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
    """Writes are accepted on this broker from now on (``writable``) or refused from now on."""

    writable: bool


Action = Union[BecomeMaster, BecomeSlave, ServeAsMaster, FollowMaster, ApplySyncStateSet, ReportSyncStateSet,
               SendHeartbeat, RequestElection, RequestNewTerm, SetWritable]
