"""Deterministic simulator throughput: seeds per second and simulated seconds per wall second.

``python benchmarks/run.py simulate [--seeds N] [--workers W] --json``. The figure is the simulator
as CI runs it (every fault kind, invariants after every step), in one process and in ``W`` worker
processes (default 2, the CI machine's cores); the same-run baseline is the same seeds with no
faults in one process (the cost of the world, the cores and the checks without crashes, recoveries
and elections). ``ratio`` = seeds/s with faults / seeds/s without, one process each (higher is
better; below 1 means faults cost time); ``workers_speedup`` = seeds/s on W workers / on one.

``profiles``: per fault profile of the CI budget (``--profiles``), seeds/s in one process over ``--profile-seeds``
seeds (the ``scale`` profile's 24 groups: a tenth of them, at least one) with the invariants as CI
runs them (incremental) and with every check run in full after every step (``full_checks``, the
same verdicts: tests/sim/test_incremental.py), run one after the other per profile;
``incremental_vs_full`` = the sum of seeds over the sum of their times, incremental / full.
"""

from __future__ import annotations

import argparse

from rocketray.sim.invariants import full_checks
from rocketray.sim.run import CI_BUDGET, PROFILES, SimConfig, run_seeds

SMOKE_ARGS = ["--seeds", "2", "--profile-seeds", "1", "--profiles", "default"]


def run(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(prog="simulate")
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--profile-seeds", type=int, default=10)
    parser.add_argument("--profiles", default=",".join(CI_BUDGET), help="comma-separated (default: the CI budget's)")
    args = parser.parse_args(argv)
    seeds = range(1, args.seeds + 1)
    faulty = run_seeds(seeds, SimConfig(), stop_at_first=False)
    parallel = run_seeds(seeds, SimConfig(), stop_at_first=False, workers=args.workers)
    quiet = run_seeds(seeds, SimConfig(max_faults=0), stop_at_first=False)
    return {
        "seeds": faulty["seeds"],
        "violations": faulty["violations"],
        "seeds_per_s": faulty["seeds_per_s"],
        "sim_s_per_wall_s": faulty["sim_s_per_wall_s"],
        "steps_per_seed": round(faulty["steps"] / max(faulty["seeds"], 1)),
        "faults_per_seed": round(faulty["faults"] / max(faulty["seeds"], 1), 1),
        "baseline_seeds_per_s_no_faults": quiet["seeds_per_s"],
        "baseline_sim_s_per_wall_s_no_faults": quiet["sim_s_per_wall_s"],
        "ratio": round(faulty["seeds_per_s"] / max(quiet["seeds_per_s"], 1e-9), 3),
        "workers": args.workers,
        "workers_seeds_per_s": parallel["seeds_per_s"],
        "workers_speedup": round(parallel["seeds_per_s"] / max(faulty["seeds_per_s"], 1e-9), 2),
        "workers_violations": parallel["violations"],
        **_profiles(args.profiles.split(","), args.profile_seeds),
    }


def _profiles(profiles: list[str], n: int) -> dict:
    """Seeds/s per profile, incremental and with every check in full (see the module docstring)."""
    out, time_inc, time_full, seeds = {}, 0.0, 0.0, 0
    for profile in profiles:
        count = max(1, n // 10) if profile == "scale" else n
        inc = run_seeds(range(1, count + 1), PROFILES[profile], stop_at_first=False)
        with full_checks():
            full = run_seeds(range(1, count + 1), PROFILES[profile], stop_at_first=False)
        out[profile] = {"seeds_per_s": inc["seeds_per_s"], "full_checks_seeds_per_s": full["seeds_per_s"],
                        "violations": inc["violations"] + full["violations"]}
        time_inc += count / max(inc["seeds_per_s"], 1e-9)
        time_full += count / max(full["seeds_per_s"], 1e-9)
        seeds += count
    return {"profiles": out, "profile_seeds": n, "incremental_vs_full": round(time_full / max(time_inc, 1e-9), 2)}
