"""``rocketray chaos``: Jepsen-style fault injection against the brokers or the controllers.

``--target brokers`` (the default) runs ``rocketray.chaos.broker_chaos``: a real cluster of Ray
actors, a recorded workload, killed/paused/partitioned masters, replicas and controllers, and the
checker's verdict (no acknowledged write lost, one master per epoch, replicas converged).
``--target controller`` runs ``rocketray.chaos.controller_chaos`` (controller nodes as local processes
behind fault-injecting proxies; linearizability of the controller API). The runners (and Ray) are
imported only when a run starts, so ``rocketray --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("chaos", help="inject faults (kills, pauses, partitions) and check the histories")
    p.add_argument("--target", choices=("brokers", "controller"), default="brokers",
                   help="what to torture (default: brokers)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of workload under faults (default 60)")
    p.add_argument("--minutes", type=float, default=None,
                   help="minutes of workload under faults (overrides --duration; the soak: --nemesis all --minutes 30)")
    p.add_argument("--seed", type=int, default=0, help="seed of the nemesis schedule and the workload")
    p.add_argument("--nemesis", default="all",
                   help="comma list, all or none (default all). brokers: kill-master, kill-broker, "
                        "kill-controller-leader, kill-controller, pause-broker, pause-controller, partition-ha, "
                        "net-partition, net-oneway, net-loss, corrupt-file, truncate-file, delete-queue, "
                        "lose-unsynced, clock-broker; process (the kills, pauses and partition-ha) or os (the "
                        "others) draw from a subset; "
                        "controller: partition-random-node, partition-random-halves, partition-majorities-ring, "
                        "bridge, kill, pause (all), loss, clock, corrupt-snapshot, truncate-snapshot, "
                        "corrupt-journal, truncate-journal (os)")
    p.add_argument("--json", action="store_true", help="print one JSON summary as the last stdout line")
    p.add_argument("--out", default=None, help="directory for the history, nemesis log and verdict")
    p.add_argument("--groups", type=int, default=None,
                   help="broker groups (brokers target: default 2; controller target: checker keys, default 3)")
    brokers = p.add_argument_group("brokers target")
    brokers.add_argument("--replicas", type=int, default=3, help="replicas per group (default 3)")
    brokers.add_argument("--controllers", type=int, default=3, help="controller actors (default 3)")
    brokers.add_argument("--profile", choices=("fast", "default"), default="fast",
                         help="timing profile (default fast)")
    brokers.add_argument("--address", default=None, help="Ray address to join (default: an embedded local Ray)")
    brokers.add_argument("--ray-nodes", type=int, default=1,
                         help="Ray nodes on this machine (default 1); N >= 2 spreads replicas and enables kill-node")
    brokers.add_argument("--producers", type=int, default=3, help="producer threads (default 3)")
    brokers.add_argument("--batch", type=int, default=10, help="payloads per send (default 10)")
    brokers.add_argument("--rate", type=float, default=100.0,
                         help="payloads per second per producer (default 100; 0: unthrottled)")
    brokers.add_argument("--no-all-ack", dest="all_ack", action="store_false",
                         help="do not wait for every SyncStateSet member (losses become possible)")
    brokers.add_argument("--unclean", action="store_true", help="allow unclean master election")
    brokers.add_argument("--data-dir", default=None, help="broker/controller stores (default: a temp dir, deleted)")
    brokers.add_argument("--settle-timeout", type=float, default=120.0, help="seconds to wait for the settle")
    brokers.add_argument("--consumer-groups", type=int, default=2,
                         help="consumer groups reading the topic, each checked for at-least-once (default 2; 0: off)")
    brokers.add_argument("--consumers", type=int, default=2, help="members per consumer group (default 2)")
    brokers.add_argument("--drain-timeout", type=float, default=90.0,
                         help="seconds the groups get after the settle to read everything (default 90)")
    ctl = p.add_argument_group("controller target")
    ctl.add_argument("--nodes", type=int, default=5, help="controller nodes (default 5)")
    ctl.add_argument("--network", choices=("kernel", "proxy"), default="kernel",
                     help="how partitions are applied: nftables rules (default) or the pair proxies")
    ctl.add_argument("--clients", type=int, default=5, help="concurrent client threads (default 5)")
    ctl.add_argument("--snapshot-threshold", type=int, default=10, help="entries between snapshots (default 10)")
    ctl.add_argument("--check-budget", type=float, default=60.0,
                     help="seconds the linearizability checker may spend before answering 'unknown'")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.minutes is not None:
        args.duration = args.minutes * 60.0
    if args.target == "brokers":
        from rocketray.chaos.broker_chaos import run as run_brokers

        return int(run_brokers(args) or 0)
    return _run_controller(args)


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
                    out_dir=args.out, check_budget_s=args.check_budget, network=args.network,
                    faketime="clock" in nemeses)
    if "loss" in nemeses and args.network != "kernel":
        print("rocketray chaos: the loss nemesis needs --network kernel", file=sys.stderr)
        return 2
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
