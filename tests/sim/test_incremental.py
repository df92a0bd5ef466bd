"""Incremental invariant checks (sim/step_inputs.py, sim/log_checks.py) accept and reject exactly what
the full checks do: the same seeds give the same traces, step counts and verdicts with every check
run in full after every step, and a skipped check would have changed nothing (the debug mode runs
it anyway and compares the checker's state). The mutants, caught by the incremental checks in the
CI budget, are caught at the same run with the same violation by the full checks
(test_mutants.py).
"""

from __future__ import annotations

import contextlib
import multiprocessing

import pytest

from rocketray.sim.invariants import full_checks
from rocketray.sim.run import PROFILES, run_seed

#: seeds 1-2 of every profile (the scale profile's 24 groups: seed 1)
RUNS = [(p, s) for p in sorted(PROFILES) for s in ((1,) if p == "scale" else (1, 2))]
#: and with every skip verified (the debug mode reads the checker's whole state at each one)
VERIFIED = [("default", 1), ("async-overlap", 1), ("windows", 1)]


def _outcome(run: tuple[str, int, str]) -> tuple:
    profile, seed, mode = run
    with {"incremental": contextlib.nullcontext(), "full": full_checks(),
          "verified": full_checks(verify=True)}[mode]:
        r = run_seed(seed, PROFILES[profile])
    return r.ok, r.violation, r.steps, r.trace, r.acked, r.read, r.commits


@pytest.mark.slow
def test_incremental_checks_give_the_full_checks_traces_and_verdicts():
    """Seeds of every profile run incrementally and with every check in full after every step (and
    a few with every skip verified): identical traces, steps and verdicts, and no skipped check that
    would have done anything."""
    jobs = [(p, s, mode) for p, s in RUNS for mode in ("incremental", "full")]
    jobs += [(p, s, "verified") for p, s in VERIFIED]
    with multiprocessing.get_context("fork").Pool(2) as pool:
        got = dict(zip(jobs, pool.map(_outcome, jobs, chunksize=1)))
    for p, s in RUNS:
        assert got[(p, s, "incremental")] == got[(p, s, "full")], (p, s)
        assert got[(p, s, "incremental")][0], (p, s, got[(p, s, "incremental")][1])
    for p, s in VERIFIED:
        assert got[(p, s, "verified")] == got[(p, s, "incremental")], (p, s)


def test_a_skip_that_hides_a_change_is_caught_by_the_debug_mode(monkeypatch):
    """The debug mode can fail: inputs that leave out the brokers and the clients make ``check_step``
    skip checks that would have recorded a new confirm offset or taken a new commit, and verifying
    the skips says so."""
    import rocketray.sim.invariants as invariants

    monkeypatch.setattr(invariants, "group_inputs",
                        lambda controller, brokers, producers, consumers, group: ((controller.master_of(group),), (), False))
    monkeypatch.setattr(invariants, "broker_step_inputs", lambda controller, group, before, index, b: before)
    with full_checks(verify=True), pytest.raises(AssertionError, match="would have changed the checker's state"):
        run_seed(1, PROFILES["default"])
