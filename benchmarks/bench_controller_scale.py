"""Controller at scale: one controller group of 3 serving G broker groups x 3 replicas.

For each G (``--groups``, default 10,100,300) a fresh cluster of 3 controller actors (the real
``ControllerService``: Raft node, broker-session listener, expiry and dead-master scans, metrics)
runs on an embedded local Ray in the chosen profile (``--profile``, default ``default``). The
brokers are light heartbeaters in one other process (``benchmarks/controller_scale_fleet.py``)
speaking the real API: register through ``AsyncControllerClient``, hold a session connection to the
leader and heartbeat on it every ``broker_heartbeat_interval_ms`` (as brokers do; with ``--transport ray``
one Ray call per heartbeat to every controller instead, the transport of clusters without session ports),
elect the first master of each group and put every replica in its SyncStateSet. Measured, per G:

- steady state over ``--seconds``: heartbeats the leader answered per second, the leader process's
  CPU (``psutil``, user + system, every thread of the actor process) in cores and per heartbeat,
  heartbeat latency p50/p99 (sent by the fleet -> the row is in the leader's table and the ack is
  back), and the latency of writes sent meanwhile (``--writes-per-s``: create then delete a topic
  through ``call_leader_sync``, each one Raft commit);
- node loss: the fleet stops every replica on node 0 at once (a third of all replicas, holding the
  masters of a third of the groups): their sessions close without a bye and their heartbeats stop.
  ``reelect_all_ms`` = from that close until the driver sees, in the leader's event log, a new
  master elected for every one of those groups (``reelect_decided_ms``: the last of those
  elections' decision time, from the leader's clock); writes keep going meanwhile;
- snapshot: size of the leader's newest snapshot file and its longest capture + encode + write;
- restart: a follower is killed for good and a ``ControllerNode`` is constructed in this process on
  its store directory and Raft address; ``restart_ms`` = from constructing it until it has applied
  the leader's commit index (snapshot load, journal replay, catch-up), its tables checked equal to
  the leader's (process start and imports excluded, as in ``controller-recovery``).

Ray starts every worker process at nice 15 (its ``worker_niceness``); the controller actors set
themselves back to nice 0 (``controller.process_niceness``, ``actors/priority.py``), and
``--no-renice`` keeps Ray's (``controller.process_niceness=none``) to show what the neighbours cost.

Targets at G = 300 in the default profile: leader under half a core, heartbeat p99 under
50 ms, all masters of the lost third re-elected within 1 s, restart under 1 s (``targets_met``).
``ratio`` = leader CPU seconds per heartbeat at the largest G / at the smallest (lower is better:
1.0 means the cost of a heartbeat does not grow with the number of groups).

    python benchmarks/run.py controller-scale [--groups 10,100,300] [--seconds 20] [--profile default] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from command_process import CommandProcess  # noqa: E402

HERE = Path(__file__).resolve().parent
FLEET = HERE / "controller_scale_fleet.py"
ANSWER = "@@fleet "
TARGETS = {"leader_cores": 0.5, "heartbeat_p99_ms": 50.0, "reelect_all_ms": 1000.0, "restart_ms": 1000.0}

#: ``benchmarks/run.py controller-scale --smoke``: a size that finishes in seconds (CI runs it).
SMOKE_ARGS = ["--groups", "3", "--seconds", "2", "--warmup", "1", "--profile", "fast"]


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2) if ordered else 0.0


def fleet_process(cluster: str, env: dict, log_path: Path) -> CommandProcess:
    """The fleet subprocess (``controller_scale_fleet.py``) and its answers."""
    return CommandProcess([sys.executable, str(FLEET), cluster], env, log_path, ANSWER, HERE.parent, wait_s=60.0)


class WriteProbe:
    """Writes to the leader at a fixed rate on a thread (create, then delete, a topic), timed."""

    def __init__(self, cluster, tag: str, per_s: float) -> None:
        self.cluster, self.tag, self.period_s = cluster, tag, 1.0 / per_s if per_s > 0 else 0.0
        self.latencies_ms: list[float] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._n = 0

    def _write(self, request) -> None:
        started = time.perf_counter()
        try:
            ok = self.cluster.call_controller(request, timeout_s=10).ok
        except Exception:  # noqa: BLE001 - counted: a failed write is a figure here, not a crash
            ok = False
        if ok:
            self.latencies_ms.append((time.perf_counter() - started) * 1000)
        else:
            self.failures += 1

    def _run(self) -> None:
        from rocketray.wire.controller_api import CreateTopicRequest, DeleteTopicRequest

        next_s = time.monotonic()
        while not self._stop.is_set():
            self._n += 1
            topic = f"probe-{self.tag}-{self._n}"
            self._write(CreateTopicRequest(topic, 1))
            self._write(DeleteTopicRequest(topic))
            next_s += self.period_s
            self._stop.wait(max(0.0, next_s - time.monotonic()))

    def __enter__(self) -> "WriteProbe":
        if self.period_s:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.period_s:
            self._thread.join(30)

    def figures(self, prefix: str) -> dict:
        return {f"{prefix}_p50_ms": _pct(self.latencies_ms, 0.5), f"{prefix}_p99_ms": _pct(self.latencies_ms, 0.99),
                f"{prefix}_n": len(self.latencies_ms), f"{prefix}_failures": self.failures}


def _cpu_s(pid: int) -> float:
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def _start_controllers(name: str, profile: str, data_dir: str, renice: bool, groups: int):
    """Three controllers whose spec names the fleet's replicas (``fleet_brokers``), and the members'
    credentials the fleet needs (the CA and the secret, as the ``setup`` command's ``ca``)."""
    import ray

    from controller_scale_fleet import fleet_brokers
    from rocketray.actors import remote
    from rocketray.actors.cluster import Cluster, plan_cluster
    from rocketray.config import load_config
    from rocketray.credentials import ClusterCredentials

    overrides = {} if renice else {"controller.process_niceness": "none"}   # see the module docstring
    spec = plan_cluster(name, controllers=3, groups=1, replicas=1, data_dir=data_dir, profile=profile,
                        overrides=overrides)
    spec = dataclasses.replace(spec, brokers=fleet_brokers(groups, 3))   # the fleet's heartbeaters
    for c in spec.controllers:
        Path(c.store_dir).mkdir(parents=True, exist_ok=True)
    credentials = ClusterCredentials.create(spec.name, load_config(profile, overrides).tls)
    access = remote.DriverAccess(credentials.client_trust)
    remote.start_registry(spec, access)
    cluster = Cluster(spec, access, credentials)
    handles = [cluster.start_controller(c.index) for c in spec.controllers]
    pids = [ray.get(h.pid.remote(), timeout=120) for h in handles]
    cluster.wait_for_leader(120)
    assert credentials.ca is not None
    ca = {"cert": credentials.ca.cert_pem.decode(), "key": credentials.ca.key_pem.decode(),
          "secret": credentials.secret}
    return cluster, pids, ca


def _leader(cluster) -> tuple[int, dict]:
    from rocketray.actors.views import to_json

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for i, md in enumerate(cluster.controller_metadata(timeout_s=10)):
            if md is not None and md.is_leader:
                return i, to_json(md)  # flat: ControllerNode.metadata()'s keys
        time.sleep(0.05)
    raise TimeoutError("no controller leader")


def _steady(fleet: CommandProcess, cluster, pids: list[int], seconds: float, writes_per_s: float,
            tag: str) -> dict:
    """The leader is the one the fleet's sessions follow (its ``stats``); a window in which it moved
    is reported (``leader_changes``) and measured on the leader at its end."""
    leader = fleet.call("stats")["leader"]
    cpu0 = [_cpu_s(p) for p in pids]
    started = time.perf_counter()
    with WriteProbe(cluster, tag, writes_per_s) as probe:
        time.sleep(seconds)
    elapsed = time.perf_counter() - started
    cpu = [_cpu_s(p) - c for p, c in zip(pids, cpu0)]
    hb = fleet.call("stats")
    answered = max(hb["answered"], 1)
    leader = hb["leader"]
    return {"leader_changes": hb["leader_changes"], "reopen_ms": hb["reopen_ms"],
            "leader_cores": round(cpu[leader] / elapsed, 3),
            "follower_cores": round(max(c for i, c in enumerate(cpu) if i != leader) / elapsed, 3),
            "leader_cpu_us_per_heartbeat": round(cpu[leader] / answered * 1e6, 1),
            "heartbeats_per_s": round(hb["answered"] / elapsed, 1),
            "heartbeat_p50_ms": hb["p50_ms"], "heartbeat_p99_ms": hb["p99_ms"], "heartbeat_max_ms": hb["max_ms"],
            "heartbeat_errors": hb["errors"], "heartbeats_late": hb["late"],
            "fleet_cores": round(hb["fleet_cpu_s"] / elapsed, 3), **probe.figures("write")}


def _node_loss(cluster, fleet: CommandProcess, writes_per_s: float, tag: str) -> dict:
    import ray

    leader, md = _leader(cluster)
    handle = cluster.controller(leader)
    cursor = md["event_log_last_index"]
    with WriteProbe(cluster, tag, writes_per_s) as probe:
        lost = fleet.call("lose", node=0, close=True)
        masters: dict[str, int] = lost["masters"]
        elected: dict[str, dict] = {}
        deadline = time.monotonic() + 60
        while len(elected) < len(masters) and time.monotonic() < deadline:
            page = ray.get(handle.events.remote(cursor, 100_000), timeout=10)
            for ev in page["events"]:
                if (ev["type"] == "ElectMasterEvent" and ev["broker_name"] in masters and ev["new_master_elected"]
                        and ev["new_master_broker_id"] != masters[ev["broker_name"]]):
                    elected.setdefault(ev["broker_name"], ev)
            cursor = page["next_index"]
            if len(elected) < len(masters):
                time.sleep(0.005)
        done_ms = time.time() * 1000
    assert len(elected) == len(masters), f"{len(masters) - len(elected)} groups without a new master in 60 s"
    return {"lost_replicas": lost["replicas"], "lost_masters": len(masters),
            "reelect_all_ms": round(done_ms - lost["at_wall_ms"], 1),
            "reelect_decided_ms": round(max(e["time_ms"] for e in elected.values()) - lost["at_wall_ms"], 1),
            **probe.figures("loss_write")}


def _snapshot(cluster, leader: int, md: dict) -> dict:
    snaps = sorted((Path(cluster.spec.controllers[leader].store_dir) / "snapshots").glob("snapshot_*.snap"))
    return {"snapshot_bytes": snaps[-1].stat().st_size if snaps else 0, "snapshots_saved": md["snapshots_saved"],
            "max_snapshot_ms": md["max_snapshot_ms"], "max_snapshot_tick_ms": md["max_snapshot_tick_ms"]}


def _restart(cluster, leader: int) -> dict:
    """Kill a follower for good, then time a ControllerNode on its store until it caught up."""
    import psutil
    import ray

    from rocketray.config import load_config
    from rocketray.controller.node import ControllerNode
    from rocketray.identity import Identity

    spec = cluster.spec
    follower = next(c for c in spec.controllers if c.index != leader)
    pid = ray.get(cluster.controller(follower.index).pid.remote(), timeout=10)
    ray.kill(cluster.controller(follower.index), no_restart=True)
    psutil.Process(pid).wait(30) if psutil.pid_exists(pid) else None
    target = ray.get(cluster.controller(leader).metadata.remote(), timeout=10).commit_index
    expected = ray.get(cluster.controller(leader).state_snapshot.remote(), timeout=10)
    settings = load_config(spec.profile, dict(spec.config_overrides))
    credentials = cluster.member_credentials(Identity.controller(spec.name, follower.index))
    started = time.perf_counter()
    node = ControllerNode({c.index: c.raft_address for c in spec.controllers}, follower.store_dir,
                          settings.controller_node_config(), credentials=credentials, tls=settings.tls.enabled)
    try:
        constructed_ms = (time.perf_counter() - started) * 1000
        deadline = time.monotonic() + 60
        while node.applied_index < target and time.monotonic() < deadline:
            time.sleep(0.001)
        restart_ms = (time.perf_counter() - started) * 1000
        assert node.applied_index >= target, f"restarted node applied {node.applied_index} < {target} in 60 s"
        assert node.snapshot_state() == expected, "restarted node's tables differ from the leader's"
        meta = node.metadata()
    finally:
        node.close()
    return {"restart_ms": round(restart_ms, 1), "restart_load_ms": round(constructed_ms, 1),
            "restart_snapshot_index": meta["snapshot_loaded_index"], "restart_target_index": target}


def measure(groups: int, args, data_dir: str) -> dict:
    import ray

    cluster, pids, ca = _start_controllers(f"scale{groups}", args.profile, data_dir, args.renice, groups)
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address, "PYTHONUNBUFFERED": "1"}
    fleet = fleet_process(cluster.spec.name, env, Path(data_dir) / f"fleet-{groups}.log")
    out: dict[str, Any] = {}
    try:   # a phase that breaks ends the size with its error; the figures so far are kept
        out.update(fleet.call("setup", wait_s=900, groups=groups, replicas=3, ca=ca,
                              ray_heartbeats=args.transport == "ray"))
        print(f"controller-scale G={groups}: set up in {out['setup_s']} s", file=sys.stderr, flush=True)
        time.sleep(args.warmup)
        out.update(_steady(fleet, cluster, pids, args.seconds, args.writes_per_s, f"s{groups}"))
        out.update(_node_loss(cluster, fleet, args.writes_per_s, f"l{groups}"))
        leader, md = _leader(cluster)
        out.update(_snapshot(cluster, leader, md))
        out.update(_restart(cluster, leader))
    except Exception as exc:  # noqa: BLE001 - reported as this size's error
        out["error"] = f"{type(exc).__name__}: {exc}"[-400:]
    finally:
        fleet.close()
        cluster.stop(delete_data=True)
    return out


