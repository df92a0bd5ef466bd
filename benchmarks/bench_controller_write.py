"""Controller write latency: elections committed on a 3-node loopback group, one writer and many.

Each sample is one `ElectMasterRequest` (the first election of a fresh broker set, so it commits
one ElectMasterEvent) through the leader pipeline: decide, propose, journal, replicate, apply,
answer. Measured in one run, on the same disk, in ``--rounds`` rounds whose order rotates (each
round starts fresh groups; the figures pool every round's samples):

- ``p50_ms``/``p99_ms``: the controller as shipped (journal fsynced before acks and before the
  leader counts itself, group commit), one writer;
- ``nofsync_p50_ms``/``nofsync_p99_ms``: the same group with ``journal_fsync=False`` (what the
  durability costs is ``fsync_ratio`` = p50 / nofsync p50);
- ``raw_fsync_p50_ms``/``raw_fsync_p99_ms``: a bare 64-byte write + fsync on that disk (a write
  needs at least one leader fsync and one follower fsync, partly overlapped);
- ``bare_pysyncobj_*``: a bare pysyncobj group with the same Raft timing whose replicated method
  does nothing (its journal is in memory), called from the leader; ``ratio`` = p50 / bare p50,
  target ``target_ratio`` (``target_met``); ``nofsync_ratio`` = nofsync p50 / bare p50 is what the
  controller costs beyond Raft when the journal's fsync is taken out;
- ``concurrent_*``: ``--clients`` threads (default 16) each writing back to back (``--per-client``
  elections each) on the fsynced controller, and ``bare_concurrent_*`` the same threads calling
  the bare group: p50/p99 per write, writes per second, and ``concurrent_ratio`` = p50 / bare p50;
  ``concurrent_syncs_per_write`` shows the group commit (3 nodes, below 3 when writes share fsyncs);
- ``journal_syncs_per_write``: journal fsyncs summed over the 3 nodes per single-writer write;
- ``notls_*`` (``--tls-baseline``, on by default): the shipped controller with TLS off on the Raft
  port (development mode: pysyncobj's password, the members' secret), single writer and
  concurrent; ``tls_ratio`` = p50 / notls p50 and ``tls_concurrent_ratio`` likewise is what TLS
  costs a write.

All three groups run in this one process, so their nodes share one GIL: what a node does in
Python delays the others, which the bare group (no decide, no apply, no journal) does not pay.

    python benchmarks/run.py controller-write [--n 300] [--rounds 3] [--clients 16] [--no-tls-baseline] [--json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from typing import Any, Callable

from pysyncobj import SyncObj, SyncObjConf, replicated

from rocketray import ports
from rocketray.wire.controller_api import ApplyBrokerIdRequest, ElectMasterRequest, RegisterBrokerRequest
from rocketray.controller.config import ControllerConfig
from rocketray.controller.proc import InProcessControllers


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class _Bare(SyncObj):
    def __init__(self, self_addr: str, others: list[str], conf: SyncObjConf) -> None:
        super().__init__(self_addr, others, conf)

    @replicated
    def noop(self, payload: bytes) -> bool:
        return True


def _bare_group(config: ControllerConfig) -> tuple[list[_Bare], _Bare]:
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
    deadline = time.monotonic() + 20
    leader = None
    while leader is None and time.monotonic() < deadline:
        leader = next((x for x in nodes if x._isLeader()), None)
        time.sleep(0.01)
    if leader is None:
        for x in nodes:
            x.destroy()
        raise AssertionError("bare pysyncobj group elected no leader")
    for _ in range(20):
        leader.noop(b"warm", sync=True, timeout=5)
    return nodes, leader


def _bare_write(leader: _Bare) -> float:
    done = threading.Event()
    started = time.perf_counter()
    leader.noop(b"x" * 64, callback=lambda res, err: done.set())
    assert done.wait(5), "bare no-op not committed"
    return (time.perf_counter() - started) * 1000


def _concurrently(clients: int, per_client: int, write: Callable[[int, int], float]) -> tuple[list[float], float]:
    """``clients`` threads each calling ``write(client, i)`` ``per_client`` times back to back:
    (every latency in ms, writes per second over the whole burst)."""
    out: list[float] = []
    errors: list[BaseException] = []
    start = threading.Barrier(clients + 1)

    def client(k: int) -> None:
        start.wait()
        try:
            for i in range(per_client):
                out.append(write(k, i))
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    began = time.perf_counter()
    for t in threads:
        t.join(120)
    elapsed = time.perf_counter() - began
    if errors:
        raise errors[0]
    return out, clients * per_client / elapsed


def _bare_round(config: ControllerConfig, n: int, clients: int, per_client: int) -> dict[str, Any]:
    nodes, leader = _bare_group(config)
    try:
        single = [_bare_write(leader) for _ in range(n)]
        conc, rate = _concurrently(clients, per_client, lambda k, i: _bare_write(leader)) if clients else ([], 0.0)
        return {"single": single, "concurrent": conc, "rate": rate}
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


def _prepare(leader: Any, names: list[str], clients: int) -> None:
    """Register every broker set (concurrently, the pipeline takes them in any order)."""
    workers = max(1, clients)

    def setup(k: int, i: int) -> float:
        j = k + i * workers
        if j < len(names):
            name = names[j]
            assert leader.handle(ApplyBrokerIdRequest("c", name, 1, f"{name}:1;1")).ok
            assert leader.handle(RegisterBrokerRequest("c", name, 1, f"{name}:1")).ok
        return 0.0

    _concurrently(workers, -(-len(names) // workers), setup)


def _elect(leader: Any, name: str) -> float:
    started = time.perf_counter()
    resp = leader.handle(ElectMasterRequest.of_broker_trigger("c", name, 1))
    elapsed = (time.perf_counter() - started) * 1000
    assert resp.ok, resp
    return elapsed


def _controller_round(config: ControllerConfig, n: int, directory: str, journal_fsync: bool,
                      clients: int, per_client: int, tls: bool = True) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-cw-", dir=directory) as tmp:
        cluster = InProcessControllers(tmp, ports.free_ports(3), config, tls=tls, alive=lambda name, bid: True,
                                       journal_fsync=journal_fsync)
        try:
            leader = cluster.wait_leader(20)
            conc_names = [[f"c{k}-{i}" for i in range(per_client)] for k in range(clients)]
            _prepare(leader, [f"g{i}" for i in range(n + 20)] + [x for row in conc_names for x in row], clients)
            for i in range(20):
                _elect(leader, f"g{n + i}")
            syncs_before = sum(node.metadata()["journal_syncs"] for node in cluster.running())
            single = [_elect(leader, f"g{i}") for i in range(n)]
            syncs_mid = sum(node.metadata()["journal_syncs"] for node in cluster.running())
            conc, rate = (_concurrently(clients, per_client, lambda k, i: _elect(leader, conc_names[k][i]))
                          if clients else ([], 0.0))
            metas = [node.metadata() for node in cluster.running()]
            syncs_end = sum(m["journal_syncs"] for m in metas)
            return {"single": single, "concurrent": conc, "rate": rate,
                    "syncs": syncs_mid - syncs_before, "concurrent_syncs": syncs_end - syncs_mid,
                    "max_tick_ms": max(m["max_tick_ms"] for m in metas),
                    "max_snapshot_ms": max(m["max_snapshot_ms"] for m in metas),
                    "max_snapshot_tick_ms": max(m["max_snapshot_tick_ms"] for m in metas),
                    "snapshots_saved": sum(m["snapshots_saved"] for m in metas)}
        finally:
            cluster.close()


#: ``benchmarks/run.py controller-write --smoke``: a size that finishes in seconds (CI runs it).
SMOKE_ARGS = ["--n", "20", "--rounds", "1", "--clients", "4", "--per-client", "5"]


TARGET_RATIO = 1.3   # target: a controller write within 1.3x a bare pysyncobj write, same run


def _median_of(rounds: list[dict[str, Any]], key: str) -> list[float]:
    return [x for r in rounds for x in r[key]]


def _tls_figures(runs: dict[str, list[dict[str, Any]]], ctrl: list[float], clients: int) -> dict[str, Any]:
    """The TLS-off group's figures and the ratios of the shipped (TLS) group to it."""
    off = _median_of(runs["notls"], "single")
    out: dict[str, Any] = {"notls_p50_ms": round(statistics.median(off), 3), "notls_p99_ms": round(_pct(off, 0.99), 3),
                           "tls_ratio": round(statistics.median(ctrl) / statistics.median(off), 3),
                           "tls_p99_ratio": round(_pct(ctrl, 0.99) / _pct(off, 0.99), 3)}
    if clients:
        conc, off_conc = _median_of(runs["ctrl"], "concurrent"), _median_of(runs["notls"], "concurrent")
        rate = statistics.median(r["rate"] for r in runs["ctrl"])
        off_rate = statistics.median(r["rate"] for r in runs["notls"])
        out.update({"notls_concurrent_p50_ms": round(statistics.median(off_conc), 3),
                    "notls_concurrent_writes_per_s": round(off_rate, 1),
                    "tls_concurrent_ratio": round(statistics.median(conc) / statistics.median(off_conc), 3),
                    "tls_concurrent_rate_ratio": round(rate / off_rate, 3)})
    return out


