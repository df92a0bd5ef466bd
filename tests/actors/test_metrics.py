"""Metrics of the actors (actors/metrics.py): what each sample records, which transitions it logs,
and, on a live cluster, that the series reach Ray's Prometheus export as ``ray_rocketray_*``."""

from __future__ import annotations

import re
import urllib.request

import pytest

from rocketray.actors.metrics import METRICS, PREFIX, BrokerMetrics, ControllerMetrics, replication_lags
from rocketray.actors.views import Role

from broker_status_factory import broker_status, controller_metadata as controller_md


class FakeMetric:
    def __init__(self, d):
        self.d = d
        self.values: dict[tuple, float] = {}
        self.observed: list[tuple[tuple, float]] = []

    def _key(self, tags):
        assert set(tags) == set(self.d.tag_keys)
        assert all(isinstance(v, str) for v in tags.values()), "Ray tags are strings"
        return tuple(sorted(tags.items()))

    def set(self, value, tags):
        self.values[self._key(tags)] = value

    def inc(self, value, tags):
        k = self._key(tags)
        self.values[k] = self.values.get(k, 0) + value

    def observe(self, value, tags):
        self.observed.append((self._key(tags), value))


class FakeFactory:
    def __init__(self):
        self.made: dict[str, FakeMetric] = {}

    def make(self, d):
        assert d.name not in self.made, "each metric object is created once, lazily"
        self.made[d.name] = FakeMetric(d)
        return self.made[d.name]

    def value(self, name, **tags):
        return self.made[name].values.get(tuple(sorted((k, str(v)) for k, v in tags.items())))


STATE = {"version": 1, "replica_info": [],
         "sync_state": [["broker-a", "c", 2, 5, [1, 2, 3], 7], ["broker-b", "c", None, 2, [1], 1]]}


def test_controller_sample_records_role_term_snapshots_and_group_view():
    """A leader's sample sets role, term, snapshot gauges and each group's epoch, master and SSS size."""
    f = FakeFactory()
    m = ControllerMetrics("k", 0, factory=f)
    assert m.observe(controller_md(), STATE) == []
    c = {"cluster": "k", "controller": 0}
    assert f.value("controller_is_leader", **c) == 1
    assert f.value("controller_term", **c) == 3
    assert f.value("controller_snapshot_count", **c) == 0
    assert f.value("group_master_epoch", cluster="k", group="broker-a") == 5
    assert f.value("group_sync_state_set_size", cluster="k", group="broker-a") == 3
    assert f.value("group_master_broker_id", cluster="k", group="broker-b") == -1


def test_controller_logs_new_snapshot_and_leadership_change_with_domain_keys():
    """Consecutive samples turn a new snapshot and a lost leadership into key=value log lines."""
    f = FakeFactory()
    m = ControllerMetrics("k", 1, factory=f)
    m.observe(controller_md(), STATE)
    lines = m.observe(controller_md(snapshots_saved=1, snapshot_last_index=1000, is_leader=False, term=4), None)
    assert "controller snapshot taken controller=1 index=1000 term=4 count=1" in lines
    assert "controller role changed controller=1 role=follower term=4" in lines
    assert f.value("controller_last_snapshot_index", cluster="k", controller=1) == 1000
    assert f.value("controller_is_leader", cluster="k", controller=1) == 0


def test_controller_counts_elections_by_trigger_and_code():
    f = FakeFactory()
    m = ControllerMetrics("k", 0, factory=f)
    m.election("broker-a", "admin", "SUCCESS")
    m.election("broker-a", "admin", "SUCCESS")
    m.election("broker-a", "admin", "CONTROLLER_ELECT_MASTER_FAILED")
    assert f.value("controller_elections_total", cluster="k", group="broker-a", trigger="admin", code="SUCCESS") == 2


def test_broker_sample_records_offsets_and_lag_per_replica():
    """The master reports every connected slave's lag (its max minus the slave's ack) under the slave's id."""
    f = FakeFactory()
    m = BrokerMetrics("k", "broker-a", factory=f)
    m.observe(broker_status())
    t = {"cluster": "k", "group": "broker-a"}
    assert f.value("broker_max_offset", broker_id=1, **t) == 1000
    assert f.value("broker_confirm_offset", broker_id=1, **t) == 900
    assert f.value("broker_is_master", broker_id=1, **t) == 1
    assert f.value("broker_replication_lag_bytes", broker_id=2, **t) == 100
    assert f.value("broker_replication_lag_bytes", broker_id=1, **t) == 0
    assert f.value("broker_replication_lag_bytes", broker_id=3, **t) is None, "no ack yet: no lag series"
    assert list(replication_lags(broker_status(ha=None))) == []


