"""Requests and responses of the controller API, as plain frozen data.

These types are the seam between the broker (ReplicasManager), the clients, the admin tools, the
Raft shell and the pure decide functions. Everything is plain data (str, int, bool, None, tuples of
str or int, frozensets of ints, dicts, and a user's ``ScramCredential`` record) so that a Ray call or a socket can carry it; nothing here
knows about transport. Field names are the snake_case forms of the RocketMQ header fields
(reference section 6.1). Topics, consumer-group membership, users and ACL rules are rocketray's own
(no nameserver: the controller holds the topic table and the users and ACL table, see
docs/controller.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from rocketray.wire.controller_codes import ResponseCode
from rocketray.scram import ScramCredential
from rocketray.wire.controller_headers import (HEADER_TYPES, NO_HEADER, ElectMasterResponseHeader,
                                               GetReplicaInfoResponseHeader, RegisterBrokerToControllerResponseHeader,
                                               ResponseHeader)

INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class GetNextBrokerIdRequest:
    cluster_name: str
    broker_name: str


@dataclass(frozen=True, slots=True)
class ApplyBrokerIdRequest:
    cluster_name: str
    broker_name: str
    applied_broker_id: int
    register_check_code: str


@dataclass(frozen=True, slots=True)
class RegisterBrokerRequest:
    cluster_name: str
    broker_name: str
    broker_id: int
    broker_address: str


@dataclass(frozen=True, slots=True)
class ElectMasterRequest:
    """Elect a master; ``broker_id == -1`` means controller-triggered (reference section 4.1)."""

    cluster_name: str
    broker_name: str
    broker_id: int = -1
    designate_elect: bool = False
    invoke_time_ms: int = 0
    #: Sent by the sitting master after a restart: it must not resume a term from before the restart,
    #: so the controller elects afresh among the live SyncStateSet by progress; on equal progress a
    #: replica that did not restart is preferred; whoever wins (possibly the requester) gets a new epoch.
    new_term: bool = False
    #: With ``new_term``: the requester's progress now (last epoch, max offset; -1 unknown). The
    #: election ranks the restarted master by this, not by its heartbeat row, which may still hold
    #: what it reported before the restart (a heartbeat and this request can arrive in either order;
    #: found by the simulator, scenario violation-6).
    epoch: int = -1
    max_offset: int = -1

    @classmethod
    def of_new_term(cls, cluster_name: str, broker_name: str, broker_id: int, epoch: int = -1,
                    max_offset: int = -1) -> ElectMasterRequest:
        return cls(cluster_name, broker_name, broker_id, new_term=True, epoch=epoch, max_offset=max_offset)

    @classmethod
    def of_controller_trigger(cls, broker_name: str) -> ElectMasterRequest:
        return cls("", broker_name)

    @classmethod
    def of_broker_trigger(cls, cluster_name: str, broker_name: str, broker_id: int) -> ElectMasterRequest:
        return cls(cluster_name, broker_name, broker_id)

    @classmethod
    def of_admin_trigger(cls, cluster_name: str, broker_name: str, broker_id: int) -> ElectMasterRequest:
        return cls(cluster_name, broker_name, broker_id, designate_elect=True)

    @property
    def is_controller_trigger(self) -> bool:
        return self.broker_id < 0


@dataclass(frozen=True, slots=True)
class ElectMastersRequest:
    """Controller-triggered elections of many groups decided together and committed in one Raft
    entry (``decide_elect_masters``): a machine that dies can hold dozens of masters, and one Raft
    round trip per group made their failover grow with their number. The answer's body is
    ``{"elections": [[broker_name, code, header, body, remark], ...]}``, one row per distinct name
    in order, each what ``ElectMasterRequest.of_controller_trigger(name)`` would have answered."""

    broker_names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class AlterSyncStateSetRequest:
    broker_name: str
    master_broker_id: int
    master_epoch: int
    new_sync_state_set: frozenset[int]
    sync_state_set_epoch: int
    invoke_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class GetReplicaInfoRequest:
    broker_name: str


@dataclass(frozen=True, slots=True)
class GetSyncStateDataRequest:
    broker_names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CleanBrokerDataRequest:
    cluster_name: str | None
    broker_name: str
    broker_controller_ids_to_clean: str | None
    clean_living_broker: bool = False
    invoke_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class BrokerHeartbeatRequest:
    cluster_name: str
    broker_name: str
    broker_address: str
    broker_id: int
    epoch: int = -1
    max_offset: int = -1
    confirm_offset: int = -1
    heartbeat_timeout_ms: int = 10000
    election_priority: int = INT32_MAX


@dataclass(frozen=True, slots=True)
class CreateTopicRequest:
    """Create ``topic`` with ``queues`` queues, or extend it to that many (a write; idempotent).

    Queue ``i`` of a new topic goes to broker group ``sorted(groups)[i % len(groups)]``; an extension
    keeps every existing assignment and continues the round robin. Shrinking is refused (2005).
    Answer header: ``{"topic", "queues": [[queue_id, broker_name], ...], "created": bool}``."""

    topic: str
    queues: int


@dataclass(frozen=True, slots=True)
class DeleteTopicRequest:
    """Forget ``topic`` (a write). TOPIC_NOT_EXIST (17) if unknown; header ``{"topic"}``."""

    topic: str


@dataclass(frozen=True, slots=True)
class GetTopicRouteRequest:
    """The queue -> broker group assignment of ``topic`` (a read). Header ``{"topic", "queues"}``;
    TOPIC_NOT_EXIST (17) if unknown."""

    topic: str


@dataclass(frozen=True, slots=True)
class ListTopicsRequest:
    """Every topic with its queue count (a read). Header ``{"topics": {name: queue_count}}``."""


@dataclass(frozen=True, slots=True)
class ConsumerHeartbeatRequest:
    """A consumer group member's heartbeat, served by the controller leader from a local table that
    is not replicated (``rocketray.controller.consumers``). ``leaving=True`` removes the member at
    once. Header ``{"group", "members": sorted live client ids}``; a follower answers NOT_LEADER."""

    group: str
    client_id: str
    topics: tuple[str, ...]
    leaving: bool = False


@dataclass(frozen=True, slots=True)
class CreateUserRequest:
    """Create user ``name`` with the SCRAM record the admin tool derived from its secret (a write).
    USER_ALREADY_EXIST (3003) if the name is taken by another record; the same record and flag
    again is SUCCESS without an event (a retry). Header ``UserResponseHeader``."""

    name: str
    credential: ScramCredential
    superuser: bool = False


@dataclass(frozen=True, slots=True)
class UpdateUserRequest:
    """Replace ``name``'s record (a new secret) and/or its superuser flag; None keeps it (a write).
    USER_NOT_EXIST (3001) if unknown. Header ``UserResponseHeader``."""

    name: str
    credential: ScramCredential | None = None
    superuser: bool | None = None


@dataclass(frozen=True, slots=True)
class DeleteUserRequest:
    """Forget ``name`` and its ACL rules (a write). USER_NOT_EXIST (3001) if unknown."""

    name: str


@dataclass(frozen=True, slots=True)
class ListUsersRequest:
    """Every user with its superuser flag, never a key (a read). Header ``ListUsersResponseHeader``."""


@dataclass(frozen=True, slots=True)
class CreateAclRequest:
    """Give ``user`` one rule per resource: ``actions`` with ``decision`` (mqadmin createAcl's ``-r -a
    -d`` strings, ``rocketray.acl.parse_rules``; a write). POLICY_ALREADY_EXIST (3004) if the user
    has another rule on one of the resources; the same rules again are SUCCESS without an event.
    Header ``AclRulesResponseHeader``: the user's rules after the request."""

    user: str
    resources: tuple[str, ...]
    actions: tuple[str, ...]
    decision: str


