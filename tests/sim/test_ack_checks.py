"""Invariant 11 (sim/ack_checks.py): what a PUT_OK promised under ``min_in_sync_replicas`` 2, checked
from the replicas' logs as the broker answers; the admission rule's own window (a SyncStateSet that
shrinks below 2 while a put waits) is reached under faults and excused, and only it."""

from __future__ import annotations

import dataclasses

from rocketray.sim.ack_checks import PROMISE, AckChecks
from rocketray.sim.mutants import ALL_MUTANTS, applied
from rocketray.sim.run import PROFILES, run_seed, swarm

#: ``crashes`` (kills, power losses, io-crashes, isolation; switch time) with min_in_sync_replicas 2
CRASHES_ISR2 = dataclasses.replace(PROFILES["crashes"], timings=dataclasses.replace(
    PROFILES["crashes"].timings, min_in_sync_replicas=2))


def test_swarm_draws_min_in_sync_replicas_2_for_some_seeds():
    drawn = {seed: swarm(seed, PROFILES["swarm"]).timings.min_in_sync_replicas for seed in range(1, 11)}
    assert set(drawn.values()) == {1, 2} and drawn[3] == 2


def test_a_put_admitted_with_too_few_replicas_in_sync_is_caught():
    """The gate's min_in_sync_replicas rule reverted: a master alone answers PUT_OK held by itself."""
    with applied(ALL_MUTANTS["gate-admits-without-isr"]):
        r = run_seed(3, PROFILES["swarm"])
    assert r.violation is not None and r.violation.startswith(PROMISE), r.violation


def test_the_admission_window_is_reached_and_excused(monkeypatch):
    """Without the excuse the rules as they are fail: a put admitted with 2 in sync is answered by a
    master whose set shrank to itself while it waited; with it, the seed passes."""
    r = run_seed(1, CRASHES_ISR2)
    assert r.ok and r.acked > 0, r.violation
    monkeypatch.setattr(AckChecks, "_was_in_sync", lambda self, b, since: False)
    r = run_seed(1, CRASHES_ISR2)
    assert r.violation is not None and r.violation.startswith(PROMISE) and "its view [" in r.violation, r.violation