def test_broker_transitions_are_logged_with_domain_keys():
    """Role/epoch change, SyncStateSet change and a max offset going back (truncation) each log one line."""
    m = BrokerMetrics("k", "broker-a", factory=FakeFactory())
    assert m.observe(broker_status()) == []
    lines = m.observe(broker_status(role=Role.SLAVE, master_epoch=3, master_broker_id=2, sync_state_set=(2,),
                                    max_offset=800))
    assert any(line.startswith("replica role changed group=broker-a broker_id=1 role=SLAVE epoch=3")
               for line in lines), lines
    assert any(line.startswith("sync state set changed group=broker-a broker_id=1 epoch=3") and
               "sync_state_set=2 previous=1;2" in line for line in lines), lines
    assert "replica truncated group=broker-a broker_id=1 epoch=3 offset=800 previous_offset=1000 cut_bytes=200" \
        in lines
    assert m.observe(broker_status(role=Role.SLAVE, master_epoch=3, master_broker_id=2, sync_state_set=(2,),
                                   max_offset=850)) == [], "no transition, no line"


def test_a_replica_without_a_role_is_not_counted_as_master():
    """Role NONE (before the first switch) reads NONE, not slave, and never as a master."""
    f = FakeFactory()
    m = BrokerMetrics("k", "broker-a", factory=f)
    m.observe(broker_status(role=Role.NONE, ha=None, master_broker_id=None))
    assert f.value("broker_is_master", cluster="k", group="broker-a", broker_id=1) == 0
    lines = m.observe(broker_status())
    assert any("role=MASTER epoch=2 previous_role=NONE" in line for line in lines), lines


def test_put_outcomes_and_latency_histogram():
    f = FakeFactory()
    m = BrokerMetrics("k", "broker-a", factory=f)
    m.put(1, "PUT_OK", 50, 3.5)
    m.put(1, "NOT_MASTER", 50, 0.0)
    t = {"cluster": "k", "group": "broker-a", "broker_id": 1}
    assert f.value("broker_puts_total", status="PUT_OK", **t) == 1
    assert f.value("broker_put_messages_total", status="NOT_MASTER", **t) == 50
    assert [v for _, v in f.made["broker_put_latency_ms"].observed] == [3.5], "only acknowledged puts are timed"


def test_a_failing_metrics_backend_disables_itself_and_reports_once():
    """Metrics must never break a service: the first error is reported and recording stops."""
    errors = []

    class Broken:
        def make(self, d):
            raise RuntimeError("no Ray here")

    m = BrokerMetrics("k", "g", factory=Broken(), on_error=lambda name, exc: errors.append(name))
    m.observe(broker_status())
    m.put(1, "PUT_OK", 1, 1.0)
    assert len(errors) == 1


# --- live: Ray's Prometheus export ------------------------------------------------------------------

def _scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


@pytest.mark.slow
def test_metrics_reach_rays_prometheus_export(make_cluster):
    """A live cluster with traffic exports the controller, group and broker series (``ray_rocketray_*``)
    through the node's metrics agent, tagged with the cluster name."""
    import ray

    from rocketray.actors.cluster import wait_for
    from rocketray.actors.pipeline import Workload

    cluster = make_cluster(controllers=1, groups=1, replicas=2)
    Workload(cluster).produce(100)
    port = next(n["MetricsExportPort"] for n in ray.nodes() if n.get("Alive"))
    want = {"ray_" + PREFIX + name for name in (
        "controller_is_leader", "controller_term", "controller_snapshot_count", "controller_last_snapshot_index",
        "controller_elections_total", "group_master_epoch", "group_sync_state_set_size", "broker_max_offset",
        "broker_confirm_offset", "broker_replication_lag_bytes", "broker_puts_total", "broker_master_epoch")}
    want.add("ray_" + PREFIX + "broker_put_latency_ms_bucket")
    seen: set[str] = set()

    def exported():
        text = _scrape(port)
        tagged = [line for line in text.splitlines()
                  if line.startswith("ray_rocketray_") and f'cluster="{cluster.spec.name}"' in line]
        seen.update(re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0) for line in tagged)
        return want <= seen

    try:
        wait_for(exported, 90, "rocketray series in Ray's metrics export", interval_s=2)
    except Exception:
        pytest.fail(f"missing from the export: {sorted(want - seen)}; seen {sorted(seen)}")
    assert len(METRICS) >= 15
