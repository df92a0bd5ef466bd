"""Pure decisions of the controller (reference sections 3.5 and 4.2).

Each ``decide_*`` reads a ``ControllerState`` and returns ``(Response, events)`` without mutating
anything. The Raft shell replicates the events and applies them (on every node) before it
answers; reads return no events. Liveness and live info come in through ``DecideContext`` so the
decisions are deterministic functions of (state, request, context). Topic requests and user and ACL
requests (rocketray's own) are decided in ``controller/topics.py`` and ``controller/users.py``;
``decide`` dispatches to them like to the others.

Deliberate fixes of reference section 18 made here (each pinned by a ``test_quirk*`` test):
- Q2: a controller-triggered election that finds nobody emits ``ElectMasterEvent(False)`` only
  when a master is currently set; with no master it answers 2004 with no event, so retries cannot
  inflate the master epoch.
- Q3: the first-ever election accepts the requesting broker only if it is registered and alive;
  otherwise the policy runs (and usually answers 2012/2004).
- Q6: alterSyncStateSet checks invalid master (2002), fenced master epoch (2000) and fenced
  SyncStateSet epoch (2001) before "no change" (2013).
- Cleaning the current master's id also emits ``ElectMasterEvent(False)`` first, so a master is
  never left outside its SyncStateSet (an invariant of reference section 19).
- Cleaning ids that would empty the SyncStateSet while other ids stay registered is refused
  (2009): RocketMQ would drop the sync-state row but keep the replica row, after which the set
  looks unknown, id 1 is handed out again and the old rows are overwritten (ids reused).

Sizes and shapes are bounded first, before anything is replicated (``check_request_limits`` in
``rocketray.controller.limits``): an oversized or badly shaped request is answered
CONTROLLER_INVALID_REQUEST (2005) with no event.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from rocketray.controller import users
from rocketray.wire.controller_api import (AlterSyncStateSetRequest, ApplyBrokerIdRequest, CleanBrokerDataRequest,
                                           CreateTopicRequest, DeleteTopicRequest, ElectMasterRequest,
                                           ElectMastersRequest, GetNextBrokerIdRequest, GetReplicaInfoRequest,
                                           GetSyncStateDataRequest, GetTopicRouteRequest, ListTopicsRequest,
                                           RegisterBrokerRequest, Response)
from rocketray.wire.controller_codes import ResponseCode as C
from rocketray.controller.election import contains_log, elect, rank_key
from rocketray.wire.controller_headers import (NO_HEADER, AlterSyncStateSetResponseHeader, ApplyBrokerIdResponseHeader,
                                               ElectMasterResponseHeader, ElectMastersResponseHeader,
                                               GetNextBrokerIdResponseHeader, GetReplicaInfoResponseHeader,
                                               RegisterBrokerToControllerResponseHeader)
from rocketray.controller.events import (AlterSyncStateSetEvent, ApplyBrokerIdEvent, CleanBrokerDataEvent,
                               ElectMasterEvent, Event, UpdateBrokerAddressEvent)
from rocketray.controller.heartbeat import BrokerLiveInfo, HeartbeatTable
from rocketray.controller.limits import check_request_limits
from rocketray.controller.state import FIRST_BROKER_CONTROLLER_ID, ControllerState
from rocketray.controller.topics import (decide_create_topic, decide_delete_topic, decide_get_topic_route,
                                         decide_list_topics)
from rocketray.identity import member_of_check_code

Decision = tuple[Response, list[Event]]
Alive = Callable[[str, int], bool]
_IDS_FORMAT = re.compile(r"^\s*-?[0-9]+\s*$")


def _always_alive(broker_name: str, broker_id: int) -> bool:
    return True


@dataclass(frozen=True, slots=True)
class DecideContext:
    """What a decision may know besides the tables: liveness, live info, unclean election."""

    alive: Alive = _always_alive
    live_info: Optional[Callable[[str, int], Optional[BrokerLiveInfo]]] = None
    enable_elect_unclean_master: bool = False

    @classmethod
    def from_heartbeats(cls, table: HeartbeatTable, now_ms: int,
                        enable_elect_unclean_master: bool = False) -> DecideContext:
        return cls(table.alive_predicate(now_ms), table.live_info, enable_elect_unclean_master)


def _sss_body(ids: set[int] | frozenset[int], epoch: int) -> dict[str, Any]:
    return {"sync_state_set": sorted(ids), "sync_state_set_epoch": epoch}


def decide_get_next_broker_id(state: ControllerState, req: GetNextBrokerIdRequest) -> Decision:
    """Next id to apply for: 1 for an unknown set, else adds + 1 (Q5 KEPT: ids never reused)."""
    replica = state.replica_info.get(req.broker_name) if state.contains(req.broker_name) else None
    next_id = FIRST_BROKER_CONTROLLER_ID if replica is None else replica.next_assign_broker_id
    return Response(C.SUCCESS, GetNextBrokerIdResponseHeader(req.cluster_name, req.broker_name, next_id)), []


def decide_apply_broker_id(state: ControllerState, req: ApplyBrokerIdRequest) -> Decision:
    """Claim an id; idempotent when re-applied with the same register check code."""
    header = ApplyBrokerIdResponseHeader(req.cluster_name, req.broker_name)
    address = req.register_check_code.split(";", 1)[0]
    event = ApplyBrokerIdEvent(req.cluster_name, req.broker_name, address, req.register_check_code,
                               req.applied_broker_id)
    if not state.contains(req.broker_name):
        if req.applied_broker_id == FIRST_BROKER_CONTROLLER_ID:
            return Response(C.SUCCESS, header), [event]
        return Response.error(C.CONTROLLER_BROKER_ID_INVALID, (
            f"Broker-set: {req.broker_name} hasn't been registered in controller, but broker try to "
            f"apply brokerId: {req.applied_broker_id}"), header), []
    known = state.replica_info[req.broker_name].broker_id_info.get(req.applied_broker_id)
    if known is None or known[1] == req.register_check_code:
        return Response(C.SUCCESS, header), [event]
    return Response.error(C.CONTROLLER_BROKER_ID_INVALID, (
        f"Fail to apply brokerId: {req.applied_broker_id} in broker-set: {req.broker_name}"), header), []


def decide_update_broker_address(state: ControllerState, cluster_name: str, broker_name: str,
                                 broker_id: int, broker_address: str) -> Decision:
    """Record a registered broker's new address; no event if unchanged."""
    replica = state.replica_info.get(broker_name) if state.contains(broker_name) else None
    if replica is None or broker_id not in replica.broker_id_info:
        return Response.error(C.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
                              f"BrokerId: {broker_id} hasn't been registered in broker-set: {broker_name}"), []
    if replica.broker_id_info[broker_id][0] == broker_address:
        return Response(C.SUCCESS), []
    return Response(C.SUCCESS), [UpdateBrokerAddressEvent(cluster_name, broker_name, broker_address, broker_id)]


