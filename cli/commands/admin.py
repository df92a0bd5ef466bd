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
their requests to the controller leader like the controller commands. So do ``user ...`` and
``acl ...`` (``cli/commands/admin_auth.py``); ``consumer-progress`` is ``cli/commands/admin_groups.py``.
What every command shares (flags, connection, errors, ``--json``) is ``rocketray.cli.admin_common``.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from rocketray.cli import admin_format as fmt
from rocketray.cli.admin_common import (EXIT_USAGE, AdminError, ResponseError, add_common_flags, add_repeat_flags,
                                        call, response_json, run, run_request)
from rocketray.cli.commands.admin_auth import add_auth_parsers
from rocketray.cli.commands.admin_groups import add_group_parsers
from rocketray.wire.controller_headers import header_fields

DEFAULT_TOPIC_QUEUES = 8  # mqadmin updateTopic's default read/write queue numbers


# --- argument parsing ------------------------------------------------------------------------------

def _target(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("-b", "--broker-name", dest="broker_name", metavar="GROUP", help="one broker group")
    g.add_argument("-c", "--cluster-name", dest="cluster_name", metavar="CLUSTER",
                   help="every group of this RocketMQ cluster name")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    admin = subparsers.add_parser("admin", help="mqadmin-style controller commands against a running cluster")
    sub = admin.add_subparsers(dest="admin_command", metavar="ADMIN_COMMAND")
    admin.set_defaults(func=lambda args: (admin.print_help(), EXIT_USAGE)[1])

    p = sub.add_parser("get-controller-metadata", help="controller group, leader and peers")
    add_common_flags(p)
    p.set_defaults(func=run_get_controller_metadata)

    p = sub.add_parser("get-sync-state-set", help="master, epochs and in-sync replicas of broker groups")
    add_common_flags(p)
    _target(p)
    add_repeat_flags(p)
    p.set_defaults(func=run_get_sync_state_set)

    p = sub.add_parser("get-broker-epoch", help="each replica's epoch entries")
    add_common_flags(p)
    _target(p)
    add_repeat_flags(p)
    p.set_defaults(func=run_get_broker_epoch)

    p = sub.add_parser("elect-master", help="elect a designated replica as master (admin trigger)")
    add_common_flags(p)
    p.add_argument("-b", "--broker-name", dest="broker_name", metavar="GROUP", required=True)
    p.add_argument("--broker-id", type=int, required=True, help="controller broker id to make master")
    p.add_argument("-c", "--cluster-name", dest="cluster_name", default=None,
                   help="RocketMQ cluster name (default: the cluster's own)")
    p.set_defaults(func=run_elect_master)

    p = sub.add_parser("clean-broker-metadata", help="forget dead replicas (or, with --clean-living, the group)")
    add_common_flags(p)
    p.add_argument("-b", "--broker-name", dest="broker_name", metavar="GROUP", required=True)
    p.add_argument("--broker-ids", default=None, metavar="'1;2'", help="controller broker ids to clean")
    p.add_argument("--clean-living", action="store_true", help="clean even living brokers (whole group)")
    p.add_argument("-c", "--cluster-name", dest="cluster_name", default=None)
    p.set_defaults(func=run_clean_broker_metadata)

    p = sub.add_parser("get-controller-events",
                       help="the controllers' event log: elections, SyncStateSet changes, registrations")
    add_common_flags(p)
    p.add_argument("-b", "--broker-name", dest="broker_name", metavar="GROUP", default=None,
                   help="only this broker group's events")
    p.add_argument("--since", type=int, default=0, metavar="INDEX", help="only events after this Raft index")
    p.add_argument("--last", type=int, default=None, metavar="N", help="only the newest N events")
    p.set_defaults(func=run_get_controller_events)

    p = sub.add_parser("get-controller-config", help="every controller's configuration")
    add_common_flags(p)
    p.set_defaults(func=run_get_controller_config)

    p = sub.add_parser("update-controller-config", help="set one controller config key on every controller")
    add_common_flags(p)
    p.add_argument("-k", "--key", required=True)
    p.add_argument("-v", "--value", required=True)
    p.set_defaults(func=run_update_controller_config)

    _add_topic_parsers(sub)
    add_group_parsers(sub)
    add_auth_parsers(sub)


def _add_topic_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("update-topic", help="create a topic, or extend it to more queues (never shrinks)")
    add_common_flags(p)
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-q", "--queues", type=int, default=DEFAULT_TOPIC_QUEUES, metavar="N",
                   help=f"number of queues, spread round robin over the broker groups (default {DEFAULT_TOPIC_QUEUES})")
    p.set_defaults(func=run_update_topic)

    p = sub.add_parser("delete-topic", help="delete a topic from the controller")
    add_common_flags(p)
    p.add_argument("-t", "--topic", required=True)
    p.set_defaults(func=run_delete_topic)

    p = sub.add_parser("topic-route", help="the broker group of each queue of a topic")
    add_common_flags(p)
    p.add_argument("-t", "--topic", required=True)
    p.set_defaults(func=run_topic_route)

    p = sub.add_parser("topic-list", help="every topic and its queue count")
    add_common_flags(p)
    p.set_defaults(func=run_topic_list)


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

    return run(args, once)


