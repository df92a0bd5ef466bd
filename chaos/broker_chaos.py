"""``rocketray chaos --target brokers``: kill, pause and partition broker and controller actors under
a recorded workload, heal, read everything back and let the checker give a verdict.

Theory of operation. The runner starts a cluster (on an embedded local Ray unless ``--address``)
whose brokers sit behind fault-injecting HA proxies (``chaos/ha_proxy.py``), with all-ack on
and unclean election off unless told otherwise. Producer threads write unique, verifiable payloads
to every group, consumer threads tail every group, and a sampler polls every replica
(``chaos/broker_workload.py``). The nemesis schedule is a pure function of the seed
(``verify/nemesis.py``); the runner resolves run-time targets (the current master, the
controller leader), acts, and records each fault's start and end in ``nemesis.jsonl``. After
``--duration`` it heals everything (SIGCONT, proxies opened), stops the workload, waits for the
cluster to settle, records the ``heal`` event, then sweeps every replica (final reads, after the last
nemesis event as the checker requires) and snapshots each replica's epochs, offsets and digest.
The run directory follows ``docs/contracts.md`` ("chaos run directory"); the verdict comes from
``rocketray.verify.checker.check_run_dir``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import ray

from rocketray.verify import nemesis as sched
from rocketray.chaos.broker_workload import (
    ConsumerLoop, ProducerLoop, RunLog, Sampler, final_reads, poll_statuses, replica_snapshots)
from rocketray.verify.checker import check_run_dir, format_verdict
from rocketray.chaos.ha_proxy import HaProxies
from rocketray.verify.history import (
    CONTROLLER_EVENTS_FILE, HISTORY_FILE, NEMESIS_FILE, REPLICAS_FILE, SAMPLES_FILE, VERDICT_FILE,
    ControllerEventRecord, write_jsonl, write_replicas)
from rocketray.actors.client import now_ms
from rocketray.actors.cluster import Cluster, ClusterError, start_cluster
from rocketray.config import load_config
from rocketray.actors.pipeline import NodeControl, node_label, settle
from rocketray.controller.api import GetReplicaInfoRequest

log = logging.getLogger("rocketray.chaos.brokers")


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
    return ("all",) if "all" in kinds else kinds


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
        step = sched._draw_step(rng, rng.choice(list(kinds)), t, names, groups, controllers, fault_ms)
        if step.end_ms > run_ms:
            break
        steps.append(step)
        t = step.end_ms + interval_ms + rng.randint(0, jitter_ms)
    return tuple(steps)


@dataclass
class Nemesis:
    """Executes schedule steps against a live cluster and records them in ``runlog``."""

    cluster: Cluster
    runlog: RunLog
    proxies: HaProxies | None
    seed: int
    paused: dict[str, int] = field(default_factory=dict)  # target -> pid stopped and not yet resumed
    acted: int = 0
    _partition_target: str = ""
    #: whole rocketray nodes (``--ray-nodes N``): ``kill-node`` needs them
    nodes: NodeControl | None = None
    #: (label, target, group) of the node ``kill-node`` took down and has not restored yet
    down_node: tuple[str, str, str | None] | None = None

    # --- resolving targets ------------------------------------------------------------------
    def replica_of(self, group: str, broker_id: int) -> int | None:
        for b, st in zip(self.cluster.spec.brokers_of(group), self.cluster.group_status(group)):
            if st and st.get("broker_id") == broker_id:
                return b.replica
        return None

    def master_of(self, group: str) -> int | None:
        try:
            resp = self.cluster.call_controller(GetReplicaInfoRequest(broker_name=group), timeout_s=3.0)
            address = (resp.header or {}).get("master_address") if resp.ok else None
            b = self.cluster.spec.broker_by_ha_address(address) if address else None
            if b is not None:
                return b.replica
        except Exception:  # noqa: BLE001 - ask the replicas instead
            pass
        return self.cluster.master_of(group)

    # --- acting -----------------------------------------------------------------------------
    def start(self, step: sched.NemesisStep) -> None:
        kind, group = step.kind, step.group
        if kind == "kill-master":
            replica = self.master_of(group)
            if replica is None:
                log.warning("kill-master: no master in %s right now; skipped", group)
                return
            self.runlog.event(kind, "start", f"broker:{group}/r{replica}", group)
            self.cluster.kill_broker(group, replica, wait_restart=False)
            self.runlog.event(kind, "end", f"broker:{group}/r{replica}", group)
        elif kind in ("kill-broker", "pause-broker"):
            replica = self.replica_of(group, step.broker_id)
            replica = (step.broker_id - 1) % len(self.cluster.spec.brokers_of(group)) if replica is None else replica
            target = f"broker:{group}/r{replica}"
            self.runlog.event(kind, "start", target, group)
            if kind == "kill-broker":
                self.cluster.kill_broker(group, replica, wait_restart=False)
                self.runlog.event(kind, "end", target, group)
            else:
                self.paused[target] = self.cluster.pause(self.cluster.broker(group, replica))
        elif kind == "kill-controller-leader":
            leader = self.cluster.leader_index()
            if leader is None:
                log.warning("kill-controller-leader: no leader right now; skipped")
                return
            self.runlog.event(kind, "start", f"controller:{leader}", None)
            self.cluster.kill_controller(leader, wait_restart=False)
            self.runlog.event(kind, "end", f"controller:{leader}", None)
        elif kind in ("kill-controller", "pause-controller"):
            target = f"controller:{step.controller}"
            self.runlog.event(kind, "start", target, None)
            if kind == "kill-controller":
                self.cluster.kill_controller(step.controller, wait_restart=False)
                self.runlog.event(kind, "end", target, None)
            else:
                self.paused[target] = self.cluster.pause(self.cluster.controller(step.controller))
        elif kind == "partition-ha":
            self._partition(step)
        elif kind == "kill-node":
            if not self._kill_node(step):
                return
        else:
            raise AssertionError(kind)
        self.acted += 1

    def _kill_node(self, step: sched.NemesisStep) -> bool:
        """Take down the whole node holding ``step.group``'s master (every actor on it dies and none
        can restart elsewhere until ``end`` brings the node back)."""
        if self.nodes is None:
            log.warning("kill-node needs a cluster on several rocketray nodes (--ray-nodes N); skipped")
            return False
        replica = self.master_of(step.group)
        spec = next((b for b in self.cluster.spec.brokers_of(step.group) if b.replica == replica), None)
        label = None if spec is None else node_label(spec.node_resource)
        if label is None:
            log.warning("kill-node: no master of %s on a labelled node right now; skipped", step.group)
            return False
        target = f"node:{label}"
        self.runlog.event("kill-node", "start", target, step.group)
        self.nodes.remove(label)
        self.down_node = (label, target, step.group)
        return True

    def _restore_node(self) -> None:
        if self.down_node is None or self.nodes is None:
            return
        label, target, group = self.down_node
        self.down_node = None
        self.nodes.restore(label)
        self.runlog.event("kill-node", "end", target, group)

    def _partition(self, step: sched.NemesisStep) -> None:
        group = step.group
        if self.proxies is None:
            log.warning("partition-ha needs the HA proxies; skipped")
            return
        mode = random.Random(self.seed * 31 + step.at_ms).choice(("cut", "stall"))
        victim = self.replica_of(group, step.broker_id)
        master = self.master_of(group)
        if victim is None or master is None:
            log.warning("partition-ha: %s has no master or broker %s is unknown; skipped", group, step.broker_id)
            return
        if victim == master:  # isolate the master's replication from every slave
            target = f"broker:{group}/r{master} {mode} all links"
            t = now_ms()
            self.proxies.fault((group, master), mode)
            self.runlog.event("partition-ha", "start", target, group, time_ms=t)
        else:  # only the link victim -> master
            pid = ray.get(self.cluster.broker(group, victim).pid.remote(), timeout=5)
            target = f"broker:{group}/r{victim} {mode} link to r{master}"
            t = now_ms()
            self.proxies.fault((group, master), mode, peer_pids=[pid])
            self.runlog.event("partition-ha", "start", target, group, time_ms=t)
        self.paused["partition-ha"] = -1
        self._partition_target = target

    def end(self, step: sched.NemesisStep) -> None:
        """Undo a pause, partition or node loss (kills need nothing: Ray restarts the actor)."""
        if step.kind == "kill-node":
            self._restore_node()
            return
        if step.kind == "partition-ha":
            if self.paused.pop("partition-ha", None) is not None and self.proxies is not None:
                self.proxies.heal()
                self.runlog.event("partition-ha", "end", self._partition_target, step.group)
            return
        for target, pid in list(self.paused.items()):
            if target == "partition-ha":
                continue
            self.cluster.resume_pid(pid)
            del self.paused[target]
            self.runlog.event(step.kind, "end", target, step.group)

    def heal_all(self) -> None:
        self._restore_node()
        for target, pid in list(self.paused.items()):
            if pid > 0:
                self.cluster.resume_pid(pid)
        self.paused.clear()
        if self.proxies is not None:
            self.proxies.heal()


def run_schedule(nemesis: Nemesis, steps: Sequence[sched.NemesisStep], t0: float, run_s: float,
                 stop: threading.Event) -> None:
    """Play ``steps`` (times relative to monotonic ``t0``) until the end of the run or ``stop``."""
    for step in steps:
        for phase, at_ms in (("start", step.at_ms), ("end", step.end_ms)):
            if phase == "end" and step.duration_ms == 0:
                continue
            delay = t0 + at_ms / 1000.0 - time.monotonic()
            if delay > 0 and stop.wait(delay):
                return
            try:
                (nemesis.start if phase == "start" else nemesis.end)(step)
            except Exception:  # noqa: BLE001 - one failed fault must not end the run
                log.exception("nemesis %s %s failed", step.kind, phase)
    remaining = t0 + run_s - time.monotonic()
    if remaining > 0:
        stop.wait(remaining)


def timing(profile: str, overrides: dict[str, str]) -> tuple[int, int]:
    """(interval_ms, fault_ms) scaled to the profile's heartbeat timeout so pauses outlast detection."""
    hb_ms = load_config(profile, overrides).broker.controller_heartbeat_timeout_ms
    return max(4000, int(hb_ms * 1.5)), max(4000, int(hb_ms * 2.5))


