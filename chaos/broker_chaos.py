"""``rocketray chaos --target brokers``: kill, pause and partition broker and controller actors under
a recorded workload, heal, read everything back and let the checker give a verdict.

Theory of operation. The runner starts a cluster (on an embedded local Ray unless ``--address``)
whose brokers sit behind fault-injecting HA proxies (``chaos/ha_proxy.py``), with all-ack on
and unclean election off unless told otherwise, and creates the run's topic. Producer threads
(``rocketray.client.Producer``) write unique, verifiable payloads to it, reader threads tail every
broker group's replicas, and a sampler polls every replica (``chaos/broker_workload.py``);
consumer groups of ``rocketray.client.Consumer`` members poll and commit, and the churn schedule
crashes, closes and replaces members (``chaos/group_workload.py``). The nemesis and churn schedules
are pure functions of the seed (``verify/nemesis.py``); the runner resolves run-time targets (the
current master, the controller leader), acts, and records each fault's start and end in
``nemesis.jsonl`` (consumer starts, crashes and closes are ``consumer`` rows of the history). After
``--duration`` it heals everything (SIGCONT, proxies opened), stops the producers and readers,
waits for the cluster to settle, drains the consumer groups (each commits up to every queue's end),
closes them, records the ``heal`` event, then sweeps every replica (final reads, after the last
nemesis event as the checker requires) and snapshots each replica's epochs, offsets and digest.
The run directory follows ``docs/contracts.md`` ("chaos run directory"); the verdict comes from
``rocketray.verify.checker.check_run_dir``.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import ray

from rocketray.verify import nemesis as sched
from rocketray.chaos.broker_workload import (
    ConsumerLoop, ProducerLoop, RunLog, Sampler, TopicLayout, create_topic, extend_topic, final_reads, poll_statuses,
    replica_snapshots)
from rocketray.chaos.group_workload import GroupWorkload
from rocketray.client import Admin
from rocketray.client.socket_transport import SocketTransport
from rocketray.verify.checker import check_run_dir, format_verdict, heal_time_ms, lost_and_unseen
from rocketray.verify.run_dir import read_run_dir
from rocketray.verify.soak import SoakRow, format_table, soak_table
from rocketray.chaos.broker_nemesis import Nemesis, run_schedule
from rocketray.chaos.ha_proxy import HaProxies
from rocketray.chaos.nft import KernelNet
from rocketray.chaos.faketime import faketime_env
from rocketray.chaos.os_nemesis import OsNemesis, broker_name, members_of
from rocketray.verify.history import (CONTROLLER_EVENTS_FILE, HISTORY_FILE, NEMESIS_FILE, REPLICAS_FILE,
                                      SAMPLES_FILE, VERDICT_FILE, ControllerEventRecord)
from rocketray.verify.run_dir import write_jsonl, write_replicas
from rocketray.actors.cluster import Cluster, ClusterError, start_cluster
from rocketray.config import load_config
from rocketray.actors.pipeline import NodeControl, settle

log = logging.getLogger("rocketray.chaos.brokers")


#: The consumer-group workload's defaults: groups (0 turns the workload off), members per group, and
#: how long the end of the run waits for every group to commit every queue to its end.
CONSUMER_GROUPS = 2
CONSUMERS_PER_GROUP = 2
DRAIN_TIMEOUT_S = 90.0
#: Halfway through the run the topic gains this many queues per broker group (consumer groups on).
EXTRA_QUEUES_PER_GROUP = 2


class NemesisListError(ValueError):
    """``--nemesis`` named a kind the broker target does not know."""


def parse_kinds(text: str) -> tuple[str, ...]:
    """``--nemesis`` for the broker target: a comma list of schedule kinds, ``all`` or ``none``."""
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    if kinds in ((), ("none",)):
        return ()
    unknown = [k for k in kinds if k not in sched.SCHEDULE_KINDS]
    if unknown:
        raise NemesisListError(f"unknown broker nemesis {', '.join(unknown)}; expected a comma list of "
                               f"{', '.join(sched.SCHEDULE_KINDS)} or none")
    for alias in ("all", "process", "os"):
        if alias in kinds:
            return (alias,) if alias == "all" or len(kinds) == 1 else kinds
    return kinds


def plan_steps(kinds: Sequence[str], seed: int, *, groups: dict[str, list[int]], controllers: int, run_ms: int,
               interval_ms: int, fault_ms: int, jitter_ms: int = 2000, warmup_ms: int = 3000
               ) -> tuple[sched.NemesisStep, ...]:
    """The seeded schedule; several kinds are drawn from like ``all`` draws from every kind."""
    if not kinds:
        return ()
    if len(kinds) == 1:
        return sched.make_schedule(kinds[0], seed, groups=groups, controllers=controllers, run_ms=run_ms,
                                   interval_ms=interval_ms, fault_ms=fault_ms, jitter_ms=jitter_ms,
                                   warmup_ms=warmup_ms)
    rng = random.Random(seed)
    names = sorted(groups)
    t = warmup_ms + rng.randint(0, jitter_ms)
    steps: list[sched.NemesisStep] = []
    for _ in range(sched.MAX_STEPS):
        kind = rng.choice(list(kinds))
        kind = rng.choice(sched.DRAWS[kind]) if kind in sched.DRAWS else kind
        step = sched._draw_step(rng, kind, t, names, groups, controllers, fault_ms)
        if step.end_ms > run_ms:
            break
        steps.append(step)
        t = step.end_ms + interval_ms + rng.randint(0, jitter_ms)
    return tuple(steps)


def timing(profile: str, overrides: dict[str, str]) -> tuple[int, int]:
    """(interval_ms, fault_ms) scaled to the profile's heartbeat timeout so pauses outlast detection."""
    hb_ms = load_config(profile, overrides).broker.controller_heartbeat_timeout_ms
    return max(4000, int(hb_ms * 1.5)), max(4000, int(hb_ms * 2.5))


