"""ReplicasInfoManagerTest (reference 16.1), the election table (4.4) and the quirk decisions (18),
run against the pure controller core: decide, then apply the emitted events."""

from __future__ import annotations

from typing import Any

import pytest

from rocketray.wire.controller_api import (AlterSyncStateSetRequest, ApplyBrokerIdRequest, BrokerHeartbeatRequest,
                                           CleanBrokerDataRequest, ElectMasterRequest, GetNextBrokerIdRequest,
                                           GetReplicaInfoRequest, GetSyncStateDataRequest, RegisterBrokerRequest,
                                           Response)
from rocketray.wire.controller_codes import ResponseCode as C
from rocketray.controller.decide import DecideContext, decide, is_write, scan_need_reelect_broker_sets
from rocketray.controller.events import CleanBrokerDataEvent, ElectMasterEvent
from rocketray.controller.election import contains_log
from rocketray.controller.heartbeat import BrokerLiveInfo, HeartbeatTable
from rocketray.controller.state import ControllerState

CLUSTER, NAME = "cluster-a", "broker-set-a"
ADDR = {1: "127.0.0.1:9000", 2: "127.0.0.1:9001", 3: "127.0.0.1:9002"}


class Harness:
    """The core plus a liveness set (or a heartbeat table), applying events after each call."""

    def __init__(self, unclean: bool = False) -> None:
        self.state = ControllerState()
        self.alive: set[int] = set()
        self.hb: HeartbeatTable | None = None
        self.now_ms = 1_000_000
        self.unclean = unclean
        self.log: list[Any] = []

    def ctx(self) -> DecideContext:
        if self.hb is not None:
            return DecideContext.from_heartbeats(self.hb, self.now_ms, self.unclean)
        return DecideContext(lambda n, i: i in self.alive, None, self.unclean)

    def call(self, req: object, apply: bool = True) -> tuple[Response, list[Any]]:
        before = self.state.to_snapshot()
        resp, events = decide(self.state, req, self.ctx())
        assert self.state.to_snapshot() == before, "decide must not mutate"
        if apply:
            self.state.apply_all(events)
            self.log.extend(events)
        return resp, events

    def register(self, broker_id: int, expected_master: int | None) -> None:
        resp, _ = self.call(GetNextBrokerIdRequest(CLUSTER, NAME))
        assert resp.ok and resp.header.next_broker_id == broker_id
        resp, _ = self.call(ApplyBrokerIdRequest(CLUSTER, NAME, broker_id, f"{ADDR[broker_id]};1700000000000"))
        assert resp.ok
        data = self.call(GetSyncStateDataRequest((NAME,)))[0].body["replicas_info_table"][NAME]
        assert any(r["broker_id"] == broker_id and r["broker_address"] == ADDR[broker_id]
                   for r in data["not_in_sync_replicas"])
        self.alive.add(broker_id)
        resp, _ = self.call(RegisterBrokerRequest(CLUSTER, NAME, broker_id, ADDR[broker_id]))
        assert resp.ok and resp.header.master_broker_id == expected_master

    def heartbeat(self, broker_id: int, epoch: int, offset: int, timeout_ms: int, prio: int = 2**31 - 1) -> None:
        self.hb = self.hb or HeartbeatTable()
        self.hb.on_heartbeat(BrokerHeartbeatRequest(CLUSTER, NAME, ADDR[broker_id], broker_id, epoch, offset,
                                                    offset, timeout_ms, prio), self.now_ms)

    def info(self) -> Response:
        return self.call(GetReplicaInfoRequest(NAME))[0]

    def data(self) -> dict[str, Any]:
        return self.call(GetSyncStateDataRequest((NAME,)))[0].body["replicas_info_table"][NAME]

    def replay_matches(self) -> bool:
        fresh = ControllerState()
        fresh.apply_all(self.log)
        return fresh == self.state


def mock_meta_data() -> Harness:
    h = Harness()
    for i in (1, 2, 3):
        h.register(i, None)
    resp, _ = h.call(ElectMasterRequest.of_broker_trigger(CLUSTER, NAME, 1))
    assert resp.ok and resp.header.master_epoch == 1 and resp.header.sync_state_set_epoch == 1
    for i in (2, 3):
        assert h.call(ElectMasterRequest.of_broker_trigger(CLUSTER, NAME, i))[0].code == C.CONTROLLER_MASTER_STILL_EXIST
    resp, _ = h.call(AlterSyncStateSetRequest(NAME, 1, 1, frozenset({1, 2, 3}), 1))
    assert resp.ok and resp.header.new_sync_state_set_epoch == 2
    return h


