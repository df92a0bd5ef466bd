"""Consumer offsets in the simulator: consumers commit through the put path and resume from the
master, invariants 8-10 hold on the rules as they are, and each fails within a few seeds when a
data-survival rule of committed offsets is reverted (a monkeypatched rule, never a flag in the
product). The #7790/#9711 scenario (offsets kept outside the replicated log) is in
test_scenarios.py.
"""

from __future__ import annotations

import dataclasses

from rocketray.wire.message import decode_record
from rocketray.wire.offset_records import OFFSETS_TOPIC
from rocketray.broker.offsets import fold_all
from rocketray.wire.put_result import PutStatus
from rocketray.ha.ack import refused
from rocketray.sim.broker import SimBroker
from rocketray.sim.invariants import Invariants
from rocketray.sim.mutants import MUTANTS, applied
from rocketray.sim.offsets import CONSUMER_GROUP, LogFold
from rocketray.sim.run import PROFILES, Sim, SimConfig, run_seed, run_seeds

BACK = "committed offset never goes back"
HELD = "acknowledged commit lost"
LOST = "acknowledged or read message lost"
QUIET = SimConfig(max_faults=0)


def _first_violation(seeds: int, config: SimConfig = PROFILES["default"]) -> tuple[int | None, str | None]:
    summary = run_seeds(range(1, seeds + 1), config)
    return summary["first_failing_seed"], summary["violation"]


def _silence(monkeypatch, *invariants: str) -> None:
    """Switch checks of the checker off, to show that another one catches a rule on its own."""
    if "1" in invariants:       # acknowledged messages (commits included) where they were acknowledged
        monkeypatch.setattr(Invariants, "_check_ends", lambda self, group, brokers: None)
        monkeypatch.setattr(Invariants, "_expect", staticmethod(lambda b, offset, body, invariant: None))
    if "8" in invariants:
        monkeypatch.setattr(Invariants, "_check_held", lambda self, group, brokers: None)
    if "9" in invariants:
        monkeypatch.setattr(Invariants, "_check_reading", lambda self, *args: None)


# -- the rules as they are --------------------------------------------------------------------------

def test_a_quiet_run_commits_and_resumes_from_the_masters_answer():
    """No faults: the consumer commits through the put path (acknowledged, stale ones too), resumes
    from what the master answers after its restarts, and ends with the master's committed offset at
    its last acknowledged commit; no violation."""
    sim = Sim(3, QUIET)
    r = sim.run()
    assert r.ok, r.violation
    consumer = sim.consumers[0]
    assert r.commits > 30 and any(c.stale for c in consumer.committed)
    assert consumer.resumes >= 2            # the start, and at least one seeded restart
    master = sim.serving_master("g0")
    assert master is not None
    table = master.offset_table()
    assert table.committed(CONSUMER_GROUP, "sim", 0) == max(c.offset for c in consumer.committed)


def test_the_masters_fold_agrees_with_the_fold_of_its_whole_log_and_of_its_records():
    """On a settled master (confirm offset = max offset) the reader's incremental fold of confirmed
    records, the checker's scan of the whole log and ``fold_all`` of the system queue agree."""
    sim = Sim(2, QUIET)
    assert sim.run().ok
    for client in sim.producers + sim.consumers:
        client.stopped = True
    sim.world.run(sim.world.now_ms + 3_000)
    master = sim.serving_master("g0")
    store = master.store
    assert store.confirm_offset == store.max_offset
    records = [(m.queue_offset, m.body) for m in store.get_messages(OFFSETS_TOPIC, 0, 0, 10_000)]
    assert len(records) > 30
    whole = LogFold(None).advance(store)
    assert master.offset_table().as_rows() == whole.as_rows() == fold_all(records).as_rows()


def test_commits_are_acknowledged_again_after_healing_or_liveness_fails(monkeypatch):
    """Invariant 10: a broker that refuses every commit once the faults stop leaves the group's
    progress stuck, and the settle check says so."""
    original = SimBroker.put
    cutoff_ms = QUIET.duration_ms

    def refuse_commits_late(self, batch, reply):
        if self.world.now_ms >= cutoff_ms and decode_record(batch.data)[0].topic == OFFSETS_TOPIC:
            reply(refused(PutStatus.NOT_MASTER))
            return
        original(self, batch, reply)
    monkeypatch.setattr(SimBroker, "put", refuse_commits_late)
    r = run_seed(1, QUIET)
    assert not r.ok and "no offset commit acknowledged after healing" in r.violation, r.violation


# -- mutants: each reverted rule is caught within a bounded number of seeds ---------------------------
# (the rules broken are sim/mutants.py's, which the mutation check in test_mutants.py also hunts)

