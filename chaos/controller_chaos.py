"""The controller chaos runner: a Jepsen-style test of the replicated controller and its snapshots.

Theory of operation. ``run(cfg)`` starts ``cfg.nodes`` controller processes (``controller_proc``)
whose Raft traffic crosses the fault-injecting proxies of ``proxy`` (address plan in its module doc),
registers ``cfg.groups`` broker groups of three replicas and elects replica 1 in each, then for
``cfg.duration_s`` lets ``cfg.clients`` threads issue reads, fenced SyncStateSet alterations and
designated elections against whichever node they believe leads, while the main thread plays a seeded
nemesis schedule (partitions, SIGKILL + restart, SIGSTOP + SIGCONT). A monitor thread polls every
node's Raft status. Snapshots are taken every ``cfg.snapshot_threshold`` applied entries, so log
compaction, snapshot loading on restart and snapshot catch-up of lagging followers run all the time.

Every client operation is one attempt recorded with its invoke and completion times and an
outcome: ``ok`` (the state machine answered, whatever the code), ``failed`` (definitely no effect:
never sent, or refused by a node that was not a ready leader before it looked at the request) or
``unknown`` (sent, then a timeout, a lost connection, or a leader that lost leadership while
committing). After the run: heal everything, wait until all nodes hold identical tables
(``converged``), read every group, SIGKILL every node, restart them all, read again (a committed
write must survive a full restart: the reads are part of the checked history), then check:

- ``linearizable``: the WGL checker per group, model = the real pure core (``CoreGroupModel``);
- ``leaders_per_term_max``: distinct nodes seen leading (ready-leader status, or acknowledging a
  write with the same term before and after) in one Raft term; must be 1;
- ``converged`` and ``restart_ok`` as above.
"""

from __future__ import annotations

import json
import random
import secrets
import shutil
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocketray.chaos.controller_workload import (BROKER_IDS, HISTORY_FILE, INITIAL_STATE_FILE, Client, Recorder,
                                                 final_reads, jsonable, to_operations)
from rocketray.controller.proc import NodeProcess, member_credentials
from rocketray.controller.proc_wire import NOT_LEADER, Lost, NodeClient, NotSent
from rocketray.verify.controller_model import CoreGroupModel, group_states
from rocketray.verify.linearizability import check_history
from rocketray import ports
from rocketray.verify.nemesis import (CONTROLLER_OS, LEADER, PROCESS_FAULTS, ControllerStep, make_controller_schedule,
                                      swap_nodes)
from rocketray.chaos.controller_faults import KernelRaftNet, NodeFaults, direct_topology
from rocketray.chaos.faketime import faketime_env, set_offset
from rocketray.chaos.proxy import ProxyNetwork, allocate_addresses, plan_topology



@dataclass
class RunConfig:
    duration_s: float = 60.0
    seed: int = 0
    nemeses: tuple[str, ...] = ()
    nodes: int = 5
    groups: int = 3
    clients: int = 5
    snapshot_threshold: int = 10
    out_dir: str | None = None
    client_timeout_s: float = 4.0
    check_budget_s: float = 60.0
    converge_timeout_s: float = 40.0
    think_s: float = 0.01
    controller: dict[str, Any] = field(default_factory=lambda: {"request_timeout_ms": 2000})
    #: ``kernel``: Raft links direct, partitions and loss by nftables (chaos/controller_faults.py);
    #: ``proxy``: through the pair proxies of chaos/proxy.py
    network: str = "kernel"
    #: run every node under libfaketime (the ``clock`` nemesis needs it)
    faketime: bool = False


