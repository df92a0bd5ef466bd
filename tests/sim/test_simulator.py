"""The deterministic simulator (rocketray.sim): replayable, silent on the current rules, and able to fail.

The simulator runs the real cores (controller decide/apply, heartbeat table and election; the broker
role machine; HA sessions and the master-side replication core; the message store over a simulated
disk) under seeded kills, power losses, crashes between IO steps, partitions, lost controller
commits and connection resets, and checks its invariants after every step. These tests pin:
- a seed replays exactly (same trace, same counts);
- a budget of seeds finds no violation with the rules as they are;
- each rule issue 15 fixed, monkeypatched back to its old form, is caught within a fixed budget
  (a simulator that never fails proves nothing: SIMULATION.md section 7).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import ha_old_rules as old
import rocketray.broker.role as role
import rocketray.ha.sync_state as sync_state
from rocketray.sim.run import SimConfig, run_seed, run_seeds


def test_a_seed_replays_exactly():
    """Same seed, same world: identical trace, step count and outcome counts."""
    a, b = run_seed(5, SimConfig()), run_seed(5, SimConfig())
    assert a.trace == b.trace and a.steps == b.steps
    assert (a.acked, a.read, a.faults, a.elections) == (b.acked, b.read, b.faults, b.elections)
    assert a.faults > 0 and a.acked > 0, "the run injected faults and acknowledged writes"


def test_different_seeds_differ():
    """The seed drives the world: two seeds do not produce the same run."""
    assert run_seed(1, SimConfig()).trace != run_seed(2, SimConfig()).trace


def test_quiet_run_acknowledges_and_reads_everything():
    """No faults: every acknowledged write is read back by the consumer; no violation."""
    r = run_seed(1, SimConfig(max_faults=0))
    assert r.ok, r.violation
    assert r.acked > 100 and r.read >= r.acked


# -- named scenarios: a rule issue 15 fixed (or the simulator found), reverted, is caught ---------------

def _old_restart_rule(sitting, epoch, last_epoch):
    """Before issue 15's role machine (#9689): a restarted broker named master of a term it held
    before the restart resumes it, instead of asking for a new term."""
    return False


#: name -> (the old rule as (owner, attribute, value) patches, the seed that shows it, the invariant)
SCENARIOS = {
    # issue 15 violation 1: confirm offset = the master's max while the confirmed set has one
    # member, and a never-backwards floor above the members' acks
    "violation-1-confirm-offset-covers-a-joining-member": (
        [(sync_state.SyncStateTracker, "compute_confirm_offset", old.old_compute_confirm_offset)], 3,
        "confirm offset within every counted member"),
    # #9689 / issue 15 role machine: a master restarted before the controller noticed resumes its term
    "restarted-master-resumes-its-old-term": (
        [(role, "is_term_from_before_restart", _old_restart_rule)], 4,
        "confirm offset within every counted member"),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_named_scenario_passes_with_the_new_rule(name):
    """The scenario's seed finds no violation with the rules as they are."""
    _patches, seed, _invariant = SCENARIOS[name]
    r = run_seed(seed, SimConfig())
    assert r.ok, (r.violation, "\n".join(r.trace))


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_named_scenario_fails_with_the_old_rule(monkeypatch, name):
    """With the old rule patched back, the scenario's seed violates the named invariant."""
    patches, seed, invariant = SCENARIOS[name]
    for owner, attr, value in patches:
        monkeypatch.setattr(owner, attr, value)
    r = run_seed(seed, SimConfig())
    assert not r.ok and r.violation.startswith(invariant), r.violation
    assert any("VIOLATION" in line for line in r.trace), "the trace ends at the violation"


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_old_rule_caught_within_the_seed_budget(monkeypatch, name):
    """The random search finds each old rule within 40 seeds (not only at the pinned seed)."""
    patches, _seed, _invariant = SCENARIOS[name]
    for owner, attr, value in patches:
        monkeypatch.setattr(owner, attr, value)
    summary = run_seeds(range(1, 41), SimConfig())
    assert summary["violations"] == 1, f"{name}: no violation in {summary['seeds']} seeds"


@pytest.mark.slow
def test_ci_budget_of_seeds_finds_no_violation():
    """The CI budget: many seeds of the full fault model, zero violations."""
    summary = run_seeds(range(1, 301), SimConfig())
    assert summary["violations"] == 0, (summary["first_failing_seed"], summary["violation"],
                                        "\n".join(summary["trace"] or []))
    assert summary["faults"] > 300 * 5 and summary["elections"] > 300


def test_cli_json_and_replay():
    """`rocketray simulate --seeds 2 --json` prints the summary; `--seed S` replays one seed."""
    out = subprocess.run([sys.executable, "-m", "rocketray.cli", "simulate", "--seeds", "2", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["seeds"] == 2 and summary["violations"] == 0
    assert {"seeds_per_s", "steps", "first_failing_seed"} <= set(summary)
    one = subprocess.run([sys.executable, "-m", "rocketray.cli", "simulate", "--seed", "3"],
                         capture_output=True, text=True, timeout=300)
    assert one.returncode == 0 and "seeds 1, violations 0" in one.stdout, one.stdout + one.stderr
