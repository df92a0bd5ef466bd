"""Named scenarios: a fault schedule, scripted or drawn by a pinned seed, that drives the simulator
into a failure that a broken rule of the cores would cause (a data-loss or split-brain bug).

Theory of operation. A random search finds most broken rules within a few dozen seeds of the right
fault mix (``PROFILES``), so most scenarios are simply a profile and the seed that shows it. A
few failures need an exact interleaving that random faults almost never produce; their scenario
is a *script*: predicates polled on virtual time (``Sim.when``) that wait for a state (a put
waiting for its acks, a truncation about to unlink segments) and then cut links or arm a crash
at one IO step. Either way the run uses the real cores and the invariants of every run; a
scenario passes with the rules as they are, and ``tests/sim/test_scenarios.py`` shows that each
fails, on the invariant it names, when the broken rule it guards against is patched in.

    rocketray simulate --scenario list
    rocketray simulate --scenario violation-4-not-master-after-write
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from rocketray.wire.controller_api import AlterSyncStateSetRequest
from rocketray.broker.config import FlushMode
from rocketray.sim.broker import SimBroker
from rocketray.sim.disk import CrashMode
from rocketray.sim.controller import CONTROLLER
from rocketray.sim.run import PROFILES, Sim, SimConfig, SimResult
from rocketray.sim.world import Violation

__all__ = ["Scenario", "SCENARIOS", "run_scenario"]


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    what: str                                   # the failure it reaches, one sentence
    config: SimConfig
    seed: int
    script: Callable[[Sim], None] | None = None


def run_scenario(name: str) -> SimResult:
    s = SCENARIOS[name]
    return Sim(s.seed, s.config).run(s.script)


# -- scripts --------------------------------------------------------------------------------------

def _serving(sim: Sim, group: str = "g0") -> SimBroker | None:
    return sim.serving_master(group)


def _cut_acks_and_heartbeats_while_a_put_waits(sim: Sim) -> None:
    """Violation 4. Once a put is written and waiting for its acks on a settled group, the slaves'
    acks stop reaching the master and the master's link to the controller is cut. The batch
    reached the slaves; the controller elects one of them; the link comes back and the master's
    next poll turns it into a slave while the put still waits. The answer must not say "not
    written": the batch is in the new master's log."""
    def ready() -> bool:
        m = _serving(sim)
        return (m is not None and len(sim.controller.sync_state_set("g0")) == sim.config.replicas
                and sum(len(p.acked) for p in sim.producers) >= 20 and bool(m.puts))

    def cut() -> None:
        m = _serving(sim)
        assert m is not None
        sim.world.note(f"SCRIPT {m.name}: slaves' acks and its heartbeats cut while a put waits")
        for b in sim.groups["g0"]:
            if b is not m:
                sim.net.cut(b.name, m.name)
        sim.net.cut(m.name, CONTROLLER)
        sim.when(lambda: sim.controller.master_of("g0")[0] not in (None, m.id),
                 lambda: sim.net.mend(m.name, CONTROLLER))
    sim.when(ready, cut, every_ms=1)


def _steady(sim: Sim) -> bool:
    """A serving master, every replica in the SyncStateSet, and 20 puts acknowledged."""
    return (_serving(sim) is not None and len(sim.controller.sync_state_set("g0")) == sim.config.replicas
            and sum(len(p.acked) for p in sim.producers) >= 20)


#: what the leader-change scenarios require: the master is replaced by the leader-change rule at the
#: end of the session grace, before the dead-master scan's next period after the window (with
#: heartbeats on the sessions a new leader's table holds no row of a master that did not reopen, so
#: the scan replaces it too, up to a scan period later) and long before heartbeat expiry
LEADER_CHANGE_REPLACED = "master replaced within the session grace after a leader change"
#: the rule elects at the window's end; the check looks this much later (the scan runs every 500 ms
#: of the run, so at 2,500 ms for a leader change at 2,000 ms: 100 ms after the window)
REPLACED_MARGIN_MS = 50


