"""The analytics and the chaos checker read the same real run and agree on what happened."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_analytics_agree_with_the_checker_on_a_real_chaos_run(spark, tmp_path):
    """A short real `rocketray chaos --target brokers` run (master kills) saved to a directory, then
    analysed by Spark on Ray: the lost count equals the checker's, there is one failover row per
    master kill (as many as the checker timed), and the epoch timeline has one row per master the
    controller elected (its event log), which covers every epoch in the replicas' epoch files."""
    from rocketray.verify.checker import check_run_dir
    from rocketray.verify.run_dir import read_controller_events, read_nemesis, read_replicas
    from rocketray.spark_on_ray import pipeline

    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "rocketray.cli", "chaos", "--target", "brokers", "--duration", "25",
                           "--seed", "3", "--nemesis", "kill-master", "--groups", "1", "--out", str(run), "--json"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    printed = json.loads(proc.stdout.strip().splitlines()[-1])
    verdict = check_run_dir(run).to_json()
    assert verdict["valid"] and printed["lost"] == verdict["lost"]

    summary, frames = pipeline.analyse_run_dir(run, tmp_path / "analytics", spark)
    assert summary["lost_messages"] == verdict["lost"] == 0
    kills = [e for e in read_nemesis(run / "nemesis.jsonl") if e.kind == "kill-master" and e.phase == "start"]
    assert kills, "the schedule killed at least one master"
    fo = frames["failovers"]
    assert len(fo[fo["kind"] == "kill-master"]) == len(kills)
    assert verdict["failover_ms"]["count"] + verdict["failover_ms"].get("unrecovered", 0) == len(kills)
    # the analytics' failovers are the checker's: the same duration for every master kill
    from rocketray.verify.checker import failover_times
    from rocketray.verify.run_dir import read_run_dir

    data = read_run_dir(run)
    _, details = failover_times(data.ops, data.nemesis)
    # (the analytics keep the history's float wall-clock times: a send started in the kill's own
    # millisecond but before it must not count, as the checker says)
    spark_ms = sorted(float(x) for x in fo["failover_ms"].dropna())
    checker_ms = sorted(float(d["failover_ms"]) for d in details if d["failover_ms"] is not None)
    assert len(spark_ms) == len(checker_ms) and all(abs(a - b) <= 1e-6 for a, b in zip(spark_ms, checker_ms)), \
        (spark_ms, checker_ms)
    # An epoch is a master term the controller elected (docs/analytics.md): the run saved the
    # controllers' whole event log, so the timeline is exactly its elections of a master, and every
    # epoch in the replicas' epoch files is one of them.
    events = read_controller_events(run / "controller_events.jsonl")
    elected = [e for e in events if e.type == "ElectMasterEvent"]
    terms = {(e.fields["broker_name"], e.fields["master_epoch"]) for e in elected if e.fields["new_master_elected"]}
    timeline = {(str(g), int(e)) for g, e in zip(frames["epoch_timeline"]["group"], frames["epoch_timeline"]["epoch"])}
    on_disk = {(r.group, e[0]) for r in read_replicas(run / "replicas.json") for e in r.epoch_entries}
    sampled = sorted({(s.group, s.master_epoch, s.role) for s in data.samples})
    evidence = {"timeline": sorted(timeline), "elected": sorted(terms), "on_disk": sorted(on_disk),
                "sampled (group, epoch, role)": sampled,
                "elections": [(e.index, e.fields["master_epoch"], e.fields["new_master_elected"]) for e in elected]}
    assert timeline == terms and summary["epochs"] == len(terms), evidence
    assert on_disk <= terms, evidence
    assert summary["controller_elections"] == len(elected) >= len(kills)
