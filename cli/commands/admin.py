"""``rocketray admin ...``: mqadmin's controller commands against a running cluster (reference 15).

Every command connects to the Ray given by ``--address`` (or uses the Ray this process is already
connected to), finds the cluster ``--name NAME`` through its registry actor, and talks to the
controller actors: requests that RocketMQ sends to the leader go through
``Cluster.call_controller`` (which follows NOT_LEADER), the per-node ones (metadata, config) go to
every controller. Text output is ``rocketray.cli.admin_format`` (mqadmin's ``#Key\\tvalue`` lines);
``--json`` prints one JSON object per answer instead. A refused request prints
``<CODE_NAME> (<code>): <remark>`` on stderr (``--json``: ``{"code", "code_name", "remark"}`` on
stdout) and exits 1; an unreachable cluster or controller exits 1 too.

``-i SECONDS`` repeats ``get-sync-state-set`` and ``get-broker-epoch`` until Ctrl-C (exit 0) or
``--count`` rounds.

Topics (mqadmin's updateTopic, deleteTopic, topicRoute, topicList) are controller state here (there
is no nameserver), so ``update-topic``, ``delete-topic``, ``topic-route`` and ``topic-list`` send
their requests to the controller leader like the controller commands.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any, Callable

from rocketray.cli import admin_format as fmt
from rocketray.cli.options import add_cluster_flags
from rocketray.controller.headers import header_fields

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
DEFAULT_TOPIC_QUEUES = 8  # mqadmin updateTopic's default read/write queue numbers


class AdminError(RuntimeError):
    """A command could not run (no cluster, no controller answered, bad arguments)."""


class ResponseError(RuntimeError):
    """A controller answered with a non-SUCCESS code."""

    def __init__(self, code: int, remark: str):
        super().__init__(fmt.format_error(code, remark))
        self.code = int(code)
        self.remark = remark

    def to_json(self) -> dict:
        return {"code": self.code, "code_name": _code_name(self.code), "remark": self.remark}


def _code_name(code: int) -> str:
    from rocketray.controller.codes import ResponseCode

    try:
        return ResponseCode(code).name
    except ValueError:
        return "UNKNOWN"


# --- argument parsing ------------------------------------------------------------------------------

def _common(p: argparse.ArgumentParser) -> None:
    add_cluster_flags(p)
    p.add_argument("--json", action="store_true", help="print machine-readable JSON instead of mqadmin lines")


def _target(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("-b", "--broker-name", dest="broker_name", metavar="GROUP", help="one broker group")
    g.add_argument("-c", "--cluster-name", dest="cluster_name", metavar="CLUSTER",
                   help="every group of this RocketMQ cluster name")


def _repeat(p: argparse.ArgumentParser) -> None:
    p.add_argument("-i", "--interval", type=float, default=None, metavar="SECONDS",
                   help="repeat every SECONDS until Ctrl-C")
    p.add_argument("--count", type=int, default=None, help="with -i: stop after this many rounds")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    admin = subparsers.add_parser("admin", help="mqadmin-style controller commands against a running cluster")
    sub = admin.add_subparsers(dest="admin_command", metavar="ADMIN_COMMAND")
    admin.set_defaults(func=lambda args: (admin.print_help(), EXIT_USAGE)[1])

    p = sub.add_parser("get-controller-metadata", help="controller group, leader and peers")
    _common(p)
    p.set_defaults(func=run_get_controller_metadata)

    p = sub.add_parser("get-sync-state-set", help="master, epochs and in-sync replicas of broker groups")
    _common(p)
    _target(p)
    _repeat(p)
    p.set_defaults(func=run_get_sync_state_set)

    p = sub.add_parser("get-broker-epoch", help="each replica's epoch entries")
    _common(p)
    _target(p)
    _repeat(p)
    p.set_defaults(func=run_get_broker_epoch)

    p = sub.add_parser("elect-master", help="elect a designated replica as master (admin trigger)")
    _common(p)
    p.add_argument("-b", "--broker-name", dest="broker_name", metavar="GROUP", required=True)
    p.add_argument("--broker-id", type=int, required=True, help="controller broker id to make master")
    p.add_argument("-c", "--cluster-name", dest="cluster_name", default=None,
                   help="RocketMQ cluster name (default: the cluster's own)")
    p.set_defaults(func=run_elect_master)

    p = sub.add_parser("clean-broker-metadata", help="forget dead replicas (or, with --clean-living, the group)")
    _common(p)
    p.add_argument("-b", "--broker-name", dest="broker_name", metavar="GROUP", required=True)
    p.add_argument("--broker-ids", default=None, metavar="'1;2'", help="controller broker ids to clean")
    p.add_argument("--clean-living", action="store_true", help="clean even living brokers (whole group)")
    p.add_argument("-c", "--cluster-name", dest="cluster_name", default=None)
    p.set_defaults(func=run_clean_broker_metadata)

    p = sub.add_parser("get-controller-events",
                       help="the controllers' event log: elections, SyncStateSet changes, registrations")
    _common(p)
    p.add_argument("-b", "--broker-name", dest="broker_name", metavar="GROUP", default=None,
                   help="only this broker group's events")
    p.add_argument("--since", type=int, default=0, metavar="INDEX", help="only events after this Raft index")
    p.add_argument("--last", type=int, default=None, metavar="N", help="only the newest N events")
    p.set_defaults(func=run_get_controller_events)

    p = sub.add_parser("get-controller-config", help="every controller's configuration")
    _common(p)
    p.set_defaults(func=run_get_controller_config)

    p = sub.add_parser("update-controller-config", help="set one controller config key on every controller")
    _common(p)
    p.add_argument("-k", "--key", required=True)
    p.add_argument("-v", "--value", required=True)
    p.set_defaults(func=run_update_controller_config)

    _add_topic_parsers(sub)
    from rocketray.cli.commands.admin_groups import add_group_parsers

    add_group_parsers(sub)


def _add_topic_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("update-topic", help="create a topic, or extend it to more queues (never shrinks)")
    _common(p)
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-q", "--queues", type=int, default=DEFAULT_TOPIC_QUEUES, metavar="N",
                   help=f"number of queues, spread round robin over the broker groups (default {DEFAULT_TOPIC_QUEUES})")
    p.set_defaults(func=run_update_topic)

    p = sub.add_parser("delete-topic", help="delete a topic from the controller")
    _common(p)
    p.add_argument("-t", "--topic", required=True)
    p.set_defaults(func=run_delete_topic)

    p = sub.add_parser("topic-route", help="the broker group of each queue of a topic")
    _common(p)
    p.add_argument("-t", "--topic", required=True)
    p.set_defaults(func=run_topic_route)

    p = sub.add_parser("topic-list", help="every topic and its queue count")
    _common(p)
    p.set_defaults(func=run_topic_list)


# --- plumbing --------------------------------------------------------------------------------------

def connect_cluster(address: str, name: str):
    """The running cluster ``name``; joins Ray at ``address`` unless this process already has."""
    import ray

    from rocketray.actors.cluster import ClusterError, connect

    if not ray.is_initialized():
        try:
            ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise AdminError(f"cannot connect to Ray at {address!r}: {exc}") from exc
    try:
        return connect(name)
    except ClusterError as exc:
        raise AdminError(str(exc)) from exc


def _dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, default=lambda o: sorted(o) if isinstance(o, (set, frozenset)) else str(o))


def _call(cluster, request):
    """The leader's SUCCESS response to ``request``; ResponseError / AdminError otherwise."""
    from rocketray.actors.controller_client import ControllerUnavailable

    try:
        response = cluster.call_controller(request)
    except ControllerUnavailable as exc:
        raise AdminError(str(exc)) from exc
    if not response.ok:
        raise ResponseError(int(response.code), response.remark)
    return response