def _plan(cluster: Cluster, args: argparse.Namespace, out: Path, say
          ) -> tuple[tuple[sched.NemesisStep, ...], tuple[sched.ChurnStep, ...], list[str]]:
    """The seeded fault and churn schedules (both saved to ``schedule.json``) and the consumer groups."""
    kinds = parse_kinds(args.nemesis)
    statuses = poll_statuses(cluster, timeout_s=10)
    groups = {g: sorted(st.broker_id for (gg, _r), st in statuses.items() if gg == g and st.broker_id is not None)
              or [b.replica + 1 for b in cluster.spec.brokers_of(g)] for g in cluster.spec.groups}
    interval_ms, fault_ms = timing(cluster.spec.profile, dict(cluster.spec.config_overrides))
    steps = plan_steps(kinds, args.seed, groups=groups, controllers=len(cluster.spec.controllers),
                       run_ms=int(args.duration * 1000), interval_ms=interval_ms, fault_ms=fault_ms)
    consumer_groups = [f"cg-{i}" for i in range(args.consumer_groups)]
    churn = sched.make_churn_schedule(args.seed, consumer_groups=consumer_groups, consumers=args.consumers,
                                      run_ms=int(args.duration * 1000)) if kinds else ()
    planned = sorted([s.to_json() for s in steps] + [c.to_json() for c in churn], key=lambda j: j["at_ms"])
    (out / "schedule.json").write_text(json.dumps(planned, indent=1))
    say(f"{len(steps)} nemesis steps planned: {', '.join(s.kind for s in steps) or 'none'}; "
        f"{len(churn)} consumer crashes/leaves in {len(consumer_groups)} consumer groups of {args.consumers}")
    return steps, churn, consumer_groups


