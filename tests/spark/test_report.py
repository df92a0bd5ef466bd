"""Tables, charts and the HTML report from pandas results (no Spark needed), and the summary numbers."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow.parquet as pq

from rocketray.spark_on_ray import pipeline, report


def result_frames(empty: bool = False) -> dict[str, pd.DataFrame]:
    """Minimal result tables shaped like the analyses' outputs (or empty ones with the same columns)."""
    frames = {
        "epoch_timeline": pd.DataFrame({"group": ["a", "a"], "epoch": [1, 2], "master_broker_id": [1, 2],
                                        "start_offset": [0, 100], "end_offset": [100, 250], "bytes": [100, 150],
                                        "start_ms": [1000, 2000], "end_ms": pd.array([2000, None], "Int64"),
                                        "duration_ms": pd.array([1000, None], "Int64")}),
        "replica_agreement": pd.DataFrame({"group": ["a"], "broker_id": [2], "epoch": [1], "status": ["diverged"]}),
        "split_brain": pd.DataFrame({"group": ["a"], "epoch": [2], "start_offsets": [[100, 120]],
                                     "masters": [[1, 2]], "reason": ["two start offsets; two masters"]}),
        "truncation_summary": pd.DataFrame({"group": ["a"], "broker_id": [2], "truncations": [1],
                                            "bytes_truncated": [20]}),
        "replication_lag": pd.DataFrame({"time_ms": [1000, 1500, 1500], "group": ["a"] * 3, "broker_id": [1, 1, 2],
                                         "master_max_offset": [50, 90, 90], "lag_bytes": [0, 0, 40]}),
        "lag_summary": pd.DataFrame({"group": ["a"], "broker_id": [2], "max_lag_bytes": [40]}),
        "failovers": pd.DataFrame({"fault_id": [1, 2, 3], "kill_ms": [1500, 2500, 2600], "kind": ["kill-master"] * 3,
                                   "group": ["a"] * 3, "first_ack_ms": pd.array([2000, 2900, None], "Int64"),
                                   "failover_ms": pd.array([500, 400, None], "Int64"),
                                   "recovered": [True, True, False]}),
        "other_faults": pd.DataFrame({"fault_id": [1, 2, 3], "fault_ms": [1800, 3000, 3000],
                                      "kind": ["kill-broker", "kill-controller-leader", "kill-controller-leader"],
                                      "target": ["a/2", "c0", "c0"], "group": ["a", "a", "b"],
                                      "first_ack_ms": pd.array([2000, 3100, None], "Int64"),
                                      "recovery_ms": pd.array([200, 100, None], "Int64"),
                                      "recovered": [True, True, False]}),
        "delivery": pd.DataFrame({"group": ["a"], "acknowledged": [10], "consumed": [9], "lost": [1],
                                  "duplicated": [0]}),
        "lost_messages": pd.DataFrame({"group": ["a"], "payload_id": ["a7"]}),
        "queue_positions": pd.DataFrame({"group": ["a", "a"], "broker_id": [1, 2], "role": ["MASTER", "SLAVE"],
                                         "topic": ["T", "T"], "queue_id": [0, 0], "min_offset": [0, 0],
                                         "max_offset": [10, 9], "visible_offset": [10, 7],
                                         "hidden_entries": [0, 2], "behind_reference": [0, 3]}),
        "elections": pd.DataFrame({"group": ["a", "a"], "epoch": [1, 2], "elected_ms": [900, 2300],
                                   "new_master_elected": [True, True], "elected_broker_id": [1, 2]}),
        "consumer_lag": pd.DataFrame({"consumer_group": ["billing"] * 3 + ["audit"],
                                      "bucket_ms": [1000, 2000, 3000, 2000],
                                      "lag": [40, 90, 10, 7], "queues": [2, 2, 2, 1], "stale_queues": [0, 1, 0, 0],
                                      "committed": [10, 10, 90, 0], "max_offset": [50, 100, 100, 7]}),
        "consumer_lag_summary": pd.DataFrame({"consumer_group": ["audit", "billing"], "buckets": [1, 3],
                                              "max_lag": [7, 90], "max_lag_bucket_ms": [2000, 2000],
                                              "final_lag": [7, 10], "queues": [1, 2]}),
        "redeliveries": pd.DataFrame({"fault_id": [1, 1, 2, 2], "kill_ms": [1500, 1500, 2500, 2500],
                                      "target": ["a/1", "a/1", "a/2", "a/2"], "group": ["a"] * 4,
                                      "consumer_group": ["audit", "billing"] * 2,
                                      "window_start_ms": [-500, -500, 500, 500],
                                      "window_end_ms": [11500, 11500, 12500, 12500],
                                      "deliveries": [3, 9, 3, 9], "redeliveries": [0, 4, 0, 4]}),
        "redelivery_totals": pd.DataFrame({"consumer_group": ["audit", "billing"], "deliveries": [3, 12],
                                           "payloads": [3, 6], "redeliveries": [0, 6], "redelivered_payloads": [0, 5],
                                           "redeliveries_near_failovers": [0, 4]}),
    }
    if empty:
        frames = {name: df.iloc[0:0] for name, df in frames.items()}
    return frames