def _response_json(response) -> dict:
    return {"code": int(response.code), "code_name": response.code.name, "remark": response.remark,
            "header": header_fields(response.header), "body": response.body}


def _run(args: argparse.Namespace, once: Callable[[Any], tuple[str, Any]]) -> int:
    """Connect, run ``once(cluster) -> (text, json_obj)`` (repeatedly with -i), print, map errors."""
    try:
        cluster = connect_cluster(args.address, args.name)
        interval = getattr(args, "interval", None)
        count = getattr(args, "count", None)
        rounds = 0
        while True:
            text, obj = once(cluster)
            print(_dumps(obj) if args.json else text, flush=True)
            rounds += 1
            if interval is None or (count is not None and rounds >= count):
                return EXIT_OK
            if not args.json:
                print(flush=True)
            time.sleep(max(0.0, interval))
    except KeyboardInterrupt:
        return EXIT_OK
    except ResponseError as exc:
        if args.json:
            print(_dumps(exc.to_json()), flush=True)
        else:
            print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_ERROR
    except AdminError as exc:
        if args.json:
            print(_dumps({"code": None, "code_name": "UNAVAILABLE", "remark": str(exc)}), flush=True)
        else:
            print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_ERROR


def _groups(cluster, args: argparse.Namespace) -> list[str]:
    if args.broker_name:
        return [args.broker_name]
    if args.cluster_name != cluster.spec.cluster_name:
        raise AdminError(f"unknown cluster name {args.cluster_name!r}; this cluster is "
                         f"{cluster.spec.cluster_name!r}")
    return list(cluster.spec.groups)