def test_register_broker_success():
    """testRegisterBrokerSuccess: after mockMetaData master 1 @9000, epochs 1/2, all three in sync."""
    h = mock_meta_data()
    d = h.data()
    assert (d["master_broker_id"], d["master_address"], d["master_epoch"], d["sync_state_set_epoch"]) == \
        (1, ADDR[1], 1, 2)
    assert len(d["in_sync_replicas"]) == 3 and not d["not_in_sync_replicas"]
    assert h.replay_matches()


def test_register_with_master_exist_resp():
    """testRegisterWithMasterExistResp: a late replica learns the master from register; 2011 for it."""
    h = Harness()
    h.register(1, None)
    h.register(2, None)
    assert h.call(ElectMasterRequest.of_broker_trigger(CLUSTER, NAME, 1))[0].ok
    assert h.call(ElectMasterRequest.of_broker_trigger(CLUSTER, NAME, 2))[0].code == C.CONTROLLER_MASTER_STILL_EXIST
    h.register(3, 1)
    assert h.call(ElectMasterRequest.of_broker_trigger(CLUSTER, NAME, 3))[0].code == C.CONTROLLER_MASTER_STILL_EXIST
    d = h.data()
    assert (d["master_broker_id"], d["master_epoch"], d["sync_state_set_epoch"]) == (1, 1, 1)
    assert len(d["in_sync_replicas"]) == 1 and len(d["not_in_sync_replicas"]) == 2


def test_register_with_old_master_inactive():
    """testRegisterWithOldMasterInactive: broker 3 alone alive takes over, SSS {3}."""
    h = mock_meta_data()
    h.alive = {3}
    resp, _ = h.call(ElectMasterRequest.of_broker_trigger(CLUSTER, NAME, 3))
    assert resp.ok
    d = h.data()
    assert (d["master_broker_id"], d["master_address"], d["master_epoch"], d["sync_state_set_epoch"]) == \
        (3, ADDR[3], 2, 3)
    assert [r["broker_id"] for r in d["in_sync_replicas"]] == [3] and len(d["not_in_sync_replicas"]) == 2


# (heartbeats (id, epoch, offset, timeout_ms, prio), expected code, expected new master)
HB_ROWS = [
    pytest.param([(1, 1, 1, 10**9, 0), (2, 1, 2, 10**9, 0), (3, 1, 3, 10**9, 0)], C.CONTROLLER_MASTER_STILL_EXIST, 1,
                 id="testElectMasterOldMasterStillAlive"),
    pytest.param([(1, 1, 1, -10000, 0), (2, 1, 2, 10**9, 0), (3, 0, 3, 10**9, 0)], C.SUCCESS, 2,
                 id="testElectMasterPreferHigherEpoch"),
    pytest.param([(1, 1, 1, -10000, 0), (2, 1, 2, 10**9, 0), (3, 1, 3, 10**9, 0)], C.SUCCESS, 3,
                 id="testElectMasterPreferHigherOffsetWhenEpochEquals"),
    pytest.param([(1, 1, 1, -10000, 3), (2, 1, 3, 10**9, 2), (3, 1, 3, 10**9, 1)], C.SUCCESS, 3,
                 id="testElectMasterPreferHigherPriorityWhenEpochAndOffsetEquals"),
]


@pytest.mark.parametrize("beats,code,master", HB_ROWS)
def test_elect_master_with_heartbeat_policy(beats, code, master):
    """16.1 / 4.4 heartbeat-ordered rows: epoch DESC, offset DESC, priority ASC."""
    h = mock_meta_data()
    for b in beats:
        h.heartbeat(*b)
    resp, _ = h.call(ElectMasterRequest.of_controller_trigger(NAME))
    assert resp.code == code and resp.header.master_broker_id == master
    info = h.info()
    assert info.header.master_broker_id == master
    assert info.header.master_epoch == (2 if code == C.SUCCESS else 1)
    if code == C.SUCCESS:
        assert info.header.master_address == ADDR[master] and info.body["sync_state_set"] == [master]


