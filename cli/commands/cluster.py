"""``rocketray start|status|stop``: manage a cluster on a running Ray (``ray start --head`` or ``ray up``)."""

from __future__ import annotations

import argparse
import json
import sys

from rocketray.cli.main import EXIT_USAGE
from rocketray.cli.options import add_cluster_flags
from rocketray.config import ConfigError, add_config_arguments, cluster_settings


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("start", help="start controllers and brokers as detached actors on a running Ray")
    add_cluster_flags(p)
    p.add_argument("--controllers", type=int, default=3)
    p.add_argument("--groups", type=int, default=1)
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--data-dir", default="/tmp/rocketray-data")
    add_config_arguments(p)
    p.set_defaults(func=run_start)

    p = subparsers.add_parser("status", help="one screen: controller leader, masters, SyncStateSets, offsets, lag")
    add_cluster_flags(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_status)

    p = subparsers.add_parser("stop", help="kill a cluster's actors (and optionally delete its data)")
    add_cluster_flags(p)
    p.add_argument("--delete-data", action="store_true")
    p.set_defaults(func=run_stop)


def _ray(address: str) -> None:
    import ray

    if not ray.is_initialized():  # in-process callers (tests, a driver) may already be connected
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)


def run_start(args: argparse.Namespace) -> int:
    from rocketray.actors.cluster import ClusterError, start_cluster

    try:  # checked here, before Ray: the actors get plain section.key=text overrides, never the file
        profile, overrides = cluster_settings(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    _ray(args.address)
    try:
        cluster = start_cluster(args.name, controllers=args.controllers, groups=args.groups,
                                replicas=args.replicas, data_dir=args.data_dir, profile=profile,
                                overrides=overrides)
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"cluster {args.name!r} is up: {len(cluster.spec.controllers)} controllers, "
          f"groups {', '.join(cluster.spec.groups)} (namespace {cluster.spec.namespace})")
    return 0


def _controller_view(cluster) -> dict:
    """Each group's master, epochs and SyncStateSet as the controller leader has them ({} if none answers)."""
    from rocketray.wire.controller_api import GetSyncStateDataRequest

    try:
        response = cluster.call_controller(GetSyncStateDataRequest(broker_names=tuple(cluster.spec.groups)),
                                           timeout_s=5.0)
    except Exception:  # noqa: BLE001 - status shows what it can; an absent leader is visible above
        return {}
    return (response.body or {}).get("replicas_info_table", {}) if response.ok else {}


def collect_status(cluster) -> dict:
    """Plain data for one status screen: controllers, and per group the controller's view and each replica."""
    from rocketray.actors.views import to_json

    metadata = cluster.controller_metadata()
    leader = next((i for i, md in enumerate(metadata) if md is not None and md.is_leader), None)
    leader_md = metadata[leader] if leader is not None else None
    view = _controller_view(cluster) if leader is not None else {}
    groups = {}
    for group in cluster.spec.groups:
        replicas = []
        statuses = cluster.group_status(group)
        master_max = max((s.max_offset for s in statuses if s is not None and s.is_master), default=None)
        for b, st in zip(cluster.spec.brokers_of(group), statuses):
            row = {"replica": b.replica, "ha_address": b.ha_address, "alive": st is not None}
            if st is not None:
                row.update({k: to_json(getattr(st, k)) for k in ("broker_id", "role", "master_epoch", "max_offset",
                                                                 "confirm_offset", "sync_state_set", "running",
                                                                 "state")})
                row["lag_bytes"] = None if master_max is None else master_max - st.max_offset
            replicas.append(row)
        info = view.get(group) or {}
        controller = None
        if info:
            controller = {"master_broker_id": info.get("master_broker_id"),
                          "master_address": info.get("master_address"), "master_epoch": info.get("master_epoch"),
                          "sync_state_set": sorted(r["broker_id"] for r in info.get("in_sync_replicas", [])),
                          "sync_state_set_epoch": info.get("sync_state_set_epoch")}
        groups[group] = {"controller": controller, "replicas": replicas}
    return {"cluster": cluster.spec.name, "controller_leader": leader,
            "controller_leader_address": leader_md.self_address if leader_md is not None else None,
            "controller_term": leader_md.term if leader_md is not None else None,
            "controllers": [None if md is None else to_json(md) for md in metadata], "groups": groups}


def _dash(value) -> str:
    return "-" if value is None else str(value)


def format_status(status: dict) -> str:
    """One screen: controllers (leader first line), then per group its master line and a replica table."""
    leader = status["controller_leader"]
    if leader is None:
        lines = ["controller leader: NONE (no controller answers as leader)"]
    else:
        md = status["controllers"][leader]
        lines = [f"controller leader: controller-{leader} ({md.get('self_id')}) "
                 f"{status['controller_leader_address']} term={status['controller_term']}"]
    for i, md in enumerate(status["controllers"]):
        lines.append(f"  controller-{i}: " + ("unreachable" if md is None else
                                             f"{md.get('self_id')} {md.get('raft_role', '?'):<9} term={md.get('term')} "
                                             f"applied={md.get('applied_index')} "
                                             f"snapshot={md.get('snapshot_last_index')}"))
    for group, g in status["groups"].items():
        c = g["controller"]
        if c is None:
            lines.append(f"group {group}: controller view unavailable")
        else:
            sss = ",".join(str(i) for i in c["sync_state_set"])
            lines.append(f"group {group}: master={_dash(c['master_broker_id'])} ({_dash(c['master_address'])}) "
                         f"epoch={c['master_epoch']} sss={{{sss}}} sss_epoch={c['sync_state_set_epoch']}")
        lines.append(f"  {'replica':>7} {'id':>3} {'role':>7} {'epoch':>5} {'max':>12} {'confirm':>12} "
                     f"{'lag':>10}  {'state':<10} ha")
        for r in g["replicas"]:
            if not r["alive"]:
                lines.append(f"  {r['replica']:>7} {'-':>3} {'-':>7} {'-':>5} {'-':>12} {'-':>12} {'-':>10}  "
                             f"{'DOWN':<10} {r['ha_address']}")
                continue
            state = "RUNNING" if r.get("running") else (r.get("state") or "-")
            lines.append(f"  {r['replica']:>7} {_dash(r['broker_id']):>3} {_dash(r['role']):>7} "
                         f"{_dash(r['master_epoch']):>5} {_dash(r['max_offset']):>12} "
                         f"{_dash(r['confirm_offset']):>12} {_dash(r['lag_bytes']):>10}  {state:<10} "
                         f"{r['ha_address']}")
    return "\n".join(lines)


def _connect(args: argparse.Namespace):
    """The named cluster on the Ray at ``--address``, or None after printing why not."""
    from rocketray.actors.cluster import ClusterError, connect

    _ray(args.address)
    try:
        return connect(args.name)
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def run_status(args: argparse.Namespace) -> int:
    cluster = _connect(args)
    if cluster is None:
        return 1
    status = collect_status(cluster)
    print(json.dumps(status, sort_keys=True, default=str) if args.json else format_status(status))
    return 0


def run_stop(args: argparse.Namespace) -> int:
    cluster = _connect(args)
    if cluster is None:
        return 1
    cluster.stop(delete_data=args.delete_data)
    print(f"cluster {args.name!r} stopped")
    return 0