# --- commands --------------------------------------------------------------------------------------

def controller_metadata(cluster) -> dict:
    """getControllerMetaData from the first controller that answers (the leader's view if any)."""
    answers = cluster.controller_metadata()
    live = [md for md in answers if md is not None]
    if not live:
        raise AdminError("no controller answered")
    md = next((m for m in live if m.is_leader), live[0])
    peers = [f"n{i}:{addr}" for i, addr in enumerate(md.peers)]
    return {"group": cluster.spec.namespace, "controller_leader_id": md.leader_id,
            "controller_leader_address": md.leader_address, "term": md.term, "peers": peers,
            "controllers": [None if m is None else {k: getattr(m, k) for k in (
                "index", "self_id", "self_address", "is_leader", "raft_role", "term", "commit_index",
                "applied_index", "snapshot_last_index", "snapshots_saved")} for m in answers]}


def run_get_controller_metadata(args: argparse.Namespace) -> int:
    def once(cluster):
        meta = controller_metadata(cluster)
        return fmt.format_controller_metadata(meta), meta

    return _run(args, once)


def run_get_sync_state_set(args: argparse.Namespace) -> int:
    from rocketray.controller.api import GetSyncStateDataRequest

    def once(cluster):
        response = _call(cluster, GetSyncStateDataRequest(broker_names=tuple(_groups(cluster, args))))
        return fmt.format_sync_state_set(response.body or {}), _response_json(response)

    return _run(args, once)


def broker_epochs(cluster, groups: list[str]) -> tuple[list[tuple[str, dict]], list[str]]:
    """``[(ha_address, epoch cache)]`` of every replica of ``groups``, and the unreachable addresses."""
    caches, missing = [], []
    for group in groups:
        replicas = cluster.spec.brokers_of(group)
        if not replicas:
            raise AdminError(f"unknown broker group {group!r}; groups: {', '.join(cluster.spec.groups)}")
        for b in replicas:
            st = cluster.broker_status(group, b.replica)
            if st is None:
                missing.append(b.ha_address)
                continue
            caches.append((b.ha_address, {
                "cluster_name": cluster.spec.cluster_name, "broker_name": group, "broker_addr": b.ha_address,
                "broker_id": st.broker_id, "role": st.role.name, "master_epoch": st.master_epoch,
                "epoch_list": [e._asdict() for e in st.epoch_entries],
                "max_offset": st.max_offset, "confirm_offset": st.confirm_offset}))
    return caches, missing


def run_get_broker_epoch(args: argparse.Namespace) -> int:
    def once(cluster):
        caches, missing = broker_epochs(cluster, _groups(cluster, args))
        for addr in missing:
            print(f"warning: broker {addr} did not answer", file=sys.stderr)
        if not caches:
            raise AdminError("no broker answered")
        return fmt.format_broker_epochs(caches), {"brokers": [c for _, c in caches], "unreachable": missing}

    return _run(args, once)


def run_elect_master(args: argparse.Namespace) -> int:
    from rocketray.controller.api import ElectMasterRequest

    def once(cluster):
        cluster_name = args.cluster_name or cluster.spec.cluster_name
        response = _call(cluster, ElectMasterRequest.of_admin_trigger(cluster_name, args.broker_name,
                                                                      args.broker_id))
        text = fmt.format_elect_master(cluster_name, args.broker_name, header_fields(response.header), response.body)
        return text, _response_json(response)

    return _run(args, once)