def execute(cluster: Cluster, args: argparse.Namespace, out: Path, proxies: HaProxies | None,
            say=print, nodes: NodeControl | None = None, kernel: KernelNet | None = None,
            clock_files: dict[str, Path] | None = None) -> dict[str, Any]:
    """Workload + nemeses + heal + settle + drain + final reads + checker against a running cluster;
    ``clock_files``: each broker's libfaketime timestamp file (the brokers run under it)."""
    runlog = RunLog()
    settle(cluster, timeout_s=args.settle_timeout)
    steps, churn, consumer_groups = _plan(cluster, args, out, say)
    layout = create_topic(cluster.spec.name, len(cluster.spec.groups))
    stop_workload, stop_sampler, stop_nemesis = threading.Event(), threading.Event(), threading.Event()
    sampler = Sampler(cluster, runlog, stop_sampler)
    producers = [ProducerLoop(cluster.spec.name, layout, i, runlog, stop_workload, batch=args.batch,
                              rate_per_s=args.rate, seed=args.seed if consumer_groups else None)
                 for i in range(args.producers)]
    readers = [ConsumerLoop(cluster, layout, g, runlog, stop_workload, args.seed) for g in cluster.spec.groups]
    members = (GroupWorkload(cluster.spec.name, SocketTransport(cluster), layout.topic, consumer_groups, args.consumers,
                             runlog, seed=args.seed) if consumer_groups else None)
    layouts = [layout]          # the topic's layout, then its layout once extended
    extender = threading.Thread(target=_extend_midway, args=(cluster, layouts, producers, runlog, args.duration / 2,
                                                            stop_workload), name="extend-topic", daemon=True)
    nemesis = Nemesis(cluster, runlog, proxies, args.seed, nodes=nodes)
    nemesis.os_faults = OsNemesis(cluster, runlog, args.seed, kernel, nemesis.master_of, nemesis.replica_of,
                                  clock_files)
    if kernel is not None:
        kernel.start(members_of(cluster.spec))
        say(f"kernel network faults: table {kernel.table}, {nemesis.os_faults.place_all()} member processes placed")
    for t in (sampler, *producers, *readers, *([extender] if consumer_groups else [])):
        t.start()
    started = time.monotonic()
    if members is not None:
        members.start(churn, started, stop_nemesis)
    try:
        run_schedule(nemesis, steps, started, args.duration, stop_nemesis)
    finally:
        stop_nemesis.set()
        nemesis.heal_all()
        runlog.event("heal", "start", None, None)
        stop_workload.set()
        for t in (*producers, *readers, *([extender] if consumer_groups else [])):
            t.join(timeout=60)
    say(f"healed after {time.monotonic() - started:.1f}s; waiting for the cluster to settle")
    settled = True
    try:
        settle(cluster, timeout_s=args.settle_timeout)
    except ClusterError as exc:
        settled = False
        say(f"the cluster did not settle: {exc}")
    drained = None
    if members is not None:
        say("draining the consumer groups")
        drain_started = time.monotonic()
        drained = members.finish(_acked_queues(producers), timeout_s=args.drain_timeout,
                                 due_ms=max(p.latest_due_ms for p in producers))
        say(f"consumer groups {'drained' if drained else 'NOT drained'} in {time.monotonic() - drain_started:.1f}s")
    stop_sampler.set()
    sampler.join(timeout=10)
    runlog.event("heal", "end", None, None)
    say("final reads from every replica")
    final_reads(cluster, layouts[-1], runlog)
    write_run(out, runlog, replica_snapshots(cluster), cluster)
    verdict = check_run_dir(out)
    table = nemesis_table(out)
    summary = {**verdict.to_json(), "settled": settled, "nemesis_steps": len(steps), "nemesis_acted": nemesis.acted,
               "churn_steps": len(churn), "churn_acted": members.acted if members is not None else 0,
               "groups_drained": drained, "producer_outcomes": _sum_outcomes(producers),
               "elapsed_s": round(time.monotonic() - started, 1), "seed": args.seed, "profile": cluster.spec.profile,
               "nemesis_table": [row.to_json() for row in table], "out_dir": str(out)}
    summary["valid"] = bool(verdict.valid and settled)
    (out / VERDICT_FILE).write_text(json.dumps(summary, indent=1, default=str))
    say(format_verdict(verdict))
    if table:
        say("per nemesis kind (docs/chaos.md, 'The soak'):\n" + format_table(table))
    return summary


def nemesis_table(out: Path) -> list[SoakRow]:
    """The per-kind table of a saved run (``verify/soak.py``)."""
    run = read_run_dir(out)
    lost, _unseen = lost_and_unseen(run.ops, heal_time_ms(run.nemesis))
    return soak_table(run.nemesis, run.ops, [op.payload_id for op in lost if op.payload_id is not None])


def _extend_midway(cluster: Cluster, layouts: list[TopicLayout], producers: Sequence[ProducerLoop], runlog: RunLog,
                   after_s: float, stop: threading.Event) -> None:
    """``after_s`` into the run, extend the topic by ``EXTRA_QUEUES_PER_GROUP`` per broker group (the
    consumer groups must read the new queues); the producers record sends with the new layout."""
    if stop.wait(after_s):
        return
    old = layouts[-1]
    new = extend_topic(Admin(cluster.spec.name, timeout_s=5.0), old, old.queues + EXTRA_QUEUES_PER_GROUP * len(cluster.spec.groups), runlog,
                       stop)
    if new is not None:
        layouts.append(new)
        for p in producers:
            p.layout = new