def run(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(prog="controller-write")
    parser.add_argument("--n", type=int, default=300, help="single-writer writes per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=16, help="concurrent writers (0: skip)")
    parser.add_argument("--per-client", type=int, default=40, help="writes per concurrent writer per round")
    parser.add_argument("--dir", default=None, help="where the journals live (default: the temp dir)")
    parser.add_argument("--tls-baseline", action=argparse.BooleanOptionalAction, default=True,
                        help="also run the controller with TLS off on the Raft port (notls_*) in this run")
    args = parser.parse_args(argv)
    # Election timing loose enough that a tick starved on a loaded machine costs no leadership
    # (a leader change mid-run fails the run); it does not enter a write's latency. Both groups.
    config = ControllerConfig(snapshot_threshold=200, raft_min_timeout_ms=2000, raft_max_timeout_ms=4000,
                              connection_timeout_ms=5000, leader_fallback_timeout_ms=8000,
                              request_timeout_ms=20000)
    directory = args.dir or tempfile.gettempdir()
    raw = _raw_fsync_latencies(directory, args.n)
    runs: dict[str, list[dict[str, Any]]] = {"ctrl": [], "nofsync": [], "bare": []}
    makers = {
        "ctrl": lambda: _controller_round(config, args.n, directory, True, args.clients, args.per_client),
        "nofsync": lambda: _controller_round(config, args.n, directory, False, 0, 0),
        "bare": lambda: _bare_round(config, args.n, args.clients, args.per_client),
    }
    if args.tls_baseline:
        runs["notls"] = []
        makers["notls"] = lambda: _controller_round(config, args.n, directory, True, args.clients, args.per_client,
                                                    tls=False)
    order = list(makers)
    for r in range(args.rounds):
        turn = r % len(order)
        for name in order[turn:] + order[:turn]:
            runs[name].append(makers[name]())
    ctrl, nofsync, bare = (_median_of(runs[k], "single") for k in ("ctrl", "nofsync", "bare"))
    p50, bare_p50 = statistics.median(ctrl), statistics.median(bare)
    nofsync_p50, raw_p50 = statistics.median(nofsync), statistics.median(raw)
    n_total = args.n * args.rounds
    out: dict[str, Any] = {
        "n": args.n,
        "rounds": args.rounds,
        "p50_ms": round(p50, 3),
        "p99_ms": round(_pct(ctrl, 0.99), 3),
        "round_p50_ms": [round(statistics.median(r["single"]), 3) for r in runs["ctrl"]],
        "nofsync_p50_ms": round(nofsync_p50, 3),
        "nofsync_p99_ms": round(_pct(nofsync, 0.99), 3),
        "fsync_ratio": round(p50 / nofsync_p50, 3),
        "fsync_p99_ratio": round(_pct(ctrl, 0.99) / _pct(nofsync, 0.99), 3),
        "raw_fsync_p50_ms": round(raw_p50, 3),
        "raw_fsync_p99_ms": round(_pct(raw, 0.99), 3),
        "p50_over_raw_fsync": round(p50 / raw_p50, 3) if raw_p50 > 0 else None,
        "bare_pysyncobj_p50_ms": round(bare_p50, 3),
        "bare_pysyncobj_p99_ms": round(_pct(bare, 0.99), 3),
        "bare_round_p50_ms": [round(statistics.median(r["single"]), 3) for r in runs["bare"]],
        "ratio": round(p50 / bare_p50, 3),
        "nofsync_ratio": round(nofsync_p50 / bare_p50, 3),
        "target_ratio": TARGET_RATIO,
        "target_met": p50 <= TARGET_RATIO * bare_p50,
        "journal_syncs_per_write": round(sum(r["syncs"] for r in runs["ctrl"]) / n_total, 2),
        "journal_dir": directory,
        "append_entries_period_ms": config.append_entries_period_ms,
        "tick_period_ms": config.tick_period_ms,
        "snapshot_threshold": config.snapshot_threshold,
        "max_tick_ms": max(r["max_tick_ms"] for r in runs["ctrl"]),
        "max_snapshot_ms": max(r["max_snapshot_ms"] for r in runs["ctrl"]),
        "max_snapshot_tick_ms": max(r["max_snapshot_tick_ms"] for r in runs["ctrl"]),
        "snapshots_saved": sum(r["snapshots_saved"] for r in runs["ctrl"]),
    }
    if args.tls_baseline:
        out.update(_tls_figures(runs, ctrl, args.clients))
    if args.clients:
        conc, bare_conc = _median_of(runs["ctrl"], "concurrent"), _median_of(runs["bare"], "concurrent")
        conc_p50, bare_conc_p50 = statistics.median(conc), statistics.median(bare_conc)
        out.update({
            "clients": args.clients,
            "per_client": args.per_client,
            "concurrent_p50_ms": round(conc_p50, 3),
            "concurrent_p99_ms": round(_pct(conc, 0.99), 3),
            "concurrent_writes_per_s": round(statistics.median(r["rate"] for r in runs["ctrl"]), 1),
            "concurrent_syncs_per_write": round(sum(r["concurrent_syncs"] for r in runs["ctrl"]) / len(conc), 2),
            "bare_concurrent_p50_ms": round(bare_conc_p50, 3),
            "bare_concurrent_p99_ms": round(_pct(bare_conc, 0.99), 3),
            "bare_concurrent_writes_per_s": round(statistics.median(r["rate"] for r in runs["bare"]), 1),
            "concurrent_ratio": round(conc_p50 / bare_conc_p50, 3),
        })
    return out
