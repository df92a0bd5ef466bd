"""Deterministic simulator throughput: seeds per second and simulated seconds per wall second.

``python benchmarks/run.py simulate [--seeds N] --json``. The figure is the simulator as CI runs it
(every fault kind, invariants after every step); the same-run baseline is the same seeds with no
faults (the cost of the world, the cores and the checks without crashes, recoveries and elections).
``ratio`` = seeds/s with faults / seeds/s without (higher is better; below 1 means faults cost time).
"""

from __future__ import annotations

import argparse

from rocketray.sim.run import SimConfig, run_seeds

SMOKE_ARGS = ["--seeds", "2"]


def run(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(prog="simulate")
    parser.add_argument("--seeds", type=int, default=40)
    args = parser.parse_args(argv)
    seeds = range(1, args.seeds + 1)
    faulty = run_seeds(seeds, SimConfig(), stop_at_first=False)
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
    }
