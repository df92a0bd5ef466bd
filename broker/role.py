"""The broker's role machine: the one owner of role, master epoch, lifecycle and SyncStateSet (pure).

Theory of operation. Everything a broker learns about its place in the group arrives as an *input*:
the controller's answers (REGISTER_BROKER, a broker-triggered election, a new-term election, the
periodic replica-info poll), the controller's role-change notifications, the HA service's events
(a proposed SyncStateSet change, the result of a role switch) and the
shell's own lifecycle steps. ``RoleMachine.step(input, facts)`` applies one input to the state and
returns the *actions* the shell must execute, in order, the way ``ha/session.py``'s
``SlaveSession.next_actions`` does. The machine never does IO, never reads a clock and never
awaits: the same inputs give the same actions, so the simulator runs it as it is. ``facts`` are
what the store says right now (its last epoch and max offset).

Every transition is in this file (its inputs and actions are declared in ``role_io.py``), and no
other part of a broker keeps a copy of what it decides: the HA service reads role and epoch here,
the HA tracker reads the confirmed SyncStateSet here, and the shells (``ReplicasManager``, the
HA service, the simulator's broker) execute the actions through one executor
(``rocketray.broker.executor``). The rules:

* **Lifecycle** (reference 10.2): ``INITIAL -> FIRST_TIME_SYNC_CONTROLLER_METADATA_DONE``
  (``LeaderFound``) ``-> REGISTER_TO_CONTROLLER_DONE`` (``Registered``) ``-> RUNNING`` (a master is
  known, possibly me) ``-> SHUTDOWN`` (``Stopped``). The broker is fenced unless RUNNING.
* **HA switch preconditions**: a switch to an epoch older than the last one in the store's epoch
  file is never started (``switch_is_stale``). A promotion stops replication, cuts a torn tail
  and starts its epoch at the max offset, and on commit starts a new term
  (``BecomeMaster.cut_torn_tail``/``new_term``, ``ServeAsMaster``); the same master at a new
  epoch only starts the epoch. The role is taken when ``SwitchDone(ok)`` arrives, then the HA
  service is told (``ServeAsMaster``/``FollowMaster``).

* **Strictly newer epochs only** (reference 19): a controller view naming a master is acted on only
  if its master epoch is strictly greater than the one this broker holds. A notification or poll
  for an equal or older epoch does nothing (the same master at the same epoch is not re-applied).
* **Switch, then commit**: to change role the machine emits ``BecomeMaster`` or ``BecomeSlave`` and
  waits for ``SwitchDone``. Only a successful switch records the new epoch, role and master; a
  refused or failed switch records nothing, so the next notification or poll retries it. One switch
  at a time: while one is pending other controller views are dropped (polling converges).
* **No resumed terms** (apache/rocketmq#9689): if the controller names this broker master of an
  epoch that is already in its own epoch file while this process does not hold that term, the
  broker was restarted before the controller noticed. It must not resume the old term (a lost tail
  would make its slaves diverge, and the election that picks the replica with the most data would
  be skipped): it heartbeats its current progress and asks for a new term (``RequestNewTerm``),
  and follows whatever that election says. The same holds for a term the answer to its
  registration names it master of: the controller elected it by progress it reported before this
  process started, which a power loss may have cut; and, after a restart (the store holds an
  epoch), for the first term anything but a new-term answer names it master of, before this
  process took any term (a registration answer that named no master, then MASTER_STILL_EXIST).
* **SyncStateSet reports are serialized**: at most one ALTER_SYNC_STATE_SET is in flight. A newer
  proposal while one is in flight replaces any queued one (the HA tracker's proposals are
  cumulative, so the latest is the merge) and is sent when the answer arrives, unless it equals
  the set just confirmed. A confirmed answer is applied only if this broker is still master of the
  epoch the report was sent in and the set's epoch is newer. A report whose outcome is unknown
  (transport failure) is retried at the next shrink check; a refused one is dropped.
* **Fencing**: the broker accepts writes (``writable``) only when registered, not stopped, master,
  and no switch is pending. ``SetWritable`` is emitted whenever that changes.
* **Handshake epoch**: every ``BecomeSlave`` carries the controller's epoch, also for the same
  master at a new epoch (``same=True``), so the HA client always knows which master epoch the
  controller named and refuses a master whose handshake shows another one (``rocketray.ha``).

How to drive it (the shell, or the simulator)::

    m = RoleMachine(broker_address="10.0.0.1:10912")
    m.step(IdAssigned(1), facts)
    for action in m.step(Registered(MasterInfo.from_response(resp)), facts):
        ...  # execute in order; BecomeMaster/BecomeSlave -> m.step(SwitchDone(ok), facts)
"""