def run_get_sync_state_set(args: argparse.Namespace) -> int:
    from rocketray.wire.controller_api import GetSyncStateDataRequest

    def once(cluster):
        response = call(cluster, GetSyncStateDataRequest(broker_names=tuple(_groups(cluster, args))))
        return fmt.format_sync_state_set(response.body or {}), response_json(response)

    return run(args, once)


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
                "broker_id": st.broker_id, "role": st.role.value, "master_epoch": st.master_epoch,
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

    return run(args, once)


def run_elect_master(args: argparse.Namespace) -> int:
    from rocketray.wire.controller_api import ElectMasterRequest

    def once(cluster):
        cluster_name = args.cluster_name or cluster.spec.cluster_name
        response = call(cluster, ElectMasterRequest.of_admin_trigger(cluster_name, args.broker_name,
                                                                      args.broker_id))
        text = fmt.format_elect_master(cluster_name, args.broker_name, header_fields(response.header), response.body)
        return text, response_json(response)

    return run(args, once)


def run_clean_broker_metadata(args: argparse.Namespace) -> int:
    from rocketray.wire.controller_api import CleanBrokerDataRequest

    def once(cluster):
        cluster_name = args.cluster_name or cluster.spec.cluster_name
        response = call(cluster, CleanBrokerDataRequest(cluster_name, args.broker_name, args.broker_ids,
                                                         clean_living_broker=args.clean_living,
                                                         invoke_time_ms=int(time.time() * 1000)))
        return fmt.format_clean_broker_metadata(args.broker_name), response_json(response)

    return run(args, once)


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

    return run(args, once)


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

    return run(args, once)


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

    return run(args, once)


# --- topics ----------------------------------------------------------------------------------------

def run_update_topic(args: argparse.Namespace) -> int:
    from rocketray.wire.controller_api import CreateTopicRequest

    return run_request(args, CreateTopicRequest(args.topic, args.queues),
                       lambda response: fmt.format_update_topic(header_fields(response.header)))


def run_delete_topic(args: argparse.Namespace) -> int:
    from rocketray.wire.controller_api import DeleteTopicRequest

    return run_request(args, DeleteTopicRequest(args.topic), lambda response: fmt.format_delete_topic(args.topic))


def run_topic_route(args: argparse.Namespace) -> int:
    from rocketray.wire.controller_api import GetTopicRouteRequest

    return run_request(args, GetTopicRouteRequest(args.topic),
                       lambda response: fmt.format_topic_route(header_fields(response.header)))


def run_topic_list(args: argparse.Namespace) -> int:
    from rocketray.wire.controller_api import ListTopicsRequest

    return run_request(args, ListTopicsRequest(), lambda response: fmt.format_topic_list(response.header.counts()))
