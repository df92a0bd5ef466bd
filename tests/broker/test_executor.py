"""The one executor of the role machine's actions (rocketray.broker.executor), one layer: the real
machine, recording ports. It checks the switch steps and their order, that the role is taken only
after the steps succeeded, that a failed step records nothing, and the controller answers' parsing.
"""

from __future__ import annotations

import asyncio

import pytest

from rocketray.broker import executor as ex
from rocketray.broker import role as rm
from rocketray.broker.executor import BrokerNames, Executor, run_now
from rocketray.broker.role import Lifecycle, MasterInfo, Role, RoleMachine, StoreFacts
from rocketray.wire.controller_headers import AlterSyncStateSetResponseHeader, ElectMasterResponseHeader
from rocketray.wire.controller_api import AlterSyncStateSetRequest, ElectMasterRequest, Response
from rocketray.wire.controller_codes import ResponseCode

NAMES = BrokerNames("c", "g", "h:1", heartbeat_timeout_ms=1500)


class Ports:
    """Both ports, answering at once (as production does once the answer is in)."""

    def __init__(self, machine: RoleMachine) -> None:
        self.m = machine
        self.calls: list[tuple] = []
        self.answers: dict[type, Response | None] = {}
        self.later: list[tuple] = []
        self.vetted: frozenset[int] | None | str = "same"
        self.fail_start = False
        self.last_epoch = -1

    async def ask(self, request, then):
        self.calls.append(("ask", type(request).__name__))
        return then(self.answers.get(type(request)))

    def ask_later(self, request, then):
        self.later.append((request, then))

    async def heartbeat(self, request):
        self.calls.append(("heartbeat", request.epoch, request.max_offset))

    async def stop_replication(self, reason):
        self.calls.append(("stop", self.m.role))

    async def start_epoch(self, epoch, cut_torn_tail):
        # the role is not taken yet, and writes are fenced, while the epoch starts
        self.calls.append(("start_epoch", epoch, cut_torn_tail, self.m.role, self.m.writable))
        if self.fail_start:
            raise OSError("disk full")
        self.last_epoch = epoch

    def serve_as_master(self, new_term):
        self.calls.append(("serve", new_term, self.m.role, self.m.master_epoch))

    def follow(self, master_address, epoch):
        self.calls.append(("follow", master_address, epoch, self.m.role))

    def set_sync_state_set(self, ids):
        self.calls.append(("sss", frozenset(ids)))

    def mark_in_flight(self, proposal):
        self.calls.append(("mark", frozenset(proposal)))
        return frozenset(proposal) if self.vetted == "same" else self.vetted


def make(me: int = 1) -> tuple[RoleMachine, Ports, Executor]:
    m = RoleMachine(f"h:{me}")
    ports = Ports(m)
    e = Executor(m, NAMES, controller=ports, ha=ports, facts=lambda: StoreFacts(ports.last_epoch, 100, 50),
                 now_ms=lambda: 7)
    run_now(e.feed(rm.IdAssigned(me)))
    return m, ports, e


def elected(master: int, epoch: int, sss=(1,), sss_epoch: int = 1) -> Response:
    addr = {1: "h:1", 2: "h:2"}[master]
    return Response(ResponseCode.SUCCESS, ElectMasterResponseHeader(master, addr, epoch),
                    {"sync_state_set": list(sss), "sync_state_set_epoch": sss_epoch})


def test_promotion_runs_the_steps_in_order_and_takes_the_role_after_them():
    m, ports, e = make()
    ports.answers[ElectMasterRequest] = elected(1, 1)
    run_now(e.feed(rm.Registered(MasterInfo(None, None, 0))))
    assert m.lifecycle == Lifecycle.REGISTER_TO_CONTROLLER_DONE
    run_now(e.feed(rm.Bootstrap()))
    assert ports.calls == [("heartbeat", -1, 100), ("ask", "ElectMasterRequest"), ("stop", Role.NONE),
                           ("start_epoch", 1, True, Role.NONE, False), ("serve", True, Role.MASTER, 1),
                           ("sss", frozenset({1}))]
    assert m.lifecycle == Lifecycle.RUNNING and m.writable