def decide_register_broker(state: ControllerState, req: RegisterBrokerRequest, alive: Alive) -> Decision:
    """Register an applied id; reports the master only if it exists and is alive. Never elects."""
    name = req.broker_name
    if not state.contains(name):
        return Response.error(C.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
                              f"Broker-set: {name} hasn't been registered in controller"), []
    update, events = decide_update_broker_address(state, req.cluster_name, name, req.broker_id,
                                                  req.broker_address)
    if not update.ok:
        return update, []
    replica, sync = state.replica_info[name], state.sync_state[name]
    master = sync.master_broker_id
    master_alive = master is not None and alive(name, master)
    header = RegisterBrokerToControllerResponseHeader(req.cluster_name, name)
    if master_alive:
        header = RegisterBrokerToControllerResponseHeader(req.cluster_name, name, master, replica.address_of(master),
                                                          sync.master_epoch, sync.sync_state_set_epoch)
    return Response(C.SUCCESS, header, _sss_body(sync.sync_state_set, sync.sync_state_set_epoch)), events


def decide_elect_master(state: ControllerState, req: ElectMasterRequest, ctx: DecideContext) -> Decision:
    """Controller-, broker- or admin-triggered election (reference 4.2 with fixes Q2, Q3).

    A ``new_term`` request from the sitting master (restarted, see ``ElectMasterRequest``) runs the
    policy without stickiness for the old master and always starts a new epoch for the winner.
    From anyone else ``new_term`` is ignored."""
    name = req.broker_name
    if not state.contains(name):
        return Response.error(C.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED, "Broker hasn't been registered"), []
    replica, sync = state.replica_info[name], state.sync_state[name]
    old = sync.master_broker_id
    new: int | None = None
    if sync.is_first_time_for_elect and req.broker_id in replica.broker_id_info \
            and ctx.alive(name, req.broker_id):
        new = req.broker_id  # Q3 FIXED: only a registered, alive requester
    renewing = req.new_term and old is not None and req.broker_id == old
    if renewing:
        ctx = _with_requester_progress(ctx, req)
    if new is None and renewing and old is not None:
        new = _elect_new_term(state, name, old, ctx)
    if new is None:
        all_ids = list(replica.broker_id_info) if ctx.enable_elect_unclean_master else None
        getter = ctx.live_info
        new = elect(sync.sync_state_set, all_ids, None if renewing else old,
                    req.broker_id if req.designate_elect else None,
                    lambda i: ctx.alive(name, i), None if getter is None else (lambda i: getter(name, i)))
    if new is not None and new == old and not renewing:
        header = ElectMasterResponseHeader(old, replica.address_of(old), sync.master_epoch,
                                           sync.sync_state_set_epoch)
        remark = f"The old master {old} is still alive, not need to elect new master for broker {name}"
        body = _sss_body(sync.sync_state_set, sync.sync_state_set_epoch)
        return Response(C.CONTROLLER_MASTER_STILL_EXIST, header, body, remark), []
    if new is not None:
        header = ElectMasterResponseHeader(new, replica.address_of(new), sync.master_epoch + 1,
                                           sync.sync_state_set_epoch + 1)
        body = _sss_body({new}, sync.sync_state_set_epoch + 1)
        body["broker_member_group"] = {
            "cluster": replica.cluster_name, "broker_name": name,
            "broker_addrs": {bid: addr for bid, (addr, _) in sorted(replica.broker_id_info.items())}}
        return Response(C.SUCCESS, header, body), [ElectMasterEvent(True, name, new)]
    if req.is_controller_trigger:
        remark = "Old master has down and failed to elect a new broker master"
        if old is None:  # Q2 FIXED: nothing to demote, do not bump the epoch again
            return Response.error(C.CONTROLLER_MASTER_NOT_AVAILABLE, remark, ElectMasterResponseHeader()), []
        header = ElectMasterResponseHeader(master_epoch=sync.master_epoch + 1)
        return Response.error(C.CONTROLLER_MASTER_NOT_AVAILABLE, remark, header), \
            [ElectMasterEvent(False, name, None)]
    return Response.error(C.CONTROLLER_ELECT_MASTER_FAILED, "Failed to elect a new master",
                          ElectMasterResponseHeader()), []