@dataclass(frozen=True, slots=True)
class UpdateAclRequest:
    """Replace ``user``'s rule on each resource (a write); POLICY_NOT_EXIST (3002) for a resource
    it has no rule on. Header ``AclRulesResponseHeader``."""

    user: str
    resources: tuple[str, ...]
    actions: tuple[str, ...]
    decision: str


@dataclass(frozen=True, slots=True)
class DeleteAclRequest:
    """Remove ``user``'s rules on ``resources`` (every rule when empty; a write); POLICY_NOT_EXIST
    (3002) for a resource it has no rule on. Header ``AclRulesResponseHeader``."""

    user: str
    resources: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class GetAclRequest:
    """``user``'s rules (a read); USER_NOT_EXIST (3001) if unknown. Header ``AclRulesResponseHeader``."""

    user: str


@dataclass(frozen=True, slots=True)
class ListAclsRequest:
    """Every rule (a read), of ``user`` only when given, and only rules whose resource text contains
    ``resource`` when given (mqadmin listAcl's filters). Header ``AclRulesResponseHeader``."""

    user: str = ""
    resource: str = ""


@dataclass(frozen=True, slots=True)
class GetAuthTableRequest:
    """The whole users and ACL table if its version is above ``since_version`` (a read; members ask
    with the version they hold, -1 for none). Header ``AuthTableResponseHeader(version, changed)``;
    when changed, ``body["table"]`` is ``AuthTable.to_plain()`` (read it with
    ``rocketray.controller.users.auth_table_of``). Holds every user's keys: members only."""

    since_version: int = -1


