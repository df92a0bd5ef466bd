"""docs/grafana/rocketray.json: a Grafana dashboard over the metrics rocketray exports through Ray.

Statically: every query names only metrics rocketray defines (actors/metrics.py), and every defined
metric has a panel. Live: a running cluster with traffic exports, through Ray's Prometheus
endpoint on its node, every series the dashboard queries, tagged with the cluster's name.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest

from rocketray.actors.metrics import METRICS, PREFIX

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "docs" / "grafana" / "rocketray.json"
NAME = re.compile(r"\bray_rocketray_[a-z_]+")


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def queried_series() -> set[str]:
    """Every ``ray_rocketray_*`` series name in a panel query or a template variable."""
    d = dashboard()
    exprs = [t["expr"] for p in d["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in d["templating"]["list"] if "definition" in v]
    return {m for e in exprs for m in NAME.findall(e)}


def exported_name(name: str) -> str:
    d = METRICS[name]
    return "ray_" + PREFIX + name + ("_bucket" if d.kind == "histogram" else "")


def test_every_query_names_a_defined_metric_and_every_metric_has_a_panel():
    defined = {exported_name(n) for n in METRICS}
    queried = queried_series()
    assert queried <= defined, f"the dashboard queries metrics rocketray does not define: {sorted(queried - defined)}"
    assert defined <= queried, f"metrics without a panel: {sorted(defined - queried)}"


def test_dashboard_is_importable_shape():
    """What Grafana's import needs: panels with ids, unique titles, a Prometheus datasource variable."""
    d = dashboard()
    assert d["uid"] == "rocketray" and d["title"]
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    assert len({p["title"] for p in d["panels"]}) == len(d["panels"])
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    for p in d["panels"]:
        assert p["datasource"]["uid"] == "${datasource}" and p["targets"], p["title"]
        for t in p["targets"]:
            assert '{cluster=~"$cluster"}' in t["expr"], t["expr"]


def _scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


@pytest.mark.slow
def test_every_series_the_dashboard_queries_is_exported_by_a_running_cluster(tmp_path):
    """One controller and a group of two replicas on a local Ray, traffic and one election (the
    master killed), then every series the dashboard queries appears in Ray's metrics export."""
    import ray

    from rocketray.actors.cluster import start_cluster, wait_for
    from rocketray.actors.pipeline import Workload, kill_master_and_time

    want = queried_series()
    ray.init(include_dashboard=False, logging_level="ERROR", log_to_driver=False,
             object_store_memory=200 * 1024 * 1024, namespace="rocketray-tests-grafana")
    cluster = None
    seen: set[str] = set()
    try:
        cluster = start_cluster("grafana", controllers=1, groups=1, replicas=2, data_dir=str(tmp_path),
                                profile="fast")
        workload = Workload(cluster)
        workload.produce(200)
        kill_master_and_time(cluster, workload, "broker-a")  # an election for controller_elections_total
        workload.produce(200)
        ports = [n["MetricsExportPort"] for n in ray.nodes() if n.get("Alive")]

        def exported():
            for port in ports:
                for line in _scrape(port).splitlines():
                    if line.startswith("ray_rocketray_") and 'cluster="grafana"' in line:
                        seen.add(re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0))
            return want <= seen

        try:
            wait_for(exported, 120, "every series the dashboard queries in Ray's export", interval_s=2)
        except Exception:  # noqa: BLE001 - report what is missing
            pytest.fail(f"queried by the dashboard but not exported: {sorted(want - seen)}; exported {sorted(seen)}")
    finally:
        if cluster is not None:
            cluster.stop(delete_data=True)
        ray.shutdown()
