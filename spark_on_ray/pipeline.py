"""End to end: collected tables -> analyses -> files, charts, HTML and one summary dict.

This is the glue the ``rocketray analytics`` command (and the benchmark, and a driver) calls; it
assumes a Spark session is up (``session.spark_session``) and knows nothing about actors.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Mapping, TextIO

import pandas as pd

from rocketray.spark_on_ray import analyses, report
from rocketray.spark_on_ray.collect import Tables, collect_records, collect_run_dir

#: Tables printed to the terminal, in this order (the rest are only written to files).
PRINTED = ("delivery", "failovers", "other_faults", "epoch_timeline", "elections", "split_brain", "truncation_summary",
           "lag_summary", "lost_messages", "consumer_lag_summary", "redelivery_totals", "redeliveries")
PRINT_MAX_ROWS = 30


def _int_or_none(value: Any) -> int | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return int(value)


def summarize(frames: Mapping[str, pd.DataFrame]) -> dict[str, Any]:
    """The headline numbers of a run, from the collected result tables (JSON-ready)."""
    timeline = frames["epoch_timeline"]
    fo = frames["failovers"]
    durations = fo["failover_ms"].dropna() if len(fo) else pd.Series(dtype="float64")
    delivery = frames["delivery"]
    lag = frames["lag_summary"]
    truncs = frames["truncation_summary"]
    queues = frames["queue_positions"]

    def total(df: pd.DataFrame, col: str) -> int:
        return int(df[col].fillna(0).sum()) if len(df) else 0

    return {
        "groups": sorted(set(timeline["group"]) | set(delivery["group"])) if len(timeline) + len(delivery) else [],
        "epochs": int(len(timeline)),
        "epochs_by_group": {str(g): int(n) for g, n in timeline.groupby("group").size().items()},
        "failovers": int(len(fo)),
        "failovers_recovered": int(fo["recovered"].sum()) if len(fo) else 0,
        "failover_ms_p50": float(durations.median()) if len(durations) else None,
        "failover_ms_max": float(durations.max()) if len(durations) else None,
        "other_faults": fault_summary(frames["other_faults"]),
        "split_brain_epochs": int(len(frames["split_brain"])),
        "controller_elections": int(len(frames["elections"])),
        "acknowledged": total(delivery, "acknowledged"),
        "consumed": total(delivery, "consumed"),
        "lost_messages": total(delivery, "lost"),
        "duplicated_messages": total(delivery, "duplicated"),
        "diverged_epoch_entries": int((frames["replica_agreement"]["status"] == "diverged").sum())
        if len(frames["replica_agreement"]) else 0,
        "truncations": total(truncs, "truncations"),
        "bytes_truncated": total(truncs, "bytes_truncated"),
        "max_lag_bytes": _int_or_none(lag["max_lag_bytes"].max()) if len(lag) else None,
        "queues": int(len(queues[["group", "topic", "queue_id"]].drop_duplicates())) if len(queues) else 0,
        "max_queue_entries_behind": _int_or_none(queues["behind_reference"].max()) if len(queues) else None,
        **consumer_group_summary(frames),
    }


def consumer_group_summary(frames: Mapping[str, pd.DataFrame]) -> dict[str, Any]:
    """Consumer groups seen, their largest lag, and redeliveries (all, and near a failover)."""
    lag = frames["consumer_lag_summary"]
    totals = frames["redelivery_totals"]
    groups = sorted({str(g) for g in [*lag["consumer_group"], *totals["consumer_group"]]})
    return {
        "consumer_groups": groups,
        "max_consumer_lag": _int_or_none(lag["max_lag"].max()) if len(lag) else None,
        "max_consumer_lag_by_group": {str(r.consumer_group): _int_or_none(r.max_lag) for r in lag.itertuples()},
        "redeliveries": int(totals["redeliveries"].fillna(0).sum()) if len(totals) else 0,
        "redeliveries_near_failovers": int(totals["redeliveries_near_failovers"].fillna(0).sum())
        if len(totals) else 0,
    }


def fault_summary(faults: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Per fault kind: rows (fault x group hit), how many recovered, and the median recovery in ms."""
    out: dict[str, dict[str, Any]] = {}
    if not len(faults):
        return out
    for kind, rows in faults.groupby("kind"):
        durations = rows["recovery_ms"].dropna()
        out[str(kind)] = {"count": int(len(rows)), "recovered": int(rows["recovered"].sum()),
                          "recovery_ms_p50": float(durations.median()) if len(durations) else None}
    return out


def analyse_tables(tables: Tables, out_dir: str | Path, title: str = "rocketray analytics") -> tuple[
        dict[str, Any], dict[str, pd.DataFrame]]:
    """Run every analysis, write tables/charts/HTML under ``out_dir``; return (summary, frames)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    cached = [df.persist() for df in tables.as_dict().values()]
    try:
        frames = report.to_pandas(analyses.analyse(tables, persist=True))
    finally:
        for df in cached:
            df.unpersist()
    analysis_s = time.monotonic() - t0
    summary = summarize(frames)
    written = report.write_tables(frames, out)
    charts = report.draw_charts(frames, out)
    summary["analysis_s"] = round(analysis_s, 3)
    html = report.write_html(frames, charts, summary, out / "report.html", title)
    summary["outputs"] = [str(p) for p in [*written, *charts.values(), html]]
    return summary, frames


def analyse_run_dir(run_dir: str | Path, out_dir: str | Path, spark: Any = None) -> tuple[
        dict[str, Any], dict[str, pd.DataFrame]]:
    """``collect_run_dir`` then ``analyse_tables``."""
    tables = collect_run_dir(run_dir, spark)
    return analyse_tables(tables, out_dir, title=f"rocketray analytics: {Path(run_dir).name}")


def analyse_live(records: Mapping[str, list[dict[str, Any]]], out_dir: str | Path, spark: Any = None) -> tuple[
        dict[str, Any], dict[str, pd.DataFrame]]:
    """``collect_records`` then ``analyse_tables``."""
    return analyse_tables(collect_records(records, spark), out_dir, title="rocketray analytics: live cluster")


def print_tables(frames: Mapping[str, pd.DataFrame], stream: TextIO) -> None:
    """The main tables as text, each headed by its name and row count."""
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        for name in PRINTED:
            df = frames.get(name)
            if df is None:
                continue
            print(f"\n== {name} ({len(df)} rows) ==", file=stream)
            if len(df) == 0:
                print("(empty)", file=stream)
            else:
                print(df.head(PRINT_MAX_ROWS).to_string(index=False), file=stream)
                if len(df) > PRINT_MAX_ROWS:
                    print(f"... {len(df) - PRINT_MAX_ROWS} more rows in the files", file=stream)
