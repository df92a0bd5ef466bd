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

    python benchmarks/run.py controller-failover [--rounds 10] [--json]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from rocketray import ports
from rocketray.controller.config import ControllerConfig
from rocketray.controller.proc import NodeProcess


FLOOR_WRITES = 20

#: ``benchmarks/run.py controller-failover --smoke``: a size that finishes in seconds (CI runs it).
SMOKE_ARGS = ["--rounds", "1"]


def run(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(prog="controller-failover")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    defaults = ControllerConfig()
    timing = {k: getattr(defaults, k) for k in (
        "raft_min_timeout_ms", "raft_max_timeout_ms", "append_entries_period_ms", "tick_period_ms",
        "connection_timeout_ms", "connection_retry_ms", "leader_fallback_timeout_ms", "request_timeout_ms")}
    addrs = [f"127.0.0.1:{p}" for p in ports.free_ports(3)]
    samples: list[float] = []
    seq = 0
    with tempfile.TemporaryDirectory(prefix="bench-cf-") as tmp:
        stores = [Path(tmp) / f"n{i}" for i in range(3)]
        handles = [NodeProcess(i, a, tuple(addrs), s, Path(tmp) / f"n{i}.log", "bench", timing)
                   for i, (a, s) in enumerate(zip(addrs, stores))]
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
            for _ in range(args.rounds):
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
    median = statistics.median(samples)
    floor = statistics.median(floor_samples)
    return {
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
