"""The broker role machine, transition by transition (tables), pure: no IO, no clock.

Each row starts from a named state, applies inputs with store facts, and checks the actions and the
resulting (role, master epoch, master, SyncStateSet, in-flight report).
"""

from __future__ import annotations

import pytest

from rocketray.broker.role import (
    ApplySyncStateSet, BecomeMaster, BecomeSlave, Bootstrap, ElectAnswered, FollowMaster, IdAssigned,
    LeaderFound, Lifecycle, MasterInfo, ServeAsMaster, SwitchOrdered, SyncStateSetOrdered, NewTermAnswered, Registered, ReplicaInfoPolled,
    ReportAnswered, ReportOutcome, ReportSyncStateSet, RequestElection, RequestNewTerm, Role,
    RoleChangeNotified, RoleMachine, SendHeartbeat, SetWritable, ShrinkChecked, Stopped, StoreFacts,
    SwitchDone, SyncStateSetProposed,
)

A1, A2, A3 = "h:1", "h:2", "h:3"
ADDR = {1: A1, 2: A2, 3: A3}
F0 = StoreFacts(last_epoch=-1, max_offset=0)


def info(master: int | None, epoch: int, sss=(), sss_epoch: int = 0) -> MasterInfo:
    return MasterInfo(master, ADDR.get(master) if master else None, epoch, sss_epoch, frozenset(sss))


def fresh(me: int = 1) -> RoleMachine:
    m = RoleMachine(ADDR[me])
    assert m.step(IdAssigned(me)) == []
    return m


def master(me: int = 1, epoch: int = 1, sss=(1,), sss_epoch: int = 1) -> RoleMachine:
    """Registered with no master, then elected master of ``epoch`` with the confirmed set ``sss``."""
    m = fresh(me)
    assert m.step(Registered(info(None, 0))) == []
    assert m.step(ElectAnswered(info(me, epoch, sss, sss_epoch)), StoreFacts(epoch - 1)) == [
        BecomeMaster(epoch, False, frozenset(sss), sss_epoch)]
    assert m.step(SwitchDone(True)) == [ServeAsMaster(epoch, True), ApplySyncStateSet(frozenset(sss), sss_epoch),
                                      SetWritable(True)]
    return m


def slave(me: int = 2, of: int = 1, epoch: int = 1) -> RoleMachine:
    m = fresh(me)
    assert m.step(Registered(info(of, epoch, (of,), 1))) == [BecomeSlave(ADDR[of], epoch, of, False)]
    assert m.step(SwitchDone(True)) == [FollowMaster(ADDR[of], epoch)]
    return m


def view(m: RoleMachine) -> tuple:
    return (m.role, m.master_epoch, m.master_broker_id, m.sync_state_set, m.sync_state_set_epoch)


# ------------------------------------------------------------------------------ start and roles


def test_fresh_machine_is_fenced_with_no_role():
    m = fresh()
    assert (m.role, m.master_epoch, m.fenced, m.writable, m.running) == (Role.NONE, 0, True, False, False)


def test_register_without_master_then_bootstrap_elects():
    m = fresh()
    assert m.step(Registered(info(None, 0))) == []
    assert m.registered and m.fenced
    assert m.step(Bootstrap()) == [SendHeartbeat(), RequestElection()]
    assert m.step(ElectAnswered(None)) == [] and m.fenced       # nobody electable yet
    assert m.step(ElectAnswered(info(1, 1, (1,), 1))) == [BecomeMaster(1, False, frozenset({1}), 1)]
    assert not m.writable, "fenced while the switch is pending"
    assert m.step(SwitchDone(True)) == [ServeAsMaster(1, True), ApplySyncStateSet(frozenset({1}), 1),
                                      SetWritable(True)]
    assert view(m) == (Role.MASTER, 1, 1, {1}, 1) and m.running and m.writable


def test_bootstrap_when_master_known_only_heartbeats():
    assert slave().step(Bootstrap()) == [SendHeartbeat()]


