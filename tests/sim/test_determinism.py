"""The same seed gives the same run: whatever ran before it in the process, in a forked worker, and
in a fresh interpreter. Every speed-up of the simulator (the world's loop, the network, the disk,
the incremental checks) must keep this; ``summary`` is what is compared (the per-seed result with
its trace), so a change that alters one run shows which seed and which field moved. Nothing here
pins a value: a legitimate change of the simulated system changes every process's runs alike.
"""

from __future__ import annotations

import dataclasses
import multiprocessing

from rocketray.sim.run import PROFILES, SimResult, run_seed, run_seeds

#: a few short runs over different fault mixes (the disk's crashes, the network's faults, swarm's
#: per-seed mix, async flush's power losses), a third of a CI run's length each
RUNS = [("load", 3), ("swarm", 7), ("network", 2), ("async-overlap", 4)]
CONFIGS = {p: dataclasses.replace(PROFILES[p], duration_ms=4_000, settle_ms=4_000) for p, _ in RUNS}


def summary(r: SimResult) -> tuple:
    return (r.ok, r.violation, r.steps, r.sim_ms, r.acked, r.read, r.faults, r.elections, r.commits, tuple(r.trace))


def _runs(order: list[tuple[str, int]]) -> dict[tuple[str, int], tuple]:
    return {(p, s): summary(run_seed(s, CONFIGS[p])) for p, s in order}


def test_a_seed_gives_the_same_run_after_other_seeds_and_in_other_processes():
    """Each run twice in this process, the second time after different runs before it; in forked
    workers (``run_seeds``); and in a fresh interpreter (spawn: no state inherited from this one)."""
    first = _runs(RUNS)
    again = _runs(list(reversed(RUNS)))
    assert again == first
    assert all(s[2] > 500 and s[6] > 0 for s in first.values()), "the runs stepped and injected faults"
    forked: dict[tuple[str, int], tuple] = {}
    for profile in sorted({p for p, _ in RUNS}):
        run_seeds([s for p, s in RUNS if p == profile], CONFIGS[profile], stop_at_first=False, workers=2,
                  progress=lambda r, profile=profile: forked.__setitem__((profile, r.seed), summary(r)))
    assert forked == first
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        fresh = pool.starmap(run_seed, [(s, CONFIGS[p]) for p, s in RUNS])
    assert {(p, s): summary(r) for (p, s), r in zip(RUNS, fresh)} == first
