"""Controller write latency: elections committed on a 3-node loopback group.

Each sample is one `ElectMasterRequest` (the first election of a fresh broker set, so it commits
one ElectMasterEvent) through the leader pipeline: decide, replicate, apply, answer. Measured in
one run, on the same disk:

- ``p50_ms``/``p99_ms``: the controller as shipped (journal fsynced before acks and before the
  leader counts itself, group commit);
- ``nofsync_p50_ms``/``nofsync_p99_ms``: the same group with ``journal_fsync=False`` (what the
  durability costs is ``fsync_ratio`` = p50 / nofsync p50);
- ``raw_fsync_p50_ms``/``raw_fsync_p99_ms``: a bare 64-byte write + fsync on that disk (a write
  needs at least one leader fsync and one follower fsync, partly overlapped);
- ``bare_pysyncobj_*``: a bare pysyncobj group with the same Raft timing whose replicated method
  does nothing (its journal is in memory), called from the leader; ``ratio`` = p50 / bare p50;
- ``journal_syncs_per_write``: journal fsyncs summed over the 3 nodes per measured write.

    python benchmarks/run.py controller-write [--n 300] [--json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time

from pysyncobj import SyncObj, SyncObjConf, replicated

from rocketray import ports
from rocketray.controller.api import ApplyBrokerIdRequest, ElectMasterRequest, RegisterBrokerRequest
from rocketray.controller.config import ControllerConfig
from rocketray.controller.proc import LocalCluster


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class _Bare(SyncObj):
    def __init__(self, self_addr: str, others: list[str], conf: SyncObjConf) -> None:
        super().__init__(self_addr, others, conf)

    @replicated
    def noop(self, payload: bytes) -> bool:
        return True


def _bare_latencies(config: ControllerConfig, n: int) -> list[float]:
    addrs = [f"127.0.0.1:{p}" for p in ports.free_ports(3)]
    nodes = []
    for a in addrs:
        conf = SyncObjConf(password="bench", autoTickPeriod=config.tick_period_ms / 1000,
                           appendEntriesPeriod=config.append_entries_period_ms / 1000,
                           appendEntriesUseBatch=config.append_entries_use_batch,
                           raftMinTimeout=config.raft_min_timeout_ms / 1000,
                           raftMaxTimeout=config.raft_max_timeout_ms / 1000,
                           connectionTimeout=config.connection_timeout_ms / 1000,
                           connectionRetryTime=config.connection_retry_ms / 1000)
        nodes.append(_Bare(a, [x for x in addrs if x != a], conf))
    try:
        deadline = time.monotonic() + 20
        leader = None
        while leader is None and time.monotonic() < deadline:
            leader = next((x for x in nodes if x._isLeader()), None)
            time.sleep(0.01)
        assert leader is not None, "bare pysyncobj group elected no leader"
        for _ in range(20):
            leader.noop(b"warm", sync=True, timeout=5)
        out = []
        for _ in range(n):
            done = threading.Event()
            started = time.perf_counter()
            leader.noop(b"x" * 64, callback=lambda res, err: done.set())
            assert done.wait(5), "bare no-op not committed"
            out.append((time.perf_counter() - started) * 1000)
        return out
    finally:
        for x in nodes:
            x.destroy()


def _raw_fsync_latencies(directory: str, n: int) -> list[float]:
    path = os.path.join(directory, "fsync-probe")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        out = []
        for _ in range(n):
            started = time.perf_counter()
            os.write(fd, b"x" * 64)
            os.fsync(fd)
            out.append((time.perf_counter() - started) * 1000)
        return out
    finally:
        os.close(fd)
        os.unlink(path)


def _controller_latencies(config: ControllerConfig, n: int, directory: str,
                          journal_fsync: bool) -> tuple[list[float], dict]:
    with tempfile.TemporaryDirectory(prefix="bench-cw-", dir=directory) as tmp:
        cluster = LocalCluster(tmp, ports.free_ports(3), config, "bench-secret", alive=lambda name, bid: True,
                               journal_fsync=journal_fsync)
        try:
            leader = cluster.wait_leader(20)
            for i in range(n + 20):
                name = f"g{i}"
                assert leader.handle(ApplyBrokerIdRequest("c", name, 1, f"h{i}:1;1")).ok
                assert leader.handle(RegisterBrokerRequest("c", name, 1, f"h{i}:1")).ok
            for i in range(20):
                assert leader.handle(ElectMasterRequest.of_broker_trigger("c", f"g{n + i}", 1)).ok
            syncs_before = sum(node.metadata()["journal_syncs"] for node in cluster.running())
            out = []
            for i in range(n):
                started = time.perf_counter()
                resp = leader.handle(ElectMasterRequest.of_broker_trigger("c", f"g{i}", 1))
                out.append((time.perf_counter() - started) * 1000)
                assert resp.ok, resp
            metas = [node.metadata() for node in cluster.running()]
            syncs = sum(m["journal_syncs"] for m in metas) - syncs_before
            return out, {"journal_syncs_per_write": round(syncs / n, 2),
                         "max_tick_ms": max(m["max_tick_ms"] for m in metas),
                         "max_snapshot_ms": max(m["max_snapshot_ms"] for m in metas),
                         "max_snapshot_tick_ms": max(m["max_snapshot_tick_ms"] for m in metas),
                         "snapshots_saved": sum(m["snapshots_saved"] for m in metas)}
        finally:
            cluster.close()


#: ``benchmarks/run.py controller-write --smoke``: a size that finishes in seconds (CI runs it).
SMOKE_ARGS = ["--n", "20"]


def run(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(prog="controller-write")
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--dir", default=None, help="where the journals live (default: the temp dir)")
    args = parser.parse_args(argv)
    config = ControllerConfig(snapshot_threshold=200)
    directory = args.dir or tempfile.gettempdir()
    raw = _raw_fsync_latencies(directory, args.n)
    ctrl, extra = _controller_latencies(config, args.n, directory, journal_fsync=True)
    nofsync, _ = _controller_latencies(config, args.n, directory, journal_fsync=False)
    bare = _bare_latencies(config, args.n)
    p50, bare_p50 = statistics.median(ctrl), statistics.median(bare)
    nofsync_p50, raw_p50 = statistics.median(nofsync), statistics.median(raw)
    return {
        "n": args.n,
        "p50_ms": round(p50, 3),
        "p99_ms": round(_pct(ctrl, 0.99), 3),
        "nofsync_p50_ms": round(nofsync_p50, 3),
        "nofsync_p99_ms": round(_pct(nofsync, 0.99), 3),
        "fsync_ratio": round(p50 / nofsync_p50, 3),
        "fsync_p99_ratio": round(_pct(ctrl, 0.99) / _pct(nofsync, 0.99), 3),
        "raw_fsync_p50_ms": round(raw_p50, 3),
        "raw_fsync_p99_ms": round(_pct(raw, 0.99), 3),
        "p50_over_raw_fsync": round(p50 / raw_p50, 3) if raw_p50 > 0 else None,
        "bare_pysyncobj_p50_ms": round(bare_p50, 3),
        "bare_pysyncobj_p99_ms": round(_pct(bare, 0.99), 3),
        "ratio": round(p50 / bare_p50, 3),
        "journal_dir": directory,
        "append_entries_period_ms": config.append_entries_period_ms,
        "tick_period_ms": config.tick_period_ms,
        "snapshot_threshold": config.snapshot_threshold,
        **extra,
    }
