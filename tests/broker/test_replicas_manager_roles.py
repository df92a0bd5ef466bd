"""ReplicasManager role changes, SyncStateSet reports and the periodic steps (reference §10.3-10.8, §5.5).

The controller is the real pure core (decide + ControllerState.apply + HeartbeatTable) at a fake
clock; the HA service and the store are recording fakes. Controller-side actions a test needs
(a controller-triggered election after a master died) are sent straight to the fake controller.
"""

from __future__ import annotations

import asyncio

import pytest

from rocketray.broker.replicas_manager import (ReplicasManager, ReplicasManagerConfig, RoleChangeNotification, Role,
                                               State)
from rocketray.wire.controller_api import ElectMasterRequest, Response
from rocketray.wire.controller_codes import ResponseCode
import replicas_manager_fakes as fakes

GROUP = fakes.GROUP
A1, A2, A3 = "127.0.0.1:9000", "127.0.0.1:9001", "127.0.0.1:9002"


async def group_of_three():
    """b1 master at epoch 1; b2 and b3 slaves; SyncStateSet {1,2,3} confirmed at epoch 2."""
    clock = fakes.FakeClock()
    ctl = fakes.FakeController(clock)
    bs = [fakes.Replica(ctl, clock, fakes.MemIdentityStore(), a) for a in (A1, A2, A3)]
    for b in bs:
        assert await b.rm.start_basic_service_once()
    assert await bs[0].rm.report_sync_state_set({1, 2, 3})
    return clock, ctl, bs


def run(coro):
    return asyncio.run(coro)


def test_slaves_follow_the_master_address_from_the_controller():
    async def scenario():
        clock, ctl, (b1, b2, b3) = await group_of_three()
        assert b1.rm.role == Role.MASTER and b1.rm.sync_state_set == {1, 2, 3}
        assert b1.ha.sync_state_set == {1, 2, 3} and b1.rm.sync_state_set_epoch == 2
        assert b2.ha.roles() == [("change_to_slave", A1, 1)] and b3.ha.roles() == [("change_to_slave", A1, 1)]
    run(scenario())


def test_role_change_only_for_strictly_newer_epochs():
    """Invariant of §19: a broker never acts on a role change whose epoch is not strictly greater."""
    async def scenario():
        clock, ctl, (b1, b2, b3) = await group_of_three()
        stale = RoleChangeNotification(2, A2, 1, 5, frozenset({2}))
        assert not await b1.rm.on_role_change(stale)
        assert not await b3.rm.on_role_change(RoleChangeNotification(3, A3, 0, 9, frozenset({3})))
        with pytest.raises(TypeError, match="MasterInfo"):  # the one shape: a map is refused, nothing changes
            await b3.rm.on_role_change({"master_broker_id": 3, "master_address": A3, "master_epoch": 5,
                                        "sync_state_set_epoch": 9, "sync_state_set": [3]})
        assert not await b2.rm.on_role_change(RoleChangeNotification(None, None, 7, 7, frozenset()))
        assert b1.ha.roles() == [("change_to_master", 1)] and b1.rm.role == Role.MASTER
        assert b3.ha.roles() == [("change_to_slave", A1, 1)]
        newer = RoleChangeNotification(2, A2, 2, 3, frozenset({2}))
        assert await b1.rm.on_role_change(newer) and await b2.rm.on_role_change(newer)
        assert await b3.rm.on_role_change(newer)
        assert not await b3.rm.on_role_change(newer)  # a duplicate notification is a no-op
        assert b1.rm.role == Role.SLAVE and not b1.rm.writable and b1.ha.roles()[-1] == ("change_to_slave", A2, 2)
        assert b2.rm.role == Role.MASTER and b2.rm.writable and b2.ha.roles()[-1] == ("change_to_master", 2)
        assert b2.rm.sync_state_set == {2} and b2.ha.sync_state_set == {2}
        assert b3.ha.roles() == [("change_to_slave", A1, 1), ("change_to_slave", A2, 2)]
    run(scenario())