def execute(cluster: Cluster, args: argparse.Namespace, out: Path, proxies: HaProxies | None,
            say=print, nodes: NodeControl | None = None) -> dict[str, Any]:
    """Workload + nemeses + heal + settle + final reads + checker against a running cluster."""
    kinds = parse_kinds(args.nemesis)
    runlog = RunLog()
    settle(cluster, timeout_s=args.settle_timeout)
    statuses = poll_statuses(cluster, timeout_s=10)
    groups = {g: sorted(int(st["broker_id"]) for (gg, _r), st in statuses.items() if gg == g and st.get("broker_id"))
              or [b.replica + 1 for b in cluster.spec.brokers_of(g)] for g in cluster.spec.groups}
    interval_ms, fault_ms = timing(cluster.spec.profile, dict(cluster.spec.config_overrides))
    steps = plan_steps(kinds, args.seed, groups=groups, controllers=len(cluster.spec.controllers),
                       run_ms=int(args.duration * 1000), interval_ms=interval_ms, fault_ms=fault_ms)
    (out / "schedule.json").write_text(json.dumps([s.to_json() for s in steps], indent=1))
    say(f"{len(steps)} nemesis steps planned: {', '.join(s.kind for s in steps) or 'none'}")
    stop_workload, stop_sampler, stop_nemesis = threading.Event(), threading.Event(), threading.Event()
    sampler = Sampler(cluster, runlog, stop_sampler)
    producers = [ProducerLoop(cluster, i, runlog, stop_workload, args.seed, batch=args.batch,
                              rate_per_s=args.rate)
                 for i in range(args.producers)]
    consumers = [ConsumerLoop(cluster, g, runlog, stop_workload, args.seed) for g in cluster.spec.groups]
    nemesis = Nemesis(cluster, runlog, proxies, args.seed, nodes=nodes)
    for t in (sampler, *producers, *consumers):
        t.start()
    started = time.monotonic()
    try:
        run_schedule(nemesis, steps, started, args.duration, stop_nemesis)
    finally:
        nemesis.heal_all()
        runlog.event("heal", "start", None, None)
        stop_workload.set()
        for t in (*producers, *consumers):
            t.join(timeout=60)
    say(f"healed after {time.monotonic() - started:.1f}s; waiting for the cluster to settle")
    settled = True
    try:
        settle(cluster, timeout_s=args.settle_timeout)
    except ClusterError as exc:
        settled = False
        say(f"the cluster did not settle: {exc}")
    stop_sampler.set()
    sampler.join(timeout=10)
    runlog.event("heal", "end", None, None)
    say("final reads from every replica")
    final_reads(cluster, runlog)
    replicas = replica_snapshots(cluster)
    write_run(out, runlog, replicas, cluster)
    verdict = check_run_dir(out)
    summary = {**verdict.to_json(), "settled": settled, "nemesis_steps": len(steps), "nemesis_acted": nemesis.acted,
               "producer_outcomes": _sum_outcomes(producers), "elapsed_s": round(time.monotonic() - started, 1),
               "seed": args.seed, "profile": cluster.spec.profile, "out_dir": str(out)}
    summary["valid"] = bool(verdict.valid and settled)
    (out / VERDICT_FILE).write_text(json.dumps(summary, indent=1, default=str))
    say(format_verdict(verdict))
    return summary