def test_register_names_another_master():
    m = slave(me=2, of=1, epoch=1)
    assert view(m) == (Role.SLAVE, 1, 1, frozenset(), 0) and m.running and not m.writable


@pytest.mark.parametrize("source", [RoleChangeNotified, ReplicaInfoPolled, Registered])
@pytest.mark.parametrize("epoch", [0, 1])
def test_equal_or_older_epoch_is_ignored_by_a_master(source, epoch):
    """Fix 7 (master part): the master acts only on a strictly newer epoch."""
    m = master(epoch=1)
    before = view(m)
    assert m.step(source(info(2, epoch, (2,), 5))) == []
    assert view(m) == before and m.writable


@pytest.mark.parametrize("epoch", [0, 1])
def test_equal_or_older_epoch_is_ignored_by_a_slave(epoch):
    m = slave(me=3, of=1, epoch=1)
    assert m.step(RoleChangeNotified(info(2, epoch, (2,), 5))) == []
    assert view(m)[:3] == (Role.SLAVE, 1, 1)


def test_notification_without_master_is_ignored():
    m = slave()
    assert m.step(RoleChangeNotified(info(None, 7))) == [] and m.master_epoch == 1


def test_master_demoted_by_newer_epoch():
    m = master(epoch=1, sss=(1, 2), sss_epoch=2)
    assert m.step(RoleChangeNotified(info(2, 2, (2,), 3))) == [BecomeSlave(A2, 2, 2, False), SetWritable(False)]
    assert m.step(SwitchDone(True)) == [FollowMaster(A2, 2)]
    assert view(m)[:3] == (Role.SLAVE, 2, 2) and not m.writable


def test_slave_promoted_by_newer_epoch():
    m = slave(me=2, of=1, epoch=1)
    assert m.step(RoleChangeNotified(info(2, 2, (2,), 3)), StoreFacts(1)) == [
        BecomeMaster(2, False, frozenset({2}), 3)]
    assert m.step(SwitchDone(True)) == [ServeAsMaster(2, True), ApplySyncStateSet(frozenset({2}), 3),
                                      SetWritable(True)]
    assert view(m) == (Role.MASTER, 2, 2, {2}, 3)


def test_same_master_new_epoch_is_a_same_switch():
    """The re-elected master only starts a new epoch; a slave of the same master only moves its epoch."""
    m = master(epoch=1)
    assert m.step(ReplicaInfoPolled(info(1, 3, (1,), 4)), StoreFacts(1)) == [
        BecomeMaster(3, True, frozenset({1}), 4), SetWritable(False)]
    assert m.step(SwitchDone(True)) == [ServeAsMaster(3, False), ApplySyncStateSet(frozenset({1}), 4),
                                      SetWritable(True)]
    s = slave(me=2, of=1, epoch=1)
    assert s.step(ReplicaInfoPolled(info(1, 3, (1,), 4))) == [BecomeSlave(A1, 3, 1, True)]
    assert s.step(SwitchDone(True)) == [FollowMaster(A1, 3)] and s.master_epoch == 3


@pytest.mark.parametrize("ok", [True, False])
def test_promoting_only_while_a_switch_to_master_runs(ok):
    """``promoting`` (the shell holds puts meanwhile) is true from BecomeMaster until SwitchDone,
    whatever its outcome, and never for a switch to slave or a stopped machine."""
    m = slave(me=2, of=1, epoch=1)
    assert not m.promoting
    assert m.step(RoleChangeNotified(info(2, 2, (2,), 3)), StoreFacts(1)) == [BecomeMaster(2, False, frozenset({2}), 3)]
    assert m.promoting and not m.writable
    m.step(SwitchDone(ok))
    assert not m.promoting and m.writable == ok
    s = slave(me=2, of=1, epoch=1)
    assert s.step(RoleChangeNotified(info(3, 2, (3,), 3))) == [BecomeSlave(A3, 2, 3, False)]
    assert not s.promoting
    p = slave(me=2, of=1, epoch=1)
    p.step(RoleChangeNotified(info(2, 2, (2,), 3)), StoreFacts(1))
    p.step(Stopped())
    assert not p.promoting