def _expect_replaced_by_grace(sim: Sim, m: SimBroker, epoch: int, what: str) -> None:
    """Liveness check of the leader-change rule: ``REPLACED_MARGIN_MS`` after the session grace that
    follows the leader change, the controller must have elected another master above ``epoch``."""
    after_ms = sim.controller.session_grace_ms + REPLACED_MARGIN_MS

    def check() -> None:
        master, now_epoch = sim.controller.master_of(m.group)
        if master == m.id or now_epoch <= epoch:
            raise Violation(LEADER_CHANGE_REPLACED, f"{what}: {m.name} still master at epoch {now_epoch} "
                                                    f"{after_ms} ms after")
        sim.world.note(f"SCRIPT {m.group} master {master} at epoch {now_epoch}: replaced in time")
    sim.world.at(after_ms, check, what="check: master replaced")


def _leader_lost_with_the_master(sim: Sim) -> None:
    """One node held the controller leader and the group's master: both die at once. The
    kill's session close reaches the dead leader only, so the new leader has no session of the
    master and no close to act on; the slaves reopen theirs at once. The leader-change rule treats
    the master as dead after the grace window; heartbeat expiry would take 1.5 s and more."""
    def kill() -> None:
        m = _serving(sim)
        assert m is not None
        epoch = sim.controller.master_of("g0")[1]
        sim.world.note(f"SCRIPT {m.name} and the controller leader die together")
        m.crash(CrashMode.KILL)
        sim.controller.change_leader()
        _expect_replaced_by_grace(sim, m, epoch, "master lost with the leader")
    sim.when(lambda: _steady(sim) and sim.world.now_ms >= 2_000, kill)


def _master_cut_off_across_a_leader_change(sim: Sim) -> None:
    """The grace rule's risk. The live master's links to the controller are cut as the leader
    changes and stay cut past the grace window, while producers keep writing to it: the new leader
    treats it as dead and elects a slave under a higher epoch while the old master still serves.
    Epoch fencing must keep it to one master per epoch and lose no acknowledged write."""
    def cut() -> None:
        m = _serving(sim)
        assert m is not None
        epoch = sim.controller.master_of("g0")[1]
        sim.world.note(f"SCRIPT {m.name} cut off from the controller as the leader changes")
        sim.net.cut(m.name, CONTROLLER)
        sim.net.cut(CONTROLLER, m.name)
        sim.controller.change_leader()
        _expect_replaced_by_grace(sim, m, epoch, "live master cut off across the leader change")
        sim.world.at(sim.config.timings.heartbeat_timeout_ms + 500, lambda: (
            sim.net.mend(m.name, CONTROLLER), sim.net.mend(CONTROLLER, m.name)), what="mend")
    sim.when(lambda: _steady(sim) and sim.world.now_ms >= 2_000, cut)


def _isolate(sim: Sim, b: SimBroker) -> None:
    for other in list(sim.brokers) + [CONTROLLER]:
        if other != b.name:
            sim.net.cut(b.name, other)
            sim.net.cut(other, b.name)


def _rejoin(sim: Sim, b: SimBroker) -> None:
    for other in list(sim.brokers) + [CONTROLLER]:
        if other != b.name:
            sim.net.mend(b.name, other)
            sim.net.mend(other, b.name)


def _lagging_member_dropped_while_an_expand_waits(sim: Sim) -> None:
    """Violation 2. Master M, members L and J. J is cut off until the controller drops it. Then
    M's link to L is congested: L still acks every put within the slave timeout, but M always has
    bytes it could not send yet, so L is not caught up. Just before L has been behind for
    ``not_catchup_ms``, J comes back and catches up; M proposes {M, L, J}; the controller commits it
    but the answer is lost, and J is cut off again. M's shrink check now drops L. The union view
    must keep J (the controller counts it) until the controller answers: a put acknowledged
    without J is lost if J is elected."""
    t = sim.config.timings
    st: dict[str, SimBroker] = {}

    def cut_joiner() -> None:
        m = _serving(sim)
        assert m is not None
        others = [b for b in sim.groups["g0"] if b is not m]
        st.update(m=m, lag=others[0], join=others[1])
        sim.world.note(f"SCRIPT {st['join'].name} cut off")
        _isolate(sim, st["join"])
        sim.when(lambda: st["join"].id not in sim.controller.sync_state_set("g0"), congest)

    def congest() -> None:
        sim.world.note(f"SCRIPT link {st['m'].name}->{st['lag'].name} congested")
        sim.net.slow(st["m"].name, st["lag"].name, 8)
        sim.when(lambda: behind_ms() >= t.not_catchup_ms - 300, rejoin)

    def behind_ms() -> int:
        seen = st["m"].master.tracker.caught_up_ms.get(st["lag"].id, sim.world.now_ms)
        return sim.world.now_ms - seen

    def rejoin() -> None:
        j = st["join"]
        sim.world.note(f"SCRIPT {j.name} rejoins")

        def expand(request: object) -> bool:
            if isinstance(request, AlterSyncStateSetRequest) and j.id in request.new_sync_state_set:
                sim.controller.answer_lost = None
                sim.world.at(0, lambda: (sim.world.note(f"SCRIPT {j.name} cut off again"), _isolate(sim, j)))
                return True
            return False
        sim.controller.answer_lost = expand
        _rejoin(sim, j)

    sim.when(lambda: _steady(sim), cut_joiner)