def run_clean_broker_metadata(args: argparse.Namespace) -> int:
    from rocketray.controller.api import CleanBrokerDataRequest

    def once(cluster):
        cluster_name = args.cluster_name or cluster.spec.cluster_name
        response = _call(cluster, CleanBrokerDataRequest(cluster_name, args.broker_name, args.broker_ids,
                                                         clean_living_broker=args.clean_living,
                                                         invoke_time_ms=int(time.time() * 1000)))
        return fmt.format_clean_broker_metadata(args.broker_name), _response_json(response)

    return _run(args, once)


def run_get_controller_events(args: argparse.Namespace) -> int:
    if args.since < 0 or (args.last is not None and args.last < 1):
        print("error: --since must be >= 0 and --last >= 1", file=sys.stderr)
        return EXIT_USAGE

    def once(cluster):
        if args.broker_name and args.broker_name not in cluster.spec.groups:
            raise AdminError(f"unknown broker group {args.broker_name!r}; groups: {sorted(cluster.spec.groups)}")
        events, uncovered = cluster.controller_events()
        if not events and not uncovered and all(md is None for md in cluster.controller_metadata()):
            raise AdminError("no controller answered")
        events = [e for e in events if e["index"] > args.since
                  and (args.broker_name is None or e.get("broker_name") == args.broker_name)]
        if args.last is not None:
            events = events[-args.last:]
        return fmt.format_controller_events(events, uncovered), {"events": events, "uncovered": uncovered}

    return _run(args, once)


def _each_controller(cluster, method: str, *call_args) -> list[tuple[str, Any]]:
    """``(raft_address, Response | None)`` of ``method`` on every controller (None: no answer)."""
    import ray

    refs = []
    for c in cluster.spec.controllers:
        try:
            refs.append((c.raft_address, getattr(cluster.controller(c.index), method).remote(*call_args)))
        except ValueError:
            refs.append((c.raft_address, None))
    out = []
    for address, ref in refs:
        try:
            out.append((address, None if ref is None else ray.get(ref, timeout=10)))
        except (ray.exceptions.RayError, TimeoutError):
            out.append((address, None))
    return out


def run_get_controller_config(args: argparse.Namespace) -> int:
    def once(cluster):
        configs: dict[str, dict] = {}
        for address, response in _each_controller(cluster, "get_config"):
            if response is None:
                raise AdminError(f"controller {address} did not answer")
            if not response.ok:
                raise ResponseError(int(response.code), response.remark)
            configs[address] = response.body["config"]
        return fmt.format_controller_config(configs), {"controllers": configs}

    return _run(args, once)


def run_update_controller_config(args: argparse.Namespace) -> int:
    def once(cluster):
        updated: list[str] = []
        result = None
        for address, response in _each_controller(cluster, "update_config", args.key, args.value):
            if response is None:
                raise AdminError(f"controller {address} did not answer (updated so far: {updated})")
            if not response.ok:
                raise ResponseError(int(response.code), response.remark)
            updated.append(address)
            result = response.body
        assert result is not None, "a cluster has at least one controller"
        text = fmt.format_update_controller_config(updated, result["key"], result["value"])
        return text, {"code": 0, "code_name": "SUCCESS", "controllers": updated, **result}

    return _run(args, once)


# --- topics ----------------------------------------------------------------------------------------

def run_update_topic(args: argparse.Namespace) -> int:
    from rocketray.controller.api import CreateTopicRequest

    def once(cluster):
        response = _call(cluster, CreateTopicRequest(args.topic, args.queues))
        return fmt.format_update_topic(header_fields(response.header)), _response_json(response)

    return _run(args, once)


def run_delete_topic(args: argparse.Namespace) -> int:
    from rocketray.controller.api import DeleteTopicRequest

    def once(cluster):
        response = _call(cluster, DeleteTopicRequest(args.topic))
        return fmt.format_delete_topic(args.topic), _response_json(response)

    return _run(args, once)


def run_topic_route(args: argparse.Namespace) -> int:
    from rocketray.controller.api import GetTopicRouteRequest

    def once(cluster):
        response = _call(cluster, GetTopicRouteRequest(args.topic))
        return fmt.format_topic_route(header_fields(response.header)), _response_json(response)

    return _run(args, once)


def run_topic_list(args: argparse.Namespace) -> int:
    from rocketray.controller.api import ListTopicsRequest

    def once(cluster):
        response = _call(cluster, ListTopicsRequest())
        return fmt.format_topic_list(response.header.counts()), _response_json(response)

    return _run(args, once)