@pytest.mark.parametrize("ok", [False])
def test_refused_switch_records_nothing_and_is_retried(ok):
    m = slave(me=2, of=1, epoch=1)
    n = RoleChangeNotified(info(2, 2, (2,), 3))
    assert m.step(n, StoreFacts(1)) == [BecomeMaster(2, False, frozenset({2}), 3)]
    assert m.step(SwitchDone(ok)) == []
    assert view(m) == (Role.SLAVE, 1, 1, frozenset(), 0)
    assert m.step(n, StoreFacts(1)) == [BecomeMaster(2, False, frozenset({2}), 3)]  # the retry


def test_one_switch_at_a_time():
    m = slave(me=2, of=1, epoch=1)
    assert m.step(RoleChangeNotified(info(3, 2, (3,), 3))) == [BecomeSlave(A3, 2, 3, False)]
    assert m.step(RoleChangeNotified(info(2, 3, (2,), 4)), StoreFacts(1)) == []  # dropped; polling retries
    assert m.step(SwitchDone(True)) == [FollowMaster(A3, 2)] and (m.master_epoch, m.master_broker_id) == (2, 3)
    assert m.step(SwitchDone(True)) == [] and m.master_epoch == 2  # a stray result changes nothing


def test_poll_with_no_master_at_newer_epoch_asks_for_election():
    m = slave(me=2, of=1, epoch=1)
    assert m.step(ReplicaInfoPolled(info(None, 2))) == [RequestElection()]
    assert m.step(ReplicaInfoPolled(info(None, 1))) == []


def test_poll_at_my_master_epoch_adopts_a_newer_sync_state_set_only():
    m = master(epoch=1, sss=(1, 2, 3), sss_epoch=2)
    assert m.step(ReplicaInfoPolled(info(1, 1, (1, 3), 3))) == [ApplySyncStateSet(frozenset({1, 3}), 3)]
    assert m.step(ReplicaInfoPolled(info(1, 1, (1, 2), 2))) == []
    assert m.sync_state_set == {1, 3}


# ------------------------------------------------------------------------------ #9689 restart


def test_restarted_before_controller_noticed_asks_for_a_new_term():
    """The controller still names me master of epoch 1, a term in my epoch file this process does not
    hold: never resume it; heartbeat and ask for a new term, then follow the new election."""
    m = fresh(me=1)
    facts = StoreFacts(last_epoch=1, max_offset=100)
    assert m.step(Registered(info(1, 1, (1, 2, 3), 2)), facts) == [SendHeartbeat(), RequestNewTerm(1)]
    assert m.role == Role.NONE and m.fenced and m.new_term_for == 1
    assert m.step(Bootstrap(), facts) == [SendHeartbeat()], "no second election while the new term is asked"
    assert m.step(ReplicaInfoPolled(info(1, 1, (1, 2, 3), 2)), facts) == []  # same old term: asked already
    assert m.step(NewTermAnswered(1, info(2, 2, (2,), 3)), facts) == [BecomeSlave(A2, 2, 2, False)]
    assert m.step(SwitchDone(True)) == [FollowMaster(A2, 2)] and view(m)[:3] == (Role.SLAVE, 2, 2)


def test_new_term_won_by_the_restarted_master_itself():
    m = fresh(me=1)
    facts = StoreFacts(last_epoch=1)
    assert m.step(RoleChangeNotified(info(1, 1, (1,), 1)), facts) == [SendHeartbeat(), RequestNewTerm(1)]
    assert m.step(NewTermAnswered(1, info(1, 2, (1,), 2)), facts) == [BecomeMaster(2, False, frozenset({1}), 2)]


