"""Driver for ``ray job submit``: the demo's failover pipeline against an existing Ray cluster.

    ray job submit --address http://HEAD:8265 --working-dir . -- python driver.py --json

Starts a rocketray cluster on the Ray it runs in (or ``--connect NAME`` to use a
running one), produces through ``rocketray.client`` to a topic spread over the
groups, kills the master broker actor and the controller leader, verifies that a
consumer group is delivered every acknowledged message and that replicas agree,
and prints the same JSON contract as ``rocketray demo --json`` (last stdout line). Exit code 0
only if every check passed. ``--keep`` leaves the cluster running afterwards.

``--name`` defaults to the CLI's cluster name (``default``), so ``rocketray status`` and
``rocketray stop`` find a cluster the driver started without ``--name``. The configuration flags are
``rocketray start``'s: ``--config FILE`` (TOML or YAML), ``--profile``, ``--set SECTION.KEY=VALUE``
(``--set`` wins over the file); the profile defaults to the file's, else ``fast``.

``--analytics`` then runs the offset/epoch analytics with PySpark on the same Ray
cluster (RayDP) over what the cluster holds (epochs, offsets, samples, the
controllers' event log), before the cluster is stopped. The JSON summary is also
written to ``OUT/summary.json`` and the analytics next to it under
``OUT/analytics/`` (``report.html``, Parquet/CSV tables, PNG charts); ``--out``
defaults to ``/tmp/rocketray-out/NAME`` on the machine the driver runs on (the
head, for ``ray job submit``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rocketray.actors.cluster import DEFAULT_NAME
from rocketray.config import ConfigError, add_config_arguments, cluster_settings

#: The pipeline's kills must fail over within its deadlines: sub-second timings unless told otherwise.
DEFAULT_PROFILE = "fast"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true")
    p.add_argument("--messages", type=int, default=3000)
    p.add_argument("--groups", type=int, default=1)
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--controllers", type=int, default=3)
    p.add_argument("--name", default=DEFAULT_NAME,
                   help=f"cluster name (namespace rocketray-NAME; default: {DEFAULT_NAME}, as in rocketray start)")
    p.add_argument("--connect", action="store_true",
                   help="use the running cluster NAME instead of starting one (the configuration flags are then unused)")
    p.add_argument("--data-dir", default="/tmp/rocketray-data")
    add_config_arguments(p, default_profile=DEFAULT_PROFILE)
    p.add_argument("--keep", action="store_true", help="leave the cluster running")
    p.add_argument("--analytics", action="store_true",
                   help="after the pipeline, run the RayDP analytics on the same cluster (report in OUT/analytics)")
    p.add_argument("--out", default=None, help="where summary.json and analytics/ go (default /tmp/rocketray-out/NAME)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    try:  # checked before Ray: the actors get plain section.key=text overrides, never the file
        profile, overrides = cluster_settings(args, default_profile=DEFAULT_PROFILE)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2  # a usage error, as in rocketray start
    out = Path(args.out or f"/tmp/rocketray-out/{args.name}").absolute()

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
                                    replicas=args.replicas, data_dir=args.data_dir, profile=profile,
                                    overrides=overrides)
        summary = pipeline.run(cluster, args.messages, say=say)
        if args.analytics:
            summary = {**summary, **run_analytics(cluster, out / "analytics", say)}
            summary["checks"]["analytics_report_written"] = bool(summary["analytics"].get("report_exists"))
            summary["ok"] = all(summary["checks"].values())
    except Exception as exc:  # noqa: BLE001
        summary = {**summary, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
        say(f"FAILED: {summary['error']}")
    finally:
        if cluster is not None and not args.keep and not args.connect:
            cluster.stop(delete_data=True)
    print_summary(summary, say)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, sort_keys=True, indent=1, default=str))
    say(f"summary written to {out / 'summary.json'}")
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    return 0 if summary.get("ok") else 1


def run_analytics(cluster, out_dir: Path, say) -> dict:
    """The live analytics of ``rocketray analytics --live`` with Spark on this Ray (RayDP); returns
    ``{"analytics": {...summary..., "report": path, "report_exists": bool}}``."""
    import time

    from rocketray.spark_on_ray import pipeline as analytics
    from rocketray.spark_on_ray.session import SparkConfig, find_java, spark_session, start_seconds

    t0 = time.monotonic()
    find_java()
    records = cluster.analytics_records()
    say(f"analytics: {len(records['replicas'])} replicas, {len(records['samples'])} samples, "
        f"{len(records['controller_events'])} controller events; starting Spark on Ray (RayDP)")
    with spark_session(SparkConfig(), ray_address="auto"):
        summary, _frames = analytics.analyse_live(records, out_dir)
        started_s = start_seconds()
    report = out_dir / "report.html"
    say(f"analytics report: {report}")
    return {"analytics": {**{k: v for k, v in summary.items() if k != "outputs"},
                          "outputs": len(summary.get("outputs", [])),
                          "spark_start_s": None if started_s is None else round(started_s, 3),
                          "elapsed_s": round(time.monotonic() - t0, 1),
                          "report": str(report), "report_exists": report.is_file()}}


if __name__ == "__main__":
    sys.exit(main())