def _acked_queues(producers: Sequence[ProducerLoop]) -> set[tuple[str, int]]:
    return set().union(*(p.acked_queues for p in producers))


def _sum_outcomes(producers: Sequence[ProducerLoop]) -> dict[str, int]:
    total: dict[str, int] = {}
    for p in producers:
        for k, v in p.outcomes.items():
            total[k.value] = total.get(k.value, 0) + v
    return total


def write_run(out: Path, runlog: RunLog, replicas, cluster: Cluster) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / HISTORY_FILE, "w", encoding="utf-8") as fh:
        for rec in runlog.history:
            fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
    write_jsonl(out / NEMESIS_FILE, sorted(runlog.nemesis, key=lambda e: e.time_ms))
    write_jsonl(out / SAMPLES_FILE, runlog.samples)
    write_replicas(out / REPLICAS_FILE, replicas)
    _write_controller_state(out, cluster)


def _write_controller_state(out: Path, cluster: Cluster) -> None:
    """The controllers' merged event log (``controller_events.jsonl``) and the leader's tables
    (``controller_state.json``). Diagnostics: a failure is logged, the run's verdict stands."""
    try:
        events, uncovered = cluster.controller_events()
        write_jsonl(out / CONTROLLER_EVENTS_FILE, [ControllerEventRecord.from_json(e) for e in events])
        if uncovered:
            (out / "controller_events_gaps.json").write_text(json.dumps(uncovered))
    except Exception as exc:  # noqa: BLE001 - diagnostics only
        (out / CONTROLLER_EVENTS_FILE).write_text("")
        log.warning("controller event log not saved: %s", exc)
    try:
        leader = cluster.wait_for_leader(30)
        snap = ray.get(cluster.controller(leader).state_snapshot.remote(), timeout=10)
        (out / "controller_state.json").write_text(json.dumps(snap, indent=1, default=str))
    except Exception as exc:  # noqa: BLE001 - diagnostics only
        log.warning("controller state not saved: %s", exc)


def cluster_overrides(args: argparse.Namespace) -> dict[str, str]:
    overrides = {"ha.all_ack_in_sync_state_set": "true" if args.all_ack else "false",
                 "controller.enable_elect_unclean_master": "true" if args.unclean else "false"}
    if "lose-unsynced" in drawn_kinds(args.nemesis):
        overrides["store.track_unsynced"] = "true"   # the replicas' undo disk (rocketray/fs_undo.py)
    return overrides


def _broker_clock(clock_files: dict[str, Path], root: Path, broker) -> dict[str, str]:
    """``start_cluster``'s ``broker_env`` when clock faults are drawn: the broker runs under
    libfaketime with a timestamp file of its own under ``root``, noted in ``clock_files``."""
    root.mkdir(parents=True, exist_ok=True)
    name = broker_name(broker.group, broker.replica)
    clock_files[name] = root / name.replace("/", "-")
    return faketime_env(clock_files[name])


def drawn_kinds(text: str) -> set[str]:
    """Every kind a ``--nemesis`` list may draw (aliases expanded)."""
    return {k for kind in parse_kinds(text) for k in sched.DRAWS.get(kind, (kind,))}


