"""``rocketray chaos``: Jepsen-style fault injection against the controllers or the brokers.

``--target controller`` runs ``rocketray.chaos.controller_chaos`` (controller nodes as local processes
behind fault-injecting proxies; linearizability of the controller API). ``--target brokers`` hands
the parsed arguments to ``rocketray.chaos.broker_chaos.run(args)`` when that module exists; it may add
its own flags through an optional ``add_arguments(parser)``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import logging
import sys

BROKER_MODULE = "rocketray.chaos.broker_chaos"
EXIT_NOT_AVAILABLE = 3


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("chaos", help="inject faults (partitions, kills, pauses) and check the histories")
    p.add_argument("--target", choices=("controller", "brokers"), default="controller",
                   help="what to torture (default: controller)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of workload under faults (default 60)")
    p.add_argument("--seed", type=int, default=0, help="seed of the nemesis schedule and the workload")
    p.add_argument("--nemesis", default="all",
                   help="comma list: partition-random-node, partition-random-halves, partition-majorities-ring, "
                        "bridge, kill, pause, all, none (default all)")
    p.add_argument("--json", action="store_true", help="print one JSON summary as the last stdout line")
    p.add_argument("--out", default=None, help="directory for the history, nemesis log and verdict")
    ctl = p.add_argument_group("controller target")
    ctl.add_argument("--nodes", type=int, default=5, help="controller nodes (default 5)")
    ctl.add_argument("--groups", type=int, default=None,
                     help="broker groups (controller target: checker keys, default 3; brokers target: default 2)")
    ctl.add_argument("--clients", type=int, default=5, help="concurrent client threads (default 5)")
    ctl.add_argument("--snapshot-threshold", type=int, default=10, help="entries between snapshots (default 10)")
    ctl.add_argument("--check-budget", type=float, default=60.0,
                     help="seconds the linearizability checker may spend before answering 'unknown'")
    if importlib.util.find_spec(BROKER_MODULE) is not None:
        try:
            hook = getattr(importlib.import_module(BROKER_MODULE), "add_arguments", None)
            if hook is not None:
                hook(p.add_argument_group("brokers target"))
        except Exception as exc:  # noqa: BLE001 - a broken broker module must not break --target controller
            logging.getLogger(__name__).warning("broker chaos flags unavailable: %s", exc)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.target == "brokers":
        return _run_brokers(args)
    return _run_controller(args)


def _run_brokers(args: argparse.Namespace) -> int:
    try:
        module = importlib.import_module(BROKER_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name != BROKER_MODULE:
            raise
        print("rocketray chaos --target brokers is not available in this build "
              f"({BROKER_MODULE} is missing); try --target controller", file=sys.stderr)
        return EXIT_NOT_AVAILABLE
    return int(module.run(args) or 0)


def _run_controller(args: argparse.Namespace) -> int:
    from rocketray.chaos.controller_chaos import RunConfig, run as run_controller
    from rocketray.verify.nemesis import NemesisSpecError, parse_nemeses

    args.groups = 3 if args.groups is None else args.groups
    try:
        nemeses = parse_nemeses(args.nemesis)
    except NemesisSpecError as exc:
        print(f"rocketray chaos: {exc}", file=sys.stderr)
        return 2
    if args.nodes < 1 or args.groups < 1 or args.clients < 1 or args.duration < 0:
        print("rocketray chaos: --nodes, --groups and --clients must be >= 1, --duration >= 0", file=sys.stderr)
        return 2
    cfg = RunConfig(duration_s=args.duration, seed=args.seed, nemeses=nemeses, nodes=args.nodes,
                    groups=args.groups, clients=args.clients, snapshot_threshold=args.snapshot_threshold,
                    out_dir=args.out, check_budget_s=args.check_budget)
    print(f"controller chaos: {cfg.nodes} nodes, {cfg.duration_s:g}s, seed {cfg.seed}, "
          f"nemeses {','.join(nemeses) or 'none'}", file=sys.stderr)
    try:
        summary = run_controller(cfg)
    except Exception as exc:  # noqa: BLE001 - still end with one JSON line saying the run is invalid
        logging.getLogger(__name__).exception("controller chaos run failed")
        summary = {"valid": False, "error": f"{type(exc).__name__}: {exc}", "ops": 0, "linearizable": "unknown",
                   "nemesis_events": 0, "converged": False}
    if args.json:
        print(json.dumps(summary, default=str))
    else:
        for key in ("ops", "ok", "failed", "unknown", "linearizable", "leaders_per_term_max", "converged",
                    "restart_ok", "nemesis_events", "snapshots_saved", "snapshots_loaded", "dumps_installed",
                    "elapsed_s", "out_dir"):
            if key in summary:
                print(f"{key}: {summary[key]}")
        print("VALID" if summary["valid"] else "INVALID")
    return 0 if summary["valid"] else 1
