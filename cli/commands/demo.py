"""``rocketray demo``: the whole mission on an embedded local Ray.

Starts a local Ray, brings up C controllers and G groups of R replicas (fast
profile), runs the failover pipeline of ``actors/pipeline.py`` with a progress
bar (everything it writes and reads goes through ``rocketray.client``: a topic,
a producer, a consumer group), prints a summary, tears everything down, and
exits 0 only if every check passed. With ``--json`` the last stdout line is one
JSON object.

``--nodes N`` (N >= 2) runs it on N Ray nodes on this machine instead (``actors/nodes.py``): each
group's replicas and the controllers are spread and pinned by node label, and after the controller
kill a node-loss step kills the node of the first group's master and brings it back
(``node_failover_ms``, ``node_rejoin_ms`` and five more checks in the summary).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("demo", help="run the one-command failover demo on an embedded local Ray")
    p.add_argument("--json", action="store_true", help="print one JSON summary as the last stdout line")
    p.add_argument("--messages", type=int, default=3000, help="messages to produce (default 3000)")
    p.add_argument("--groups", type=int, default=1, help="broker groups (default 1)")
    p.add_argument("--replicas", type=int, default=3, help="replicas per group (default 3)")
    p.add_argument("--controllers", type=int, default=3, help="controller nodes (default 3)")
    p.add_argument("--data-dir", default=None, help="where stores live (default: a temporary directory)")
    p.add_argument("--keep", action="store_true", help="keep the data directory after the demo")
    p.add_argument("--nodes", type=int, default=1,
                   help="Ray nodes on this machine (default 1); with 2 or more, each group's replicas sit on "
                        "different nodes and a node-loss step kills the node of a master and brings it back")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import ray
    from tqdm import tqdm

    from rocketray.actors import pipeline
    from rocketray.actors.cluster import DEFAULT_NAME, start_cluster

    def say(msg: str) -> None:
        print(f"[demo] {msg}", file=sys.stderr if args.json else sys.stdout, flush=True)

    tmp = None
    data_dir = args.data_dir
    if data_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="rocketray-demo-")
        data_dir = tmp.name
    nodes = None
    if args.nodes > 1:
        from rocketray.actors.nodes import LocalNodes

        say(f"starting a local Ray of {args.nodes} nodes (plus a head for this driver)")
        nodes = LocalNodes(args.nodes, namespace="rocketray-demo-driver")
    else:
        say("starting an embedded local Ray")
        ray.init(address="local", include_dashboard=False, logging_level="ERROR", log_to_driver=False,
                 object_store_memory=300 * 1024 * 1024, namespace="rocketray-demo-driver")
    cluster = None
    summary: dict = {"ok": False, "checks": {}}
    try:
        say(f"starting {args.controllers} controllers and {args.groups} group(s) x {args.replicas} replicas")
        cluster = start_cluster(DEFAULT_NAME, controllers=args.controllers, groups=args.groups,
                                replicas=args.replicas, data_dir=data_dir, profile="fast")
        summary = pipeline.run(cluster, args.messages,
                               progress_factory=lambda total: tqdm(total=total, unit="msg", file=sys.stderr,
                                                                   disable=None),
                               say=say, nodes=nodes)
        if nodes is not None:
            summary["nodes"] = args.nodes
    except Exception as exc:  # noqa: BLE001 - the demo reports any failure as a failed check
        summary = {**summary, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
        say(f"FAILED: {summary['error']}")
    finally:
        if cluster is not None:
            cluster.stop(delete_data=not args.keep)
        if nodes is not None:
            nodes.shutdown()
        else:
            ray.shutdown()
        if tmp is not None and not args.keep:
            tmp.cleanup()
    print_summary(summary, say)
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    return 0 if summary.get("ok") else 1


def print_summary(summary: dict, say) -> None:
    for key in ("messages_acked", "messages_lost", "replicas_consistent", "broker_failover_ms",
                "controller_failover_ms", "node_failover_ms", "node_rejoin_ms"):
        if key in summary:
            say(f"{key:>24}: {summary[key]}")
    for name, passed in summary.get("checks", {}).items():
        say(f"{'PASS' if passed else 'FAIL'}  {name}")
    say("all checks passed" if summary.get("ok") else "some checks FAILED")
