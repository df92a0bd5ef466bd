"""Controller failover: SIGKILL the leader, time until the next write commits.

Three controller nodes run in child processes with the default Raft timing of ControllerConfig
(election timeout drawn from [raft_min_timeout_ms, raft_max_timeout_ms)). Each round kills the
current leader with SIGKILL, then writes through whichever survivor becomes a ready leader until
one write is acknowledged; the killed node is restarted before the next round. Reported: median
and max over the rounds.

Same-run floor: the median of ``FLOOR_WRITES`` writes on the live leader before the first kill
(one request, decided, replicated with fsync, applied, answered), what a failover costs beyond
noticing the leader is gone and electing another. ``ratio`` = median failover / floor (lower is
better). For reference, ``mean_election_timeout_ms`` = (min + max) / 2: a follower waits that long
on average before it stands for election, so it dominates the figure.

Clients (``--client-rounds``, 0 to skip): three controller *actors* on an embedded Ray
(``--client-profile``, default ``default``: the same Raft timing as above), a driver client
(``Cluster.call_controller``, ``actors/controller_client.py``) writing in a loop, and per round the
leader actor killed with ``ray.kill`` (Ray restarts it, as in ``rocketray demo``). Two clocks start at
the kill: ``election_ms``, the first write acknowledged by a survivor when writing to the survivors
only (an oracle that knows which controller died, the figure above), and ``client_failover_ms``, the
first write the looping client gets acknowledged by a controller other than the killed one (it
does not know which died). Reported: both p50 and max, ``client_over_election_p50_ms`` (target:
at most ``CLIENT_TARGET_MS``, ``client_target_met``).

TLS (``--tls-baseline``, on by default): the node-process rounds run with TLS on the Raft port (as
shipped), then again with TLS off (development mode: pysyncobj's password, the members' secret);
``notls_*`` are the second set and ``tls_failover_ratio`` / ``tls_floor_ratio`` = with TLS / without.

    python benchmarks/run.py controller-failover [--rounds 10] [--client-rounds 10] [--no-tls-baseline] [--json]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from rocketray import ports
from rocketray.controller.config import ControllerConfig
from rocketray.controller.proc import NodeProcess, member_credentials


FLOOR_WRITES = 20
CLIENT_TARGET_MS = 50

#: ``benchmarks/run.py controller-failover --smoke``: a size that finishes in seconds (CI runs it).
SMOKE_ARGS = ["--rounds", "1", "--client-rounds", "1"]


def _p50(values: list[float]) -> float:
    s = sorted(values)
    return s[(len(s) - 1) // 2]


def measure_clients(rounds: int, profile: str, data_dir: str) -> dict:
    """The client rounds of the module docstring on an embedded Ray (or the Ray already initialised)."""
    import itertools
    import threading

    import ray

    from rocketray.actors.cluster import start_cluster
    from rocketray.wire.controller_api import ApplyBrokerIdRequest
    from rocketray.wire.controller_codes import ResponseCode

    started = not ray.is_initialized()
    if started:
        ray.init(address="local", include_dashboard=False, logging_level="ERROR", log_to_driver=False,
                 object_store_memory=200 * 1024 * 1024, namespace="rocketray-bench")
    seq = itertools.count()

    def request(tag: str) -> ApplyBrokerIdRequest:
        n = next(seq)
        return ApplyBrokerIdRequest("bench", f"{tag}{n}", 1, f"h:1;{n}")

    elections: list[float] = []
    clients: list[float] = []
    cluster = start_cluster(f"bench-cf-{int(time.time())}", controllers=3, groups=1, replicas=1,
                            data_dir=data_dir, profile=profile)
    try:
        for _ in range(rounds):
            leader = cluster.wait_for_leader(60)
            assert cluster.call_controller(request("warm"), timeout_s=30).ok
            stop = threading.Event()
            killed_at: list[float] = []
            client_ms: list[float] = []

            def client_loop() -> None:
                while not stop.is_set():
                    try:
                        ok = cluster.call_controller(request("c"), timeout_s=30).ok
                    except Exception:  # noqa: BLE001 - unavailable: keep calling, as an application would
                        continue
                    now = time.perf_counter()
                    served_by = cluster.controller_client.leader
                    if ok and killed_at and not client_ms and served_by is not None and served_by.index != leader:
                        client_ms.append((now - killed_at[0]) * 1000)
                        return

            thread = threading.Thread(target=client_loop, daemon=True)
            thread.start()
            time.sleep(0.3)                       # the client is calling in a loop when the leader dies
            survivors = [cluster.controller(c.index) for c in cluster.spec.controllers if c.index != leader]
            killed_at.append(time.perf_counter())
            cluster.kill_controller(leader, wait_restart=False)
            election = None
            while election is None and time.perf_counter() - killed_at[0] < 60:
                refs = [h.handle.remote(request("o")) for h in survivors]
                for ref in refs:
                    try:
                        if ray.get(ref, timeout=10).code == ResponseCode.SUCCESS and election is None:
                            election = (time.perf_counter() - killed_at[0]) * 1000
                    except ray.exceptions.RayError:
                        pass
                time.sleep(0.002)
            thread.join(60)
            stop.set()
            if election is None or not client_ms:
                raise TimeoutError(f"round without a figure: election {election}, client {client_ms}")
            elections.append(election)
            clients.append(client_ms[0])
            cluster.wait_for_leader(60)
            deadline = time.monotonic() + 60
            while any(md is None for md in cluster.controller_metadata()) and time.monotonic() < deadline:
                time.sleep(0.05)                  # the killed controller is back before the next round
    finally:
        cluster.stop(delete_data=True)
        if started:
            ray.shutdown()
    over = _p50(clients) - _p50(elections)
    return {"rounds": rounds, "profile": profile,
            "election_p50_ms": round(_p50(elections), 1), "election_max_ms": round(max(elections), 1),
            "client_failover_p50_ms": round(_p50(clients), 1), "client_failover_max_ms": round(max(clients), 1),
            "client_over_election_p50_ms": round(over, 1), "client_target_ms": CLIENT_TARGET_MS,
            "client_target_met": over <= CLIENT_TARGET_MS,
            "election_ms": [round(x, 1) for x in elections], "client_failover_ms": [round(x, 1) for x in clients]}


def measure_processes(rounds: int, timing: dict, tls: bool) -> tuple[list[float], list[float]]:
    """The node-process rounds of the module docstring: (failover samples, floor samples) in ms."""
    addrs = [f"127.0.0.1:{p}" for p in ports.free_ports(3)]
    samples: list[float] = []
    seq = 0
    with tempfile.TemporaryDirectory(prefix="bench-cf-") as tmp:
        stores = [Path(tmp) / f"n{i}" for i in range(3)]
        credentials = member_credentials(3)
        handles = [NodeProcess(i, dict(enumerate(addrs)), s, Path(tmp) / f"n{i}.log", credentials[i], timing, tls=tls)
                   for i, s in enumerate(stores)]
        procs: list[NodeProcess | None] = list(handles)
        for h in handles:
            h.start()

        def apply(p: NodeProcess, name: str, timeout_s: float = 5.0) -> dict | None:
            return p.call("request", {"type": "apply", "broker_name": name, "broker_id": 1,
                                      "check_code": f"{name};1"}, timeout_s=timeout_s)
        try:
            def leader(timeout_s: float) -> int:
                deadline = time.monotonic() + timeout_s
                while time.monotonic() < deadline:
                    for i, p in enumerate(procs):
                        meta = p.call("status", timeout_s=1) if p else None
                        if meta and meta.get("is_leader"):
                            return i
                    time.sleep(0.002)
                raise TimeoutError("no leader")

            li = leader(30)
            floor_samples = []
            for _ in range(FLOOR_WRITES):
                seq += 1
                t0 = time.perf_counter()
                assert apply(procs[li], f"floor{seq}")["code"] == 0
                floor_samples.append((time.perf_counter() - t0) * 1000)
            for _ in range(rounds):
                li = leader(30)
                seq += 1
                assert apply(procs[li], f"pre{seq}")["code"] == 0
                procs[li].kill()
                killed_at = time.perf_counter()
                procs[li] = None
                done = False
                while not done:
                    for p in procs:
                        if p is None:
                            continue
                        seq += 1
                        resp = apply(p, f"w{seq}", timeout_s=6)
                        if resp and resp.get("code") == 0:
                            samples.append((time.perf_counter() - killed_at) * 1000)
                            done = True
                            break
                    if time.perf_counter() - killed_at > 60:
                        raise TimeoutError("no write committed within 60 s of killing the leader")
                handles[li].start()
                procs[li] = handles[li]
                target = max(p.call("status")["commit_index"] for p in procs if p)
                deadline = time.monotonic() + 30
                while (procs[li].call("status") or {}).get("last_applied", 0) < target and time.monotonic() < deadline:
                    time.sleep(0.01)
        finally:
            for p in procs:
                if p is not None:
                    p.kill()
    return samples, floor_samples


def run(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(prog="controller-failover")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--client-rounds", type=int, default=10)
    parser.add_argument("--client-profile", default="default", choices=("default", "fast"))
    parser.add_argument("--tls-baseline", action=argparse.BooleanOptionalAction, default=True,
                        help="also run the node-process rounds with TLS off (development mode) in this run")
    args = parser.parse_args(argv)
    defaults = ControllerConfig()
    timing = {k: getattr(defaults, k) for k in (
        "raft_min_timeout_ms", "raft_max_timeout_ms", "append_entries_period_ms", "tick_period_ms",
        "connection_timeout_ms", "connection_retry_ms", "leader_fallback_timeout_ms", "request_timeout_ms")}
    samples, floor_samples = measure_processes(args.rounds, timing, tls=True)
    notls: dict = {}
    if args.tls_baseline:
        off, off_floor = measure_processes(args.rounds, timing, tls=False)
        notls = {"notls_failover_median_ms": round(statistics.median(off), 1),
                 "notls_failover_max_ms": round(max(off), 1),
                 "notls_floor_ms": round(statistics.median(off_floor), 2),
                 "tls_failover_ratio": round(statistics.median(samples) / statistics.median(off), 3),
                 "tls_floor_ratio": round(statistics.median(floor_samples) / statistics.median(off_floor), 3)}
    median = statistics.median(samples)
    floor = statistics.median(floor_samples)
    client: dict = {}
    if args.client_rounds > 0:
        with tempfile.TemporaryDirectory(prefix="bench-cf-clients-") as tmp:
            client = {"clients": measure_clients(args.client_rounds, args.client_profile, tmp)}
    return {**client, **notls,
        "rounds": args.rounds,
        "failover_median_ms": round(median, 1),
        "failover_max_ms": round(max(samples), 1),
        "failover_min_ms": round(min(samples), 1),
        "floor_ms": round(floor, 2),
        "raft_min_timeout_ms": defaults.raft_min_timeout_ms,
        "raft_max_timeout_ms": defaults.raft_max_timeout_ms,
        "mean_election_timeout_ms": (defaults.raft_min_timeout_ms + defaults.raft_max_timeout_ms) / 2,
        "ratio": round(median / floor, 1),
        "baseline": "floor_ms",
    }
