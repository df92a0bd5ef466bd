"""``rocketray analytics``: offset and epoch analytics with PySpark on Ray (RayDP).

``--run DIR`` analyses a chaos run directory; ``--live`` gathers the same records from a running
cluster through Ray. Prints the tables, writes Parquet/CSV, PNG charts and an HTML report under
``--out``; with ``--json`` the last stdout line is one JSON summary.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rocketray.cli.options import add_cluster_flags

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("analytics", help="offset and epoch analytics with PySpark on Ray (RayDP)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--run", metavar="DIR", help="a chaos run directory (history.jsonl, replicas.json, ...)")
    src.add_argument("--live", action="store_true", help="gather the records from a running rocketray cluster")
    add_cluster_flags(p, name_default=None)  # --live: which cluster, on which Ray
    p.add_argument("--out", metavar="DIR", default=None,
                   help="where to write tables, charts and report.html (default: DIR/analytics or ./analytics)")
    p.add_argument("--json", action="store_true", help="print one JSON summary as the last stdout line")
    p.add_argument("--executor-memory", default=None, help="Spark executor memory (default 1g)")
    p.add_argument("--executors", type=int, default=None, help="Spark executors (default 1)")
    p.add_argument("--start-timeout", type=float, default=None, help="seconds for one Spark start attempt")
    p.set_defaults(func=run)


def _config(args: argparse.Namespace) -> Any:
    from rocketray.spark_on_ray.session import SparkConfig, with_overrides

    changes: dict[str, Any] = {}
    if args.executor_memory:
        changes["executor_memory"] = args.executor_memory
    if args.executors:
        changes["num_executors"] = args.executors
    if args.start_timeout:
        changes["start_timeout_s"] = args.start_timeout
    return with_overrides(SparkConfig(), **changes)


def _join_running_ray(address: str | None) -> None:
    """--live analyses a cluster that is running, so it joins that Ray and never starts its own."""
    import logging

    import ray

    if ray.is_initialized():
        return
    try:
        ray.init(address=address or "auto", logging_level=logging.WARNING, log_to_driver=False)
    except ConnectionError as exc:
        raise RuntimeError(f"--live needs a running Ray cluster with rocketray on it: {exc}") from exc


def _live_records(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """Records of a running cluster (``rocketray.actors.cluster``, imported here: it needs Ray)."""
    from rocketray.actors.cluster import connect

    return (connect(args.name) if args.name else connect()).analytics_records()


def run(args: argparse.Namespace) -> int:
    from rocketray.spark_on_ray import pipeline
    from rocketray.spark_on_ray.collect import CollectError
    from rocketray.spark_on_ray.session import SparkOnRayError, find_java, spark_session, start_seconds

    if args.run and not Path(args.run).is_dir():
        print(f"rocketray analytics: {args.run} is not a directory", file=sys.stderr)
        return EXIT_USAGE
    out = Path(args.out) if args.out else (Path(args.run) / "analytics" if args.run else Path("analytics"))
    try:
        config = _config(args)
        records = None
        find_java()
        if args.live:  # gather first: no Spark start-up for a cluster that is not there
            _join_running_ray(args.address)
            records = _live_records(args)
        with spark_session(config, ray_address=args.address) as spark:
            if records is not None:
                summary, frames = pipeline.analyse_live(records, out, spark)
            else:
                summary, frames = pipeline.analyse_run_dir(args.run, out, spark)
            started_s = start_seconds()
            summary["spark_start_s"] = None if started_s is None else round(started_s, 3)
    except (SparkOnRayError, CollectError, RuntimeError) as exc:
        print(f"rocketray analytics: {exc}", file=sys.stderr)
        if args.json:
            print(json.dumps({"ok": False, "error": str(exc), "error_type": type(exc).__name__}))
        return EXIT_ERROR
    pipeline.print_tables(frames, sys.stdout)
    print(f"\nwrote {len(summary['outputs'])} files under {out} (report: {out / 'report.html'})")
    if args.json:
        print(json.dumps({"ok": True, **summary}, sort_keys=True))
    return EXIT_OK