def decide_elect_masters(state: ControllerState, req: ElectMastersRequest, ctx: DecideContext) -> Decision:
    """Controller-triggered elections of every distinct group in ``req`` (in order), as one decision
    whose events go into one Raft entry. Each group is decided by ``decide_elect_master`` on the same
    state: a group's election reads and changes only that group's rows, so this equals deciding
    them one after another, each on the state its predecessors left (tests check it). Answer:
    SUCCESS with ``body["elections"]`` = ``[[name, code, header, body, remark], ...]``."""
    rows: list[list[Any]] = []
    events: list[Event] = []
    for name in dict.fromkeys(req.broker_names):
        response, more = decide_elect_master(state, ElectMasterRequest.of_controller_trigger(name), ctx)
        rows.append([name, int(response.code), response.header, response.body, response.remark])
        events.extend(more)
    return Response(C.SUCCESS, ElectMastersResponseHeader(len(rows)), {"elections": rows}), events


def election_answers(response: Response) -> dict[str, Response]:
    """The per-group answers of an ``ElectMastersRequest`` (empty when the batch was refused whole)."""
    rows = (response.body or {}).get("elections", []) if response.ok else []
    return {name: Response(C(code), header, body, remark) for name, code, header, body, remark in rows}


def _with_requester_progress(ctx: DecideContext, req: ElectMasterRequest) -> DecideContext:
    """The restarted master's row as it stands now: its heartbeat row with the progress the request
    carries: the heartbeat table ranks a replica by its last report (``controller/heartbeat.py``), and
    a request decided before the restart's first heartbeat would otherwise rank it by what it
    reported before it lost its unflushed tail."""
    getter = ctx.live_info
    if getter is None or req.max_offset < 0:
        return ctx

    def live_info(name: str, broker_id: int) -> BrokerLiveInfo | None:
        row = getter(name, broker_id)
        if broker_id != req.broker_id or name != req.broker_name or row is None:
            return row
        return dataclasses.replace(row, epoch=req.epoch, max_offset=req.max_offset)
    return dataclasses.replace(ctx, live_info=live_info)


