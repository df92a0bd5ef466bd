"""Driver for ``ray job submit``: the demo's failover pipeline against an existing Ray cluster.

    ray job submit --address http://HEAD:8265 --working-dir . -- python driver.py --json

Starts a rocketray cluster on the Ray it runs in (or ``--connect NAME`` to use a
running one), produces, kills the master broker actor and the controller
leader, verifies nothing acknowledged was lost and replicas agree, and prints the
same JSON contract as ``rocketray demo --json`` (last stdout line). Exit code 0
only if every check passed. ``--keep`` leaves the cluster running afterwards.
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true")
    p.add_argument("--messages", type=int, default=3000)
    p.add_argument("--groups", type=int, default=1)
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--controllers", type=int, default=3)
    p.add_argument("--name", default="driver", help="cluster name (namespace rocketray-NAME)")
    p.add_argument("--connect", action="store_true", help="use the running cluster NAME instead of starting one")
    p.add_argument("--data-dir", default="/tmp/rocketray-data")
    p.add_argument("--profile", default="fast", choices=["fast", "default"])
    p.add_argument("--keep", action="store_true", help="leave the cluster running")
    args = p.parse_args(argv)

    import ray

    from rocketray.actors import pipeline
    from rocketray.actors.cluster import connect, start_cluster
    from rocketray.cli.commands.demo import print_summary

    def say(msg: str) -> None:
        print(f"[driver] {msg}", file=sys.stderr if args.json else sys.stdout, flush=True)

    ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
    cluster = None
    summary: dict = {"ok": False, "checks": {}}
    try:
        if args.connect:
            cluster = connect(args.name)
        else:
            cluster = start_cluster(args.name, controllers=args.controllers, groups=args.groups,
                                    replicas=args.replicas, data_dir=args.data_dir, profile=args.profile)
        summary = pipeline.run(cluster, args.messages, say=say)
    except Exception as exc:  # noqa: BLE001
        summary = {**summary, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
        say(f"FAILED: {summary['error']}")
    finally:
        if cluster is not None and not args.keep and not args.connect:
            cluster.stop(delete_data=True)
    print_summary(summary, say)
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    return 0 if summary.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