def _master_restarts_with_less_than_it_reported(sim: Sim) -> None:
    """Violation 6 (async flush). The master's heartbeat has just reported a batch its slaves have
    not received yet; at that moment it loses power, losing every byte it had not flushed,
    including acknowledged ones its slaves hold. It restarts before the controller notices and
    asks for a new term. Ranked by the progress it reported before the power loss, it would win
    and its slaves would truncate acknowledged messages to follow it; ranked by what it holds
    now, a slave wins."""
    def reported_ahead() -> bool:
        m = _serving(sim)
        if m is None or m.store is None or sum(len(p.acked) for p in sim.producers) < 30:
            return False
        row = sim.controller.heartbeats.live_info("g0", m.id)
        slaves = [b for b in sim.groups["g0"] if b is not m]
        return (row is not None and all(b.up and b.store is not None for b in slaves)
                and row.max_offset > max(b.store.max_offset for b in slaves)
                and max(p.acked_end for p in sim.producers) > m.flushed_end)

    def power_loss() -> None:
        m = _serving(sim)
        assert m is not None
        sim.world.note(f"SCRIPT {m.name} loses power right after reporting unreplicated bytes")
        m.crash(CrashMode.POWER_LOSS)
    sim.when(reported_ahead, power_loss, every_ms=1)


def _master_loses_power_before_its_expand_commits(sim: Sim) -> None:
    """Simulator ``async`` seed 5049. Master M's committed SyncStateSet is {M}; slave J has caught
    up and M proposes {M, J}, but the controller never applies it (the request is lost, again on
    every retry). M acknowledges puts under the union view {M, J}, so J holds them, and loses power
    (async flush) with some of them unflushed. It restarts before the controller notices and asks
    for a new term. The committed set names M alone, so an election among its members re-elects M
    with its shorter log and J truncates acknowledged messages to follow it; J's log provably
    contains M's (same last epoch, more bytes), so J must win."""
    st: dict[str, SimBroker] = {}

    def first_master() -> bool:
        m = _serving(sim)
        if m is None:
            return False
        st["m"] = m

        def expand(request: object) -> bool:
            return isinstance(request, AlterSyncStateSetRequest) and len(request.new_sync_state_set) > 1
        sim.controller.request_lost = expand
        return True

    def acked_beyond_flush() -> bool:
        m = st["m"]
        joined = [b for b in sim.groups["g0"] if b is not m and b.up and b.store is not None]
        end = max(p.acked_end for p in sim.producers)
        return (m.up and sim.controller.sync_state_set("g0") == frozenset({m.id}) and end > m.flushed_end
                and any(b.store.max_offset >= end for b in joined))

    def power_loss() -> None:
        m = st["m"]
        sim.world.note(f"SCRIPT {m.name} loses power with acknowledged bytes only a joining member holds")
        sim.controller.request_lost = None
        m.crash(CrashMode.POWER_LOSS)
    sim.when(first_master, lambda: sim.when(acked_beyond_flush, power_loss, every_ms=1), every_ms=1)