def test_failover_found_by_polling_and_old_master_rejoins_as_slave():
    """§16.7 testChangeMaster at the unit level: the master dies, the controller elects b2 (epoch 2),
    b2 and b3 learn it by polling; the old master restarts and registers as b2's slave."""
    async def scenario():
        clock, ctl, (b1, b2, b3) = await group_of_three()
        clock.advance(11_000)  # b1 stops heartbeating; b2 and b3 keep going
        for b in (b2, b3):
            b.store.max_offset = 100
            assert await b.rm.heartbeat_once()
        resp = await ctl.call(ElectMasterRequest.of_controller_trigger(GROUP), address=ctl.leader)
        assert resp.ok and resp.header.master_epoch == 2
        new_master = resp.header.master_broker_id
        assert new_master in (2, 3)
        for b in (b2, b3):
            await b.rm.sync_metadata_once()
        winner, other = (b2, b3) if new_master == 2 else (b3, b2)
        assert winner.rm.role == Role.MASTER and winner.rm.master_epoch == 2
        assert winner.ha.roles()[-1] == ("change_to_master", 2)
        assert other.ha.roles()[-1] == ("change_to_slave", winner.address, 2)
        b1.restart()
        assert await b1.rm.start_basic_service_once()
        assert b1.rm.role == Role.SLAVE and b1.ha.roles() == [("change_to_slave", winner.address, 2)]
    run(scenario())


def test_polling_no_master_triggers_a_broker_election():
    """§10.7: the controller says 'no master' at a newer epoch -> the broker asks for an election."""
    async def scenario():
        clock, ctl, (b1, b2, b3) = await group_of_three()
        assert await b1.rm.report_sync_state_set({1})  # SSS shrinks to the master alone
        clock.advance(11_000)  # everybody's heartbeat expired
        resp = await ctl.call(ElectMasterRequest.of_controller_trigger(GROUP), address=ctl.leader)
        assert resp.code == ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE
        assert ctl.master() == (None, None, 2)
        for b in (b2, b3):  # not in the SSS: polling asks, the controller refuses; they stay put
            await b.rm.heartbeat_once()
            await b.rm.sync_metadata_once()
            assert b.rm.master_epoch == 1
        await b1.rm.heartbeat_once()
        await b1.rm.sync_metadata_once()  # the SSS member comes back and is elected again
        assert ctl.master() == (1, A1, 3)
        assert b1.rm.master_epoch == 3 and b1.ha.roles()[-1] == ("change_to_master_same", 3)
        await b2.rm.sync_metadata_once()
        # same master at the same HA address: the HA service is told the new epoch (it keeps its client)
        assert b2.rm.master_epoch == 3 and b2.ha.roles() == [("change_to_slave", A1, 1), ("change_to_slave", A1, 3)]
    run(scenario())


def test_sss_expand_applied_only_after_controller_confirms():
    """§10.8: the HA listener's proposal reaches the HA service only as the controller's answer."""
    async def scenario():
        clock = fakes.FakeClock()
        ctl = fakes.FakeController(clock)
        b1 = fakes.Replica(ctl, clock, fakes.MemIdentityStore(), A1)
        b2 = fakes.Replica(ctl, clock, fakes.MemIdentityStore(), A2)
        assert await b1.rm.start_basic_service_once() and await b2.rm.start_basic_service_once()
        assert b1.ha.listeners == [b1.rm._on_sss_proposed]
        ctl.fail("AlterSyncStateSetRequest",
                 Response.error(ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH, "fenced"))
        b1.ha.listeners[0]({1, 2})
        await b1.rm.settle()
        assert b1.rm.sync_state_set == {1} and b1.ha.sync_state_set == {1}
        assert ("set_sync_state_set", frozenset({1, 2})) not in b1.ha.calls
        ctl.fail("AlterSyncStateSetRequest")  # transport failure: logged, nothing applied
        b1.ha.listeners[0]({1, 2})
        await b1.rm.settle()
        assert b1.rm.sync_state_set == {1}
        b1.ha.listeners[0]({1, 2})
        await b1.rm.settle()
        assert b1.rm.sync_state_set == {1, 2} and b1.ha.sync_state_set == {1, 2}
        assert b1.rm.sync_state_set_epoch == 2 == ctl.state.sync_state[GROUP].sync_state_set_epoch
    run(scenario())