def test_elect_master_full_sequence():
    """testElectMaster: failover, alter, admin designate (dead -> 2012, current -> 2011, alive -> ok)."""
    h = mock_meta_data()
    h.alive = {2, 3}
    resp, _ = h.call(ElectMasterRequest.of_controller_trigger(NAME))
    x = resp.header.master_broker_id
    assert resp.ok and x != 1 and resp.header.master_epoch == 2
    assert x == 2  # Q4 FIXED: deterministic, lowest id on ties
    # the reference row says "sssEpoch 2"; after the election the current SSS epoch is 3 (2 + elect), and
    # with fencing checked first (Q6) only the current epoch is accepted.
    assert h.call(AlterSyncStateSetRequest(NAME, x, 2, frozenset({1, 2, 3}), 2))[0].code == \
        C.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH
    assert h.call(AlterSyncStateSetRequest(NAME, x, 2, frozenset({1, 2, 3}), 3))[0].code == C.CONTROLLER_BROKER_NOT_ALIVE
    h.alive = {1, 2, 3}
    assert h.call(AlterSyncStateSetRequest(NAME, x, 2, frozenset({1, 2, 3}), 3))[0].ok
    h.alive = {2, 3}
    assert h.call(ElectMasterRequest.of_admin_trigger(CLUSTER, NAME, 1))[0].code == C.CONTROLLER_ELECT_MASTER_FAILED
    h.alive = {1, 2, 3}
    assert h.call(ElectMasterRequest.of_admin_trigger(CLUSTER, NAME, x))[0].code == C.CONTROLLER_MASTER_STILL_EXIST
    h.alive = {1, 2, 3} - {x}
    assert h.call(ElectMasterRequest.of_admin_trigger(CLUSTER, NAME, 1))[0].ok
    info = h.info()
    assert (info.header.master_broker_id, info.header.master_address, info.header.master_epoch) == \
        (1, ADDR[1], 3)
    assert h.replay_matches()


def test_all_replicas_shutdown_and_restart():
    """testAllReplicasShutdownAndRestart (+ DLedger variant): SSS {1}, 1 dead -> one ElectMasterEvent(False),
    master null, epoch 2, SSS kept; broker 2 then gets 2012; 1 back -> re-elected at epoch 3."""
    h = mock_meta_data()
    assert h.call(AlterSyncStateSetRequest(NAME, 1, 1, frozenset({1}), 2))[0].ok
    h.alive = {2, 3}
    resp, events = h.call(ElectMasterRequest.of_controller_trigger(NAME))
    assert resp.code == C.CONTROLLER_MASTER_NOT_AVAILABLE
    assert events == [ElectMasterEvent(False, NAME, None)]
    info = h.info()
    assert info.header.master_address is None and info.header.master_epoch == 2
    assert info.body["sync_state_set"] == [1]
    resp, _ = h.call(ElectMasterRequest.of_broker_trigger(CLUSTER, NAME, 2))
    assert resp.code == C.CONTROLLER_ELECT_MASTER_FAILED and resp.header.master_broker_id is None
    h.alive = {1, 2, 3}
    resp, _ = h.call(ElectMasterRequest.of_broker_trigger(CLUSTER, NAME, 1))
    assert resp.ok and resp.header.master_address == ADDR[1] and resp.header.master_epoch == 3


def test_enable_elect_unclean_master():
    """testEnableElectUnCleanMaster: SSS {1}, 1 dead, unclean on -> another id, SSS {it}, epoch 2."""
    h = mock_meta_data()
    h.unclean = True
    assert h.call(AlterSyncStateSetRequest(NAME, 1, 1, frozenset({1}), 2))[0].ok
    h.alive = {2, 3}
    resp, _ = h.call(ElectMasterRequest.of_controller_trigger(NAME))
    assert resp.ok and resp.header.master_broker_id == 2
    info = h.info()
    assert info.body["sync_state_set"] == [2] and info.header.master_epoch == 2


# testCleanBrokerData rows (events NOT applied between calls): (cluster, name, ids, living, alive, code)
CLEAN_ROWS = [
    pytest.param(CLUSTER, NAME, "1", False, {1, 2, 3}, C.CONTROLLER_INVALID_CLEAN_BROKER_METADATA, id="id-alive"),
    pytest.param(CLUSTER, NAME, None, False, {1, 2, 3}, C.CONTROLLER_INVALID_CLEAN_BROKER_METADATA,
                 id="no-ids-master-exists"),
    pytest.param(CLUSTER, NAME, "1", False, set(), C.SUCCESS, id="id-dead"),
    pytest.param(CLUSTER, NAME, "1;2;3", False, set(), C.SUCCESS, id="ids-dead"),
    pytest.param(CLUSTER, "broker12", "1;2;3", True, set(), C.CONTROLLER_INVALID_CLEAN_BROKER_METADATA,
                 id="unknown-set-living"),
    pytest.param(None, "broker12", "1;2;3", True, set(), C.CONTROLLER_INVALID_CLEAN_BROKER_METADATA,
                 id="unknown-set-no-cluster"),
    pytest.param(None, NAME, "1;2;3", True, set(), C.SUCCESS, id="known-set-living"),
    pytest.param(CLUSTER, NAME, "1;x", False, set(), C.CONTROLLER_INVALID_CLEAN_BROKER_METADATA, id="bad-format"),
]