def run(args: argparse.Namespace) -> int:
    """Entry point of ``rocketray chaos --target brokers``; returns the exit code."""
    def say(msg: str) -> None:
        print(f"[chaos] {msg}", file=sys.stderr if args.json else sys.stdout, flush=True)

    try:
        parse_kinds(args.nemesis)
    except NemesisListError as exc:
        print(f"rocketray chaos: {exc}", file=sys.stderr)
        return 2
    ray_nodes = getattr(args, "ray_nodes", 1)
    if "kill-node" in parse_kinds(args.nemesis) and ray_nodes < 2:
        print("rocketray chaos: the kill-node nemesis needs --ray-nodes N (N >= 2, N >= --replicas)", file=sys.stderr)
        return 2
    args.groups = 2 if getattr(args, "groups", None) is None else args.groups
    # The consumer-group workload's settings (the CLI may not declare them yet: these defaults).
    args.consumer_groups = getattr(args, "consumer_groups", None)
    args.consumer_groups = CONSUMER_GROUPS if args.consumer_groups is None else args.consumer_groups
    args.consumers = getattr(args, "consumers", None) or CONSUMERS_PER_GROUP
    args.drain_timeout = getattr(args, "drain_timeout", None) or DRAIN_TIMEOUT_S
    if args.groups < 1 or args.replicas < 1 or args.controllers < 1 or args.duration < 0 or args.producers < 1:
        print("rocketray chaos: --groups, --replicas, --controllers, --producers must be >= 1", file=sys.stderr)
        return 2
    if args.consumer_groups < 0 or args.consumers < 1:
        print("rocketray chaos: --consumer-groups must be >= 0 (0: off), --consumers >= 1", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="rocketray-chaos-brokers-"))
    out.mkdir(parents=True, exist_ok=True)
    tmp = None if args.data_dir else tempfile.TemporaryDirectory(prefix="rocketray-chaos-data-")
    data_dir = args.data_dir or tmp.name
    nodes = None
    if ray_nodes > 1:
        from rocketray.actors.nodes import LocalNodes

        say(f"starting a local Ray of {ray_nodes} rocketray nodes (plus a head for the workload)")
        nodes = LocalNodes(ray_nodes, namespace="rocketray-chaos-driver")
    elif args.address:
        ray.init(address=args.address, namespace="rocketray-chaos-driver", log_to_driver=False)
    else:
        ray.init(address="local", include_dashboard=False, logging_level="ERROR", log_to_driver=False,
                 object_store_memory=300 * 1024 * 1024, namespace="rocketray-chaos-driver")
    cluster: Cluster | None = None
    proxies: HaProxies | None = None
    kernel = KernelNet() if drawn_kinds(args.nemesis) & sched.NET_KINDS else None
    clock_files: dict[str, Path] | None = {} if drawn_kinds(args.nemesis) & sched.CLOCK_KINDS else None
    summary: dict[str, Any]
    try:
        if kernel is not None:
            kernel.prepare()   # conntrack sees every connection of the cluster from its first packet
        def start_proxies(spec):
            nonlocal proxies
            proxies = HaProxies(spec).start()

        say(f"starting {args.controllers} controllers, {args.groups} group(s) x {args.replicas} replicas "
            f"({args.profile} profile, all-ack {'on' if args.all_ack else 'off'}, "
            f"unclean election {'on' if args.unclean else 'off'}) behind HA proxies")
        cluster = start_cluster(f"chaos-{os.getpid()}", controllers=args.controllers, groups=args.groups,
                                replicas=args.replicas, data_dir=data_dir, profile=args.profile,
                                overrides=cluster_overrides(args), ha_proxy=True, before_brokers=start_proxies,
                                broker_env=None if clock_files is None else
                                functools.partial(_broker_clock, clock_files, Path(data_dir) / "clocks"))
        summary = execute(cluster, args, out, proxies, say=say, nodes=nodes, kernel=kernel, clock_files=clock_files)
    except Exception as exc:  # noqa: BLE001 - still end with one JSON line saying the run is invalid
        log.exception("broker chaos run failed")
        summary = {"valid": False, "error": f"{type(exc).__name__}: {exc}", "ops": 0, "acked": 0, "lost": None,
                   "unseen": None, "duplicates": None, "inconsistent_offsets": None, "masters_per_epoch_max": None,
                   "replicas_converged": False, "failover_ms": {"p50": None, "max": None}, "consumer_groups": {},
                   "out_dir": str(out)}
    finally:
        if kernel is not None:
            kernel.close()
        if cluster is not None:
            cluster.stop(delete_data=tmp is not None)
        if proxies is not None:
            proxies.close()
        if nodes is not None:
            nodes.shutdown()
        else:
            ray.shutdown()
        if tmp is not None:
            tmp.cleanup()
    if args.json:
        summary = {k: v for k, v in summary.items() if k != "examples"} | {"examples": summary.get("examples", {})}
        print(json.dumps(summary, default=str))
    else:
        say("VALID" if summary["valid"] else "INVALID")
    return 0 if summary["valid"] else 1
