"""Deterministic simulator throughput: seeds per second and simulated seconds per wall second.

``python benchmarks/run.py simulate [--seeds N] [--workers W] --json``. The figure is the simulator
as CI runs it (every fault kind, invariants after every step), in one process and in ``W`` worker
processes (default 2, the CI machine's cores); the same-run baseline is the same seeds with no
faults in one process (the cost of the world, the cores and the checks without crashes, recoveries
and elections). ``ratio`` = seeds/s with faults / seeds/s without, one process each (higher is
better; below 1 means faults cost time); ``workers_speedup`` = seeds/s on W workers / on one.
"""

from __future__ import annotations

import argparse

from rocketray.sim.run import SimConfig, run_seeds

SMOKE_ARGS = ["--seeds", "2"]


def run(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(prog="simulate")
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--workers", type=int, default=2)
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
    }