def test_a_fold_that_keeps_the_last_commit_is_caught(monkeypatch):
    """OffsetTable.apply keeping the last committed value instead of the maximum: a stale commit
    (a consumer that lost its queue, a late commit) rolls the group's progress back. Invariant 9
    sees it on the master at seed 1; with 9 off, invariant 8 sees it in the replicas' logs."""
    with applied(MUTANTS["offsets-fold-keeps-last"]):
        seed, violation = _first_violation(3)
        assert seed == 1 and violation.startswith(BACK), violation
        _silence(monkeypatch, "9")
        seed, violation = _first_violation(3)
        assert seed == 1 and violation.startswith(HELD), violation


def test_a_commit_acknowledged_without_the_replicas_acks_is_caught(monkeypatch):
    """A commit handler that answers PUT_OK after the master's own write, without waiting for the
    SyncStateSet's acks (messages keep the rule). Invariant 1 sees the commit record missing on a
    member at seed 1; with 1 off, invariant 8 does; with 1 and 8 off, invariant 9 sees the group's
    progress go back after a failover within 10 seeds."""
    with applied(MUTANTS["commit-acked-on-own-write"]):
        seed, violation = _first_violation(3)
        assert seed == 1 and violation.startswith(LOST), violation
        _silence(monkeypatch, "1")
        seed, violation = _first_violation(3)
        assert seed == 1 and violation.startswith(HELD), violation
        _silence(monkeypatch, "8")
        seed, violation = _first_violation(10)
        assert seed is not None and violation.startswith(BACK), violation


def test_a_reader_that_ignores_the_confirm_offset_is_caught():
    """The master answers at once from every commit record of its log, confirmed or not: a commit
    whose outcome the consumer never learnt is answered, then lost with the master, and the group's
    progress goes back (invariant 9 within 20 seeds of the default mix). Either guard alone is not
    reached: see docs/simulation.md."""
    with applied(MUTANTS["offsets-reader-ignores-confirm"]):
        seed, violation = _first_violation(20)
    assert seed is not None and violation.startswith(BACK), violation


def test_the_failover_scenario_resumes_from_each_new_master_including_the_restarted_old_one():
    """The #7790/#9711 scenario as scripted: two masters killed after acknowledged commits, the
    consumer resumes from every new master's answer, and the second election picks the restarted
    first master, so both upstream paths (an elected slave, a restarted old master) are exercised."""
    from rocketray.sim.scenarios import SCENARIOS

    s = SCENARIOS["committed-offsets-survive-failover"]
    sim = Sim(s.seed, s.config)
    r = sim.run(s.script)
    assert r.ok, r.violation
    masters = [master for _group, _epoch, master in sim.controller.elections]
    assert len(masters) >= 3 and masters[0] == masters[2] != masters[1], masters
    assert sim.consumers[0].resumes >= 3


# -- an admin's reset: the one allowed regression -----------------------------------------------------

RESETS = dataclasses.replace(PROFILES["default"], consumer_reset_p=0.15)


def test_resets_move_the_group_back_under_faults_and_nothing_else_does():
    """With the admin's resets on (reset records to a random offset at or below the cursor), the
    default fault mix passes: each acknowledged reset is the recorded regression the checker allows,
    the consumer resumes from it, and commits move on from there. The runs did go back: some reset
    was acknowledged below an offset committed before it."""
    regressions = 0
    for seed in (1, 2, 3, 4):
        sim = Sim(seed, RESETS)
        r = sim.run()
        assert r.ok, (seed, r.violation)
        for consumer in sim.consumers:
            running = -1
            for c in consumer.committed:
                if c.reset and c.offset < running:
                    regressions += 1
                running = c.offset if c.reset else max(running, c.offset)
    assert regressions >= 2, regressions


def test_quiet_run_with_resets_ends_at_the_folds_value():
    """No faults: the master's committed offset at the end is the running value of the acknowledged
    records (the maximum, set back by each reset), not their maximum."""
    sim = Sim(3, dataclasses.replace(QUIET, consumer_reset_p=0.15))
    r = sim.run()
    assert r.ok, r.violation
    consumer = sim.consumers[0]
    assert any(c.reset for c in consumer.committed)
    running = -1
    for c in consumer.committed:
        running = c.offset if c.reset else max(running, c.offset)
    master = sim.serving_master("g0")
    assert master is not None and master.offset_table().committed(CONSUMER_GROUP, "sim", 0) == running


def test_with_resets_on_a_fold_that_keeps_the_last_commit_is_still_caught():
    """Allowing resets does not let other regressions through: the keep-the-last fold (a stale commit
    rolls progress back) is still caught as a committed offset going back within 3 seeds."""
    with applied(MUTANTS["offsets-fold-keeps-last"]):
        seed, violation = _first_violation(3, RESETS)
    assert seed is not None and violation.startswith(BACK), violation