def _sum_outcomes(producers: Sequence[ProducerLoop]) -> dict[str, int]:
    total: dict[str, int] = {}
    for p in producers:
        for k, v in p.outcomes.items():
            total[k] = total.get(k, 0) + v
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
    return {"ha.all_ack_in_sync_state_set": "true" if args.all_ack else "false",
            "controller.enable_elect_unclean_master": "true" if args.unclean else "false"}


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
    if args.groups < 1 or args.replicas < 1 or args.controllers < 1 or args.duration < 0 or args.producers < 1:
        print("rocketray chaos: --groups, --replicas, --controllers, --producers must be >= 1", file=sys.stderr)
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
    summary: dict[str, Any]
    try:
        def start_proxies(spec):
            nonlocal proxies
            proxies = HaProxies(spec).start()

        say(f"starting {args.controllers} controllers, {args.groups} group(s) x {args.replicas} replicas "
            f"({args.profile} profile, all-ack {'on' if args.all_ack else 'off'}, "
            f"unclean election {'on' if args.unclean else 'off'}) behind HA proxies")
        cluster = start_cluster(f"chaos-{os.getpid()}", controllers=args.controllers, groups=args.groups,
                                replicas=args.replicas, data_dir=data_dir, profile=args.profile,
                                overrides=cluster_overrides(args), ha_proxy=True, before_brokers=start_proxies)
        summary = execute(cluster, args, out, proxies, say=say, nodes=nodes)
    except Exception as exc:  # noqa: BLE001 - still end with one JSON line saying the run is invalid
        log.exception("broker chaos run failed")
        summary = {"valid": False, "error": f"{type(exc).__name__}: {exc}", "ops": 0, "acked": 0, "lost": None,
                   "unseen": None, "duplicates": None, "inconsistent_offsets": None, "masters_per_epoch_max": None,
                   "replicas_converged": False, "failover_ms": {"p50": None, "max": None}, "out_dir": str(out)}
    finally:
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