@pytest.mark.parametrize("cluster,name,ids,living,alive,code", CLEAN_ROWS)
def test_clean_broker_data(cluster, name, ids, living, alive, code):
    """testCleanBrokerData rows; remarks as in the reference."""
    h = mock_meta_data()
    h.alive = alive
    resp, events = h.call(CleanBrokerDataRequest(cluster, name, ids, living), apply=False)
    assert resp.code == code
    if code != C.SUCCESS:
        assert events == []
    if ids is None and not living:
        assert resp.remark == f"Broker {name} is still alive, clean up failure"
    if name == "broker12":
        assert resp.remark == "Broker broker12 is not existed,clean broker data failure."
    if living and code == C.SUCCESS:
        assert events == [CleanBrokerDataEvent(NAME, None)]  # quirk 17 kept: whole set wiped


def test_clean_master_id_demotes_master_first():
    """Cleaning the dead master's id emits ElectMasterEvent(False) first: the master never stays outside
    its SSS (reference 19); cleaning every id removes the set."""
    h = mock_meta_data()
    h.alive = set()
    resp, events = h.call(CleanBrokerDataRequest(CLUSTER, NAME, "1", False))
    assert resp.ok and events == [ElectMasterEvent(False, NAME, None), CleanBrokerDataEvent(NAME, frozenset({1}))]
    sync = h.state.sync_state[NAME]
    assert sync.master_broker_id is None and sync.sync_state_set == {2, 3} and sync.master_epoch == 2
    assert h.call(CleanBrokerDataRequest(CLUSTER, NAME, "2;3", False))[0].ok
    assert not h.state.contains(NAME) and h.replay_matches()


def test_clean_refuses_to_empty_sss_while_ids_remain():
    """Cleaning the only SSS member while others stay registered is refused (2009): no half-deleted set,
    so ids 2 and 3 can never be handed out again."""
    h = mock_meta_data()
    assert h.call(AlterSyncStateSetRequest(NAME, 1, 1, frozenset({1}), 2))[0].ok
    h.alive = set()
    resp, events = h.call(CleanBrokerDataRequest(CLUSTER, NAME, "1", False))
    assert resp.code == C.CONTROLLER_INVALID_CLEAN_BROKER_METADATA and events == []
    assert h.call(CleanBrokerDataRequest(CLUSTER, NAME, "1;2;3", False))[0].ok
    assert not h.state.replica_info and not h.state.sync_state


def test_serialize_round_trip():
    """testSerialize: snapshot -> fresh state holds the same tables."""
    import msgpack
    h = mock_meta_data()
    data = msgpack.unpackb(msgpack.packb(h.state.to_snapshot()))
    assert ControllerState.from_snapshot(data) == h.state
    assert h.replay_matches()


def test_apply_broker_id_rules():
    """Invariants 19: unknown set -> next id 1 and only 1 accepted; same check code re-apply ok; other 2014."""
    h = Harness()
    assert h.call(GetNextBrokerIdRequest(CLUSTER, NAME))[0].header.next_broker_id == 1
    assert h.call(ApplyBrokerIdRequest(CLUSTER, NAME, 2, "a;1"))[0].code == C.CONTROLLER_BROKER_ID_INVALID
    assert h.call(ApplyBrokerIdRequest(CLUSTER, NAME, 1, "a:1;1"))[0].ok
    assert h.state.replica_info[NAME].broker_id_info[1] == ("a:1", "a:1;1")
    assert h.call(ApplyBrokerIdRequest(CLUSTER, NAME, 1, "a:1;1"))[0].ok
    assert h.state.replica_info[NAME].next_assign_broker_id == 2
    assert h.call(ApplyBrokerIdRequest(CLUSTER, NAME, 1, "b:1;2"))[0].code == C.CONTROLLER_BROKER_ID_INVALID


def test_register_updates_address_and_unknown_ids():
    """registerBroker: unknown set/id -> 2010; a new address emits UpdateBrokerAddressEvent (check code kept)."""
    h = mock_meta_data()
    assert h.call(RegisterBrokerRequest(CLUSTER, "nope", 1, "x"))[0].code == C.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED
    assert h.call(RegisterBrokerRequest(CLUSTER, NAME, 9, "x"))[0].code == C.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED
    resp, events = h.call(RegisterBrokerRequest(CLUSTER, NAME, 2, "10.0.0.2:9001"))
    assert resp.ok and len(events) == 1 and resp.body["sync_state_set"] == [1, 2, 3]
    assert h.state.replica_info[NAME].broker_id_info[2] == ("10.0.0.2:9001", f"{ADDR[2]};1700000000000")
    h.alive = {2}
    assert h.call(RegisterBrokerRequest(CLUSTER, NAME, 2, "10.0.0.2:9001"))[0].header.master_broker_id is None