@pytest.mark.parametrize("answer", [None, info(1, 1, (1,), 1)])
def test_refused_or_stale_new_term_is_asked_again_later(answer):
    m = fresh(me=1)
    m.step(Registered(info(1, 1, (1,), 1)), StoreFacts(1))
    assert m.step(NewTermAnswered(1, answer), StoreFacts(1)) == [] and m.new_term_for is None
    assert m.step(ReplicaInfoPolled(info(1, 1, (1,), 1)), StoreFacts(1)) == [SendHeartbeat(), RequestNewTerm(1)]


@pytest.mark.parametrize("last_epoch", [-1, 1, 2])
def test_term_named_by_the_registration_answer_is_asked_again(last_epoch):
    """Simulator async seed 5453 (scenario elected-then-lost-power): the answer to this process's
    registration names it master of epoch 3, a term it never took (not in its epoch file). The
    controller elected it by progress reported before this process started, which a power loss may
    have cut: ask for a new term, ranked by what the store holds now."""
    m = fresh(me=1)
    facts = StoreFacts(last_epoch=last_epoch, max_offset=100)
    assert m.step(Registered(info(1, 3, (1,), 4)), facts) == [SendHeartbeat(), RequestNewTerm(3)]
    assert m.fenced and m.new_term_for == 3
    assert m.step(NewTermAnswered(3, info(2, 4, (2,), 5)), facts) == [BecomeSlave(A2, 4, 2, False)]


def test_term_named_after_registration_is_taken_by_a_new_broker():
    """The same view from an election answer, a notification or a poll after registering, on a broker
    whose store holds no epoch yet (nothing a power loss could have cut): the term is taken at once."""
    for source in (ElectAnswered, RoleChangeNotified, ReplicaInfoPolled):
        m = fresh(me=1)
        assert m.step(Registered(info(None, 0))) == []
        assert m.step(source(info(1, 3, (1,), 4)), StoreFacts(-1)) == [BecomeMaster(3, False, frozenset({1}), 4)]


def test_first_term_after_a_restart_is_asked_again_whatever_names_it():
    """Simulator async-overlap seed 21 (scenario elected-while-down-named-later): the controller
    elected broker 1 while it was down (its heartbeats not yet expired) by progress it reported
    before losing power. Restarted with less (its store holds epoch 2), its registration answer names
    no master (the master's row is not alive there), and then a MASTER_STILL_EXIST answer to its
    election request, a notification or a poll names it master of epoch 3. It must not take that
    term with its shorter log: it asks for a new term, and takes the one that answer gives."""
    for source in (ElectAnswered, RoleChangeNotified, ReplicaInfoPolled):
        m = fresh(me=1)
        facts = StoreFacts(last_epoch=2, max_offset=100)
        assert m.step(Registered(info(None, 0)), facts) == []
        assert m.step(source(info(1, 3, (1,), 4)), facts) == [SendHeartbeat(), RequestNewTerm(3)]
        assert m.fenced and m.new_term_for == 3
        assert m.step(NewTermAnswered(3, info(1, 4, (1,), 5)), facts) == [BecomeMaster(4, False, frozenset({1}), 5)]


def test_a_later_term_of_a_restarted_broker_is_taken():
    """Once this process took a term (here a slave of epoch 3), a term naming it master was won by
    progress this process reported: taken at once."""
    m = fresh(me=1)
    facts = StoreFacts(last_epoch=2, max_offset=100)
    assert m.step(Registered(info(2, 3, (2,), 4)), facts) == [BecomeSlave(A2, 3, 2, False)]
    assert m.step(SwitchDone(True)) == [FollowMaster(A2, 3)]
    assert m.step(RoleChangeNotified(info(1, 4, (1,), 5)), StoreFacts(3, 100)) == [
        BecomeMaster(4, False, frozenset({1}), 5)]


