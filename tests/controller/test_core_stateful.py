"""Hypothesis stateful test of the controller core: register / heartbeat / expire / elect / alter / clean.

Invariants (reference 19): master and SyncStateSet epochs never decrease while a set exists; a master is
always in its SyncStateSet; a successful election leaves SSS == {new master} with both epochs +1; decide
never mutates; replaying the emitted events on a fresh state (and a snapshot round trip) reproduces it."""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from rocketray.wire.controller_api import (AlterSyncStateSetRequest, ApplyBrokerIdRequest, BrokerHeartbeatRequest,
                                           CleanBrokerDataRequest, ElectMasterRequest, GetNextBrokerIdRequest,
                                           RegisterBrokerRequest, Response)
from rocketray.wire.controller_codes import ResponseCode as C
from rocketray.controller.decide import DecideContext, decide, scan_need_reelect_broker_sets
from rocketray.controller.events import decode_events, encode_events
from rocketray.controller.heartbeat import HeartbeatTable
from rocketray.controller.state import ControllerState

GROUPS = ("g0", "g1")
groups = st.sampled_from(GROUPS)
broker_ids = st.integers(1, 5)


def mostly(value: bool) -> st.SearchStrategy[bool]:
    """``value`` four times out of five."""
    return st.integers(0, 4).map(lambda x: value if x else not value)


class ControllerCoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = ControllerState()
        self.hb = HeartbeatTable()
        self.now_ms = 0
        self.log: list[Any] = []
        self.unclean = False
        self.epochs: dict[str, tuple[int, int]] = {}

    @initialize(unclean=st.booleans(), seeded=st.integers(0, 3))
    def setup(self, unclean: bool, seeded: int) -> None:
        """Start with ``seeded`` replicas registered in g0 (g1 starts empty)."""
        self.unclean = unclean
        for _ in range(seeded):
            self.register("g0", 3000)
        if seeded:
            assert self.call(ElectMasterRequest.of_broker_trigger("c", "g0", 1)).ok
        if seeded > 1:
            full = frozenset(range(1, seeded + 1))
            assert self.call(AlterSyncStateSetRequest("g0", 1, 1, full, 1)).ok

    def ctx(self) -> DecideContext:
        return DecideContext.from_heartbeats(self.hb, self.now_ms, self.unclean)

    def call(self, req: object) -> Response:
        before = self.state.to_snapshot()
        resp, events = decide(self.state, req, self.ctx())
        assert self.state.to_snapshot() == before, "decide mutated the state"
        assert resp.ok or events == [] or resp.code == C.CONTROLLER_MASTER_NOT_AVAILABLE
        events = decode_events(encode_events(events))  # what Raft would carry
        self.state.apply_all(events)
        self.log.extend(events)
        event(f"{type(req).__name__} -> {resp.code.name}")
        return resp

    @rule(group=groups, timeout_ms=st.integers(100, 3000))
    def register(self, group: str, timeout_ms: int) -> None:
        next_id = self.call(GetNextBrokerIdRequest("c", group)).header.next_broker_id
        if next_id > 5:
            return
        addr = f"10.0.0.{next_id}:9000"
        assert self.call(ApplyBrokerIdRequest("c", group, next_id, f"{addr};{self.now_ms}")).ok
        self.hb.on_heartbeat(BrokerHeartbeatRequest("c", group, addr, next_id, heartbeat_timeout_ms=timeout_ms),
                             self.now_ms)
        assert self.call(RegisterBrokerRequest("c", group, next_id, addr)).ok

    @rule(group=groups, bid=broker_ids, epoch=st.integers(-1, 6), offset=st.integers(-1, 2**40),
          prio=st.integers(0, 3), timeout_ms=st.integers(-100, 3000), port=st.integers(9000, 9001))
    def heartbeat(self, group: str, bid: int, epoch: int, offset: int, prio: int, timeout_ms: int,
                  port: int) -> None:
        req = BrokerHeartbeatRequest("c", group, f"10.0.0.{bid}:{port}", bid, epoch, offset, offset, timeout_ms, prio)
        assert self.hb.on_heartbeat(req, self.now_ms).ok

    @rule(delta_ms=st.integers(0, 4000))
    def expire(self, delta_ms: int) -> None:
        self.now_ms += delta_ms
        for _, name, bid in self.hb.expire(self.now_ms):
            assert not self.hb.is_alive(name, bid, self.now_ms)

    @rule(group=groups, kind=st.sampled_from(["controller", "broker", "admin"]), bid=broker_ids)
    def elect(self, group: str, kind: str, bid: int) -> None:
        req = {"controller": ElectMasterRequest.of_controller_trigger(group),
               "broker": ElectMasterRequest.of_broker_trigger("c", group, bid),
               "admin": ElectMasterRequest.of_admin_trigger("c", group, bid)}[kind]
        before = self.state.sync_state.get(group)
        epochs = None if before is None else (before.master_epoch, before.sync_state_set_epoch)
        resp = self.call(req)
        if resp.ok:
            after = self.state.sync_state[group]
            assert after.master_broker_id == resp.header.master_broker_id
            assert after.sync_state_set == {after.master_broker_id}
            assert epochs is not None and (after.master_epoch, after.sync_state_set_epoch) == \
                (epochs[0] + 1, epochs[1] + 1)
            assert self.hb.is_alive(group, after.master_broker_id, self.now_ms)

    @rule(group=groups, mask=st.integers(0, 31), stranger=mostly(False), fresh=mostly(True),
          with_master=mostly(True))
    def alter(self, group: str, mask: int, stranger: bool, fresh: bool, with_master: bool) -> None:
        replica = self.state.replica_info.get(group)
        known = sorted(replica.broker_id_info) if replica is not None else []
        members = frozenset(b for i, b in enumerate(known) if mask >> i & 1) | ({5} if stranger else set())
        sync = self.state.sync_state.get(group)
        master = sync.master_broker_id if sync is not None else 1
        m_epoch = sync.master_epoch if sync is not None else 0
        s_epoch = sync.sync_state_set_epoch if sync is not None else 0
        if master is not None and with_master:
            members = members | {master}
        req = AlterSyncStateSetRequest(group, master if master is not None else 1,
                                       m_epoch if fresh else m_epoch - 1, members, s_epoch)
        resp = self.call(req)
        if resp.ok:
            assert self.state.sync_state[group].sync_state_set == set(members)

    @rule(group=groups, mask=st.none() | st.integers(1, 31), stranger=mostly(False), living=mostly(False))
    def clean(self, group: str, mask: int | None, stranger: bool, living: bool) -> None:
        replica = self.state.replica_info.get(group)
        known = sorted(replica.broker_id_info) if replica is not None else []
        ids = None if mask is None else sorted({b for i, b in enumerate(known) if mask >> i & 1} |
                                               ({5} if stranger or not known else set()))
        text = None if not ids else ";".join(str(i) for i in ids)
        self.call(CleanBrokerDataRequest("c", group, text, living))

    @rule()
    def scan_and_reelect(self) -> None:
        ctx = self.ctx()
        for name in scan_need_reelect_broker_sets(self.state, ctx.alive):
            self.call(ElectMasterRequest.of_controller_trigger(name))

    @invariant()
    def epochs_never_decrease_and_master_in_sss(self) -> None:
        for name in list(self.epochs):
            if name not in self.state.sync_state:
                del self.epochs[name]  # a wiped set starts over
        for name, sync in self.state.sync_state.items():
            now = (sync.master_epoch, sync.sync_state_set_epoch)
            old = self.epochs.get(name, (0, 0))
            assert now[0] >= old[0] and now[1] >= old[1], (name, old, now)
            self.epochs[name] = now
            if sync.master_broker_id is not None:
                assert sync.master_broker_id in sync.sync_state_set
            assert sync.sync_state_set <= set(self.state.replica_info[name].broker_id_info)
        assert set(self.state.replica_info) == set(self.state.sync_state), "half-deleted broker-set"

    @invariant()
    def replay_and_snapshot_reproduce_state(self) -> None:
        fresh = ControllerState()
        fresh.apply_all(self.log)
        assert fresh == self.state
        data = msgpack.unpackb(msgpack.packb(self.state.to_snapshot()))
        assert ControllerState.from_snapshot(data) == self.state


ControllerCoreMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=50, deadline=None)
TestControllerCore = ControllerCoreMachine.TestCase
