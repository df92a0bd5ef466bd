"""Offset and epoch analytics on Spark-on-Ray (RayDP) against the same aggregations in pandas.

A synthetic chaos run (default 1,000,000 history records: sends plus reads, and ~10,000 epoch
entries over 10 groups of 3 replicas, with planted lost, duplicated and split-brain cases) is
analysed end to end after Spark is up: Arrow tables -> Ray Datasets -> Spark DataFrames (RayDP)
-> every analysis of ``rocketray.spark_on_ray.analyses`` -> pandas results on the driver. The baseline runs
the same aggregations in pandas on the same data in the same process. Both must find the planted
truth (``agree``). ``ratio`` = Spark seconds / pandas seconds at the largest size: lower is better
(on one executor core Spark is expected to be slower; its point is scaling out on the cluster).

``--records N`` (default 1000000) also measures 100,000 when N is larger; ``--epochs E`` (default
10000) epoch entries in total; ``--groups G`` (default 10); ``--warmup-records W`` (default 20000)
records in the unmeasured warm-up pass, 0 for none (the smoke size: its one size is then charged
with the one-off costs).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

REPLICAS = 3
SIZE = 100
EPOCH_MS = 1_000
LOST_EVERY = 10_007
DUP_EVERY = 20_011
SPLIT_EVERY = 97


def synthetic_run(records: int, epoch_entries: int, groups: int, seed: int = 7) -> tuple[dict[str, pd.DataFrame],
                                                                                          dict[str, Any]]:
    """Pandas frames of every record kind but the consumer-group ones (collect.SCHEMAS columns) and the
    planted truth."""
    rng = np.random.default_rng(seed)
    groups = max(1, groups)
    epochs = max(2, epoch_entries // (groups * REPLICAS))
    sends = records // 2
    per_group = sends // groups
    sends = per_group * groups
    g_idx = np.repeat(np.arange(groups), per_group)
    k = np.tile(np.arange(per_group), groups)
    epoch = (k * epochs // per_group + 1).astype(np.int64)
    if per_group < epochs:
        raise ValueError(f"{records} records are too few for {epochs} epochs in each of {groups} groups")
    first_k = np.searchsorted(np.arange(per_group) * epochs // per_group + 1, np.arange(1, epochs + 1))
    offset_in_epoch = k - first_k[epoch - 1]
    end_ms = 1_000_000 + epoch * EPOCH_MS + 200 + (offset_in_epoch * (EPOCH_MS - 300)) // np.maximum(
        1, np.diff(np.append(first_k, per_group))[epoch - 1])
    group_names = np.array([f"g{i:02d}" for i in range(groups)])
    master = (epoch - 1) % REPLICAS + 1
    send_df = pd.DataFrame({
        "op_id": np.char.add("s", np.arange(sends).astype(str)), "process": "producer",
        "f": "send", "group": group_names[g_idx], "queue_id": 0,
        "payload_id": np.char.add(np.char.add(group_names[g_idx], "-"), k.astype(str)),
        "queue_offset": k, "physical_offset": k * SIZE, "start_ms": end_ms - 5, "end_ms": end_ms,
        "outcome": "ok", "broker_id": master, "error": None})
    lost_mask = (np.arange(sends) % LOST_EVERY) == 3
    dup_mask = (np.arange(sends) % DUP_EVERY) == 5
    reads = send_df.loc[~lost_mask].copy()
    dups = send_df.loc[dup_mask & ~lost_mask].copy()
    dups["queue_offset"] = dups["queue_offset"] + per_group  # stored a second time further on
    reads = pd.concat([reads, dups], ignore_index=True)
    reads["f"], reads["process"], reads["broker_id"] = "read", "consumer", None
    reads["op_id"] = np.char.add("r", np.arange(len(reads)).astype(str))
    reads["start_ms"] = 9_000_000
    reads["end_ms"] = 9_000_001
    history = pd.concat([send_df, reads], ignore_index=True)

    starts = first_k * SIZE
    ends = np.append(starts[1:], per_group * SIZE)
    replica_rows, split = [], 0
    for g in range(groups):
        for r in range(1, REPLICAS + 1):
            entries = []
            for e in range(1, epochs + 1):
                s = int(starts[e - 1])
                if r == 2 and g == 0 and e % SPLIT_EVERY == 0:
                    s += 1
                    split += 1
                entries.append({"epoch": e, "start_offset": s, "end_offset": int(ends[e - 1])})
            entries[-1]["end_offset"] = 2**63 - 1
            replica_rows.append({"group": group_names[g], "broker_id": r,
                                 "role": "MASTER" if r == master[-1] else "SLAVE", "master_epoch": epochs,
                                 "epoch_entries": entries, "min_offset": 0, "max_offset": per_group * SIZE,
                                 "confirm_offset": per_group * SIZE, "queues": []})
    replicas = pd.DataFrame(replica_rows)

    e_all = np.arange(1, epochs + 1)
    kill_ms = 1_000_000 + e_all[1:] * EPOCH_MS + 50 + (e_all[1:] % 7) * 10  # failovers of 90..150 ms
    nemesis = pd.DataFrame({"time_ms": np.tile(kill_ms, groups), "kind": "kill-master", "phase": "start",
                            "target": "master", "group": np.repeat(group_names, epochs - 1)})
    samp = []
    for g in range(groups):
        for e in map(int, e_all):
            for r in range(1, REPLICAS + 1):
                for frac in (0.3, 0.8):
                    t = 1_000_000 + int(e) * EPOCH_MS + int(frac * EPOCH_MS) + r
                    top = int(starts[e - 1] + frac * (ends[e - 1] - starts[e - 1]))
                    behind = 0 if r == (e - 1) % REPLICAS + 1 else int(rng.integers(0, 5)) * SIZE
                    role = "MASTER" if r == (e - 1) % REPLICAS + 1 else "SLAVE"
                    samp.append((t, group_names[g], r, role, int(e), max(0, top - behind),
                                 max(0, top - behind - SIZE)))
    samples = pd.DataFrame(samp, columns=["time_ms", "group", "broker_id", "role", "master_epoch", "max_offset",
                                          "confirm_offset"])
    events = pd.DataFrame({"index": np.arange(groups * epochs), "time_ms": np.tile(1_000_000 + e_all * EPOCH_MS,
                                                                                   groups),
                           "type": "ElectMasterEvent", "broker_name": np.repeat(group_names, epochs),
                           "new_master_elected": True,
                           "new_master_broker_id": np.tile((e_all - 1) % REPLICAS + 1, groups), "fields_json": "{}"})
    events["seq"] = 0
    events["master_broker_id"] = events["new_master_broker_id"]
    events["master_epoch"] = np.tile(e_all, groups)
    events["sync_state_set_epoch"] = 1
    truth = {"records": len(history), "epoch_entries": groups * epochs * REPLICAS, "epochs": groups * epochs,
             "failovers": groups * (epochs - 1), "lost": int(lost_mask.sum()), "split_brain": split,
             "duplicated": int((dup_mask & ~lost_mask).sum())}
    frames = {"history": history, "nemesis": nemesis, "replicas": replicas, "samples": samples,
              "controller_events": events}
    return frames, truth


# -- the pandas baseline: the same aggregations ------------------------------------------------------

def pandas_analyses(f: dict[str, pd.DataFrame]) -> dict[str, Any]:
    h = f["history"]
    h = h[h["payload_id"].notna()]
    sends = h[h["f"] == "send"]
    acked = sends[sends["outcome"] == "ok"].groupby(["group", "payload_id"]).size().rename("acked")
    rd = h[(h["f"] == "read") & (h["outcome"] == "ok")]
    reads = rd.groupby(["group", "payload_id"]).agg(reads=("op_id", "size"),
                                                      positions=("queue_offset", "nunique"))
    fate = pd.concat([acked, reads], axis=1).fillna(0)
    dup = (fate["positions"] > 1) | ((fate["positions"] == 0) & (fate["reads"] > 1))
    lost = (fate["acked"] > 0) & (fate["reads"] == 0)
    delivery = pd.DataFrame({"lost": lost, "duplicated": dup & (fate["reads"] > 0)}).groupby(level="group").sum()

    # the checker's failover: a master kill -> the earliest ack of a send started at or after it
    nem = f["nemesis"]
    kills = nem[(nem["kind"] == "kill-master") & (nem["phase"] == "start")].sort_values("time_ms")
    acks = sends[sends["outcome"] == "ok"][["group", "start_ms", "end_ms"]].sort_values("start_ms")
    acks["ack_ms"] = acks[::-1].groupby("group")["end_ms"].cummin()
    fo = pd.merge_asof(kills, acks[["group", "start_ms", "ack_ms"]], left_on="time_ms", right_on="start_ms",
                       by="group", direction="forward", allow_exact_matches=True)
    fo["failover_ms"] = fo["ack_ms"] - fo["time_ms"]

    rep = f["replicas"].explode("epoch_entries", ignore_index=True)
    ent = pd.concat([rep[["group", "broker_id"]], pd.json_normalize(rep["epoch_entries"].tolist())], axis=1)
    by_epoch = ent.groupby(["group", "epoch"]).agg(starts=("start_offset", "nunique"),
                                                   start=("start_offset", "min"))
    s = f["samples"].sort_values(["group", "broker_id", "time_ms"])
    masters = s[s["role"] == "MASTER"].groupby(["group", "master_epoch"])["broker_id"].nunique()
    split = by_epoch["starts"].gt(1).sum() + int((masters > 1).sum())
    s["prev"] = s.groupby(["group", "broker_id"])["max_offset"].shift()
    truncated = (s["max_offset"] < s["prev"]).sum()
    s2 = f["samples"].sort_values("time_ms")
    m = s2[s2["role"] == "MASTER"][["time_ms", "group", "max_offset"]]
    lag = pd.merge_asof(s2, m.rename(columns={"max_offset": "master_max"}), on="time_ms", by="group")
    lag["lag_bytes"] = (lag["master_max"] - lag["max_offset"]).clip(lower=0)
    lag_summary = lag.groupby(["group", "broker_id"])["lag_bytes"].agg(["max", "mean"])
    return {"epochs": len(by_epoch), "failovers": len(fo), "lost": int(delivery["lost"].sum()),
            "duplicated": int(delivery["duplicated"].sum()), "split_brain": int(split),
            "truncations": int(truncated), "failover_ms_p50": float(fo["failover_ms"].median()),
            "lag_rows": len(lag_summary)}


# -- the Spark side ------------------------------------------------------------------------------------

def spark_analyses(spark: Any, frames: dict[str, pd.DataFrame]) -> tuple[dict[str, Any], float]:
    """Arrow -> Ray Dataset -> Spark -> every analysis -> pandas. Returns (numbers, collect seconds)."""
    import ray.data

    from rocketray.spark_on_ray import analyses, report
    from rocketray.spark_on_ray.collect import (KINDS, ROWS_PER_BLOCK, SCHEMAS, Tables, dataset_to_spark, spark_schema,
                                                to_transport)

    t0 = time.monotonic()
    dfs = {}
    for kind, pdf in frames.items():
        table = to_transport(kind, pa.Table.from_pandas(pdf, schema=SCHEMAS[kind], preserve_index=False))
        blocks = [table.slice(i, ROWS_PER_BLOCK) for i in range(0, max(1, table.num_rows), ROWS_PER_BLOCK)]
        dfs[kind] = dataset_to_spark(spark, kind, ray.data.from_arrow(blocks)).persist()
    for kind in KINDS:  # the synthetic run has no consumer-group rows: those tables are empty
        if kind not in dfs:
            dfs[kind] = spark.createDataFrame([], spark_schema(kind))
    tables = Tables(**dfs)
    for df in dfs.values():
        df.count()
    collect_s = time.monotonic() - t0
    out = report.to_pandas(analyses.analyse(tables, persist=True))
    for df in dfs.values():
        df.unpersist()
    fo = out["failovers"]
    numbers = {"epochs": len(out["epoch_timeline"]), "failovers": len(fo),
               "lost": int(out["delivery"]["lost"].sum()), "duplicated": int(out["delivery"]["duplicated"].sum()),
               "split_brain": int(len(out["split_brain"])), "truncations": int(len(out["truncations"])),
               "failover_ms_p50": float(fo["failover_ms"].median()), "lag_rows": len(out["lag_summary"])}
    return numbers, collect_s


#: ``benchmarks/run.py analytics --smoke``: a size that finishes in seconds (CI runs it).
SMOKE_ARGS = ["--records", "20000", "--epochs", "300", "--groups", "2", "--warmup-records", "0"]


def run(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(prog="bench analytics")
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--epochs", type=int, default=10_000)
    ap.add_argument("--groups", type=int, default=10)
    ap.add_argument("--warmup-records", type=int, default=20_000,
                    help="history records of the unmeasured warm-up pass (0: none; the smoke size skips it)")
    args = ap.parse_args(argv)

    import logging

    import ray

    from rocketray.spark_on_ray.session import spark_session, start_seconds

    sizes = sorted({min(100_000, args.records), args.records})
    result: dict[str, Any] = {"records": args.records, "epoch_entries": args.epochs}
    # A private local Ray (never someone else's running cluster), sized like the tests'.
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=1024**3, logging_level=logging.WARNING,
             log_to_driver=False)
    try:
        result.update(_measure(args, sizes, spark_session, start_seconds))
    finally:
        ray.shutdown()
    result["ratio"] = round(result["spark_s"] / max(result["pandas_s"], 1e-9), 2)
    return result


def _measure(args: argparse.Namespace, sizes: list[int], spark_session: Any, start_seconds: Any) -> dict[str, Any]:
    result: dict[str, Any] = {}
    with spark_session() as spark:
        result["spark_start_s"] = round(start_seconds() or 0.0, 2)
        # Warm-up (not measured as a size): Python workers, JIT and code paths, so the first size is not
        # charged with one-off costs.
        if args.warmup_records > 0:
            t0 = time.monotonic()
            spark_analyses(spark, synthetic_run(args.warmup_records, 300, 2)[0])
            result["spark_warmup_s"] = round(time.monotonic() - t0, 2)
        agree = True
        for n in sizes:
            frames, truth = synthetic_run(n, args.epochs, args.groups)
            t0 = time.monotonic()
            got_spark, collect_s = spark_analyses(spark, frames)
            spark_s = time.monotonic() - t0
            t0 = time.monotonic()
            got_pandas = pandas_analyses(frames)
            pandas_s = time.monotonic() - t0
            keys = ("epochs", "failovers", "lost", "duplicated", "split_brain")
            ok = all(got_spark[k] == got_pandas[k] == truth[k] for k in keys)
            ok = ok and got_spark["failover_ms_p50"] == got_pandas["failover_ms_p50"]
            agree = agree and ok
            tag = f"{n // 1000}k"
            print(f"bench analytics {tag}: spark {spark_s:.1f}s (collect {collect_s:.1f}s), pandas {pandas_s:.2f}s, "
                  f"agree {ok}", file=sys.stderr, flush=True)
            result[f"spark_s_{tag}"] = round(spark_s, 2)
            result[f"spark_collect_s_{tag}"] = round(collect_s, 2)
            result[f"pandas_s_{tag}"] = round(pandas_s, 3)
            result[f"agree_{tag}"] = ok
            if not ok:
                result[f"mismatch_{tag}"] = {"truth": truth, "spark": got_spark, "pandas": got_pandas}
            result["history_records"] = truth["records"]
            result["epoch_entries"] = truth["epoch_entries"]
            result["spark_s"], result["pandas_s"] = round(spark_s, 2), round(pandas_s, 3)
    result["agree"] = agree
    return result