def test_shrink_check_reports_and_slave_never_reports():
    async def scenario():
        clock, ctl, (b1, b2, b3) = await group_of_three()
        b1.ha.shrink_result = {1, 2}  # 3 did not catch up in time
        await b1.rm.check_sync_state_set_once()
        assert b1.rm.sync_state_set == {1, 2} and ctl.state.sync_state[GROUP].sync_state_set == {1, 2}
        n = len(ctl.requests)
        await b1.rm.check_sync_state_set_once()  # nothing changed: no request
        assert len(ctl.requests) == n
        b2.ha.shrink_result = {2}
        await b2.rm.check_sync_state_set_once()
        assert not await b2.rm.report_sync_state_set({2})
        assert len(ctl.requests) == n
    run(scenario())


def test_polling_adopts_a_newer_sss_for_the_same_epoch():
    """§10.7: same master epoch and I am master -> adopt the controller's SSS if its epoch is newer."""
    async def scenario():
        clock, ctl, (b1, b2, b3) = await group_of_three()
        # the controller moved on without us seeing the answer (e.g. the reply was lost)
        from rocketray.wire.controller_api import AlterSyncStateSetRequest

        req = AlterSyncStateSetRequest(GROUP, 1, 1, frozenset({1, 3}), 2)
        assert (await ctl.call(req, address=ctl.leader)).ok
        await b1.rm.sync_metadata_once()
        assert b1.rm.sync_state_set == {1, 3} and b1.rm.sync_state_set_epoch == 3 and b1.ha.sync_state_set == {1, 3}
    run(scenario())


@pytest.mark.parametrize("how", ["stale", "raise"])
def test_refused_promotion_is_retried_at_the_same_epoch(how):
    """If a promotion is stale (the epoch file already holds a newer epoch: the role machine never
    starts it) or the HA service fails it, the epoch is not recorded, so the next notification or
    poll retries it."""
    async def scenario():
        clock, ctl, (b1, b2, b3) = await group_of_three()
        n = RoleChangeNotification(2, A2, 2, 3, frozenset({2}))
        if how == "raise":
            b2.ha.fail_master = True
            with pytest.raises(RuntimeError):
                await b2.rm.on_role_change(n)
        else:
            b2.store.epoch_file.epochs.append(3)
            assert not await b2.rm.on_role_change(n)
            assert b2.ha.roles() == [("change_to_slave", A1, 1)], "never started"
            b2.store.epoch_file.epochs.pop()
        assert b2.rm.master_epoch == 1 and b2.rm.role == Role.SLAVE and b2.rm.sync_state_set == frozenset()
        b2.ha.fail_master = False
        assert await b2.rm.on_role_change(n) and b2.rm.role == Role.MASTER and b2.rm.master_epoch == 2
    run(scenario())


def test_ha_factory_is_called_once_with_the_registered_id():
    """The HA service needs the broker id: built once the id is durable, before REGISTER_BROKER."""
    async def scenario():
        clock = fakes.FakeClock()
        ctl = fakes.FakeController(clock)
        store = fakes.FakeStore()
        made = []

        async def factory(broker_id, roles):
            made.append((broker_id, list(ctl.names())))
            return fakes.FakeHA(store)

        rm = ReplicasManager(cluster_name=fakes.CLUSTER, broker_name=GROUP, broker_address=A1,
                             controller_client=ctl, store=store, identity=fakes.MemIdentityStore(),
                             now_ms=clock, ha_factory=factory)
        assert rm.ha is None
        ctl.fail("RegisterBrokerRequest")
        assert not await rm.start_basic_service_once()
        assert await rm.start_basic_service_once()
        assert made == [(1, ["GetNextBrokerIdRequest", "ApplyBrokerIdRequest"])]
        assert rm.ha.roles() == [("change_to_master", 1)]
    run(scenario())