def _elect_new_term(state: ControllerState, name: str, old: int, ctx: DecideContext) -> int | None:
    """The best live replica other than the restarted master ``old``, if it has at least ``old``'s
    progress (so on equal progress a replica that did not just restart takes over); else None, and
    the ordinary policy (without stickiness) decides.

    The replicas considered are the other SyncStateSet members and, a deliberate difference from
    RocketMQ, any live replica whose log provably contains ``old``'s (``contains_log``: same last
    epoch, more bytes). A master that lost its unflushed tail may have acknowledged it under the
    union view of an expansion the controller never applied (simulator ``async`` seed 5049,
    scenario ``new-term-outside-sss``): the joining replica holds those records and is the only
    one that does, while the committed set names ``old`` alone."""
    sync, replica = state.sync_state[name], state.replica_info[name]
    getter = ctx.live_info
    info = None if getter is None else (lambda i: getter(name, i))
    pool = sync.sync_state_set - {old}
    if info is not None:
        mine = info(old)
        pool |= {i for i in replica.broker_id_info if contains_log(info(i), mine)}
    other = elect(pool, None, None, None, lambda i: ctx.alive(name, i), info)
    if other is None:
        return None
    if info is None or rank_key(other, info(other))[:4] <= rank_key(old, info(old))[:4]:
        return other
    return None


def decide_alter_sync_state_set(state: ControllerState, req: AlterSyncStateSetRequest,
                                alive: Alive) -> Decision:
    """Replace the SyncStateSet; fencing before "no change" (Q6 FIXED), then replica checks."""
    name, new_set = req.broker_name, frozenset(req.new_sync_state_set)
    fail = C.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED
    if not state.contains(name):
        return Response.error(fail, "Broker metadata is not existed"), []
    replica, sync = state.replica_info[name], state.sync_state[name]
    if sync.master_broker_id is None or sync.master_broker_id != req.master_broker_id:
        return Response.error(C.CONTROLLER_INVALID_MASTER, (
            f"Rejecting alter syncStateSet request because the current leader is:{sync.master_broker_id}, "
            f"not {req.master_broker_id}")), []
    if req.master_epoch != sync.master_epoch:
        return Response.error(C.CONTROLLER_FENCED_MASTER_EPOCH, (
            f"Rejecting alter syncStateSet request because the current master epoch is:{sync.master_epoch}, "
            f"not {req.master_epoch}")), []
    if req.sync_state_set_epoch != sync.sync_state_set_epoch:
        return Response.error(C.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH, (
            f"Rejecting alter syncStateSet request because the current syncStateSet epoch is:"
            f"{sync.sync_state_set_epoch}, not {req.sync_state_set_epoch}")), []
    if new_set == sync.sync_state_set:
        return Response.error(fail, "The newSyncStateSet is equal with oldSyncStateSet, no needed to "
                                    "update syncStateSet"), []
    for broker_id in sorted(new_set):
        if broker_id not in replica.broker_id_info:
            return Response.error(C.CONTROLLER_INVALID_REPLICAS, (
                f"Rejecting alter syncStateSet request because the replicas {broker_id} don't exist")), []
        if not alive(name, broker_id):
            return Response.error(C.CONTROLLER_BROKER_NOT_ALIVE, (
                f"Rejecting alter syncStateSet request because the replicas {broker_id} don't alive")), []
    if sync.master_broker_id not in new_set:
        return Response.error(fail, (
            f"Rejecting alter syncStateSet request because the newSyncStateSet don't contains origin "
            f"leader {sync.master_broker_id}")), []
    new_epoch = sync.sync_state_set_epoch + 1
    return (Response(C.SUCCESS, AlterSyncStateSetResponseHeader(new_epoch), _sss_body(new_set, new_epoch)),
            [AlterSyncStateSetEvent(name, new_set)])