# Reference 4.4 rows as (alive, request kind, target, unclean, sss, expected code, expected master)
ELECT_ROWS = [
    pytest.param({1, 2, 3}, "controller", -1, False, {1, 2, 3}, C.CONTROLLER_MASTER_STILL_EXIST, 1, id="all-alive"),
    pytest.param({3}, "broker", 3, False, {1, 2, 3}, C.SUCCESS, 3, id="broker3-only-alive"),
    pytest.param({2, 3}, "admin", 1, False, {1, 2, 3}, C.CONTROLLER_ELECT_MASTER_FAILED, None, id="designate-dead"),
    pytest.param({1, 2, 3}, "admin", 1, False, {1, 2, 3}, C.CONTROLLER_MASTER_STILL_EXIST, 1,
                 id="designate-current"),
    pytest.param({1, 2}, "admin", 2, False, {1, 2, 3}, C.SUCCESS, 2, id="designate-other-alive"),
    pytest.param({2, 3}, "controller", -1, False, {1}, C.CONTROLLER_MASTER_NOT_AVAILABLE, None, id="sss1-dead"),
    pytest.param({2, 3}, "broker", 2, False, {1}, C.CONTROLLER_ELECT_MASTER_FAILED, None, id="sss1-broker2"),
    pytest.param({2, 3}, "controller", -1, True, {1}, C.SUCCESS, 2, id="sss1-unclean"),
    pytest.param({2, 3}, "controller", -1, False, {1, 2, 3}, C.SUCCESS, 2, id="quirk4-lowest-id-no-live-info"),
]


@pytest.mark.parametrize("alive,kind,target,unclean,sss,code,master", ELECT_ROWS)
def test_election_table(alive, kind, target, unclean, sss, code, master):
    """Reference 4.4 (master 1 at epoch 1): code, new master, epochs, SSS after apply."""
    h = mock_meta_data()
    if sss != {1, 2, 3}:
        assert h.call(AlterSyncStateSetRequest(NAME, 1, 1, frozenset(sss), 2))[0].ok
    h.alive, h.unclean = alive, unclean
    req = {"controller": ElectMasterRequest.of_controller_trigger(NAME),
           "broker": ElectMasterRequest.of_broker_trigger(CLUSTER, NAME, target),
           "admin": ElectMasterRequest.of_admin_trigger(CLUSTER, NAME, target)}[kind]
    before = h.state.sync_state[NAME]
    epoch0, sss_epoch0 = before.master_epoch, before.sync_state_set_epoch
    resp, events = h.call(req)
    assert resp.code == code and resp.header.master_broker_id == master
    after = h.state.sync_state[NAME]
    if code == C.SUCCESS:
        assert after.master_epoch == epoch0 + 1 and after.sync_state_set == {master}
        assert after.sync_state_set_epoch == sss_epoch0 + 1
        assert set(resp.body["broker_member_group"]["broker_addrs"]) == {1, 2, 3}
    elif code == C.CONTROLLER_MASTER_NOT_AVAILABLE:
        assert after.master_broker_id is None and after.master_epoch == epoch0 + 1 and after.sync_state_set == sss
    else:
        assert events == [] and after.master_epoch == epoch0


# alterSyncStateSet checks (reference 3.5), in our order (Q6 FIXED: fencing before "no change")
ALTER_ROWS = [
    pytest.param("nope", 1, 1, {1, 2, 3}, 2, {1, 2, 3}, C.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED, id="unknown-set"),
    pytest.param(NAME, 2, 1, {1, 2}, 2, {1, 2, 3}, C.CONTROLLER_INVALID_MASTER, id="not-master"),
    pytest.param(NAME, 1, 0, {1, 2}, 2, {1, 2, 3}, C.CONTROLLER_FENCED_MASTER_EPOCH, id="stale-master-epoch"),
    pytest.param(NAME, 1, 1, {1, 2}, 1, {1, 2, 3}, C.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH, id="stale-sss-epoch"),
    # a *future* epoch is fenced too: only the exact current epoch may alter the set
    pytest.param(NAME, 1, 2, {1, 2}, 2, {1, 2, 3}, C.CONTROLLER_FENCED_MASTER_EPOCH, id="future-master-epoch"),
    pytest.param(NAME, 1, 1, {1, 2}, 3, {1, 2, 3}, C.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH, id="future-sss-epoch"),
    pytest.param(NAME, 1, 1, {1, 2, 3}, 3, {1, 2, 3}, C.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH,
                 id="future-sss-epoch-no-change"),
    pytest.param(NAME, 1, 1, {1, 2, 3}, 2, {1, 2, 3}, C.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED, id="no-change"),
    pytest.param(NAME, 1, 1, {1, 4}, 2, {1, 2, 3}, C.CONTROLLER_INVALID_REPLICAS, id="unregistered"),
    pytest.param(NAME, 1, 1, {1, 2}, 2, {1, 3}, C.CONTROLLER_BROKER_NOT_ALIVE, id="dead-replica"),
    pytest.param(NAME, 1, 1, {2, 3}, 2, {1, 2, 3}, C.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED, id="drops-master"),
    pytest.param(NAME, 1, 1, {1, 2}, 2, {1, 2, 3}, C.SUCCESS, id="ok"),
]


