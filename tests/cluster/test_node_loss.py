"""Whole nodes die: a Ray cluster of several nodes on one machine (ray.cluster_utils.Cluster through
actors/nodes.py), each group's replicas and the controllers spread and pinned by node label.

Killing the node of a master kills every actor on it and none restarts elsewhere; the group fails
over by heartbeat expiry, writes resume, nothing acknowledged is lost; when the node comes back its
actors restart from their store directories and rejoin as slaves. Run under the shared lock.
"""

from __future__ import annotations

import pytest
import ray

from rocketray.actors import pipeline
from rocketray.actors.cluster import ClusterError, plan_cluster, start_cluster
from rocketray.actors.nodes import LocalNodes

pytestmark = pytest.mark.slow


@pytest.fixture
def nodes():
    n = LocalNodes(3, namespace="rocketray-tests-nodes")
    yield n
    n.shutdown()


def test_node_loss_fails_over_and_the_node_rejoins(nodes, tmp_path):
    spec = plan_cluster("plan", controllers=3, groups=2, replicas=3, data_dir=str(tmp_path))
    for group in spec.groups:
        placed = [b.node_resource for b in spec.brokers_of(group)]
        assert len(set(placed)) == 3 and None not in placed, "a group's replicas on three different nodes"
    assert len({c.node_resource for c in spec.controllers}) == 3
    assert all(f"/{b.node_resource.rsplit('_', 1)[1]}/" in b.store_dir for b in spec.brokers), \
        "each node has its own store directory"
    with pytest.raises(ClusterError):
        plan_cluster("plan", controllers=1, groups=1, replicas=4, data_dir=str(tmp_path))

    cluster = start_cluster("nodes", controllers=3, groups=1, replicas=3, data_dir=str(tmp_path), profile="fast")
    try:
        summary = pipeline.run(cluster, 600, say=print, nodes=nodes)
        print({k: v for k, v in summary.items() if k != "checks"})
        assert summary["ok"], summary["checks"]
        for check in ("replicas_on_distinct_nodes", "node_loss_killed_its_actors", "writes_resumed_after_node_loss",
                      "master_moved_off_lost_node", "lost_node_brokers_rejoined_as_slaves"):
            assert summary["checks"][check], check
        assert summary["messages_lost"] == 0 and summary["replicas_consistent"]
        assert summary["node_failover_ms"] > 0 and summary["node_rejoin_ms"] > 0
        # the restarted actors sit on the restored node (same label, a new Ray node id)
        label = summary["node_lost"]
        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive") and f"rocketray_node_{label}" in n["Resources"]}
        assert len(alive) == 1
    finally:
        cluster.stop(delete_data=True)


def test_demo_with_three_nodes_passes_its_checks_with_a_node_loss():
    """``rocketray demo --nodes 3 --json``: the one-command demo on three nodes, with the node-loss step."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    rocketray = Path(sys.executable).parent / "rocketray"
    proc = subprocess.run([str(rocketray), "demo", "--nodes", "3", "--messages", "600", "--json"],
                          capture_output=True, text=True, timeout=900)
    assert proc.stdout.strip(), proc.stderr[-4000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 0 and summary["ok"], (summary, proc.stderr[-4000:])
    assert summary["nodes"] == 3
    assert summary["node_failover_ms"] > 0 and summary["node_rejoin_ms"] > 0
    for check in ("replicas_on_distinct_nodes", "node_loss_killed_its_actors", "writes_resumed_after_node_loss",
                  "master_moved_off_lost_node", "lost_node_brokers_rejoined_as_slaves",
                  "every_acked_message_readable", "replicas_consistent"):
        assert summary["checks"][check], check