def decide_get_replica_info(state: ControllerState, req: GetReplicaInfoRequest) -> Decision:
    """Master id/address/epoch and the SyncStateSet of one set (2008 if unknown)."""
    name = req.broker_name
    if not state.contains(name):
        return Response.error(C.CONTROLLER_BROKER_METADATA_NOT_EXIST, "Broker metadata is not existed"), []
    replica, sync = state.replica_info[name], state.sync_state[name]
    header = GetReplicaInfoResponseHeader(sync.master_broker_id, replica.address_of(sync.master_broker_id),
                                          sync.master_epoch)
    return Response(C.SUCCESS, header, _sss_body(sync.sync_state_set, sync.sync_state_set_epoch)), []


def decide_get_sync_state_data(state: ControllerState, req: GetSyncStateDataRequest, alive: Alive) -> Decision:
    """In-sync and not-in-sync replicas of each known set named in the request."""
    if not req.broker_names:
        return Response.error(C.SYSTEM_ERROR, "not set any response code"), []
    table: dict[str, Any] = {}
    for name in req.broker_names:
        if not state.contains(name):
            continue
        replica, sync = state.replica_info[name], state.sync_state[name]
        in_sync: list[dict[str, Any]] = []
        not_in_sync: list[dict[str, Any]] = []
        for bid, (addr, code) in sorted(replica.broker_id_info.items()):
            member = member_of_check_code(code)
            row = {"broker_name": name, "broker_id": bid, "broker_address": addr, "alive": alive(name, bid),
                   "member": None if member is None else member.uri}
            (in_sync if bid in sync.sync_state_set else not_in_sync).append(row)
        table[name] = {"master_broker_id": sync.master_broker_id,
                       "master_address": replica.address_of(sync.master_broker_id),
                       "master_epoch": sync.master_epoch, "sync_state_set_epoch": sync.sync_state_set_epoch,
                       "in_sync_replicas": in_sync, "not_in_sync_replicas": not_in_sync}
    return Response(C.SUCCESS, NO_HEADER, {"replicas_info_table": table}), []


def parse_broker_ids(text: str) -> frozenset[int]:
    """Parse ``"1;2;3"``; raises ``ValueError`` on anything else."""
    parts = [p for p in text.split(";") if p.strip()]
    if not parts or not all(_IDS_FORMAT.match(p) for p in parts):
        raise ValueError(f"invalid broker id list {text!r}")
    return frozenset(int(p) for p in parts)


def decide_clean_broker_data(state: ControllerState, req: CleanBrokerDataRequest, alive: Alive) -> Decision:
    """Forget dead replicas (or, with ``clean_living_broker``, the whole set; quirk 17 kept)."""
    name, bad = req.broker_name, C.CONTROLLER_INVALID_CLEAN_BROKER_METADATA
    ids: frozenset[int] | None = None
    text = req.broker_controller_ids_to_clean
    if not req.clean_living_broker:
        if text is None or not text.strip():
            if state.contains(name) and state.sync_state[name].master_broker_id is not None:
                return Response.error(bad, f"Broker {name} is still alive, clean up failure"), []
        else:
            try:
                ids = parse_broker_ids(text)
            except ValueError as exc:
                return Response.error(bad, "Please set the option <brokerControllerIdsToClean> according "
                                           f"to the format, exception: {exc}"), []
            living = sorted(i for i in ids if alive(name, i))
            if living:
                return Response.error(bad, f"Broker [{name},  {living}] is still alive, clean up failure"), []
    if not state.contains(name):
        return Response.error(bad, f"Broker {name} is not existed,clean broker data failure."), []
    sync, registered = state.sync_state[name], state.replica_info[name].broker_id_info
    if ids is not None and not (sync.sync_state_set - ids) and set(registered) - ids:
        return Response.error(bad, f"Cleaning {sorted(ids)} would empty the SyncStateSet of {name} while "
                                   f"{sorted(set(registered) - ids)} stay registered; clean them too"), []
    events: list[Event] = []
    master = sync.master_broker_id
    if ids is not None and master is not None and master in ids:
        events.append(ElectMasterEvent(False, name, None))  # never leave a master outside its SSS
    events.append(CleanBrokerDataEvent(name, ids))
    return Response(C.SUCCESS), events


