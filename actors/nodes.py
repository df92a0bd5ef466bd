"""Several Ray nodes on one machine, for whole-node failures (``rocketray demo --nodes N``, tests).

A head node runs the driver (no rocketray actor can go there: it offers no rocketray resource);
each worker node is a separate raylet with its own CPU share and the custom resource
``rocketray_node_<label>`` (``actors/cluster.py`` pins actors by it, and gives each node its own
store directory ``DATA/NAME/<label>/``). ``remove(label)`` kills the node's raylet without grace,
so every actor process on it dies at once, like a machine losing power; until a node with the
same label is back none of them can be scheduled anywhere else. ``restore(label)`` starts a new
raylet with that label and Ray restarts the actors there, on their store directories.

Built on ``ray.cluster_utils.Cluster`` (the multi-node test harness that ships with Ray); the head
gets short GCS health checks so that a dead node is declared dead within about a second.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import ray

from rocketray.actors.cluster import ClusterError, node_resource

#: How much of a node's label resource one actor takes (``actors/remote.py`` asks for 1).
LABEL_CAPACITY = 1000


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first), from /proc."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


class LocalNodes:
    """A head plus ``count`` labelled worker nodes (``n1``, ``n2``, ...) on this machine; connects Ray."""

    def __init__(self, count: int, *, node_cpus: float = 1, object_store_bytes: int = 80 * 1024 * 1024,
                 namespace: str | None = None):
        from ray.cluster_utils import Cluster

        if count < 1:
            raise ClusterError("--nodes must be at least 1")
        self._node_cpus = node_cpus
        self._object_store_bytes = object_store_bytes
        self._nodes: dict[str, Any] = {}
        self.cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "include_dashboard": False, "object_store_memory": 150 * 1024 * 1024,
            "_system_config": {"health_check_initial_delay_ms": 0, "health_check_period_ms": 300,
                               "health_check_timeout_ms": 1000, "health_check_failure_threshold": 3}})
        try:
            for i in range(count):
                self.add(f"n{i + 1}")
            ray.init(address=self.cluster.address, logging_level="ERROR", log_to_driver=False, namespace=namespace)
        except BaseException:
            self.cluster.shutdown()
            raise

    @property
    def labels(self) -> list[str]:
        return sorted(self._nodes)

    def add(self, label: str) -> None:
        if label in self._nodes:
            raise ClusterError(f"node {label} is already running")
        self._nodes[label] = self.cluster.add_node(num_cpus=self._node_cpus,
                                                   resources={node_resource(label): LABEL_CAPACITY},
                                                   object_store_memory=self._object_store_bytes)
        self.cluster.wait_for_nodes()

    def remove(self, label: str) -> None:
        """Kill node ``label`` at once, like a power loss: SIGKILL to its raylet and then to every
        process under it (the actors' workers, which would otherwise notice the raylet's death only
        a moment later and could still answer), then Ray's own teardown of the node."""
        from ray._private import ray_constants

        node = self._nodes.pop(label)
        raylet_pid = node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid
        tree = descendants(raylet_pid)
        for pid in [raylet_pid, *tree]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.cluster.remove_node(node, allow_graceful=False)

    def restore(self, label: str) -> None:
        """Bring node ``label`` back as a new raylet offering the same label resource."""
        self.add(label)

    def wait_dead(self, label: str, timeout_s: float = 60) -> None:
        """Until Ray's GCS no longer lists an alive node offering ``label``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not any(n.get("Alive") and node_resource(label) in n.get("Resources", {}) for n in ray.nodes()):
                return
            time.sleep(0.1)
        raise ClusterError(f"node {label} still listed alive after {timeout_s:.0f}s")

    def shutdown(self) -> None:
        ray.shutdown()
        self.cluster.shutdown()