def test_same_master_new_epoch_only_starts_the_epoch_and_a_slave_follows():
    m, ports, e = make()
    ports.answers[ElectMasterRequest] = elected(1, 1)
    run_now(e.feed(rm.Registered(MasterInfo(None, None, 0))))
    run_now(e.feed(rm.Bootstrap()))
    ports.calls.clear()
    run_now(e.feed(rm.ReplicaInfoPolled(MasterInfo(1, "h:1", 2, 1, frozenset({1})))))
    assert ports.calls == [("start_epoch", 2, False, Role.MASTER, False), ("serve", False, Role.MASTER, 2)]
    ports.calls.clear()
    run_now(e.feed(rm.RoleChangeNotified(MasterInfo(2, "h:2", 3, 2, frozenset({2})))))
    assert ports.calls == [("stop", Role.MASTER), ("follow", "h:2", 3, Role.SLAVE)]
    ports.calls.clear()
    run_now(e.feed(rm.RoleChangeNotified(MasterInfo(2, "h:2", 4, 2, frozenset({2})))))
    assert ports.calls == [("follow", "h:2", 4, Role.SLAVE)], "the same master: the link only learns the epoch"


def test_a_failed_step_records_nothing_and_raises():
    m, ports, e = make()
    ports.fail_start = True
    run_now(e.feed(rm.Registered(MasterInfo(None, None, 0))))
    with pytest.raises(OSError):
        run_now(e.feed(rm.ElectAnswered(MasterInfo(1, "h:1", 1, 1, frozenset({1})))))
    assert (m.role, m.master_epoch, m.switching, m.fenced) == (Role.NONE, 0, None, True)
    ports.fail_start = False
    run_now(e.feed(rm.ElectAnswered(MasterInfo(1, "h:1", 1, 1, frozenset({1})))))
    assert m.role == Role.MASTER and m.writable, "retried at the same epoch"


def test_a_stale_switch_is_never_started():
    """The epoch file already ends at a newer epoch: no step runs, nothing is recorded."""
    m, ports, e = make(me=2)
    ports.last_epoch = 5
    run_now(e.feed(rm.Registered(MasterInfo(1, "h:1", 4, 1, frozenset({1})))))
    assert ports.calls == [] and (m.role, m.master_epoch, m.switching) == (Role.NONE, 0, None)


def test_report_is_vetted_sent_in_the_background_and_its_answer_parsed():
    m, ports, e = make()
    ports.answers[ElectMasterRequest] = elected(1, 1)
    run_now(e.feed(rm.Registered(MasterInfo(None, None, 0))))
    run_now(e.feed(rm.Bootstrap()))
    ports.vetted = frozenset({1, 2})            # member 3 lags the confirm offset: dropped
    run_now(e.feed(rm.SyncStateSetProposed(frozenset({1, 2, 3}))))
    (request, then), = ports.later
    assert isinstance(request, AlterSyncStateSetRequest)
    assert (request.new_sync_state_set, request.master_epoch, request.invoke_time_ms) == (frozenset({1, 2}), 1, 7)
    ok = Response(ResponseCode.SUCCESS, AlterSyncStateSetResponseHeader(2), {"sync_state_set": [1, 2]})
    assert then(ok) == rm.ReportAnswered(rm.ReportOutcome.CONFIRMED, frozenset({1, 2}), 2)
    assert then(None) == rm.ReportAnswered(rm.ReportOutcome.UNKNOWN)
    assert then(Response.error(ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH, "old")) == \
        rm.ReportAnswered(rm.ReportOutcome.REFUSED)
    run_now(e.feed(then(ok)))
    assert m.sync_state_set == {1, 2} and ("sss", frozenset({1, 2})) in ports.calls


def test_a_proposal_with_nothing_left_to_send_is_answered_refused_at_once():
    m, ports, e = make()
    ports.answers[ElectMasterRequest] = elected(1, 1)
    run_now(e.feed(rm.Registered(MasterInfo(None, None, 0))))
    run_now(e.feed(rm.Bootstrap()))
    ports.vetted = None
    run_now(e.feed(rm.SyncStateSetProposed(frozenset({1, 3}))))
    assert ports.later == [] and m.report_in_flight is None


def test_answers_of_elections_and_new_terms():
    still = Response(ResponseCode.CONTROLLER_MASTER_STILL_EXIST, ElectMasterResponseHeader(2, "h:2", 3))
    assert ex.elect_answer(still).info == MasterInfo(2, "h:2", 3)
    assert ex.elect_answer(None) == rm.ElectAnswered(None)
    assert ex.elect_answer(Response.error(ResponseCode.CONTROLLER_ELECT_MASTER_FAILED, "none")).info is None
    assert ex.new_term_answer(4, still) == rm.NewTermAnswered(4, None), "a new term is only SUCCESS"
    assert ex.new_term_answer(4, elected(1, 5)).info.master_epoch == 5
    assert ex.register_answer(None) is None and ex.poll_answer(still) is None
    req = ex.new_term_request(NAMES, 1, StoreFacts(3, 900))
    assert (req.new_term, req.epoch, req.max_offset) == (True, 3, 900)


def test_run_now_refuses_a_port_that_suspends():
    async def suspends():
        await asyncio.sleep(0)
    with pytest.raises(AssertionError):
        run_now(suspends())