def _elected_slave_loses_power_before_taking_the_term(sim: Sim) -> None:
    """Simulator ``async`` seed 5453. On a settled group the master's link to the controller is cut,
    and the controller elects slave X by the progress X last reported. Before X takes the term, X
    loses power (async flush) and with it acknowledged bytes the other two hold. It restarts, and
    the answer to its registration names it master of a term it never took: taking it would make
    the others truncate to its shorter log; asking for a new term ranks it by what it holds now."""
    st: dict[str, SimBroker] = {}

    def cut_master() -> None:
        m = _serving(sim)
        assert m is not None
        st["m"] = m
        sim.world.note(f"SCRIPT {m.name} cut off from the controller")
        sim.net.cut(m.name, CONTROLLER)
        sim.net.cut(CONTROLLER, m.name)
        sim.when(elected_behind, power_loss, every_ms=1)

    def elected_behind() -> bool:
        master_id, _epoch = sim.controller.master_of("g0")
        if master_id is None or master_id == st["m"].id:
            return False
        x = next(b for b in sim.groups["g0"] if b.id == master_id)
        st["x"] = x
        return True

    def power_loss() -> None:
        x, m = st["x"], st["m"]
        sim.world.note(f"SCRIPT {x.name}, just elected, loses power before taking the term")
        x.crash(CrashMode.POWER_LOSS)
        sim.net.mend(m.name, CONTROLLER)
        sim.net.mend(CONTROLLER, m.name)
    sim.when(lambda: _steady(sim), cut_master)


def _commits(sim: Sim) -> int:
    return sum(len(c.committed) for c in sim.consumers)


def _masters_killed_after_commits(sim: Sim) -> None:
    """apache/rocketmq#7790, #9711. On a settled group whose consumer has had offset commits
    acknowledged, the master is killed: a slave is elected, the consumer's next commit fails, and
    it resumes from the offset the new master answers. Once the killed master is back in the
    SyncStateSet and ten more commits are acknowledged, the third replica is cut off until the
    controller drops it from the set, and the new master is killed: the restarted first master is
    elected and answers. Commits kept in a per-broker table rather than in the replicated log roll
    the group's progress back at the first election."""
    st: dict[str, SimBroker] = {}

    def kill_master() -> None:
        m = _serving(sim)
        assert m is not None
        st["first"] = m
        sim.world.note(f"SCRIPT {m.name} killed after {_commits(sim)} acknowledged commits")
        m.crash(CrashMode.KILL)
        at_commits = _commits(sim) + 10
        sim.when(lambda: _steady(sim) and _commits(sim) >= at_commits, cut_third)

    def cut_third() -> None:
        m = _serving(sim)
        assert m is not None
        st["second"] = m
        st["third"] = next(b for b in sim.groups["g0"] if b is not m and b is not st["first"])
        sim.world.note(f"SCRIPT {st['third'].name} cut off")
        _isolate(sim, st["third"])
        sim.when(lambda: st["third"].id not in sim.controller.sync_state_set("g0"), kill_second)

    def kill_second() -> None:
        sim.world.note(f"SCRIPT {st['second'].name} killed; the restarted {st['first'].name} is the "
                       f"only other member of the SyncStateSet")
        st["second"].crash(CrashMode.KILL)
        sim.when(lambda: _serving(sim) is st["first"], lambda: _rejoin(sim, st["third"]))
    sim.when(lambda: _steady(sim) and _commits(sim) >= 10, kill_master)


def _no_sessions(config: SimConfig) -> SimConfig:
    """``config`` without controller sessions: the controller learns of a dead broker only by
    heartbeat expiry (as after a power loss, across a cut link, or with a new leader), and with role
    switches that end in the step they start. The pinned seeds below were found before sessions and
    switch time existed; this keeps their schedules."""
    return dataclasses.replace(config, timings=dataclasses.replace(config.timings, controller_sessions=False,
                                                                   switch_ms=(0, 0)))


def _no_commits(config: SimConfig) -> SimConfig:
    """``config`` with consumers that never commit offsets. The pinned seeds and the congestion
    script of violation 2 were found before consumers committed; commit records change every
    schedule after the first one (sizes, IO steps, delays drawn), so this keeps theirs."""
    return dataclasses.replace(config, commit_interval_ms=0)


def _in_flight_dropped(config: SimConfig) -> SimConfig:
    """``config`` with a crashed node's sends dropped with it (the network before in-flight delivery,
    ``net.Network.in_flight``). The pinned seeds below were found with that network; this keeps
    their schedules."""
    return dataclasses.replace(config, in_flight_after_crash=False)


def _quiet(**timings: int) -> SimConfig:
    base = SimConfig(max_faults=0, loss=0.0, commit_fault_p=0.0, duration_ms=8_000, settle_ms=8_000)
    return dataclasses.replace(base, timings=dataclasses.replace(base.timings, **timings))


