"""Spark-on-Ray test fixtures: one RayDP session for the whole test session, constructed runs.

RayDP takes 10-30 s to start and allows one session per process, so every spark test shares the
session-scoped ``spark`` fixture (a real local Ray with 2 CPUs and a small object store).
``tiny_run`` is a hand-built chaos run directory whose right answers are written next to it in
``TINY_TRUTH``: the analyses must find exactly those numbers.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable

import pytest

#: PySpark 3.5 under pandas 3 warns on every Arrow conversion (LooseVersion, astype copy=...); noise here.
SPARK_WARNING_FILTERS = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::pandas.errors.PandasChangeWarning"),
]


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            for mark in SPARK_WARNING_FILTERS:
                item.add_marker(mark)


# -- a hand-built run with known answers -------------------------------------------------------
#
# Group "a" (brokers 1, 2, 3), 100-byte messages:
#   epoch 1: master 1 from offset 0, payloads a0..a9 acknowledged at 1000..1900 (offsets 0..1000);
#            broker 1 also wrote a 101st..110th byte range (offset 1000..1100) that was never acked.
#   t=2000 kill-master a/1.  epoch 2: master 2 from offset 1000; a10..a19 acked at 2500..3400.
#            broker 1 comes back as a slave and truncates 1100 -> 1000 (100 bytes) at t=3000.
#   t=4000 kill-master a/2.  epoch 3: master 3 from offset 2000; a20..a24 acked at 4800..5200.
#   a5 is never read (lost); a12 is read at two queue offsets (duplicated).
# Group "b" (brokers 1, 2): split brain in epoch 2.
#   epoch 1: master 1 from 0, b0..b4 acked at 1000..1400 (0..500).
#   t=2000 kill-master b/1.  epoch 2: broker 2 starts it at 500, but broker 1 (back, still
#            believing it is master) records epoch 2 at 600 and both sample as master in epoch 2.
#            b5..b9 acked at 2300..2700 (500..1000). b7 is never read (lost).
# t=6000 kill-controller-leader (no group): first acks after it: a at 6200, b at 6400.
# Failovers (master kills, as the checker counts them): a 500, 800; b 300 -> 3, p50 500 ms.
# The controller kill is another fault, reported under its own kind: a 200, b 400.

TINY_TRUTH = {
    "epochs": 5,
    "epochs_by_group": {"a": 3, "b": 2},
    "failovers": 3,
    "failover_ms": {("a", 2000): 500, ("a", 4000): 800, ("b", 2000): 300},
    "failover_ms_p50": 500.0,
    "other_faults_ms": {("kill-controller-leader", "a", 6000): 200, ("kill-controller-leader", "b", 6000): 400},
    "split_brain_epochs": 1,
    "lost": {"a": ["a5"], "b": ["b7"]},
    "lost_messages": 2,
    "duplicated": {"a": ["a12"]},
    "truncated_bytes": {("a", 1): 100},
    "masters": {("a", 1): 1, ("a", 2): 2, ("a", 3): 3, ("b", 1): 1},
}

SIZE = 100


def _op(op_id: int, f: str, group: str, payload: str, offset: int | None, start_ms: int, end_ms: int,
        outcome: str = "ok", broker_id: int | None = None, queue_offset: int | None = None) -> dict[str, Any]:
    return {"op_id": op_id, "process": f"{f}er-{group}", "f": f, "group": group, "queue_id": 0,
            "payload_id": payload, "queue_offset": queue_offset if queue_offset is not None
            else (None if offset is None else offset // SIZE),
            "physical_offset": offset, "start_ms": start_ms, "end_ms": end_ms, "outcome": outcome,
            "broker_id": broker_id, "error": None if outcome == "ok" else "FLUSH_SLAVE_TIMEOUT"}


def tiny_run_records() -> dict[str, list[dict[str, Any]]]:
    """The records of the hand-built run above, keyed by record kind."""
    history: list[dict[str, Any]] = []
    op = iter(range(1, 10_000))

    def send(group: str, i: int, at_ms: int, master: int) -> None:
        history.append(_op(next(op), "send", group, f"{group}{i}", i * SIZE, at_ms - 50, at_ms, "ok", master))

    for i in range(10):
        send("a", i, 1000 + 100 * i, 1)
    # an in-flight send to the old master fails when it is killed (not acked, never stored)
    history.append(_op(next(op), "send", "a", "a-x", None, 1990, 2010, "failed", 1))
    for i in range(10, 20):
        send("a", i, 2500 + 100 * (i - 10), 2)
    for i in range(20, 25):
        send("a", i, 4800 + 100 * (i - 20), 3)
    history.append(_op(next(op), "send", "a", "a25", 25 * SIZE, 6150, 6200, "ok", 3))
    for i in range(5):
        send("b", i, 1000 + 100 * i, 1)
    for i in range(5, 10):
        send("b", i, 2300 + 100 * (i - 5), 2)
    history.append(_op(next(op), "send", "b", "b10", 10 * SIZE, 6350, 6400, "ok", 2))
    # reads after heal: everything acknowledged except a5 and b7; a12 twice at different offsets
    t = 9000
    for group, n in (("a", 26), ("b", 11)):
        for i in range(n):
            if f"{group}{i}" in ("a5", "b7"):
                continue
            history.append(_op(next(op), "read", group, f"{group}{i}", i * SIZE, t, t + 1))
            t += 2
    history.append(_op(next(op), "read", "a", "a12", 30 * SIZE, t, t + 1, queue_offset=30))

    nemesis = [
        {"time_ms": 2000, "kind": "kill-master", "phase": "start", "target": "a/1", "group": "a"},
        {"time_ms": 2000, "kind": "kill-master", "phase": "start", "target": "b/1", "group": "b"},
        {"time_ms": 3500, "kind": "heal", "phase": "end", "target": None, "group": None},
        {"time_ms": 4000, "kind": "kill-master", "phase": "start", "target": "a/2", "group": "a"},
        {"time_ms": 6000, "kind": "kill-controller-leader", "phase": "start", "target": "controller-0",
         "group": None},
    ]
    big = 2**63 - 1
    replicas = [
        {"group": "a", "broker_id": 3, "role": "MASTER", "master_epoch": 3,
         "epoch_entries": [[1, 0, 1000], [2, 1000, 2000], [3, 2000, big]], "min_offset": 0, "max_offset": 2600,
         "confirm_offset": 2600},
        {"group": "a", "broker_id": 1, "role": "SLAVE", "master_epoch": 3,
         "epoch_entries": [[1, 0, 1000], [2, 1000, 2000], [3, 2000, big]], "min_offset": 0, "max_offset": 2600,
         "confirm_offset": 2600},
        {"group": "a", "broker_id": 2, "role": "SLAVE", "master_epoch": 3,
         "epoch_entries": [[1, 0, 1000], [2, 1000, 2000], [3, 2000, big]], "min_offset": 0, "max_offset": 2600,
         "confirm_offset": 2600},
        {"group": "b", "broker_id": 2, "role": "MASTER", "master_epoch": 2,
         "epoch_entries": [[1, 0, 500], [2, 500, big]], "min_offset": 0, "max_offset": 1100,
         "confirm_offset": 1100,
         "queues": [{"topic": "T", "queue_id": 0, "min_offset": 0, "max_offset": 11, "visible_offset": 11}]},
        {"group": "b", "broker_id": 1, "role": "SLAVE", "master_epoch": 2,
         "epoch_entries": [[1, 0, 600], [2, 600, big]], "min_offset": 0, "max_offset": 1100,
         "confirm_offset": 1000,
         "queues": [{"topic": "T", "queue_id": 0, "min_offset": 0, "max_offset": 11, "visible_offset": 10}]},
    ]
    samples: list[dict[str, Any]] = []

    def sample(t_ms: int, group: str, broker: int, role: str, epoch: int, max_off: int, confirm: int) -> None:
        samples.append({"time_ms": t_ms, "group": group, "broker_id": broker, "role": role,
                        "master_epoch": epoch, "max_offset": max_off, "confirm_offset": confirm})

    # group a: epoch 1 until 2000, epoch 2 from 2400, epoch 3 from 4700
    sample(1500, "a", 1, "MASTER", 1, 600, 500)
    sample(1500, "a", 2, "SLAVE", 1, 500, 500)
    sample(1500, "a", 3, "SLAVE", 1, 400, 400)
    sample(1990, "a", 1, "MASTER", 1, 1100, 1000)
    sample(2400, "a", 2, "MASTER", 2, 1000, 1000)
    sample(2400, "a", 3, "SLAVE", 2, 1000, 1000)
    sample(2600, "a", 1, "SLAVE", 2, 1100, 1000)     # back, not yet truncated
    sample(3000, "a", 1, "SLAVE", 2, 1000, 1000)     # truncated 100 bytes
    sample(3500, "a", 2, "MASTER", 2, 2000, 2000)
    sample(3500, "a", 1, "SLAVE", 2, 1700, 1700)
    sample(3500, "a", 3, "SLAVE", 2, 2000, 2000)
    sample(4700, "a", 3, "MASTER", 3, 2000, 2000)
    sample(5500, "a", 3, "MASTER", 3, 2600, 2600)
    sample(5500, "a", 1, "SLAVE", 3, 2600, 2600)
    # group b: epoch 1 until 2000, epoch 2 from 2250 (broker 2), broker 1 also claims master at 2260
    sample(1500, "b", 1, "MASTER", 1, 500, 500)
    sample(1500, "b", 2, "SLAVE", 1, 500, 500)
    sample(2250, "b", 2, "MASTER", 2, 500, 500)
    sample(2260, "b", 1, "MASTER", 2, 600, 600)
    sample(3000, "b", 2, "MASTER", 2, 1000, 1000)
    sample(3000, "b", 1, "SLAVE", 2, 900, 800)
    controller_events = [
        {"index": 1, "time_ms": 900, "type": "ElectMasterEvent", "new_master_elected": True, "broker_name": "a",
         "new_master_broker_id": 1},
        {"index": 2, "time_ms": 900, "type": "ElectMasterEvent", "new_master_elected": True, "broker_name": "b",
         "new_master_broker_id": 1},
        {"index": 3, "time_ms": 2200, "type": "ElectMasterEvent", "new_master_elected": True, "broker_name": "b",
         "new_master_broker_id": 2},
        {"index": 4, "time_ms": 2300, "type": "ElectMasterEvent", "new_master_elected": True, "broker_name": "a",
         "new_master_broker_id": 2},
        {"index": 5, "time_ms": 2310, "type": "AlterSyncStateSetEvent", "broker_name": "a",
         "new_sync_state_set": [2, 3]},
        {"index": 6, "time_ms": 4600, "type": "ElectMasterEvent", "new_master_elected": True, "broker_name": "a",
         "new_master_broker_id": 3},
    ]
    return {"history": history, "nemesis": nemesis, "replicas": replicas, "samples": samples,
            "controller_events": controller_events}


# -- the consumer-group workload's rows, added to the tiny run -----------------------------------
#
# Two consumer groups read the tiny run's topic T (queue 0). The master kills are at 2000 (a/1,
# failover #1; b/1, #2) and 4000 (a/2, #3), so the redelivery windows are [0, 12000) for #1 and #2
# and [2000, 14000) for #3.
#   billing: a0 at 1000, a1 at 1100, a0 again at 2500 (a redelivery, inside all three windows).
#   audit:   a0 at 1500, a0 again at 13000 (a redelivery, inside #3's window only).
# Progress (lag = max_offset - committed of T/0): billing 10 at 1000, 0 at 2500; audit 10 at 1500,
# nothing in 2000..2999 (its 10 carried), 5 at 3000. Commit and consumer-lifecycle rows are read but
# not analysed.

GROUP_TRUTH = {
    "consumer_groups": ["audit", "billing"],
    "max_consumer_lag": 10,
    "redeliveries": 2,
    "redeliveries_near_failovers": 2,
    "redeliveries_by_failover": {(1, "billing"): 1, (2, "billing"): 1, (3, "billing"): 1,
                                 (1, "audit"): 0, (2, "audit"): 0, (3, "audit"): 1},
    "lag": [("audit", 1000, 10), ("audit", 2000, 10), ("audit", 3000, 5), ("billing", 1000, 10), ("billing", 2000, 0)],
}


def group_rows() -> list[dict[str, Any]]:
    """The consumer-group rows above, shaped like ``history.jsonl`` lines (docs/contracts.md)."""
    def deliver(group: str, payload: str, offset: int, t_ms: int) -> dict[str, Any]:
        return {"f": "deliver", "process": f"{group}-0", "consumer_group": group, "topic": "T", "queue_id": 0,
                "queue_offset": offset, "payload_id": payload, "msg_id": f"M{payload}", "poll_start_ms": t_ms - 20,
                "time_ms": t_ms}

    def progress(group: str, committed: int, max_offset: int, end_ms: int) -> dict[str, Any]:
        return {"f": "progress", "consumer_group": group, "topic": "T", "queue_id": 0, "committed": committed,
                "max_offset": max_offset, "start_ms": end_ms - 10, "end_ms": end_ms}

    return [
        {"f": "consumer", "process": "billing-0", "consumer_group": "billing", "event": "start", "time_ms": 900},
        {"f": "consumer", "process": "audit-0", "consumer_group": "audit", "event": "start", "time_ms": 900},
        deliver("billing", "a0", 0, 1000), deliver("billing", "a1", 1, 1100), deliver("billing", "a0", 0, 2500),
        deliver("audit", "a0", 0, 1500), deliver("audit", "a0", 0, 13000),
        {"f": "commit", "process": "billing-0", "consumer_group": "billing", "topic": "T", "queue_id": 0,
         "offset": 2, "outcome": "ok", "start_ms": 2600, "end_ms": 2610},
        progress("billing", 0, 10, 1000), progress("billing", 10, 10, 2500),
        progress("audit", 0, 10, 1500), progress("audit", 5, 10, 3000),
    ]


def write_run_dir(path: Path, records: dict[str, list[dict[str, Any]]]) -> Path:
    """Write records as a chaos run directory following docs/contracts.md."""
    path.mkdir(parents=True, exist_ok=True)
    for kind in ("history", "nemesis", "samples", "controller_events"):
        with open(path / f"{kind}.jsonl", "w", encoding="utf-8") as fh:
            for rec in records[kind]:
                fh.write(json.dumps(rec) + "\n")
    (path / "replicas.json").write_text(json.dumps(records["replicas"], indent=1), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def spark():
    """A real RayDP session on a small local Ray, shared by every spark test."""
    import ray

    from rocketray.spark_on_ray.session import SparkConfig, spark_session

    started = False
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, object_store_memory=500 * 1024 * 1024,
                 logging_level=logging.WARNING, log_to_driver=False)
        started = True
    try:
        with spark_session(SparkConfig(start_timeout_s=180)) as session:
            yield session
    finally:
        if started:
            ray.shutdown()


@pytest.fixture(scope="session")
def frame(spark) -> Callable[[str, list[dict[str, Any]]], Any]:
    """``frame(kind, rows)``: a small DataFrame of a record kind's schema, built directly in Spark."""
    from rocketray.spark_on_ray.collect import NORMALIZERS, spark_schema

    def build(kind: str, rows: list[dict[str, Any]]) -> Any:
        return spark.createDataFrame([NORMALIZERS[kind](r) for r in rows], spark_schema(kind))

    return build


@pytest.fixture(scope="session")
def tiny_records() -> dict[str, list[dict[str, Any]]]:
    return tiny_run_records()


@pytest.fixture(scope="session")
def tiny_truth() -> dict[str, Any]:
    return TINY_TRUTH


@pytest.fixture
def tiny_run(tmp_path) -> Path:
    return write_run_dir(tmp_path / "run", tiny_run_records())


@pytest.fixture(scope="session")
def consumer_group_rows() -> list[dict[str, Any]]:
    return group_rows()


@pytest.fixture(scope="session")
def group_truth() -> dict[str, Any]:
    return GROUP_TRUTH


@pytest.fixture
def tiny_run_with_groups(tmp_path) -> Path:
    """The tiny run with the consumer-group rows in its history (``GROUP_TRUTH``)."""
    records = tiny_run_records()
    records["history"] = [*records["history"], *group_rows()]
    return write_run_dir(tmp_path / "run-groups", records)