Request = Union[
    GetNextBrokerIdRequest, ApplyBrokerIdRequest, RegisterBrokerRequest, ElectMasterRequest, ElectMastersRequest,
    AlterSyncStateSetRequest, GetReplicaInfoRequest, GetSyncStateDataRequest, CleanBrokerDataRequest,
    BrokerHeartbeatRequest, CreateTopicRequest, DeleteTopicRequest, GetTopicRouteRequest, ListTopicsRequest,
    ConsumerHeartbeatRequest, CreateUserRequest, UpdateUserRequest, DeleteUserRequest, ListUsersRequest,
    CreateAclRequest, UpdateAclRequest, DeleteAclRequest, GetAclRequest, ListAclsRequest, GetAuthTableRequest,
]


@dataclass(frozen=True, slots=True)
class Response:
    """The answer to one request: a code, the request kind's typed header
    (``rocketray.wire.controller_headers``; ``NO_HEADER`` when it has none), an optional body, a remark."""

    code: ResponseCode
    header: ResponseHeader = NO_HEADER
    body: dict[str, Any] | None = None
    remark: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.header, HEADER_TYPES):
            raise TypeError(f"a Response header is a typed header (wire/controller_headers.py), "
                            f"not {type(self.header).__name__}")

    @property
    def ok(self) -> bool:
        return self.code == ResponseCode.SUCCESS

    @classmethod
    def error(cls, code: ResponseCode, remark: str, header: ResponseHeader = NO_HEADER) -> Response:
        return cls(code, header, None, remark)


@dataclass(frozen=True, slots=True)
class MasterInfo:
    """The controller's view of one group as a broker reads it: who is master at which epoch, and the
    SyncStateSet. It is what the controller pushes after an election (NOTIFY_BROKER_ROLE_CHANGED,
    reference 5.5: master id, address and epoch, SyncStateSet epoch, the set as body) and what a
    broker takes from the answers to REGISTER_BROKER, ELECT_MASTER and GET_REPLICA_INFO."""

    master_broker_id: int | None
    master_address: str | None
    master_epoch: int
    sync_state_set_epoch: int = 0
    sync_state_set: frozenset[int] = frozenset()

    @property
    def names_master(self) -> bool:
        return self.master_broker_id is not None and bool(self.master_address)

    @classmethod
    def from_response(cls, resp: Response) -> MasterInfo:
        """From a register, elect or replica-info answer: its header (master_*) and body
        (sync_state_set*); an answer with another header names no master (epoch 0)."""
        header, body = resp.header, resp.body or {}
        if not isinstance(header, (RegisterBrokerToControllerResponseHeader, ElectMasterResponseHeader,
                                   GetReplicaInfoResponseHeader)):
            return cls(None, None, 0)
        sss_epoch = body.get("sync_state_set_epoch")
        if sss_epoch is None and not isinstance(header, GetReplicaInfoResponseHeader):
            sss_epoch = header.sync_state_set_epoch
        return cls(header.master_broker_id, header.master_address or None, header.master_epoch or 0,
                   int(sss_epoch or 0), frozenset(int(i) for i in body.get("sync_state_set") or ()))
