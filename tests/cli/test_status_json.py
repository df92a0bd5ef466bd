"""``rocketray status`` data from typed actor answers (one layer: a fake cluster handle, no Ray).

The JSON is a documented interface: its keys stay what they were when the actors answered dicts;
roles are written by name, and a replica with no role yet shows NONE (it used to show "slave")."""

from __future__ import annotations

import json
import types

from rocketray.actors.views import Role
from rocketray.cli.commands.cluster import collect_status, format_status

from broker_status_factory import broker_status, controller_metadata


class FakeCluster:
    def __init__(self) -> None:
        brokers = [types.SimpleNamespace(replica=r, ha_address=f"10.0.0.{r}:1") for r in range(3)]
        self.spec = types.SimpleNamespace(name="k", groups=["broker-a"], brokers_of=lambda g: brokers)
        self.statuses = [broker_status(replica=0, broker_id=1, max_offset=1000),
                         broker_status(replica=1, broker_id=2, role=Role.SLAVE, max_offset=900),
                         None]

    def controller_metadata(self):
        return [controller_metadata(), controller_metadata(index=1, is_leader=False, raft_role="follower"), None]

    def call_controller(self, request, timeout_s):
        raise TimeoutError("no controller view in this test")

    def group_status(self, group):
        return self.statuses


def test_status_json_keeps_its_keys_and_names_roles():
    out = json.loads(json.dumps(collect_status(FakeCluster())))
    assert out["controller_leader"] == 0 and out["controller_term"] == 3
    assert out["controller_leader_address"] == "10.0.0.1:9000"
    leader = out["controllers"][0]
    assert leader["is_leader"] and leader["self_id"] == "n0" and leader["journal_len"] == 40, leader
    assert out["controllers"][2] is None
    rows = out["groups"]["broker-a"]["replicas"]
    assert set(rows[0]) == {"replica", "ha_address", "alive", "broker_id", "role", "master_epoch", "max_offset",
                            "confirm_offset", "sync_state_set", "running", "state", "lag_bytes"}
    assert [r.get("role") for r in rows] == ["MASTER", "SLAVE", None]
    assert [r.get("lag_bytes") for r in rows] == [0, 100, None] and rows[2]["alive"] is False
    screen = format_status(out)
    assert "controller leader: controller-0 (n0) 10.0.0.1:9000 term=3" in screen and " SLAVE " in screen


def test_a_replica_without_a_role_reads_none_and_has_no_master_lag():
    cluster = FakeCluster()
    cluster.statuses = [broker_status(replica=r, broker_id=r + 1, role=Role.NONE, ha=None) for r in range(3)]
    rows = collect_status(cluster)["groups"]["broker-a"]["replicas"]
    assert [r["role"] for r in rows] == ["NONE"] * 3 and all(r["lag_bytes"] is None for r in rows)