class ProxiedControllers:
    """The chaos run's controller group: node processes (``NodeProcess``) that reach each other
    only through fault proxies (``ProxyNetwork``), not Ray actors (that is ``actors.cluster.Cluster``)
    nor in-process nodes (``controller.proc.InProcessControllers``)."""

    def __init__(self, cfg: RunConfig, workdir: Path, recorder: Recorder) -> None:
        n = cfg.nodes
        if cfg.network == "kernel":
            node_addresses = sorted(f"127.0.0.2:{p}" for p in ports.free_ports(n, "0.0.0.0", rng=random.Random()))
            self.topology = direct_topology(node_addresses)
            self.net: ProxyNetwork | KernelRaftNet = KernelRaftNet(self.topology, lambda: self.nodes)
            self.net.start()
        else:
            node_addresses, proxy_sockets = allocate_addresses(n, random.Random())
            self.topology = plan_topology(node_addresses, sorted(proxy_sockets))
            self.net = ProxyNetwork(self.topology)
            self.net.start(proxy_sockets)
        self.secret = secrets.token_hex(32)
        self.recorder = recorder
        config = {"snapshot_threshold": cfg.snapshot_threshold, **cfg.controller}
        controllers = dict(enumerate(self.topology.self_addresses))
        credentials = member_credentials(n, secret=self.secret)
        self.clock_files = [workdir / f"clock-{i}" for i in range(n)] if cfg.faketime else None
        self.nodes = [NodeProcess(i, controllers, workdir / "nodes" / str(i), workdir / f"node-{i}.log",
                                  credentials[i], config, dial=self._dial(i),
                                  extra_env=faketime_env(self.clock_files[i]) if self.clock_files else None)
                      for i in range(n)]
        self.faults = NodeFaults(self.nodes, self.net, self.clock_files)

    def _dial(self, i: int) -> dict[int, str]:
        """Where node ``i`` reaches each peer (a proxy, or its Raft address): the topology's peer list
        holds one entry per other node, in index order."""
        others = [j for j in range(self.topology.size) if j != i]
        return dict(zip(others, self.topology.peer_addresses[i]))

    def client(self, i: int) -> NodeClient:
        return NodeClient("127.0.0.1", self.nodes[i].client_port, self.secret.encode())

    def call(self, i: int, op: str, args: dict[str, Any] | None = None, timeout_s: float = 2.0) -> Any:
        client = self.client(i)
        try:
            return client.call(op, args, timeout_s)
        finally:
            client.close()

    def statuses(self, timeout_s: float = 1.0) -> dict[int, dict[str, Any]]:
        out = {}
        for node in self.nodes:
            if node.running and not node.paused:
                try:
                    out[node.index] = self.call(node.index, "status", timeout_s=timeout_s)
                except (NotSent, Lost, RuntimeError):
                    pass
        return out

    def leader(self) -> int | None:
        for i, status in self.statuses().items():
            if status.get("is_leader"):
                return i
        return None

    def wait_leader(self, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            leader = self.leader()
            if leader is not None:
                return leader
            time.sleep(0.1)
        raise TimeoutError(f"no ready leader within {timeout_s}s")

    def call_leader(self, args: dict[str, Any], timeout_s: float = 30.0) -> dict[str, Any]:
        """Setup helper: retry an idempotent request until a leader answers it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            leader = self.leader()
            if leader is not None:
                try:
                    reply = self.call(leader, "request", args, timeout_s=5.0)
                    if reply["code"] != NOT_LEADER and reply["code"] != 1:
                        return reply
                except (NotSent, Lost):
                    pass
            time.sleep(0.1)
        raise TimeoutError(f"request {args} not served within {timeout_s}s")

    def heal(self) -> None:
        self.net.heal()
        for clock in self.clock_files or ():
            set_offset(clock, 0)
        for node in self.nodes:
            if node.paused:
                node.resume()
            if not node.running:
                node.start()

    def close(self) -> None:
        for node in self.nodes:
            if node.paused:
                node.resume()
            node.kill()
        self.net.close()


def monitor(cluster: ProxiedControllers, stop: threading.Event, period_s: float = 0.25) -> None:
    """Record ready-leader claims per term and the snapshot counters of every node incarnation."""
    while not stop.wait(period_s):
        for i, status in cluster.statuses(timeout_s=0.5).items():
            if status.get("leader_term_claim") is not None:
                cluster.recorder.claim(int(status["leader_term_claim"]), i)
            with cluster.recorder.lock:
                cluster.recorder.counters[(i, cluster.nodes[i].incarnation)] = {
                    k: int(status.get(k) or 0) for k in ("snapshots_saved", "snapshots_loaded", "dumps_installed",
                                                          "fenced_batches", "commit_index")}


def play(cluster: ProxiedControllers, steps: list[ControllerStep], t0: float, stop: threading.Event, rng: random.Random) -> None:
    """Execute the nemesis schedule; each step logged with the wall-clock time it took effect."""
    resolved: dict[int, tuple[tuple[int, ...], tuple[tuple[int, int], ...]]] = {}
    for step in steps:
        if stop.wait(max(0.0, t0 + step.at_s - time.monotonic())):
            return
        targets, grudge = resolved.get(step.fault_id, (step.targets, step.grudge))
        if step.phase == "start" and (step.kind in PROCESS_FAULTS or step.kind in CONTROLLER_OS) and LEADER in targets:
            leader = cluster.leader()
            targets = (leader if leader is not None else rng.randrange(cluster.topology.size),)
        if step.phase == "start" and step.leader_swap:
            leader = cluster.leader()
            if leader is not None:
                grudge, targets = swap_nodes(grudge, targets, targets[0], leader)
        resolved[step.fault_id] = (targets, grudge)
        extra: dict[str, Any] = {"fault_id": step.fault_id, "planned_at_s": round(step.at_s, 3)}
        if step.kind in CONTROLLER_OS:
            node = targets[0]
            info = cluster.faults.start(step.kind, node, step.param) if step.phase == "start" else \
                cluster.faults.end(step.kind, node)
            cluster.recorder.event(step.kind, step.phase, target=node, **info, **extra)
        elif step.kind == "kill":
            node = cluster.nodes[targets[0]]
            node.kill() if step.phase == "start" else node.start()
            cluster.recorder.event("kill-controller", step.phase, target=targets[0], **extra)
        elif step.kind == "pause":
            node = cluster.nodes[targets[0]]
            node.pause() if step.phase == "start" else node.resume()
            cluster.recorder.event("pause-controller", step.phase, target=targets[0], **extra)
        else:
            cluster.net.block(grudge if step.phase == "start" else ())
            if step.phase == "end" and isinstance(cluster.net, KernelRaftNet):
                extra["dropped_packets_so_far"] = cluster.net.dropped()   # the kernel's counters, whole run
            cluster.recorder.event("partition-controller", step.phase, target=list(targets), topology=step.kind,
                                   grudge=[list(p) for p in grudge], leader_swap=step.leader_swap, **extra)


def setup_groups(cluster: ProxiedControllers, groups: list[str]) -> None:
    """Register replicas 1..3 in every group and elect replica 1 (idempotent steps, retried)."""
    for group in groups:
        for broker_id in BROKER_IDS:
            address = f"127.0.0.1:{30910 + broker_id}"
            reply = cluster.call_leader({"type": "apply", "broker_name": group, "broker_id": broker_id,
                                         "check_code": f"{address};{group}-{broker_id}"})
            assert reply["code"] == 0, reply
            reply = cluster.call_leader({"type": "register", "broker_name": group, "broker_id": broker_id,
                                         "address": address})
            assert reply["code"] == 0, reply
        reply = cluster.call_leader({"type": "elect", "broker_name": group, "broker_id": 1, "designate": True})
        assert reply["code"] in (0, 2011), reply


def leader_state(cluster: ProxiedControllers, timeout_s: float = 30.0) -> dict[str, Any]:
    """The replicated tables on a ready leader (its barrier committed: every committed entry applied)."""
    leader = cluster.wait_leader(timeout_s)
    return cluster.call(leader, "state", timeout_s=5.0)["state"]


def wait_converged(cluster: ProxiedControllers, timeout_s: float) -> tuple[bool, dict[str, Any]]:
    """All nodes hold identical tables and applied indexes; (converged, details)."""
    deadline = time.monotonic() + timeout_s
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        states = {}
        for node in cluster.nodes:
            try:
                states[node.index] = cluster.call(node.index, "state", timeout_s=2.0)
            except (NotSent, Lost, RuntimeError) as exc:
                states[node.index] = {"error": str(exc)}
        tables = {json.dumps(s.get("state"), sort_keys=True) for s in states.values()}
        applied = {s.get("meta", {}).get("applied_index") for s in states.values()}
        last = {"distinct_tables": len(tables), "applied_index": sorted(applied, key=str)}
        if len(tables) == 1 and len(applied) == 1 and None not in applied:
            return True, last
        time.sleep(0.2)
    return False, last


def run_checks(cfg: RunConfig, recorder: Recorder, base: dict[str, Any]) -> dict[str, Any]:
    result = check_history(to_operations(recorder.ops), CoreGroupModel(base), budget_s=cfg.check_budget_s)
    counts: dict[str, int] = defaultdict(int)
    for r in recorder.ops:
        counts[r["outcome"]] += 1
    snapshot_totals: dict[str, int] = defaultdict(int)
    for values in recorder.counters.values():
        for k, v in values.items():
            if k != "commit_index":
                snapshot_totals[k] += v
    return {
        "ops": len(recorder.ops), "ok": counts["ok"], "failed": counts["failed"], "unknown": counts["unknown"],
        "linearizable": result.valid,
        "groups": {k.key: {"valid": k.valid, "ops": k.ops, "configurations": k.configurations,
                           "elapsed_s": round(k.elapsed_s, 3), **({"failure": k.failure} if k.failure else {}),
                           **({"reason": k.reason} if k.reason else {})} for k in result.keys},
        "leaders_per_term_max": max((len(v) for v in recorder.leader_claims.values()), default=0),
        "terms_observed": len(recorder.leader_claims),
        **dict(snapshot_totals),
    }


def run(cfg: RunConfig) -> dict[str, Any]:
    """Run one chaos test; returns the summary (``valid`` says whether every check passed)."""
    started = time.monotonic()
    workdir = Path(cfg.out_dir) if cfg.out_dir else Path(tempfile.mkdtemp(prefix="rocketray-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    recorder = Recorder()
    groups = [f"group-{g}" for g in range(cfg.groups)]
    steps = make_controller_schedule(cfg.nemeses, cfg.nodes, cfg.duration_s, random.Random(cfg.seed))
    cluster = ProxiedControllers(cfg, workdir, recorder)
    stop_clients, stop_monitor = threading.Event(), threading.Event()
    summary: dict[str, Any] = {"seed": cfg.seed, "nemeses": list(cfg.nemeses), "nodes": cfg.nodes,
                               "duration_s": cfg.duration_s}
    try:
        for node in cluster.nodes:
            node.start()
        cluster.wait_leader(60.0)
        setup_groups(cluster, groups)
        base = leader_state(cluster)
        summary["initial"] = {g: jsonable(s) for g, s in group_states(base).items()}
        monitor_thread = threading.Thread(target=monitor, args=(cluster, stop_monitor), daemon=True)
        monitor_thread.start()
        t0_ns, t0 = time.monotonic_ns(), time.monotonic()
        clients = [Client(i, cluster, cfg, groups, stop_clients, t0_ns) for i in range(cfg.clients)]
        for c in clients:
            c.start()
        play(cluster, steps, t0, stop_clients, random.Random(f"{cfg.seed}-resolve"))
        stop_clients.wait(max(0.0, t0 + cfg.duration_s - time.monotonic()))
        stop_clients.set()
        for c in clients:
            c.join(cfg.client_timeout_s + 5)
        for c in clients:
            if c.error is not None:
                raise RuntimeError(f"client {c.index} failed; the history would be incomplete") from c.error
        cluster.heal()
        recorder.event("heal", "end", target=None)
        converged, detail = wait_converged(cluster, cfg.converge_timeout_s)
        final_reads(cluster, recorder, groups, "final", t0_ns)
        before_restart = leader_state(cluster)
        stop_monitor.set()
        monitor_thread.join(5)
        recorder.event("restart-all", "start", target=None)
        for node in cluster.nodes:
            node.kill()
        for node in cluster.nodes:
            node.start()
        recorder.event("restart-all", "end", target=None)
        final_reads(cluster, recorder, groups, "after-restart", t0_ns)
        after_restart = leader_state(cluster)
        with recorder.lock:  # last counters of the restarted incarnations: snapshots loaded on start
            for i, status in cluster.statuses().items():
                recorder.counters[(i, cluster.nodes[i].incarnation)] = {
                    k: int(status.get(k) or 0) for k in ("snapshots_saved", "snapshots_loaded", "dumps_installed",
                                                          "fenced_batches")}
        summary.update(run_checks(cfg, recorder, base))
        summary["_base"] = base
        summary.update({"nemesis_events": len(recorder.nemesis), "converged": converged, "convergence": detail,
                        "restart_ok": before_restart == after_restart,
                        "final": {g: jsonable(s) for g, s in group_states(after_restart).items()}})
    finally:
        stop_clients.set()
        stop_monitor.set()
        cluster.close()
    summary["valid"] = (summary.get("linearizable") is True and bool(summary.get("converged"))
                        and summary.get("leaders_per_term_max", 2) <= 1 and bool(summary.get("restart_ok")))
    summary["elapsed_s"] = round(time.monotonic() - started, 1)
    base_state = summary.pop("_base", None)
    if cfg.out_dir:
        write_outputs(workdir, recorder, steps, summary, base_state)
        summary["out_dir"] = str(workdir)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return summary


def write_outputs(workdir: Path, recorder: Recorder, steps: list[ControllerStep], summary: dict[str, Any],
                  base_state: dict[str, Any] | None) -> None:
    if base_state is not None:
        with open(workdir / INITIAL_STATE_FILE, "w") as fh:
            json.dump(base_state, fh)
    with open(workdir / HISTORY_FILE, "w") as fh:
        for r in recorder.ops:
            fh.write(json.dumps({k: v for k, v in r.items() if not k.startswith("_")}) + "\n")
    with open(workdir / "controller_nemesis.jsonl", "w") as fh:
        for e in recorder.nemesis:
            fh.write(json.dumps(e) + "\n")
    with open(workdir / "nemesis_plan.json", "w") as fh:
        json.dump([s.to_json() for s in steps], fh, indent=1)
    with open(workdir / "leader_claims.json", "w") as fh:
        json.dump({str(t): sorted(v) for t, v in sorted(recorder.leader_claims.items())}, fh)
    with open(workdir / "verdict.json", "w") as fh:
        json.dump(summary, fh, indent=1, default=str)
