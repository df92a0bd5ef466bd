"""The controller core at scale: many groups' controller-triggered elections decided as one batch
(``decide_elect_masters``), and the heartbeat table's refresh."""

from __future__ import annotations

import random

import pytest

from rocketray.wire.controller_api import (AlterSyncStateSetRequest, ApplyBrokerIdRequest, BrokerHeartbeatRequest,
                                           ElectMasterRequest, ElectMastersRequest)
from rocketray.wire.controller_codes import ResponseCode as C
from rocketray.controller.decide import DecideContext, decide, election_answers, is_write
from rocketray.controller.events import ElectMasterEvent
from rocketray.controller.heartbeat import HeartbeatTable
from rocketray.controller.state import ControllerState

CLUSTER = "c"


def build(groups: int, rng: random.Random) -> tuple[ControllerState, HeartbeatTable]:
    """``groups`` groups of 3 replicas in assorted states: no master yet, a master with 1-3 members
    in sync, a master already demoted; every replica heartbeats with its own progress."""
    state, table = ControllerState(), HeartbeatTable()
    for g in range(groups):
        name = f"g{g:03d}"
        for bid in (1, 2, 3):
            state.apply_all(decide(state, ApplyBrokerIdRequest(CLUSTER, name, bid, f"h{g}:{bid};x"), DecideContext())[1])
            table.on_heartbeat(BrokerHeartbeatRequest(CLUSTER, name, f"h{g}:{bid}", bid, rng.randint(0, 2),
                                                      rng.randint(0, 100), 0, 10_000), 0)
        shape = rng.randint(0, 3)
        if shape == 0:
            continue  # never elected
        master = rng.randint(1, 3)
        state.apply(ElectMasterEvent(True, name, master))
        sss = {master} | {b for b in (1, 2, 3) if rng.random() < 0.6}
        ctx = DecideContext()
        state.apply_all(decide(state, AlterSyncStateSetRequest(name, master, 1, frozenset(sss), 1), ctx)[1])
        if shape == 3:
            state.apply(ElectMasterEvent(False, name, None))
    return state, table


def alive_except(table: HeartbeatTable, dead: set[tuple[str, int]]):
    return lambda name, bid: (name, bid) not in dead and table.is_alive(name, bid, 0)


@pytest.mark.parametrize("seed", range(20))
def test_a_batch_of_elections_equals_the_same_elections_one_after_another(seed):
    """Deciding many groups' elections on one state (one Raft entry) gives the same answers, the same
    events and the same final tables as deciding them one by one, each on its predecessor's state."""
    rng = random.Random(seed)
    state, table = build(30, rng)
    dead = {(f"g{g:03d}", rng.randint(1, 3)) for g in range(30) if rng.random() < 0.5}
    ctx = DecideContext(alive_except(table, dead), table.live_info)
    names = [f"g{g:03d}" for g in rng.sample(range(30), 20)] + ["unknown-group"]
    names += names[:3]  # repeated names are decided once
    before = state.to_snapshot()
    batch, batch_events = decide(state, ElectMastersRequest(tuple(names)), ctx)
    assert state.to_snapshot() == before, "decide must not mutate"
    assert batch.ok and is_write(ElectMastersRequest(()))
    answers = election_answers(batch)
    assert list(answers) == list(dict.fromkeys(names))

    one_by_one, sequential_events = ControllerState.from_snapshot(before), []
    for name in dict.fromkeys(names):
        resp, events = decide(one_by_one, ElectMasterRequest.of_controller_trigger(name), ctx)
        assert answers[name] == resp, name
        one_by_one.apply_all(events)
        sequential_events.extend(events)
    assert batch_events == sequential_events
    state.apply_all(batch_events)
    assert state == one_by_one


def test_a_lost_third_is_re_elected_in_one_batch():
    """A node holding the masters of a third of 300 groups (and a replica of every group) dies: one
    batch elects a live in-sync replica for every one of those groups, and touches no other group."""
    state, table = ControllerState(), HeartbeatTable()
    for g in range(300):
        name = f"g{g:03d}"
        for bid in (1, 2, 3):
            state.apply_all(decide(state, ApplyBrokerIdRequest(CLUSTER, name, bid, f"h:{bid};x"), DecideContext())[1])
            table.on_heartbeat(BrokerHeartbeatRequest(CLUSTER, name, "h", bid, 1, 100, 100, 10_000), 0)
        state.apply(ElectMasterEvent(True, name, 1 + g % 3))
        state.apply_all(decide(state, AlterSyncStateSetRequest(name, 1 + g % 3, 1, frozenset({1, 2, 3}), 1),
                               DecideContext())[1])
    # node 0 holds broker id 1 of every group: the masters of g % 3 == 0
    lost = [f"g{g:03d}" for g in range(300) if g % 3 == 0]
    for g in range(300):
        table.remove(f"g{g:03d}", 1)
    ctx = DecideContext.from_heartbeats(table, 0)
    resp, events = decide(state, ElectMastersRequest(tuple(lost)), ctx)
    answers = election_answers(resp)
    assert all(a.code == C.SUCCESS and a.header.master_broker_id == 2 for a in answers.values())
    assert events == [ElectMasterEvent(True, name, 2) for name in lost]
    untouched = state.sync_state["g001"].master_epoch
    state.apply_all(events)
    assert state.sync_state["g001"].master_epoch == untouched
    assert {state.sync_state[n].master_broker_id for n in lost} == {2}


def test_a_refused_batch_has_no_answers():
    """A batch over the request limits is refused whole (2005, no event), never partly decided."""
    resp, events = decide(ControllerState(), ElectMastersRequest(tuple(f"g{i}" for i in range(2000))), DecideContext())
    assert resp.code == C.CONTROLLER_INVALID_REQUEST and events == [] and election_answers(resp) == {}


def test_heartbeat_refresh_keeps_every_field_of_the_last_report():
    """A refresh replaces address, timeout, priority and progress with the newest report (one row
    per replica however many groups there are)."""
    table = HeartbeatTable()
    for g in range(100):
        table.on_heartbeat(BrokerHeartbeatRequest(CLUSTER, f"g{g}", "a:1", 1, 1, 10, 5, 3000, 7), 0)
    table.on_heartbeat(BrokerHeartbeatRequest("c2", "g7", "b:2", 1, 2, 4, 3, 5000, 9), 50)
    row = table.live_info("g7", 1)
    assert (row.cluster_name, row.broker_address, row.last_update_ms, row.heartbeat_timeout_ms, row.epoch,
            row.max_offset, row.confirm_offset, row.election_priority) == ("c2", "b:2", 50, 5000, 2, 4, 3, 9)
    assert len(table) == 100 and table.live_info("g6", 1).last_update_ms == 0