#: async flush, and a crashed broker back within 0.3-0.6 s: before the controller notices (1.5 s)
_ASYNC_QUICK_RESTART = _quiet(flush_mode=FlushMode.ASYNC, restart_min_ms=300, restart_max_ms=600)

SCENARIOS: dict[str, Scenario] = {s.name: s for s in [
    Scenario("violation-1-confirm-offset-covers-a-joining-member",
             "the confirm offset covers a message a joining member lacks; consumers read it",
             _in_flight_dropped(_no_commits(_no_sessions(PROFILES["default"]))), 5),
    Scenario("violation-6-restarted-master-ranked-by-lost-progress",
             "a master that lost unflushed bytes in a power loss wins the new-term election with the "
             "progress it reported before, and its slaves truncate acknowledged messages",
             _ASYNC_QUICK_RESTART, 9,
             _master_restarts_with_less_than_it_reported),
    Scenario("new-term-outside-sss",
             "a master that lost power before the controller applied its expand wins the new-term "
             "election among the committed members, and the joining member that holds what it "
             "acknowledged truncates it",
             dataclasses.replace(_ASYNC_QUICK_RESTART,
                                 replicas=2), 1, _master_loses_power_before_its_expand_commits),
    Scenario("elected-then-lost-power",
             "a slave elected by the progress it reported loses power before taking the term, "
             "restarts with less, and takes the term its registration names; the others truncate "
             "acknowledged messages to follow it",
             _ASYNC_QUICK_RESTART, 3,
             _elected_slave_loses_power_before_taking_the_term),
    Scenario("restarted-master-resumes-its-old-term",
             "a master restarted before the controller noticed resumes its term (#9689)",
             _in_flight_dropped(_no_commits(_no_sessions(PROFILES["default"]))), 32),
    Scenario("violation-2-lagging-member-dropped-while-an-expand-waits",
             "the shrink check replaced a pending expand; a put was acknowledged without the member "
             "the controller had just added",
             _no_commits(dataclasses.replace(_quiet(not_catchup_ms=1_000, shrink_ms=100), window_bytes=1_024,
                                             producers=16)), 4,
             _lagging_member_dropped_while_an_expand_waits),
    Scenario("violation-3-kill-between-two-unlinks",
             "a truncation killed between two segment unlinks reopens with a hole and an old end",
             _in_flight_dropped(_no_commits(_no_sessions(PROFILES["crashes"]))), 42),
    Scenario("violation-5-recovery-trusts-unsynced-bytes",
             "recovery after a kill trusts a tail it never synced; a later power loss tears what "
             "was replicated and read",
             _in_flight_dropped(_no_commits(_no_sessions(PROFILES["crashes"]))), 47),
    Scenario("committed-offsets-survive-failover",
             "apache/rocketmq#7790, #9711: after the master is killed, the elected slave, and later the "
             "restarted old master, answer the group's committed offset with every acknowledged commit "
             "instead of rolling the group's progress back",
             dataclasses.replace(_quiet(), duration_ms=16_000), 1, _masters_killed_after_commits),
    Scenario("leader-lost-with-master",
             "the controller leader and the master die together; the new leader, which holds no "
             "session of the master, replaces it after the session grace instead of at heartbeat expiry",
             _quiet(restart_min_ms=6_000, restart_max_ms=8_000), 1, _leader_lost_with_the_master),
    Scenario("leader-change-cuts-off-the-master",
             "a live master cannot reopen its session with a new leader within the grace and "
             "is deposed while it serves: one master per epoch, no acknowledged write lost",
             _quiet(), 1, _master_cut_off_across_a_leader_change),
    Scenario("violation-4-not-master-after-write",
             "a put written and replicated, then the role changed during the ack wait: answered as "
             "not written while the new master holds the batch",
             _quiet(slave_timeout_ms=4_000), 1, _cut_acks_and_heartbeats_while_a_put_waits),
    Scenario("elected-while-down-named-later",
             "async-overlap seed 36 (found as seed 21 before later changes moved the schedules): a broker "
             "that lost power is elected while its heartbeats are still alive; restarted with less, its "
             "registration answer names no master, and the answer to its election request "
             "(MASTER_STILL_EXIST) names it master of that term, which it takes; the others truncate "
             "acknowledged messages to follow it",
             PROFILES["async-overlap"], 36),
]}