def test_reverting_the_registration_rule_takes_the_term(monkeypatch):
    from rocketray.broker import role

    monkeypatch.setattr(role, "is_term_won_before_boot", lambda sitting, at_registration: False)
    monkeypatch.setattr(role, "is_first_term_after_restart", lambda sitting, held_epoch, last_epoch: False)
    m = fresh(me=1)
    assert m.step(Registered(info(1, 3, (1,), 4)), StoreFacts(2)) == [BecomeMaster(3, False, frozenset({1}), 4)]


def test_reverting_the_first_term_rule_takes_the_term(monkeypatch):
    from rocketray.broker import role

    monkeypatch.setattr(role, "is_first_term_after_restart", lambda sitting, held_epoch, last_epoch: False)
    m = fresh(me=1)
    assert m.step(Registered(info(None, 0)), StoreFacts(2)) == []
    assert m.step(ElectAnswered(info(1, 3, (1,), 4)), StoreFacts(2)) == [BecomeMaster(3, False, frozenset({1}), 4)]


def test_sitting_master_is_not_a_restart():
    """A master re-elected while it sits (its epoch is in its file because it wrote it) just goes on."""
    m = master(epoch=1)
    assert m.step(RoleChangeNotified(info(1, 2, (1,), 2)), StoreFacts(last_epoch=2)) == [
        BecomeMaster(2, True, frozenset({1}), 2), SetWritable(False)]


# ------------------------------------------------------------------------------ SyncStateSet reports


def test_proposal_reported_and_applied_only_when_confirmed():
    m = master(epoch=1)
    assert m.step(SyncStateSetProposed(frozenset({1, 2}))) == [ReportSyncStateSet(frozenset({1, 2}), 1, 1)]
    assert m.sync_state_set == {1}
    assert m.step(ReportAnswered(ReportOutcome.CONFIRMED, frozenset({1, 2}), 2)) == [
        ApplySyncStateSet(frozenset({1, 2}), 2)]
    assert m.report_in_flight is None and m.sync_state_set == {1, 2}


def test_one_report_in_flight_latest_queued_proposal_wins():
    m = master(epoch=1)
    assert m.step(SyncStateSetProposed(frozenset({1, 2}))) == [ReportSyncStateSet(frozenset({1, 2}), 1, 1)]
    assert m.step(SyncStateSetProposed(frozenset({1, 2, 3}))) == []
    assert m.step(ShrinkChecked(frozenset({1, 3}))) == []
    assert m.queued_proposal == {1, 3}
    assert m.step(ReportAnswered(ReportOutcome.CONFIRMED, frozenset({1, 2}), 2)) == [
        ApplySyncStateSet(frozenset({1, 2}), 2), ReportSyncStateSet(frozenset({1, 3}), 1, 2)]


def test_queued_proposal_equal_to_the_confirmed_set_is_dropped():
    m = master(epoch=1)
    m.step(SyncStateSetProposed(frozenset({1, 2})))
    m.step(SyncStateSetProposed(frozenset({1, 2})))
    assert m.step(ReportAnswered(ReportOutcome.CONFIRMED, frozenset({1, 2}), 2)) == [
        ApplySyncStateSet(frozenset({1, 2}), 2)]
    assert m.report_in_flight is None and m.queued_proposal is None


def test_refused_report_is_dropped_unknown_one_retried_at_next_check():
    m = master(epoch=1)
    m.step(SyncStateSetProposed(frozenset({1, 2})))
    assert m.step(ReportAnswered(ReportOutcome.REFUSED)) == [] and m.sync_state_set == {1}
    assert m.step(ShrinkChecked(frozenset({1}))) == []
    m.step(SyncStateSetProposed(frozenset({1, 2})))
    assert m.step(ReportAnswered(ReportOutcome.UNKNOWN)) == [] and m.retry_proposal == {1, 2}
    assert m.step(ShrinkChecked(frozenset({1}))) == [ReportSyncStateSet(frozenset({1, 2}), 1, 1)]