@pytest.mark.parametrize("name,master,epoch,new_set,sss_epoch,alive,code", ALTER_ROWS)
def test_alter_sync_state_set_checks(name, master, epoch, new_set, sss_epoch, alive, code):
    """Each alterSyncStateSet refusal has its code; success bumps the SSS epoch by one."""
    h = mock_meta_data()
    h.alive = alive
    resp, events = h.call(AlterSyncStateSetRequest(name, master, epoch, frozenset(new_set), sss_epoch))
    assert resp.code == code
    assert (len(events) == 1) == (code == C.SUCCESS)
    if code == C.SUCCESS:
        assert resp.body == {"sync_state_set": sorted(new_set), "sync_state_set_epoch": 3}


def test_quirk2_fixed_failed_controller_election_does_not_bump_epoch_twice():
    """Q2 FIXED: retries of a controller-triggered election that finds nobody bump masterEpoch once."""
    h = mock_meta_data()
    assert h.call(AlterSyncStateSetRequest(NAME, 1, 1, frozenset({1}), 2))[0].ok
    h.alive = set()
    codes, counts = [], []
    for _ in range(3):
        resp, events = h.call(ElectMasterRequest.of_controller_trigger(NAME))
        codes.append(resp.code)
        counts.append(len(events))
    assert codes == [C.CONTROLLER_MASTER_NOT_AVAILABLE] * 3 and counts == [1, 0, 0]
    assert h.state.sync_state[NAME].master_epoch == 2


def test_quirk3_fixed_first_election_requires_registered_alive_requester():
    """Q3 FIXED: the first election does not accept an unregistered or dead requester blindly."""
    h = Harness()
    h.register(1, None)
    h.register(2, None)
    assert h.call(ElectMasterRequest.of_broker_trigger(CLUSTER, NAME, 7))[0].code == C.CONTROLLER_ELECT_MASTER_FAILED
    h.alive = {2}
    assert h.call(ElectMasterRequest.of_broker_trigger(CLUSTER, NAME, 1))[0].code == C.CONTROLLER_ELECT_MASTER_FAILED
    resp, events = h.call(ElectMasterRequest.of_controller_trigger(NAME))
    assert resp.code == C.CONTROLLER_MASTER_NOT_AVAILABLE and events == []  # Q2: no master to demote
    assert h.state.sync_state[NAME].master_epoch == 0
    assert h.call(ElectMasterRequest.of_broker_trigger(CLUSTER, NAME, 2))[0].ok


def test_quirk4_fixed_ties_break_by_lowest_id_and_exact_offsets():
    """Q4 FIXED: equal (epoch, offset, priority) -> lowest id; offset gaps >= 2**31 compare exactly."""
    h = mock_meta_data()
    h.heartbeat(1, 1, 0, -10000)
    h.heartbeat(3, 5, 7, 10**9, 1)
    h.heartbeat(2, 5, 7, 10**9, 1)
    assert h.call(ElectMasterRequest.of_controller_trigger(NAME), apply=False)[0].header.master_broker_id == 2
    h2 = mock_meta_data()
    h2.heartbeat(1, 1, 0, -10000)
    h2.heartbeat(2, 5, 2**40 + 2**32, 10**9)
    h2.heartbeat(3, 5, 2**40, 10**9)
    assert h2.call(ElectMasterRequest.of_controller_trigger(NAME))[0].header.master_broker_id == 2


def test_quirk5_kept_next_id_is_adds_plus_one_and_ids_never_reused():
    """Q5 KEPT: next id counts adds; cleaning ids never lowers it, so a cleaned id is never handed out again."""
    h = mock_meta_data()
    assert h.call(GetNextBrokerIdRequest(CLUSTER, NAME))[0].header.next_broker_id == 4
    h.alive = {1}
    assert h.call(CleanBrokerDataRequest(CLUSTER, NAME, "3", False))[0].ok
    assert h.call(GetNextBrokerIdRequest(CLUSTER, NAME))[0].header.next_broker_id == 4
    assert h.call(ApplyBrokerIdRequest(CLUSTER, NAME, 9, "x;1"))[0].ok  # out-of-order id: counter still +1
    assert h.call(GetNextBrokerIdRequest(CLUSTER, NAME))[0].header.next_broker_id == 5


