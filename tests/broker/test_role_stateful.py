"""Hypothesis stateful test of the broker role machine against a model controller.

The model controller keeps the history of its elections (epoch -> master); the broker under test
(id 1) receives views drawn from that history in any order (stale, duplicated, reordered, as
notifications, polls and answers), switch results that may fail, SyncStateSet proposals and report
answers, and restarts (a new machine on the same epoch file). After every step:
  * the master epoch of one machine never goes back;
  * the broker is master only at an epoch where the controller elected it, and never resumes a term
    that was in its epoch file when it (re)started;
  * at most one SyncStateSet report is in flight, and at most one switch is pending;
  * applied SyncStateSet epochs strictly increase; writable implies running master.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rocketray.broker.role import (
    ApplySyncStateSet, BecomeMaster, BecomeSlave, Bootstrap, ElectAnswered, IdAssigned, MasterInfo,
    NewTermAnswered, Registered, ReplicaInfoPolled, ReportAnswered, ReportOutcome, ReportSyncStateSet,
    RequestElection, RequestNewTerm, Role, RoleChangeNotified, RoleMachine, SetWritable, ShrinkChecked,
    Stopped, StoreFacts, SwitchDone, SyncStateSetProposed,
)

ME = 1
ADDR = {1: "h:1", 2: "h:2", 3: "h:3"}
ids = st.sampled_from([1, 2, 3])
masters = st.sampled_from([1, 2, 3, None])   # None: a failed election (the epoch still moves)


class RoleMachineModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.elections: dict[int, int | None] = {}   # controller: epoch -> elected master (None: failed)
        self.ctl_epoch = 0
        self.sss_epoch = 0
        self.last_epoch = -1                          # the broker's epoch file (survives restarts)
        self.start()

    def start(self) -> None:
        self.m = RoleMachine(ADDR[ME])
        self.m.step(IdAssigned(ME))
        self.file_at_start = self.last_epoch
        self.held_epoch = 0
        self.outstanding_report: ReportSyncStateSet | None = None
        self.pending_switch: BecomeMaster | BecomeSlave | None = None
        self.pending_new_term: int | None = None
        self.elect_asked = False
        self.applied_epochs: list[int] = []

    # -- helpers ---------------------------------------------------------------------------------

    def facts(self) -> StoreFacts:
        return StoreFacts(self.last_epoch, 0)

    def view(self, epoch: int) -> MasterInfo:
        master = self.elections.get(epoch)
        self.sss_epoch += 1
        return MasterInfo(master, ADDR[master] if master else None, epoch, self.sss_epoch,
                          frozenset({master}) if master else frozenset())

    def feed(self, event) -> None:
        actions = self.m.step(event, self.facts())
        for a in actions:
            if isinstance(a, (BecomeMaster, BecomeSlave)):
                assert self.pending_switch is None, "a second switch while one is pending"
                self.pending_switch = a
                if isinstance(a, BecomeMaster):
                    assert self.elections.get(a.epoch) == ME, f"master at epoch {a.epoch} not elected by the controller"
                    assert a.same or a.epoch > self.file_at_start, "resumed a term from before the restart"
            elif isinstance(a, ReportSyncStateSet):
                assert self.outstanding_report is None, "a second report while one is in flight"
                assert self.m.is_master and a.master_epoch == self.m.master_epoch
                self.outstanding_report = a
            elif isinstance(a, ApplySyncStateSet):
                assert not self.applied_epochs or a.epoch > self.applied_epochs[-1]
                self.applied_epochs.append(a.epoch)
            elif isinstance(a, RequestNewTerm):
                self.pending_new_term = a.old_epoch
            elif isinstance(a, RequestElection):
                self.elect_asked = True
            elif isinstance(a, SetWritable):
                assert a.writable == self.m.writable

    # -- the controller --------------------------------------------------------------------------

    @rule(master=masters)
    def controller_elects(self, master):
        self.ctl_epoch += 1
        self.elections[self.ctl_epoch] = master

    # -- inputs ----------------------------------------------------------------------------------

    @rule()
    def register(self):
        self.feed(Registered(self.view(self.ctl_epoch)))

    @rule()
    def bootstrap(self):
        self.feed(Bootstrap())

    @precondition(lambda self: self.ctl_epoch > 0)
    @rule(data=st.data(), kind=st.sampled_from([RoleChangeNotified, ReplicaInfoPolled]))
    def controller_view(self, data, kind):
        epoch = data.draw(st.integers(max(1, self.ctl_epoch - 3), self.ctl_epoch))  # stale or current
        self.feed(kind(self.view(epoch)))

    @precondition(lambda self: self.elect_asked)
    @rule()
    def elect_answered(self):
        self.elect_asked = False
        info = self.view(self.ctl_epoch)
        self.feed(ElectAnswered(info if info.names_master else None))

    @precondition(lambda self: self.pending_new_term is not None)
    @rule(master=masters, refused=st.booleans())
    def new_term_answered(self, master, refused):
        old, self.pending_new_term = self.pending_new_term, None
        if refused:
            self.feed(NewTermAnswered(old, None))
            return
        self.controller_elects(master)
        info = self.view(self.ctl_epoch)
        self.feed(NewTermAnswered(old, info if info.names_master else None))

    @precondition(lambda self: self.pending_switch is not None)
    @rule(ok=st.sampled_from([True, True, False]))
    def switch_done(self, ok):
        pending, self.pending_switch = self.pending_switch, None
        if ok and isinstance(pending, BecomeMaster) and self.last_epoch < pending.epoch:
            self.last_epoch = pending.epoch              # the HA service appended the epoch entry
        self.feed(SwitchDone(ok))

    @rule(members=st.frozensets(ids))
    def ha_proposes(self, members):
        self.feed(SyncStateSetProposed(members))

    @rule(members=st.frozensets(ids))
    def shrink_check(self, members):
        self.feed(ShrinkChecked(members))

    @precondition(lambda self: self.outstanding_report is not None)
    @rule(outcome=st.sampled_from(list(ReportOutcome)))
    def report_answered(self, outcome):
        sent, self.outstanding_report = self.outstanding_report, None
        self.sss_epoch += 1
        self.feed(ReportAnswered(outcome, sent.proposal, self.sss_epoch))

    @rule()
    def restart(self):
        self.feed(Stopped())
        assert not self.m.writable
        self.start()

    # -- invariants ------------------------------------------------------------------------------

    @invariant()
    def epoch_never_goes_back(self):
        assert self.m.master_epoch >= self.held_epoch
        self.held_epoch = self.m.master_epoch

    @invariant()
    def master_only_at_an_elected_epoch(self):
        if self.m.role == Role.MASTER:
            assert self.elections.get(self.m.master_epoch) == ME
            assert self.m.master_epoch > self.file_at_start or self.m.master_epoch == 0

    @invariant()
    def one_report_in_flight(self):
        assert (self.m.report_in_flight is None) == (self.outstanding_report is None)

    @invariant()
    def writable_means_running_master(self):
        if self.m.writable:
            assert self.m.running and self.m.role == Role.MASTER and self.m.switching is None


TestRoleMachineModel = RoleMachineModel.TestCase
TestRoleMachineModel.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)
