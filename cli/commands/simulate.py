"""``rocketray simulate``: run the deterministic simulator over many seeds, or replay one.

    rocketray simulate --seeds 500             # seeds 1..500, stop at the first violation
    rocketray simulate --seed 14               # replay one seed; prints its trace if it fails
    rocketray simulate --seeds 200 --json      # one JSON object: seeds, violations, seeds_per_s, ...
    rocketray simulate --profile crashes       # a fault mix: default, crashes, network, load, controller, async
    rocketray simulate --scenario list         # the named scenarios; --scenario NAME runs one
    rocketray simulate --mutants all           # break each data-survival rule of sim/mutants.py in turn and
                                               # hunt it over the CI seed budget: seeds-to-catch per mutant
    rocketray simulate --mutants list          # the mutants (and those not reached yet); NAME[,NAME] hunts some

Exit status 0 when no invariant was violated (with --mutants: when every mutant was caught), 1 when one was (the failing seed, the violated
invariant and the last events before it are printed, with the smallest failing configuration when
``--shrink`` is given).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

EXIT_VIOLATION = 1


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("simulate", help="run the deterministic simulator (seeded faults, invariants)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=100, help="how many seeds to run, from --first (default 100)")
    p.add_argument("--first", type=int, default=1, help="first seed of the range (default 1)")
    p.add_argument("--seed", type=int, default=None, help="run (replay) this one seed only")
    p.add_argument("--groups", type=int, default=None, help="broker groups (default: the profile's, 1 but for scale)")
    p.add_argument("--replicas", type=int, default=3, help="replicas per group (default 3)")
    p.add_argument("--duration-ms", type=int, default=None,
                   help="simulated time with faults (default: the profile's, 12000)")
    p.add_argument("--faults", type=int, default=None,
                   help="at most this many faults per seed (default: the profile's, 12 for default, 40 for the others)")
    p.add_argument("--profile", default="default",
                   help="fault mix: default (every kind), crashes, network, load, controller, async, scale (24 groups, "
                        "node losses), ... (default: default)")
    p.add_argument("--scenario", default=None,
                   help="run one named scenario (a scripted or pinned-seed failure schedule); 'list' lists them")
    p.add_argument("--workers", type=int, default=None,
                   help="processes running seeds side by side (default: the machine's cores, at most 8); "
                        "results and the first failing seed are the same as with one")
    p.add_argument("--mutants", default=None,
                   help="'all', 'list' or NAME[,NAME]: hunt single broken rules over the CI seed budget "
                        "(sim/mutants.py); fails if any survives")
    p.add_argument("--budget", type=int, default=None,
                   help="with --mutants: at most this many runs of the CI schedule per mutant (default: all 2000)")
    p.add_argument("--keep-going", action="store_true", help="do not stop at the first violation")
    p.add_argument("--shrink", action="store_true", help="for a failing seed, find the smallest failing config")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    import dataclasses

    from rocketray.sim.run import PROFILES, run_seed, run_seeds, shrink

    if args.scenario is not None:
        return _scenario(args)
    if args.mutants is not None:
        return _mutants(args)
    if args.profile not in PROFILES:
        print(f"rocketray simulate: unknown profile {args.profile!r} (one of {', '.join(PROFILES)})", file=sys.stderr)
        return 2
    base = PROFILES[args.profile]
    config = dataclasses.replace(base, groups=base.groups if args.groups is None else args.groups,
                                 replicas=args.replicas,
                                 duration_ms=base.duration_ms if args.duration_ms is None else args.duration_ms,
                                 max_faults=base.max_faults if args.faults is None else args.faults)
    seeds = [args.seed] if args.seed is not None else range(args.first, args.first + args.seeds)
    bar = None if args.json or args.seed is not None else tqdm(total=len(seeds), unit="seed", file=sys.stderr)
    workers = args.workers if args.workers is not None else min(8, os.cpu_count() or 1)
    summary = run_seeds(seeds, config, stop_at_first=not args.keep_going,
                        workers=max(1, min(workers, len(seeds))),
                        progress=(lambda r: bar.update(1)) if bar is not None else None)
    summary["profile"] = args.profile
    if bar is not None:
        bar.close()
    failing = summary["first_failing_seed"]
    if failing is not None and args.shrink:
        smallest = shrink(failing, config)
        summary["shrunk"] = {"max_faults": smallest.max_faults, "duration_ms": smallest.duration_ms,
                             "violation": run_seed(failing, smallest).violation}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"seeds {summary['seeds']}, violations {summary['violations']}, {summary['seeds_per_s']} seeds/s, "
              f"{summary['steps']} steps, {summary['acked']} acknowledged, {summary['faults']} faults, "
              f"{summary['elections']} elections")
        if failing is not None:
            print(f"FIRST FAILING SEED {failing}: {summary['violation']}")
            print("last events:")
            for line in summary["trace"]:
                print("  " + line)
            if "shrunk" in summary:
                print(f"smallest failing config: {summary['shrunk']}")
            print(f"replay: rocketray simulate --seed {failing}"
                  + (f" --profile {args.profile}" if args.profile != "default" else "")
                  + (f" --groups {args.groups}" if args.groups is not None else "")
                  + (f" --replicas {args.replicas}" if args.replicas != 3 else ""))
    return EXIT_VIOLATION if summary["violations"] else 0


def _scenario(args: argparse.Namespace) -> int:
    import json as _json

    from rocketray.sim.scenarios import SCENARIOS, run_scenario

    if args.scenario == "list":
        for s in SCENARIOS.values():
            print(f"{s.name}: {s.what}")
        return 0
    if args.scenario not in SCENARIOS:
        print(f"rocketray simulate: unknown scenario {args.scenario!r} (see --scenario list)", file=sys.stderr)
        return 2
    r = run_scenario(args.scenario)
    if args.json:
        print(_json.dumps({"scenario": args.scenario, "ok": r.ok, "violation": r.violation, "steps": r.steps,
                           "acked": r.acked, "elections": r.elections, "trace": None if r.ok else r.trace}))
    else:
        print(f"scenario {args.scenario}: {'no violation' if r.ok else 'VIOLATION ' + str(r.violation)}; "
              f"{r.steps} steps, {r.acked} acknowledged, {r.elections} elections")
        if not r.ok:
            for line in r.trace:
                print("  " + line)
    return 0 if r.ok else EXIT_VIOLATION


def _mutants(args: argparse.Namespace) -> int:
    from rocketray.sim.mutants import ALL_MUTANTS, MutantTargetError, hunt_all

    if args.mutants == "list":
        for m in ALL_MUTANTS.values():
            print(f"{m.name} [{m.area}]: {m.rule}" + (f" (NOT REACHED: {m.not_reached})" if m.not_reached else ""))
        return 0
    names = None if args.mutants == "all" else [n.strip() for n in args.mutants.split(",") if n.strip()]
    unknown = [n for n in names or () if n not in ALL_MUTANTS]
    if unknown:
        print(f"rocketray simulate: unknown mutant {', '.join(unknown)} (see --mutants list)", file=sys.stderr)
        return 2
    workers = args.workers if args.workers is not None else 2

    def show(h) -> None:
        if not args.json:
            caught = f"caught at run {h.caught_at} ({h.profile} seed {h.seed})" if h.caught_at else "SURVIVED"
            print(f"{h.mutant}: {caught}, {h.wall_s} s" + (f": {h.violation[:160]}" if h.violation else ""),
                  flush=True)
    try:
        hunts = hunt_all(names, workers=max(1, workers), limit=args.budget, progress=show)
    except MutantTargetError as exc:
        print(f"rocketray simulate: {exc}", file=sys.stderr)
        return 2
    survived = [h.mutant for h in hunts if h.caught_at is None]
    if args.json:
        print(json.dumps({"mutants": [{"mutant": h.mutant, "area": ALL_MUTANTS[h.mutant].area,
                                                         "seeds_to_catch": h.caught_at, "profile": h.profile,
                                                         "seed": h.seed, "violation": h.violation,
                                                         "runs": h.runs, "wall_s": h.wall_s} for h in hunts],
                          "survived": survived}))
    else:
        caught = sorted(h.caught_at for h in hunts if h.caught_at)
        print(f"mutants {len(hunts)}, caught {len(caught)}, survived {len(survived)}"
              + (f" ({', '.join(survived)})" if survived else "")
              + (f"; seeds-to-catch median {caught[len(caught) // 2]}, max {caught[-1]}" if caught else ""))
    return EXIT_VIOLATION if survived else 0