def run(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(prog="controller-scale")
    parser.add_argument("--groups", default="10,100,300")
    parser.add_argument("--profile", default="default", choices=("default", "fast"))
    parser.add_argument("--seconds", type=float, default=20.0, help="steady-state measuring window")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds between setup and measuring")
    parser.add_argument("--writes-per-s", type=float, default=5.0, help="probe writes (create + delete topic)")
    parser.add_argument("--transport", default="session", choices=("session", "ray"),
                        help="heartbeats on the brokers' sessions (default) or one Ray call to every controller")
    parser.add_argument("--no-renice", dest="renice", action="store_false",
                        help="leave the controller actors at Ray's worker niceness (15)")
    args = parser.parse_args(argv)
    sizes = [int(g) for g in args.groups.split(",")]
    import ray

    load_before = os.getloadavg()[0]
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", include_dashboard=False, logging_level="ERROR", log_to_driver=False,
                 object_store_memory=200 * 1024 * 1024, namespace="rocketray-bench")
    result: dict[str, Any] = {"groups": sizes, "profile": args.profile, "seconds": args.seconds,
                              "transport": args.transport, "controllers_reniced": args.renice}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-cscale-") as tmp:
            for g in sizes:
                try:
                    figures = measure(g, args, tmp)
                except Exception as exc:  # noqa: BLE001 - a size that breaks is a result: say how, go on
                    figures = {"error": f"{type(exc).__name__}: {exc}"[-400:]}
                for key, value in figures.items():
                    result[f"{key}_{g}"] = value
    finally:
        if started:
            ray.shutdown()
    top, low = sizes[-1], sizes[0]
    result["targets"] = TARGETS
    result["targets_met"] = all(result.get(f"{k}_{top}", float("inf")) <= limit for k, limit in TARGETS.items())
    top_us, low_us = (result.get(f"leader_cpu_us_per_heartbeat_{g}") for g in (top, low))
    result["ratio"] = round(top_us / max(low_us, 1e-9), 2) if top_us and low_us else None
    result["load_avg_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    return result