def test_quirk6_fixed_fencing_checked_before_no_change():
    """Q6 FIXED: a stale master proposing the current set is fenced (2002/2000/2001), not told 'no change'."""
    h = mock_meta_data()
    same = frozenset({1, 2, 3})
    assert h.call(AlterSyncStateSetRequest(NAME, 2, 1, same, 2))[0].code == C.CONTROLLER_INVALID_MASTER
    assert h.call(AlterSyncStateSetRequest(NAME, 1, 0, same, 2))[0].code == C.CONTROLLER_FENCED_MASTER_EPOCH
    assert h.call(AlterSyncStateSetRequest(NAME, 1, 1, same, 1))[0].code == C.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH
    assert h.call(AlterSyncStateSetRequest(NAME, 1, 1, same, 2))[0].code == C.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED


def test_scan_need_reelect_and_reads():
    """Inactive-master scan: master dead and someone alive; reads are not writes; unknown request -> 3."""
    h = mock_meta_data()
    alive = {1, 2, 3}
    assert scan_need_reelect_broker_sets(h.state, lambda n, i: i in alive) == []
    alive = {2}
    assert scan_need_reelect_broker_sets(h.state, lambda n, i: i in alive) == [NAME]
    alive = set()
    assert scan_need_reelect_broker_sets(h.state, lambda n, i: i in alive) == []
    assert not is_write(GetReplicaInfoRequest(NAME)) and is_write(ElectMasterRequest.of_controller_trigger(NAME))
    assert h.call(GetReplicaInfoRequest("nope"))[0].code == C.CONTROLLER_BROKER_METADATA_NOT_EXIST
    assert h.call(GetSyncStateDataRequest(()))[0].code == C.SYSTEM_ERROR
    assert h.call("bogus")[0].code == C.REQUEST_CODE_NOT_SUPPORTED


@pytest.mark.parametrize("requester, beats, code, master, epoch", [
    # the restarted master is the most advanced replica: it wins, but under a new epoch
    (1, {1: (1, 300), 2: (1, 200), 3: (1, 100)}, C.SUCCESS, 1, 2),
    # a slave holds more data than the restarted master (its unflushed tail was lost): the slave wins
    (1, {1: (1, 100), 2: (1, 300), 3: (1, 200)}, C.SUCCESS, 2, 2),
    # equal progress: a replica that did not just restart is preferred (lowest id among them)
    (1, {1: (1, 300), 2: (1, 300), 3: (1, 300)}, C.SUCCESS, 2, 2),
    # the only live member is the restarted master itself: it gets a new epoch
    (1, {1: (1, 300)}, C.SUCCESS, 1, 2),
    # new_term from a replica that is not the master is an ordinary broker trigger: master still exists
    (2, {1: (1, 300), 2: (1, 300), 3: (1, 300)}, C.CONTROLLER_MASTER_STILL_EXIST, 1, 1),
])
def test_new_term_request_from_restarted_master_elects_by_progress(requester, beats, code, master, epoch):
    """Fix for a master killed and restarted before its heartbeat expired (a new epoch with the same
    master, apache/rocketmq#9689): it asks for a new term; the winner is chosen by progress with no
    preference for the old master, and always starts a new epoch with SyncStateSet {winner}."""
    h = mock_meta_data()
    h.alive = set()
    for broker_id, (ep, offset) in beats.items():
        h.heartbeat(broker_id, ep, offset, 10**9)
    resp, events = h.call(ElectMasterRequest.of_new_term(CLUSTER, NAME, requester))
    assert resp.code == code
    info = h.info()
    assert info.header.master_broker_id == master and info.header.master_epoch == epoch
    if code == C.SUCCESS:
        assert events == [ElectMasterEvent(True, NAME, master)]
        assert info.body["sync_state_set"] == [master]
    assert h.replay_matches()


@pytest.mark.parametrize("carried, master", [
    ((1, 100), 2),     # it holds 100 now (its unflushed tail is gone): the slave holding 300 wins
    ((1, 500), 1),     # it still holds 500: it wins again, under a new epoch
    ((-1, -1), 1),     # no progress carried: its row (500, reported before the restart) decides
])
def test_new_term_ranks_the_requester_by_the_progress_it_carries(carried, master):
    """Issue 15 fix 6 under reordering (found by the simulator, scenario violation-6): the restarted
    master's new-term request can be decided before its first heartbeat after the restart, while
    its row still holds what it reported before it lost power. The request carries its progress
    now, and that ranks it."""
    h = mock_meta_data()
    h.alive = set()
    h.heartbeat(1, 1, 500, 10**9)     # reported before the power loss
    h.heartbeat(2, 1, 300, 10**9)
    epoch, offset = carried
    resp, _events = h.call(ElectMasterRequest.of_new_term(CLUSTER, NAME, 1, epoch, offset))
    assert resp.code == C.SUCCESS and resp.header.master_broker_id == master