from __future__ import annotations

from dataclasses import dataclass

from rocketray.broker import role_io
from rocketray.broker.role_io import (Action, ApplySyncStateSet, BecomeMaster, BecomeSlave, Bootstrap,
                                      ElectAnswered, FollowMaster, IdAssigned, Input, LeaderFound,
                                      Lifecycle, MasterInfo, NewTermAnswered, Registered, ReplicaInfoPolled,
                                      ReportAnswered, ReportOutcome, ReportSyncStateSet, RequestElection,
                                      RequestNewTerm, Role, RoleChangeNotified, SendHeartbeat, ServeAsMaster,
                                      SetWritable, ShrinkChecked, Stopped, StoreFacts, SwitchDone,
                                      SwitchOrdered, SyncStateSetOrdered, SyncStateSetProposed)

__all__ = [*role_io.__all__,  # re-exported: the shells and tests use role.X
           "RoleMachine", "acts_on_epoch", "is_term_from_before_restart", "is_term_won_before_boot",
           "is_first_term_after_restart",
           "report_may_start", "switch_is_stale"]


# ---------------------------------------------------------------------------------------------
# The rules a simulator test reverts (module functions, looked up at call time)


def acts_on_epoch(new_epoch: int, held_epoch: int) -> bool:
    """A controller view is acted on only for a strictly newer master epoch (reference 19)."""
    return new_epoch > held_epoch


def is_term_from_before_restart(sitting: bool, epoch: int, last_epoch: int) -> bool:
    """Named master of ``epoch`` while not holding it, and ``epoch`` is already in the epoch file:
    this broker held that term before a restart (#9689)."""
    return not sitting and epoch <= last_epoch


def is_term_won_before_boot(sitting: bool, at_registration: bool) -> bool:
    """Named master by the answer to this process's registration, while not holding the term: the
    controller elected this broker by progress it reported before the process (re)started, which a
    power loss may since have cut (simulator ``async`` seed 5453, scenario
    ``elected-then-lost-power``). Ask for a new term, ranked by what the store holds now."""
    return not sitting and at_registration


def is_first_term_after_restart(sitting: bool, held_epoch: int, last_epoch: int) -> bool:
    """Named master of a term by anything but a new-term answer while this process has taken no
    term yet (``held_epoch`` 0) and its store already holds data of an earlier one (a restart): the
    controller may have elected it by progress reported before the restart, which a power loss may
    since have cut, even when the answer to its registration named no master (the master's heartbeat
    row was not alive there) and a MASTER_STILL_EXIST answer to its election request, a poll or a
    notification names it instead (simulator ``async-overlap`` seed 21, scenario
    ``elected-while-down-named-later``). Ask for a new term, ranked by what the store holds now."""
    return not sitting and held_epoch == 0 and last_epoch > 0


def switch_is_stale(epoch: int, last_epoch: int) -> bool:
    """A switch to ``epoch`` while the store's epoch file already ends at a newer epoch would write
    an epoch entry that goes back: never started. The machine decides it, not the HA service, so
    the one rule runs in the broker and the simulator alike."""
    return epoch < last_epoch


def report_may_start(in_flight: "ReportSyncStateSet | None") -> bool:
    """A SyncStateSet report starts only when none is in flight (the old shell ran them concurrently)."""
    return in_flight is None


