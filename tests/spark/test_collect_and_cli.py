"""Collection through Ray Data into Spark, and the ``rocketray analytics`` command end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from rocketray.spark_on_ray.collect import FILES, KINDS, SCHEMAS, CollectError, records_to_arrow, split_history

# -- pure normalisation (no Spark) ----------------------------------------------------------------


def test_records_normalise_idents_times_and_missing_nullable_keys():
    # Integer and string identifiers both become strings; times keep their fraction of a ms (the
    # checker compares them unrounded); absent nullable keys are null.
    table = records_to_arrow("history", [
        {"op_id": 7, "process": 3, "f": "send", "group": "g", "queue_id": 0, "payload_id": 42,
         "start_ms": 1.6, "end_ms": 2, "outcome": "ok"},
        {"op_id": "r-1", "process": "c", "f": "read", "group": "g", "queue_id": 1, "payload_id": "42",
         "queue_offset": 5, "physical_offset": 500, "start_ms": 3, "end_ms": 4, "outcome": "ok", "broker_id": 2},
    ])
    assert table.schema == SCHEMAS["history"]
    got = table.to_pylist()
    assert [r["op_id"] for r in got] == ["7", "r-1"] and [r["payload_id"] for r in got] == ["42", "42"]
    assert got[0]["start_ms"] == 1.6 and got[1]["end_ms"] == 4.0
    assert got[0]["queue_offset"] is None and got[0]["broker_id"] is None


def test_replica_epoch_entries_become_structs_and_controller_event_extras_are_kept():
    # [epoch, start, end] lists become structs; event fields other than the known ones survive as JSON.
    reps = records_to_arrow("replicas", [{"group": "g", "broker_id": 1, "role": "MASTER", "master_epoch": 2,
                                          "epoch_entries": [[1, 0, 10], [2, 10, 2**63 - 1]], "min_offset": 0,
                                          "max_offset": 20, "confirm_offset": 20}]).to_pylist()
    assert reps[0]["epoch_entries"][1] == {"epoch": 2, "start_offset": 10, "end_offset": 2**63 - 1}
    ev = records_to_arrow("controller_events", [{"index": 1, "time_ms": 5, "type": "AlterSyncStateSetEvent",
                                                 "broker_name": "g", "new_sync_state_set": [1, 2]}]).to_pylist()
    assert json.loads(ev[0]["fields_json"]) == {"broker_name": "g", "new_sync_state_set": [1, 2]}


def test_consumer_group_rows_of_the_history_become_their_own_kinds(consumer_group_rows):
    # deliver and progress rows leave the history for their own tables; commit and consumer rows are
    # not analysed and are dropped; sends and reads stay.
    send = {"op_id": 1, "process": "p", "f": "send", "group": "g", "queue_id": 0, "payload_id": "x",
            "start_ms": 1, "end_ms": 2, "outcome": "ok"}
    got = split_history({"history": [send, *consumer_group_rows]})
    assert got["history"] == [send]
    assert [r["f"] for r in got["deliveries"]] == ["deliver"] * 5
    assert [r["f"] for r in got["consumer_progress"]] == ["progress"] * 4
    table = records_to_arrow("deliveries", got["deliveries"])
    assert table.schema == SCHEMAS["deliveries"] and table.column("time_ms").to_pylist()[0] == 1000.0
    assert records_to_arrow("consumer_progress", got["consumer_progress"]).column("committed").to_pylist() == [
        0, 10, 0, 5]
    # every other row kind of the workload (verify/group_history.GROUP_FUNCTIONS) is dropped too
    others = [{"f": "assign", "process": "c", "consumer_group": "g", "topic": "T", "queue_id": 0,
               "event": "assigned", "poll": 1, "time_ms": 5},
              {"f": "sample", "consumer_group": "g", "broker_group": "b", "outcome": "ok", "start_ms": 1, "end_ms": 2},
              {"f": "group", "consumer_group": "g", "topic": "T", "members": 2, "time_ms": 0},
              {"f": "drain", "consumer_group": "g", "outcome": "ok", "lag": 0, "time_ms": 9}]
    assert split_history({"history": [send, *others]})["history"] == [send]


def test_a_record_missing_a_required_key_is_rejected_with_its_kind_and_index():
    # A nemesis line without time_ms names the kind and the record number.
    with pytest.raises(CollectError, match="nemesis record 1"):
        records_to_arrow("nemesis", [{"time_ms": 1, "kind": "heal"}, {"kind": "heal"}])


# -- through Ray Data and RayDP --------------------------------------------------------------------


def _plain(nested):
    """A nested cell of toPandas (None, or an array of Rows / dicts / lists) as plain Python."""
    return [] if nested is None else [dict(x) if hasattr(x, "keys") else list(x) for x in nested]


@pytest.mark.slow
def test_run_dir_and_live_records_give_the_same_dataframes(spark, tiny_run, tiny_records):
    # Reading the run directory (the checker's reader) and handing live lists over yield equal tables.
    from rocketray.spark_on_ray.collect import collect_records, collect_run_dir

    from_dir = collect_run_dir(tiny_run, spark)
    live = collect_records(tiny_records, spark)
    for kind in FILES:
        a = from_dir.as_dict()[kind].toPandas()
        b = live.as_dict()[kind].toPandas()
        assert list(a.columns) == SCHEMAS[kind].names
        assert len(a) == len(tiny_records[kind]) > 0, kind
        nested = ("epoch_entries", "queues")
        key = [c for c in a.columns if c not in nested]
        a, b = a.sort_values(key).reset_index(drop=True), b.sort_values(key).reset_index(drop=True)
        pd.testing.assert_frame_equal(a[key], b[key])
        for col in (c for c in nested if c in a.columns):
            assert [_plain(v) for v in a[col]] == [_plain(v) for v in b[col]], col
    queues = {(r["group"], r["broker_id"]): [q.asDict() for q in r["queues"]]
              for r in from_dir.replicas.collect()}
    assert queues[("b", 1)] == [{"topic": "T", "queue_id": 0, "min_offset": 0, "max_offset": 11, "visible_offset": 10}]
    assert queues[("a", 3)] == []


@pytest.mark.slow
def test_run_dir_without_optional_files_gives_empty_tables(spark, tmp_path, tiny_records):
    # Only history.jsonl and replicas.json are required; the rest come back empty with their schema.
    from rocketray.spark_on_ray.collect import collect_run_dir

    run = tmp_path / "bare"
    run.mkdir()
    (run / "history.jsonl").write_text("\n".join(json.dumps(r) for r in tiny_records["history"][:3]) + "\n")
    (run / "replicas.json").write_text(json.dumps(tiny_records["replicas"]))
    tables = collect_run_dir(run, spark)
    assert tables.history.count() == 3 and tables.samples.count() == 0
    assert tables.samples.columns == SCHEMAS["samples"].names
    with pytest.raises(CollectError, match="replicas.json"):
        (run / "replicas.json").unlink()
        collect_run_dir(run, spark)


@pytest.mark.slow
def test_cli_analytics_on_a_constructed_run_reports_the_known_truth(spark, tiny_run, tiny_truth, tmp_path, capsys):
    # End to end: `rocketray analytics --run DIR --json` finds the constructed epochs, faults, losses and split brain,
    # prints the tables, and writes Parquet, CSV, PNG charts and the HTML report.
    from rocketray.cli import main as cli

    out = tmp_path / "out"
    assert cli.main(["analytics", "--run", str(tiny_run), "--out", str(out), "--json"]) == 0
    stdout = capsys.readouterr().out
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["ok"] is True
    for key in ("epochs", "failovers", "failover_ms_p50", "split_brain_epochs", "lost_messages"):
        assert summary[key] == tiny_truth[key], key
    assert summary["epochs_by_group"] == tiny_truth["epochs_by_group"]
    assert summary["duplicated_messages"] == 1 and summary["bytes_truncated"] == 100
    assert "== delivery" in stdout and "== failovers" in stdout and "== split_brain (1 rows)" in stdout

    outputs = [Path(p) for p in summary["outputs"]]
    assert all(p.exists() and p.stat().st_size > 0 for p in outputs)
    names = {p.name for p in outputs}
    for table in ("epoch_timeline", "failovers", "split_brain", "delivery", "lost_messages", "replication_lag"):
        assert {f"{table}.parquet", f"{table}.csv"} <= names
    charts = ("epoch_timeline.png", "replication_lag.png", "failovers.png", "consumer_lag.png", "redeliveries.png")
    assert {*charts, "report.html"} <= names
    for png in charts:
        assert (out / "charts" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lost = pd.read_parquet(out / "tables" / "lost_messages.parquet")
    assert sorted(lost["payload_id"]) == ["a5", "b7"]
    timeline = pd.read_csv(out / "tables" / "epoch_timeline.csv")
    assert len(timeline) == tiny_truth["epochs"] and (timeline["bytes"] > 0).all()
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 5 and "split brain" in html
    # a run without consumer-group rows: their tables are written, empty, and the summary says so
    for table in ("consumer_lag", "consumer_lag_summary", "redeliveries", "redelivery_totals"):
        assert len(pd.read_parquet(out / "tables" / f"{table}.parquet")) == 0, table
    assert (summary["consumer_groups"], summary["max_consumer_lag"], summary["redeliveries"]) == ([], None, 0)


@pytest.mark.slow
def test_analytics_of_a_run_with_consumer_groups_reports_lag_and_redeliveries(spark, tiny_run_with_groups, tmp_path,
                                                                              group_truth, tiny_truth):
    # The tiny run plus two consumer groups' rows in its history (conftest GROUP_TRUTH): the report
    # has their lag over time and the redeliveries around each of the three master kills.
    from rocketray.spark_on_ray import pipeline

    GROUP_TRUTH, TINY_TRUTH = group_truth, tiny_truth  # noqa: N806 - read like the constants they are

    summary, frames = pipeline.analyse_run_dir(tiny_run_with_groups, tmp_path / "out", spark)
    for key in ("consumer_groups", "max_consumer_lag", "redeliveries", "redeliveries_near_failovers"):
        assert summary[key] == GROUP_TRUTH[key], key
    assert summary["failovers"] == TINY_TRUTH["failovers"] and summary["lost_messages"] == TINY_TRUTH["lost_messages"]
    lag = frames["consumer_lag"]
    assert list(zip(lag["consumer_group"], lag["bucket_ms"], lag["lag"])) == GROUP_TRUTH["lag"]
    redeliveries = frames["redeliveries"]
    assert {(int(r.fault_id), r.consumer_group): int(r.redeliveries) for r in redeliveries.itertuples()} == \
        GROUP_TRUTH["redeliveries_by_failover"]
    html = (tmp_path / "out" / "report.html").read_text()
    assert "consumer lag summary" in html and "redeliveries" in html


@pytest.mark.slow
def test_multi_chunk_arrow_blocks_reach_spark_intact(spark):
    # Regression: under pandas 3 a block whose string columns have several Arrow chunks broke PySpark 3.5's
    # conversion ("Expected Array, got ChunkedArray"); ray_dataset_to_spark combines chunks per block.
    import pyarrow as pa
    import ray

    from rocketray.spark_on_ray.collect import dataset_to_spark, records_to_arrow

    rows = [{"time_ms": i, "kind": "kill-master", "phase": "start", "target": f"t{i}", "group": f"g{i % 3}"}
            for i in range(300)]
    chunked = pa.concat_tables([records_to_arrow("nemesis", rows[:100]), records_to_arrow("nemesis", rows[100:])])
    assert chunked.column("target").num_chunks == 2
    ds = ray.data.from_arrow([chunked, records_to_arrow("nemesis", rows[:5])])
    df = dataset_to_spark(spark, "nemesis", ds)
    assert df.count() == 305 and df.where("group = 'g1'").count() == 100 + 2


def test_the_constructed_run_follows_the_contract_of_the_chaos_reader(tiny_run, tiny_records):
    # The hand-built run directory is read without complaint by the chaos package's strict reader.
    from rocketray.verify.run_dir import read_run_dir
    run = read_run_dir(tiny_run)
    assert len(run.ops) == len(tiny_records["history"]) and len(run.replicas) == len(tiny_records["replicas"])


def test_run_dir_is_read_by_the_checkers_reader(tiny_run, tiny_records, tmp_path):
    # No Spark: the run directory's records come from verify/run_dir.py, so a line the checker would
    # refuse is refused here too, naming the file and the line.
    import shutil

    from rocketray.spark_on_ray.collect import run_dir_records

    got = run_dir_records(tiny_run)
    assert {k: len(v) for k, v in got.items()} == {k: len(tiny_records.get(k, [])) for k in KINDS}
    bad = tmp_path / "bad"
    shutil.copytree(tiny_run, bad)
    with open(bad / "history.jsonl", "a") as fh:
        fh.write(json.dumps({**tiny_records["history"][0], "outcome": "maybe"}) + "\n")
    with pytest.raises(CollectError, match=r"history\.jsonl:\d+: key 'outcome' must be one of"):
        run_dir_records(bad)
    (bad / "replicas.json").unlink()
    with pytest.raises(CollectError, match="replicas.json is missing"):
        run_dir_records(bad)