def scan_need_reelect_broker_sets(state: ControllerState, alive: Alive,
                                  names: Iterable[str] | None = None) -> list[str]:
    """Sets (of ``names``, default all) whose master is set but dead while at least one registered
    replica is alive."""
    out = []
    for name in state.broker_names() if names is None else names:
        if name not in state.sync_state:
            continue
        master = state.sync_state[name].master_broker_id
        if master is None or alive(name, master):
            continue
        if any(alive(name, bid) for bid in state.replica_info[name].broker_id_info):
            out.append(name)
    return out


def master_session_closed(state: ControllerState, broker_name: str, broker_id: int) -> bool:
    """A broker's session closed without a bye (its process died): does its group need an election
    now? Yes iff it was the group's master (RocketMQ's onBrokerChannelClose -> onBrokerInactive);
    a dead slave only leaves the live set. ``rocketray.controller.session``."""
    info = state.sync_state.get(broker_name)
    return info is not None and info.master_broker_id == broker_id


_WRITES = (ApplyBrokerIdRequest, RegisterBrokerRequest, ElectMasterRequest, ElectMastersRequest,
           AlterSyncStateSetRequest, CleanBrokerDataRequest, CreateTopicRequest, DeleteTopicRequest,
           *users.WRITES)

#: Requests decided from the tables alone: ``decide_*(state, request)``.
_BY_STATE: dict[type, Callable[[ControllerState, Any], Decision]] = {
    GetNextBrokerIdRequest: decide_get_next_broker_id,
    ApplyBrokerIdRequest: decide_apply_broker_id,
    GetReplicaInfoRequest: decide_get_replica_info,
    CreateTopicRequest: decide_create_topic,
    DeleteTopicRequest: decide_delete_topic,
    GetTopicRouteRequest: decide_get_topic_route,
    ListTopicsRequest: decide_list_topics,
    **users.DECISIONS,
}


def is_write(request: object) -> bool:
    """True for requests whose decision may emit events (they go through Raft)."""
    return isinstance(request, _WRITES)


def decide(state: ControllerState, request: object, ctx: DecideContext) -> Decision:
    """Dispatch one request to its ``decide_*``; unknown requests get REQUEST_CODE_NOT_SUPPORTED,
    oversized or badly shaped ones CONTROLLER_INVALID_REQUEST (``check_request_limits``)."""
    refused = check_request_limits(request)
    if refused is not None:
        return refused, []
    by_state = _BY_STATE.get(type(request))
    if by_state is not None:
        return by_state(state, request)
    if isinstance(request, RegisterBrokerRequest):
        return decide_register_broker(state, request, ctx.alive)
    if isinstance(request, ElectMasterRequest):
        return decide_elect_master(state, request, ctx)
    if isinstance(request, ElectMastersRequest):
        return decide_elect_masters(state, request, ctx)
    if isinstance(request, AlterSyncStateSetRequest):
        return decide_alter_sync_state_set(state, request, ctx.alive)
    if isinstance(request, GetSyncStateDataRequest):
        return decide_get_sync_state_data(state, request, ctx.alive)
    if isinstance(request, CleanBrokerDataRequest):
        return decide_clean_broker_data(state, request, ctx.alive)
    return Response.error(C.REQUEST_CODE_NOT_SUPPORTED,
                          f" request type {type(request).__name__} not supported"), []