def test_summary_counts_epochs_faults_split_brain_and_losses():
    # p50 over recovered faults only (500 and 400 -> 450); the unrecovered one still counts as a failover.
    s = pipeline.summarize(result_frames())
    assert (s["epochs"], s["failovers"], s["failovers_recovered"], s["failover_ms_p50"]) == (2, 3, 2, 450.0)
    assert (s["split_brain_epochs"], s["lost_messages"], s["diverged_epoch_entries"], s["bytes_truncated"]) == (1, 1, 1,
                                                                                                              20)
    assert s["controller_elections"] == 2 and (s["queues"], s["max_queue_entries_behind"]) == (1, 3)
    # other faults are reported under their own kind, never mixed into the failover figures
    assert s["other_faults"] == {"kill-broker": {"count": 1, "recovered": 1, "recovery_ms_p50": 200.0},
                                 "kill-controller-leader": {"count": 2, "recovered": 1, "recovery_ms_p50": 100.0}}
    # consumer groups: the largest lag of any group, redeliveries in all and near a failover
    assert (s["consumer_groups"], s["max_consumer_lag"], s["max_consumer_lag_by_group"]) == (
        ["audit", "billing"], 90, {"audit": 7, "billing": 90})
    assert (s["redeliveries"], s["redeliveries_near_failovers"]) == (6, 4)
    json.dumps(s)  # JSON-ready


def test_summary_of_a_run_without_consumer_groups():
    # An older run (or analytics --live): the consumer-group tables are empty, the summary says so.
    s = pipeline.summarize(result_frames(empty=True))
    assert (s["consumer_groups"], s["max_consumer_lag"], s["redeliveries"], s["redeliveries_near_failovers"]) == (
        [], None, 0, 0)


def test_files_charts_and_html_are_written_even_for_empty_results(tmp_path):
    # Every table as Parquet and CSV (array columns as JSON text in CSV), five PNGs (the consumer-lag and
    # redelivery charts say "no ... in this run" when empty), one self-contained HTML.
    for empty in (False, True):
        out = tmp_path / ("empty" if empty else "full")
        frames = result_frames(empty)
        written = report.write_tables(frames, out)
        charts = report.draw_charts(frames, out)
        html = report.write_html(frames, charts, pipeline.summarize(frames), out / "report.html", "t")
        assert len(written) == 2 * len(frames) and all(p.stat().st_size > 0 for p in written)
        assert all(p.read_bytes()[:4] == b"\x89PNG" for p in charts.values())
        assert set(charts) == {"epoch_timeline", "replication_lag", "failovers", "consumer_lag", "redeliveries"}
        assert html.read_text().count("data:image/png;base64,") == 5
        assert ("consumer lag summary" in html.read_text()) and ("redelivery totals" in html.read_text())
    full = tmp_path / "full" / "tables"
    assert pq.read_table(full / "split_brain.parquet").column("start_offsets").to_pylist() == [[100, 120]]
    assert json.loads(pd.read_csv(full / "split_brain.csv")["masters"][0]) == [1, 2]