def test_shrink_check_reports_only_a_change():
    m = master(epoch=1, sss=(1, 2, 3), sss_epoch=2)
    assert m.step(ShrinkChecked(frozenset({1, 2, 3}))) == []
    assert m.step(ShrinkChecked(frozenset({2}))) == [ReportSyncStateSet(frozenset({1, 2}), 1, 2)]  # me added


def test_answer_for_an_old_term_is_not_applied():
    """Demoted while the report was in flight: the confirmed set belongs to the old term."""
    m = master(epoch=1)
    m.step(SyncStateSetProposed(frozenset({1, 2})))
    m.step(RoleChangeNotified(info(2, 2, (2,), 5)))
    m.step(SwitchDone(True))
    assert m.step(ReportAnswered(ReportOutcome.CONFIRMED, frozenset({1, 2}), 2)) == []
    assert m.sync_state_set == {1} and m.role == Role.SLAVE


def test_old_report_in_flight_holds_back_the_next_term_until_answered():
    """Re-elected at a new epoch while a report of the old epoch is in flight: still one in flight."""
    m = master(epoch=1)
    m.step(SyncStateSetProposed(frozenset({1, 2})))
    m.step(ReplicaInfoPolled(info(1, 2, (1,), 2)), StoreFacts(1))
    m.step(SwitchDone(True))
    assert m.step(SyncStateSetProposed(frozenset({1, 3}))) == []
    assert m.step(ReportAnswered(ReportOutcome.CONFIRMED, frozenset({1, 2}), 3)) == [
        ReportSyncStateSet(frozenset({1, 3}), 2, 2)]


@pytest.mark.parametrize("make", [lambda: slave(), lambda: fresh()])
def test_non_master_never_reports(make):
    m = make()
    assert m.step(SyncStateSetProposed(frozenset({1, 2}))) == [] and m.step(ShrinkChecked(frozenset({2}))) == []


def test_stopped_master_is_fenced_and_never_reports():
    m = master(epoch=1, sss=(1, 2, 3), sss_epoch=2)
    assert m.step(Stopped()) == [SetWritable(False)]
    assert m.step(SyncStateSetProposed(frozenset({1}))) == [] and m.report_in_flight is None
    assert m.step(RoleChangeNotified(info(2, 2, (2,), 3))) == [] and m.fenced


# ------------------------------------------------------------------------------ handshake epoch


def test_every_slave_switch_carries_the_controller_epoch():
    """The HA client refuses a master whose handshake epoch is not the controller's: so the machine
    hands it the controller's epoch on every switch, also for the same master at a new epoch."""
    m = slave(me=2, of=1, epoch=1)
    for epoch in (2, 5):
        assert m.step(RoleChangeNotified(info(1, epoch, (1,), epoch))) == [BecomeSlave(A1, epoch, 1, True)]
        assert m.step(SwitchDone(True)) == [FollowMaster(A1, epoch)] and m.master_epoch == epoch
    assert m.step(RoleChangeNotified(info(3, 6, (3,), 6))) == [BecomeSlave(A3, 6, 3, False)]


def test_master_info_from_controller_answers():
    from rocketray.wire.controller_api import Response
    from rocketray.wire.controller_headers import ElectMasterResponseHeader, GetReplicaInfoResponseHeader

    elect = Response(0, ElectMasterResponseHeader(2, A2, 4, 5), {"sync_state_set": [2], "sync_state_set_epoch": 5})
    poll = Response(0, GetReplicaInfoResponseHeader(None, None, 3), {"sync_state_set": [1, 2], "sync_state_set_epoch": 6})
    assert MasterInfo.from_response(elect) == MasterInfo(2, A2, 4, 5, frozenset({2}))
    assert MasterInfo.from_response(poll) == MasterInfo(None, None, 3, 6, frozenset({1, 2}))
    assert not MasterInfo.from_response(poll).names_master