def test_heartbeat_content():
    """§10.9: epoch of the local epoch file, max and confirm offsets, configured timeout and priority."""
    async def scenario():
        clock, ctl, (b1, b2, b3) = await group_of_three()
        b1.store.max_offset, b1.store.confirm_offset = 4096, 2048
        await b1.rm.heartbeat_once()
        hb = ctl.heartbeat_log[-1]
        assert (hb.broker_name, hb.broker_id, hb.broker_address, hb.epoch) == (GROUP, 1, A1, 1)
        assert (hb.max_offset, hb.confirm_offset, hb.heartbeat_timeout_ms) == (4096, 2048, 10000)
        assert hb.election_priority == 2**31 - 1
        hb2 = b2.rm.heartbeat_request()
        assert hb2.epoch == -1  # a slave that never received data has an empty epoch file
    run(scenario())


def test_lost_controller_metadata_triggers_re_register():
    async def scenario():
        clock, ctl, (b1, b2, b3) = await group_of_three()
        ctl.fail("GetReplicaInfoRequest",
                 Response.error(ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST, "Broker metadata is not existed"))
        await b2.rm.sync_metadata_once()
        assert ctl.names()[-1] == "RegisterBrokerRequest"
    run(scenario())


def test_runner_reaches_running_and_keeps_heartbeating():
    """start() schedules bootstrap and periodic steps; driven by a fake sleep that advances the clock."""
    async def scenario():
        clock = fakes.FakeClock()
        ctl = fakes.FakeController(clock)
        b = fakes.Replica(ctl, clock, fakes.MemIdentityStore(), A1)
        b.rm.config = ReplicasManagerConfig(broker_heartbeat_interval_ms=100, sync_broker_metadata_period_ms=200)
        ctl.fail("GetNextBrokerIdRequest", times=2)  # the bootstrap has to retry

        async def fake_sleep(seconds: float) -> None:
            clock.advance(int(seconds * 1000))
            await asyncio.sleep(0)

        b.rm._sleep = fake_sleep
        b.rm.start()
        for _ in range(2000):
            if b.rm.state == State.RUNNING and len(ctl.heartbeat_log) >= 5 and \
                    ctl.names().count("GetReplicaInfoRequest") >= 2:
                break
            await asyncio.sleep(0)
        assert b.rm.state == State.RUNNING, b.rm.status()
        assert len(ctl.heartbeat_log) >= 5 and ctl.names().count("GetReplicaInfoRequest") >= 2
        assert b.ha.listeners == [b.rm._on_sss_proposed]  # registered once despite retries
        await b.rm.stop()
        assert b.rm.state == State.SHUTDOWN and b.rm.fenced and b.rm._tasks == []
        n = len(ctl.heartbeat_log)
        for _ in range(50):
            await asyncio.sleep(0)
        assert len(ctl.heartbeat_log) == n
    run(scenario())


def test_no_sss_report_after_stop():
    """Closing a stopped master's HA service drops its slaves; that shrink must not reach the
    controller, or the dying master would be left alone in its SyncStateSet and block failover."""
    async def scenario():
        clock, ctl, (b1, b2, b3) = await group_of_three()
        await b1.rm.stop()
        n = len(ctl.requests)
        b1.ha.listeners[0]({1})
        assert not await b1.rm.report_sync_state_set({1})
        await b1.rm.settle()
        assert len(ctl.requests) == n and ctl.state.sync_state[GROUP].sync_state_set == {1, 2, 3}
    run(scenario())