# ---------------------------------------------------------------------------------------------
# The machine


@dataclass(slots=True)
class RoleMachine:
    """See the module docstring. Read the fields; change them only through ``step``."""

    broker_address: str
    broker_id: int | None = None
    role: Role = Role.NONE
    master_epoch: int = 0
    master_broker_id: int | None = None
    master_address: str = ""
    sync_state_set: frozenset[int] = frozenset()
    sync_state_set_epoch: int = 0
    lifecycle: Lifecycle = Lifecycle.INITIAL
    switching: BecomeMaster | BecomeSlave | None = None
    report_in_flight: ReportSyncStateSet | None = None
    queued_proposal: frozenset[int] | None = None   # sent when the report in flight is answered
    retry_proposal: frozenset[int] | None = None    # an unknown-outcome report, retried at the next check
    new_term_for: int | None = None                  # the old epoch a new term was asked for

    # -- views -----------------------------------------------------------------------------------

    @property
    def registered(self) -> bool:
        """REGISTER_BROKER was answered (and the broker was not stopped before that)."""
        return self.lifecycle >= Lifecycle.REGISTER_TO_CONTROLLER_DONE

    @property
    def stopped(self) -> bool:
        return self.lifecycle == Lifecycle.SHUTDOWN

    @property
    def running(self) -> bool:
        """Registered, a master known (possibly me), not stopped: the broker is past its start."""
        return self.lifecycle == Lifecycle.RUNNING

    @property
    def fenced(self) -> bool:
        return not self.running

    @property
    def is_master(self) -> bool:
        return self.role == Role.MASTER and self.broker_id is not None and self.master_broker_id == self.broker_id

    @property
    def writable(self) -> bool:
        return self.running and self.is_master and self.switching is None

    @property
    def promoting(self) -> bool:
        """A switch to master is under way: the broker will be writable once it is done (if it
        succeeds). The shell may hold a put that arrives meanwhile instead of refusing it."""
        return isinstance(self.switching, BecomeMaster) and not self.stopped

    # -- the one entry point ---------------------------------------------------------------------

    def step(self, event: Input, facts: StoreFacts = StoreFacts()) -> list[Action]:
        """Apply one input; return the actions to execute in order."""
        was_writable = self.writable
        actions = self._dispatch(event, facts)
        if self.lifecycle == Lifecycle.REGISTER_TO_CONTROLLER_DONE and self.master_broker_id is not None:
            self.lifecycle = Lifecycle.RUNNING
        if self.writable != was_writable:
            actions.append(SetWritable(self.writable))
        return actions

    def _dispatch(self, event: Input, facts: StoreFacts) -> list[Action]:
        if isinstance(event, IdAssigned):
            assert self.broker_id in (None, event.broker_id), "a broker id never changes"
            self.broker_id = event.broker_id
            return []
        if isinstance(event, Stopped):
            self.lifecycle = Lifecycle.SHUTDOWN
            self.queued_proposal = self.retry_proposal = None
            return []
        if self.stopped:
            return []
        if isinstance(event, LeaderFound):
            self.lifecycle = max(self.lifecycle, Lifecycle.FIRST_TIME_SYNC_CONTROLLER_METADATA_DONE)
            return []
        if isinstance(event, Registered):
            self.lifecycle = max(self.lifecycle, Lifecycle.REGISTER_TO_CONTROLLER_DONE)
            return self._follow(event.info, facts, at_registration=True)
        if isinstance(event, Bootstrap):
            return self._bootstrap()
        if isinstance(event, ElectAnswered):
            return [] if event.info is None else self._follow(event.info, facts)
        if isinstance(event, NewTermAnswered):
            return self._new_term_answered(event, facts)
        if isinstance(event, ReplicaInfoPolled):
            return self._polled(event.info, facts)
        if isinstance(event, RoleChangeNotified):
            return self._follow(event.info, facts)
        if isinstance(event, SwitchDone):
            return self._switch_done(event.ok)
        if isinstance(event, SyncStateSetProposed):
            return self._propose(event.proposal)
        if isinstance(event, ShrinkChecked):
            return self._shrink_checked(event.candidate)
        if isinstance(event, ReportAnswered):
            return self._report_answered(event)
        if isinstance(event, SwitchOrdered):
            return self._ordered(event.switch, facts)
        if isinstance(event, SyncStateSetOrdered):
            return self._adopt_sync_state_set(event.members, self.sync_state_set_epoch + 1)
        raise TypeError(f"not a role machine input: {event!r}")

    # -- controller views ------------------------------------------------------------------------

    def _bootstrap(self) -> list[Action]:
        """Reference 10.2 REGISTER_TO_CONTROLLER_DONE: heartbeat now; elect if no master is known
        (and nothing else is already under way)."""
        if self.master_broker_id is not None or self.switching is not None or self.new_term_for is not None:
            return [SendHeartbeat()]
        return [SendHeartbeat(), RequestElection()]

    def _polled(self, info: MasterInfo, facts: StoreFacts) -> list[Action]:
        """Reference 10.7: a newer epoch is followed (or, with no master, an election is asked
        for); at my own master epoch a newer SyncStateSet is adopted."""
        if acts_on_epoch(info.master_epoch, self.master_epoch) and not info.names_master:
            return [] if self.switching is not None else [RequestElection()]
        if (info.master_epoch == self.master_epoch and self.is_master and self.switching is None
                and info.master_broker_id == self.broker_id):
            return self._adopt_sync_state_set(info.sync_state_set, info.sync_state_set_epoch)
        return self._follow(info, facts)

    def _new_term_answered(self, event: NewTermAnswered, facts: StoreFacts) -> list[Action]:
        if self.new_term_for == event.old_epoch:
            self.new_term_for = None
        if event.info is None or event.info.master_epoch <= event.old_epoch:
            return []
        return self._follow(event.info, facts, new_term=True)

    def _follow(self, info: MasterInfo, facts: StoreFacts, at_registration: bool = False,
                new_term: bool = False) -> list[Action]:
        """Act on a controller view naming a master: only for a strictly newer epoch. ``new_term``:
        the answer to this process's new-term request (ranked by what its store held when asking)."""
        if (not info.names_master or not acts_on_epoch(info.master_epoch, self.master_epoch)
                or self.switching is not None):
            return []
        assert self.broker_id is not None, "a role needs the broker id"
        epoch = info.master_epoch
        if info.master_broker_id == self.broker_id:
            sitting = self.is_master
            if (is_term_from_before_restart(sitting, epoch, facts.last_epoch)
                    or is_term_won_before_boot(sitting, at_registration)
                    or (not new_term and is_first_term_after_restart(sitting, self.master_epoch, facts.last_epoch))):
                # A term from before a restart (#9689), or won by progress reported before it:
                # never resume or take it; ask for a new one.
                if self.new_term_for is not None and self.new_term_for >= epoch:
                    return []
                self.new_term_for = epoch
                return [SendHeartbeat(), RequestNewTerm(epoch)]
            if switch_is_stale(epoch, facts.last_epoch):
                return []
            self.switching = BecomeMaster(epoch, sitting, info.sync_state_set, info.sync_state_set_epoch)
            return [self.switching]
        assert info.master_address is not None and info.master_broker_id is not None
        if switch_is_stale(epoch, facts.last_epoch):
            return []
        same = (self.role == Role.SLAVE and info.master_broker_id == self.master_broker_id
                and info.master_address == self.master_address)
        self.switching = BecomeSlave(info.master_address, epoch, info.master_broker_id, same)
        return [self.switching]

    def _ordered(self, switch: BecomeMaster | BecomeSlave, facts: StoreFacts) -> list[Action]:
        """A standalone endpoint's switch: the same preconditions, no controller view to check."""
        if self.switching is not None or switch_is_stale(switch.epoch, facts.last_epoch):
            return []
        assert self.broker_id is not None, "a role needs the broker id"
        self.switching = switch
        return [switch]

    def _switch_done(self, ok: bool) -> list[Action]:
        pending, self.switching = self.switching, None
        if pending is None or not ok:
            return []
        self.master_epoch = pending.epoch
        self.new_term_for = None
        if isinstance(pending, BecomeMaster):
            self.role = Role.MASTER
            self.master_broker_id = self.broker_id
            self.master_address = self.broker_address
            if pending.new_term:
                self.queued_proposal = self.retry_proposal = None
            return [ServeAsMaster(pending.epoch, pending.new_term),
                    *self._adopt_sync_state_set(pending.sync_state_set, pending.sync_state_set_epoch)]
        self.role = Role.SLAVE
        self.master_broker_id = pending.master_broker_id
        self.master_address = pending.master_address or ""
        self.queued_proposal = self.retry_proposal = None
        return [FollowMaster(pending.master_address, pending.epoch)]

    def _adopt_sync_state_set(self, members: frozenset[int], epoch: int) -> list[Action]:
        """Reference 10.6: a confirmed set is applied only if its epoch is newer."""
        if epoch <= self.sync_state_set_epoch:
            return []
        self.sync_state_set, self.sync_state_set_epoch = frozenset(members), epoch
        return [ApplySyncStateSet(self.sync_state_set, epoch)]

    # -- SyncStateSet reports --------------------------------------------------------------------

    def _may_report(self) -> bool:
        return self.running and self.is_master and self.switching is None

    def _send(self, proposal: frozenset[int]) -> list[Action]:
        """Report ``proposal`` now, or queue it behind the report in flight (latest wins)."""
        if not report_may_start(self.report_in_flight):
            self.queued_proposal = proposal
            return []
        self.queued_proposal = None
        if proposal == self.sync_state_set:
            return []
        self.report_in_flight = ReportSyncStateSet(proposal, self.master_epoch, self.sync_state_set_epoch)
        return [self.report_in_flight]

    def _propose(self, proposal: frozenset[int]) -> list[Action]:
        if not self._may_report():
            return []
        assert self.broker_id is not None
        self.retry_proposal = None
        return self._send(frozenset(proposal) | {self.broker_id})

    def _shrink_checked(self, candidate: frozenset[int]) -> list[Action]:
        if not self._may_report():
            return []
        assert self.broker_id is not None
        candidate = frozenset(candidate) | {self.broker_id}
        retry, self.retry_proposal = self.retry_proposal, None
        if candidate == self.sync_state_set and retry is not None:
            candidate = retry
        return self._send(candidate)

    def _report_answered(self, event: ReportAnswered) -> list[Action]:
        sent, self.report_in_flight = self.report_in_flight, None
        if sent is None:
            return []
        actions: list[Action] = []
        still_master = self.is_master and self.master_epoch == sent.master_epoch and self.switching is None
        if event.outcome == ReportOutcome.CONFIRMED and still_master:
            actions += self._adopt_sync_state_set(event.sync_state_set, event.sync_state_set_epoch)
        elif event.outcome == ReportOutcome.UNKNOWN and still_master and self.queued_proposal is None:
            self.retry_proposal = sent.proposal
        queued, self.queued_proposal = self.queued_proposal, None
        if queued is not None and self._may_report():
            actions += self._send(queued)
        return actions

    # -- snapshot for status/logs ----------------------------------------------------------------

    def snapshot(self) -> dict:
        return {"role": self.role.value, "broker_id": self.broker_id, "master_epoch": self.master_epoch,
                "master_broker_id": self.master_broker_id, "master_address": self.master_address,
                "sync_state_set": sorted(self.sync_state_set), "sync_state_set_epoch": self.sync_state_set_epoch,
                "lifecycle": self.lifecycle.name, "writable": self.writable,
                "switching": repr(self.switching) if self.switching else None,
                "report_in_flight": sorted(self.report_in_flight.proposal) if self.report_in_flight else None,
                "new_term_for": self.new_term_for}