def test_reverting_the_strictly_newer_rule_is_caught(monkeypatch):
    """The old rule (act on an equal epoch) re-switches a sitting master: this table catches it."""
    from rocketray.broker import role

    monkeypatch.setattr(role, "acts_on_epoch", lambda new, held: new >= held)
    m = master(epoch=1)
    assert m.step(RoleChangeNotified(info(2, 1, (2,), 5))) != []


def test_reverting_serialized_reports_is_caught(monkeypatch):
    """The old rule (every proposal reported at once) starts a second report while one is in flight."""
    from rocketray.broker import role

    m = master(epoch=1)
    m.step(SyncStateSetProposed(frozenset({1, 2})))
    assert m.step(SyncStateSetProposed(frozenset({1, 3}))) == []
    monkeypatch.setattr(role, "report_may_start", lambda in_flight: True)
    assert m.step(SyncStateSetProposed(frozenset({1, 2, 3}))) == [ReportSyncStateSet(frozenset({1, 2, 3}), 1, 1)]


# ------------------------------------------------------------------------------ lifecycle, preconditions


def test_lifecycle_is_the_machines():
    """INITIAL -> leader found -> registered -> RUNNING once a master is known -> SHUTDOWN; fenced
    unless RUNNING (reference 10.2; the lifecycle used to live beside the machine in the manager)."""
    m = fresh()
    assert m.lifecycle == Lifecycle.INITIAL and m.fenced
    assert m.step(LeaderFound()) == [] and m.lifecycle == Lifecycle.FIRST_TIME_SYNC_CONTROLLER_METADATA_DONE
    assert m.step(Registered(info(None, 0))) == [] and m.lifecycle == Lifecycle.REGISTER_TO_CONTROLLER_DONE
    m.step(ElectAnswered(info(1, 1, (1,), 1)))
    assert m.lifecycle == Lifecycle.REGISTER_TO_CONTROLLER_DONE and m.fenced, "not while the switch is pending"
    m.step(SwitchDone(True))
    assert m.lifecycle == Lifecycle.RUNNING and not m.fenced
    assert m.step(LeaderFound()) == [] and m.step(Registered(info(1, 1))) == [] and m.lifecycle == Lifecycle.RUNNING
    assert m.step(Stopped()) == [SetWritable(False)] and m.lifecycle == Lifecycle.SHUTDOWN and m.fenced


@pytest.mark.parametrize("who", ["slave", "same-master"])
def test_a_switch_to_an_epoch_older_than_the_epoch_file_is_never_started(who):
    """HA precondition (was HAService's): the epoch file already ends at a newer epoch."""
    if who == "slave":
        m = slave(me=2, of=1, epoch=1)
        event = RoleChangeNotified(info(3, 2, (3,), 3))
    else:
        m = master(epoch=1)
        event = ReplicaInfoPolled(info(1, 2, (1,), 3))
    before = view(m)
    assert m.step(event, StoreFacts(last_epoch=4)) == [] and m.switching is None and view(m) == before
    assert m.step(event, StoreFacts(last_epoch=2)) != [], "the next poll retries once it is not stale"


def test_a_standalone_endpoint_orders_switches_with_the_same_precondition():
    m = RoleMachine("ha-1", broker_id=1, lifecycle=Lifecycle.REGISTER_TO_CONTROLLER_DONE)
    go = BecomeMaster(3, False, frozenset(), 0)
    assert m.step(SwitchOrdered(go), StoreFacts(4)) == [], "stale"
    assert m.step(SwitchOrdered(go), StoreFacts(2)) == [go]
    assert m.step(SwitchDone(True)) == [ServeAsMaster(3, True), SetWritable(True)]
    assert m.step(SyncStateSetOrdered(frozenset({1, 7}))) == [ApplySyncStateSet(frozenset({1, 7}), 1)]
    down = BecomeSlave(None, 4, None, False)
    assert m.step(SwitchOrdered(down), StoreFacts(3)) == [down, SetWritable(False)]
    assert m.step(SwitchDone(True)) == [FollowMaster(None, 4)] and (m.role, m.master_epoch) == (Role.SLAVE, 4)