def test_restarted_master_asks_for_a_new_term_and_the_most_advanced_replica_wins():
    """A master killed and restarted before its heartbeat expired: the controller still names it
    master of epoch 1, a term already in its epoch file. It must not resume that term: it asks for
    a new term, the controller elects by progress (here b2 holds more data), and the old master
    follows b2 at epoch 2 instead of writing on."""
    async def scenario():
        clock, ctl, (b1, b2, b3) = await group_of_three()
        for b, offset in ((b2, 300), (b3, 200)):
            b.store.epoch_file.epochs = [1]  # replicated from the master (the fake HA does not)
            b.store.max_offset = offset
            assert await b.rm.heartbeat_once()
        b1.restart()
        b1.store.max_offset = 100  # its unflushed tail was lost in the crash
        assert await b1.rm.start_basic_service_once()
        assert ("ElectMasterRequest" in ctl.names() and
                any(getattr(r, "new_term", False) for n, r in ctl.requests if n == "ElectMasterRequest"))
        assert ctl.master() == (2, A2, 2)
        assert b1.rm.role == Role.SLAVE and b1.rm.master_epoch == 2 and not b1.rm.writable
        assert b1.ha.roles() == [("change_to_slave", A2, 2)], "never promoted into the old term"
    run(scenario())


def test_register_names_me_master_but_ha_fails_stays_fenced():
    """A promotion the HA service fails never unfences the broker."""
    async def scenario():
        clock = fakes.FakeClock()
        ctl = fakes.FakeController(clock)
        b = fakes.Replica(ctl, clock, fakes.MemIdentityStore(), A1)
        b.ha.fail_master = True
        with pytest.raises(RuntimeError):
            await b.rm.start_basic_service_once()
        assert b.rm.fenced and b.rm.master_broker_id is None and b.rm.state == State.REGISTER_TO_CONTROLLER_DONE
        b.ha.fail_master = False
        assert await b.rm.start_basic_service_once() and b.rm.writable
    run(scenario())


def test_sss_answer_for_an_old_term_is_not_applied():
    """The controller confirmed a SyncStateSet, but the broker was demoted while the call was in
    flight: the answer belongs to the old term and must not reach the (now slave) HA service."""
    async def scenario():
        clock, ctl, (b1, b2, b3) = await group_of_three()
        real_call = ctl.call

        async def call_then_demote(request, address=None):
            resp = await real_call(request, address)
            if type(request).__name__ == "AlterSyncStateSetRequest":
                await b1.rm.on_role_change(RoleChangeNotification(2, A2, 2, 9, frozenset({2})))
            return resp

        b1.rm.client = type("C", (), {"call": staticmethod(call_then_demote), "heartbeat": ctl.heartbeat,
                                      "metadata": ctl.metadata})()
        assert not await b1.rm.report_sync_state_set({1, 2})
        assert b1.rm.role == Role.SLAVE and b1.ha.sync_state_set == {1, 2, 3}
    run(scenario())