def test_new_term_old_rule_ranks_by_the_stale_row(monkeypatch):
    """Reverting the rule (ignore the carried progress) elects the master by data it no longer has."""
    from rocketray.controller import decide as decide_mod

    monkeypatch.setattr(decide_mod, "_with_requester_progress", lambda ctx, req: ctx)
    h = mock_meta_data()
    h.alive = set()
    h.heartbeat(1, 1, 500, 10**9)
    h.heartbeat(2, 1, 300, 10**9)
    resp, _events = h.call(ElectMasterRequest.of_new_term(CLUSTER, NAME, 1, 1, 100))
    assert resp.header.master_broker_id == 1


def only_master_in_sync() -> Harness:
    """Master 1 at epoch 1 with SyncStateSet {1}; 2 and 3 registered (expansions not yet applied)."""
    h = Harness()
    for i in (1, 2, 3):
        h.register(i, None)
    assert h.call(ElectMasterRequest.of_broker_trigger(CLUSTER, NAME, 1))[0].ok
    assert h.info().body["sync_state_set"] == [1]
    h.alive = set()
    return h


@pytest.mark.parametrize("beats, carried, master", [
    # 2 (outside the set) last wrote in epoch 1 too and holds more: its log contains 1's, it wins
    ({2: (1, 300), 3: (1, 100)}, (1, 200), 2),
    # the longest containing log wins (both 2 and 3 contain 1's)
    ({2: (1, 300), 3: (1, 400)}, (1, 200), 3),
    # equal bytes prove nothing new: the restarted master keeps the term (a new epoch)
    ({2: (1, 200), 3: (1, 100)}, (1, 200), 1),
    # a different last epoch proves no containment, however long
    ({2: (0, 900), 3: (2, 900)}, (1, 200), 1),
    # the requester carried no progress: its row decides (it reported 500 before the restart)
    ({2: (1, 300)}, (-1, -1), 1),
    # a dead replica is never elected
    ({}, (1, 200), 1),
])
def test_new_term_prefers_a_live_replica_whose_log_contains_the_masters(beats, carried, master):
    """Simulator async seed 5049 (scenario new-term-outside-sss): a master that lost its unflushed
    tail may have acknowledged it under the union view of an expansion the controller never applied;
    the joining replica holds those records. The new-term election considers, besides the other
    members, every live replica whose log provably contains the restarted master's."""
    h = only_master_in_sync()
    h.heartbeat(1, 1, 500, 10**9)
    for broker_id, (ep, offset) in beats.items():
        h.heartbeat(broker_id, ep, offset, 10**9)
    resp, events = h.call(ElectMasterRequest.of_new_term(CLUSTER, NAME, 1, *carried))
    assert resp.code == C.SUCCESS and resp.header.master_broker_id == master
    assert resp.header.master_epoch == 2 and h.info().body["sync_state_set"] == [master]
    assert events == [ElectMasterEvent(True, NAME, master)]
    assert h.replay_matches()


def test_new_term_outside_the_set_old_rule_reelects_the_shorter_master(monkeypatch):
    """Reverting the rule (only SyncStateSet members) re-elects the master with its shorter log."""
    from rocketray.controller import decide as decide_mod

    monkeypatch.setattr(decide_mod, "contains_log", lambda candidate, of: False)
    h = only_master_in_sync()
    h.heartbeat(1, 1, 500, 10**9)
    h.heartbeat(2, 1, 300, 10**9)
    resp, _events = h.call(ElectMasterRequest.of_new_term(CLUSTER, NAME, 1, 1, 200))
    assert resp.header.master_broker_id == 1


def test_contains_log():
    def row(epoch: int, offset: int) -> BrokerLiveInfo:
        return BrokerLiveInfo(CLUSTER, NAME, "a", 2, 0, epoch=epoch, max_offset=offset)
    assert contains_log(row(3, 10), row(3, 9))
    assert not contains_log(row(3, 9), row(3, 9)) and not contains_log(row(4, 10), row(3, 9))
    assert not contains_log(row(3, 10), row(-1, 0)) and not contains_log(None, row(3, 9))
    assert not contains_log(row(3, 10), None)
