"""`rocketray analytics --live` on a real running cluster sharing the Ray (and Spark) of the test session."""

from __future__ import annotations

import json

import pytest

from rr_testing import wait_until

pytestmark = pytest.mark.slow


def test_live_analytics_reads_a_running_cluster(spark, tmp_path, capsys):
    """Start a small cluster on the same Ray, write through it, then analyse it live: the epoch
    table is built from the replicas' epoch entries and samples gathered through Ray, and agrees
    with what the cluster reports."""
    from rocketray.cli import main as cli
    from rocketray.actors.cluster import start_cluster
    from rocketray.actors.pipeline import Workload, settle

    cluster = start_cluster("analytics-live", controllers=1, groups=1, replicas=2,
                            data_dir=str(tmp_path / "data"), profile="fast")
    try:
        Workload(cluster).produce(200)
        settle(cluster)
        wait_until(lambda: len(cluster.analytics_records()["samples"]) >= 4, 30, what="a few samples per replica")
        records = cluster.analytics_records()
        epochs = {(r["group"], e[0]) for r in records["replicas"] for e in r["epoch_entries"]}
        # The controllers' event log came along: every epoch a replica holds was an election in it,
        # and the newest election names the current master and its epoch.
        elected = [e for e in records["controller_events"] if e["type"] == "ElectMasterEvent"]
        assert epochs <= {(e["broker_name"], e["master_epoch"]) for e in elected}
        master = next(r for r in records["replicas"] if r["role"] == "MASTER")   # Role by name (docs/contracts.md)
        assert (elected[-1]["master_broker_id"], elected[-1]["master_epoch"]) == (master["broker_id"],
                                                                                   master["master_epoch"])
        assert all(e["time_ms"] > 0 for e in records["controller_events"])
        # Consume-queue positions came along too: after settle every replica serves the same entries.
        visible = [{(q["topic"], q["queue_id"]): q["visible_offset"] for q in r["queues"]} for r in records["replicas"]]
        assert len(visible) == 2 and visible[0] == visible[1] and sum(visible[0].values()) >= 200
        out = tmp_path / "out"
        capsys.readouterr()
        assert cli.main(["analytics", "--live", "--name", "analytics-live", "--out", str(out), "--json"]) == 0
        summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert summary["ok"] and summary["epochs"] == len(epochs) >= 1
        assert summary["split_brain_epochs"] == 0 and summary["controller_elections"] == len(elected)
        assert summary["queues"] == len(visible[0]) and summary["max_queue_entries_behind"] == 0
        assert (out / "report.html").exists() and summary["outputs"]
    finally:
        cluster.stop(delete_data=True)
