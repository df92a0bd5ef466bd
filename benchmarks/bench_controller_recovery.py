"""Controller restart time: snapshot + journal tail vs full journal replay.

A single-node group (it commits alone, so building big logs is fast) applies N events, one event
per log entry: 500 broker sets are created, then SyncStateSet changes cycle over them (a realistic
controller: few sets, long history). The node is closed and restarted; the figure is the time
from constructing the node until its state is rebuilt up to the last applied entry (checked equal
to the state before the restart). Done twice per size: with snapshots (`snapshot_threshold`
1000, the default) and without (threshold out of reach: full journal replay, what RocketMQ's
DLedger controller does at HEAD). `ratio` = with-snapshot restart / full-replay restart at the
largest size (lower is better).

    python benchmarks/run.py controller-recovery [--sizes 10000,100000] [--full] [--json]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

from rocketray import ports
from rocketray.controller.config import ControllerConfig
from rocketray.controller.events import AlterSyncStateSetEvent, ApplyBrokerIdEvent, encode_events
from rocketray.controller.node import ControllerNode
from rocketray.controller.proc import member_credentials
from rocketray.controller.raft import encode_payload

SETS = 500


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.002)


def _event(i: int):
    if i < SETS:
        return ApplyBrokerIdEvent("c", f"g{i}", f"h{i}:1", f"h{i}:1;1", 1)
    return AlterSyncStateSetEvent(f"g{i % SETS}", frozenset({1}) if i % 2 else frozenset({1, 2}))


def _fill(node: ControllerNode, n: int) -> None:
    """Append n one-event entries, pipelined (a benchmark shortcut around the request pipeline)."""
    term = node._raft.raftCurrentTerm
    window = threading.Semaphore(2000)
    failures = []

    def done(result, error):
        if error != 0 or result is not True:
            failures.append(error)
        window.release()

    for i in range(n):
        window.acquire()
        node._raft.apply_batch(encode_payload(term, encode_events([_event(i)]), int(time.time() * 1000)), callback=done)
    for _ in range(2000):
        window.acquire()
    assert not failures, f"{len(failures)} appends failed: {failures[:3]}"


def _measure(store: Path, n: int, threshold: int) -> dict:
    address = f"127.0.0.1:{ports.free_port()}"
    config = ControllerConfig(snapshot_threshold=threshold, raft_min_timeout_ms=100, raft_max_timeout_ms=200,
                              connection_timeout_ms=1000)
    credentials = member_credentials(1)[0]
    node = ControllerNode({0: address}, store, config, credentials=credentials)
    _wait(node.is_leader, 30, "single node leader")
    _fill(node, n)
    last = node._raft.raftLastApplied
    expected = node.snapshot_state()
    max_tick_ms = node.metadata()["max_tick_ms"]
    max_snapshot_ms = node.metadata()["max_snapshot_ms"]
    max_snapshot_tick_ms = node.metadata()["max_snapshot_tick_ms"]
    node.close()
    started = time.perf_counter()
    node = ControllerNode({0: address}, store, config, credentials=credentials)
    _wait(lambda: node._raft.raftLastApplied >= last and node.applied_index >= last - 1, 600, "replay")
    elapsed_ms = (time.perf_counter() - started) * 1000
    assert node.snapshot_state() == expected, "state after restart differs"
    meta = node.metadata()
    node.close()
    return {"restart_ms": round(elapsed_ms, 1), "snapshot_index": meta["snapshot_loaded_index"],
            "journal_entries": meta["journal_len"], "max_tick_ms": max_tick_ms,
            "max_snapshot_ms": max_snapshot_ms, "max_snapshot_tick_ms": max_snapshot_tick_ms}


#: ``benchmarks/run.py controller-recovery --smoke``: a size that finishes in seconds (CI runs it).
SMOKE_ARGS = ["--sizes", "1000"]


def run(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(prog="controller-recovery")
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--full", action="store_true", help="add 1,000,000 events")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")] + ([1_000_000] if args.full else [])
    result: dict = {"sizes": sizes}
    with tempfile.TemporaryDirectory(prefix="bench-cr-") as tmp:
        for n in sizes:
            snap = _measure(Path(tmp) / f"snap-{n}", n, 1000)
            full = _measure(Path(tmp) / f"full-{n}", n, 2 ** 40)
            result[f"restart_ms_snapshot_{n}"] = snap["restart_ms"]
            result[f"restart_ms_full_replay_{n}"] = full["restart_ms"]
            result[f"journal_entries_replayed_snapshot_{n}"] = snap["journal_entries"]
            result[f"max_tick_ms_snapshot_{n}"] = snap["max_tick_ms"]
            result[f"max_snapshot_ms_{n}"] = snap["max_snapshot_ms"]
            result[f"max_snapshot_tick_ms_{n}"] = snap["max_snapshot_tick_ms"]
    largest = sizes[-1]
    result["ratio"] = round(result[f"restart_ms_snapshot_{largest}"] / result[f"restart_ms_full_replay_{largest}"], 4)
    return result