def test_sss_reports_are_serialized_one_in_flight():
    """HA proposals arriving while a report is in flight wait; the latest is sent after the answer
    (SyncStateSet reports used to run as concurrent tasks)."""
    async def scenario():
        clock, ctl, (b1, b2, b3) = await group_of_three()
        real_call = ctl.call
        gate = asyncio.Event()
        in_flight, most = [0], [0]

        async def slow_alter(request, address=None):
            if type(request).__name__ != "AlterSyncStateSetRequest":
                return await real_call(request, address)
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
            await gate.wait()
            try:
                return await real_call(request, address)
            finally:
                in_flight[0] -= 1

        b1.rm.client = type("C", (), {"call": staticmethod(slow_alter), "heartbeat": ctl.heartbeat,
                                      "metadata": ctl.metadata})()
        listener = b1.ha.listeners[0]
        listener({1, 2})          # connection of 3 closed
        for _ in range(20):
            await asyncio.sleep(0)
        assert b1.rm.machine.report_in_flight is not None and in_flight[0] == 1
        listener({1})             # then 2's: queued behind the first
        listener({1, 3})          # 3 is back: the latest proposal wins
        for _ in range(20):
            await asyncio.sleep(0)
        assert in_flight[0] == 1 and b1.rm.machine.queued_proposal == {1, 3}
        gate.set()
        await b1.rm.settle()
        assert most[0] == 1
        sent = [r.new_sync_state_set for n, r in ctl.requests if n == "AlterSyncStateSetRequest"]
        assert sent[-2:] == [{1, 2}, {1, 3}]
        marked = [c[1] for c in b1.ha.calls if c[0] == "mark_in_flight"]
        assert marked[-2:] == [{1, 2}, {1, 3}], "each report enters the HA union view as it is sent"
        assert b1.rm.sync_state_set == {1, 3} == ctl.state.sync_state[GROUP].sync_state_set
        assert b1.ha.sync_state_set == {1, 3} and b1.rm.sync_state_set_epoch == 4
    run(scenario())


def test_equal_epoch_notification_does_not_touch_a_sitting_master():
    """Fix 7 (master part) through the shell: the same or an older epoch never reaches the HA service."""
    async def scenario():
        clock, ctl, (b1, b2, b3) = await group_of_three()
        calls = list(b1.ha.calls)
        for epoch in (0, 1):
            assert not await b1.rm.on_role_change(RoleChangeNotification(2, A2, epoch, 9, frozenset({2})))
        assert b1.ha.calls == calls and b1.rm.writable and b1.rm.sync_state_set == {1, 2, 3}
    run(scenario())


def test_shell_does_not_probe_its_ports():
    """Ports are declared Protocols; the shell never fits itself to a collaborator."""
    import inspect as _inspect

    import rocketray.broker.replicas_manager as module

    source = _inspect.getsource(module)
    for probe in ("import inspect", "hasattr(", "_maybe_await", "callable(", "getattr("):
        assert probe not in source, probe


@pytest.mark.parametrize("rule, winner", [("as_is", 2), ("old_heartbeat_rule", 2), ("no_carried_progress", 2),
                                          ("both_old", 1)])
def test_restarted_master_with_a_lost_tail_is_ranked_by_what_it_has_now(monkeypatch, rule, winner):
    """Fix 6 through the shell: the master heartbeated 500 bytes, was killed and restarted with 100
    (power loss). It asks for a new term with a fresh heartbeat and its progress in the request; the
    controller must rank it by 100, so b2 (300) wins. Either rule alone suffices here (the fresh
    heartbeat lands first); with both old rules (the heartbeat row keeps the best progress of the
    epoch, the request carries none) the old master wins the new term with data it no longer has."""
    from rocketray.controller import decide as decide_mod
    from rocketray.controller import heartbeat as hb

    if rule in ("old_heartbeat_rule", "both_old"):
        monkeypatch.setattr(hb, "_takes_report", lambda old, req: req.epoch > old.epoch or (
            req.epoch == old.epoch and req.max_offset > old.max_offset))
    if rule in ("no_carried_progress", "both_old"):
        monkeypatch.setattr(decide_mod, "_with_requester_progress", lambda ctx, req: ctx)

    async def scenario():
        clock, ctl, (b1, b2, b3) = await group_of_three()
        b1.store.max_offset = 500
        assert await b1.rm.heartbeat_once()
        for b, offset in ((b2, 300), (b3, 200)):
            b.store.epoch_file.epochs = [1]
            b.store.max_offset = offset
            assert await b.rm.heartbeat_once()
        b1.restart()
        b1.store.max_offset = 100
        assert await b1.rm.start_basic_service_once()
        return ctl.master()[0]

    assert run(scenario()) == winner
