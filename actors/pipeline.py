"""The failover pipeline shared by ``rocketray demo`` and ``driver.py``.

Everything the pipeline writes and reads goes through ``rocketray.client`` (``actors/workload.py``):
it creates a topic whose queues the controller spreads over the groups, produces with a
``Producer``, kills the master broker actor of the first group and times until a send to that group
is acknowledged again (the client's own failover: it follows the controller to the next master),
kills the controller leader and times until a new leader serves, keeps producing, lets the cluster
settle, then verifies: a fresh consumer group is delivered every acknowledged message, and all
replicas of a group hold identical bytes up to their common confirm offset. The result is a summary
dict whose ``checks`` all must be true for success; ``summary_json`` keys are the demo's JSON
contract.
"""

from __future__ import annotations

import time
from typing import Callable, Protocol

import ray

from rocketray.actors.cluster import Cluster, ClusterError, wait_for
from rocketray.actors.views import to_json
from rocketray.actors.workload import BATCH, Workload
from rocketray.wire.controller_api import GetReplicaInfoRequest
from rocketray.waiting import NotYet

__all__ = ["Workload", "BATCH", "kill_master_and_time", "kill_controller_leader_and_time", "lose_node_and_time",
           "settle", "verify", "run", "NodeControl", "node_label", "actors_on", "replicas_on_distinct_nodes"]


def now_ms() -> float:
    return time.time() * 1000.0


def kill_master_and_time(cluster: Cluster, workload: Workload, group: str) -> tuple[float, int, int | None]:
    """Kill the master broker actor of ``group``; returns (ms until a write is acknowledged again,
    the killed replica, the replica that acknowledged it)."""
    old = cluster.wait_for_master(group, 60)
    epoch = master_view(cluster, group)[1]
    t0 = time.monotonic()
    cluster.kill_broker(group, old, wait_restart=False)
    new = first_ack_after_kill(cluster, workload, group, old, epoch, timeout_s=120)
    return (time.monotonic() - t0) * 1000.0, old, new


def master_view(cluster: Cluster, group: str) -> tuple[int | None, int | None]:
    """(master replica, master epoch) of ``group`` as the controller leader sees it now."""
    resp = cluster.call_controller(GetReplicaInfoRequest(broker_name=group), timeout_s=10.0)
    if not resp.ok:
        return None, None
    b = cluster.spec.broker_by_ha_address(resp.header.master_address or "")
    return (None if b is None else b.replica), resp.header.master_epoch


def first_ack_after_kill(cluster: Cluster, workload: Workload, group: str, old: int, epoch: int | None,
                         timeout_s: float) -> int | None:
    """Send to ``group`` until its next master acknowledges; returns that replica. An ack from the
    killed replica ``old`` counts only once the controller re-elected it under an epoch above
    ``epoch`` (Ray restarted it and it won a new term): before that it came from the killed process
    in the moments before it died (``ray.kill`` returns at once, and the client's connection reaches
    that process directly)."""
    deadline = time.monotonic() + timeout_s
    while True:
        replica = workload.send_until_acked(group, timeout_s=max(0.1, deadline - time.monotonic()))
        if replica != old:
            return replica
        master, now_epoch = master_view(cluster, group)
        if master == old and now_epoch is not None and (epoch is None or now_epoch > epoch):
            return replica


def kill_controller_leader_and_time(cluster: Cluster) -> float:
    """Kill the controller leader; ms until a (new) leader answers a read."""
    leader = cluster.wait_for_leader(60)
    t0 = time.monotonic()
    cluster.kill_controller(leader, wait_restart=False)
    group = cluster.spec.groups[0]

    def served():
        return cluster.call_controller(GetReplicaInfoRequest(broker_name=group), timeout_s=2.0).ok

    wait_for(served, 120, "a controller leader to serve again after killing the leader", interval_s=0.02)
    return (time.monotonic() - t0) * 1000.0


class NodeControl(Protocol):
    """Whole rocketray nodes that can be killed and brought back (``actors/nodes.py``)."""

    def remove(self, label: str) -> None: ...

    def restore(self, label: str) -> None: ...

    def wait_dead(self, label: str, timeout_s: float = 60) -> None: ...


def node_label(resource: str | None) -> str | None:
    from rocketray.actors.cluster import NODE_RESOURCE_PREFIX

    return None if resource is None else resource[len(NODE_RESOURCE_PREFIX):]


def actors_on(cluster: Cluster, label: str) -> tuple[list[int], list[tuple[str, int]]]:
    """(controller indexes, (group, replica) brokers) pinned to rocketray node ``label``."""
    ctrls = [c.index for c in cluster.spec.controllers if node_label(c.node_resource) == label]
    brokers = [(b.group, b.replica) for b in cluster.spec.brokers if node_label(b.node_resource) == label]
    return ctrls, brokers


def lose_node_and_time(cluster: Cluster, workload: Workload, nodes: NodeControl, group: str,
                       produce_while_down: int = 300, say: Callable[[str], None] = print) -> dict:
    """Kill the whole node that holds ``group``'s master (every actor on it dies, none can restart
    elsewhere), time until a write is acknowledged again (the kernel closes the dead master's
    controller session; by heartbeat expiry if the controller leader died with the node), keep
    producing, bring the node back and time until its brokers run again as slaves and its
    controllers answer. Returns the figures and what moved."""
    old = cluster.wait_for_master(group, 60)
    spec = next(b for b in cluster.spec.brokers_of(group) if b.replica == old)
    label = node_label(spec.node_resource)
    if label is None:
        raise ClusterError("the node-loss step needs actors pinned to labelled rocketray nodes (actors/nodes.py)")
    ctrls, brokers = actors_on(cluster, label)
    say(f"killing node {label}: controllers {ctrls}, brokers {[f'{g}-{r}' for g, r in brokers]} "
        f"(the master of {group} among them)")
    epoch = master_view(cluster, group)[1]
    t0 = time.monotonic()
    nodes.remove(label)
    new_master = first_ack_after_kill(cluster, workload, group, old, epoch, timeout_s=120)
    failover_ms = (time.monotonic() - t0) * 1000.0
    say(f"writes resumed {failover_ms:.0f} ms after the node died (replica {new_master} is master)")
    nodes.wait_dead(label)
    down_statuses = {f"{g}-{r}": cluster.broker_status(g, r, timeout_s=1.0) for g, r in brokers}
    workload.produce(produce_while_down)
    say(f"bringing node {label} back")
    t1 = time.monotonic()
    nodes.restore(label)

    def rejoined():
        for g, r in brokers:
            st = cluster.broker_status(g, r, timeout_s=2.0)
            if st is None or not st.is_running_slave:
                return False
        md = cluster.controller_metadata(timeout_s=2.0)
        return all(md[i] is not None for i in ctrls)

    wait_for(rejoined, 180, f"node {label}'s actors to restart and rejoin as slaves", interval_s=0.2)
    rejoin_ms = (time.monotonic() - t1) * 1000.0
    say(f"node {label}'s actors rejoined as slaves {rejoin_ms:.0f} ms after it came back")
    return {"node": label, "node_failover_ms": failover_ms, "node_rejoin_ms": rejoin_ms, "old_master": old,
            "new_master": new_master, "lost_controllers": ctrls, "lost_brokers": [f"{g}-{r}" for g, r in brokers],
            "lost_broker_keys": brokers,
            "unreachable_while_down": all(st is None for st in down_statuses.values()),
            "new_master_off_lost_node": new_master is not None and (group, new_master) not in brokers}


def replicas_on_distinct_nodes(cluster: Cluster) -> bool:
    """Every group's replicas are pinned to pairwise different nodes (and each to some node)."""
    for group in cluster.spec.groups:
        labels = [b.node_resource for b in cluster.spec.brokers_of(group)]
        if None in labels or len(set(labels)) != len(labels):
            return False
    return True


SETTLE_KEYS = ("replica", "broker_id", "state", "role", "fenced", "master_epoch", "sync_state_set", "max_offset",
               "confirm_offset", "master_address")


def settle(cluster: Cluster, timeout_s: float = 120, in_sync: bool = False) -> None:
    """Wait until every replica runs and each group's slaves confirmed the master's whole log; with
    ``in_sync`` also until each master's SyncStateSet (as the controller confirmed it) holds every
    replica, so that losing any one of them leaves an electable replica."""

    def settled():
        for group in cluster.spec.groups:
            statuses = cluster.group_status(group)
            brief = [None if s is None else {k: to_json(getattr(s, k)) for k in SETTLE_KEYS} for s in statuses]
            if any(s is None or not s.running for s in statuses):
                return NotYet(f"{group}: a replica is not running: {brief}")
            masters = [s for s in statuses if s is not None and s.is_master]
            if len(masters) != 1:
                return NotYet(f"{group}: {len(masters)} masters: {brief}")
            end = masters[0].max_offset
            if any(s.confirm_offset < end or s.max_offset < end for s in statuses if s is not None):
                return NotYet(f"{group}: a replica has not confirmed the master's end {end}: {brief}")
            if in_sync and not {s.broker_id for s in statuses if s is not None} <= set(masters[0].sync_state_set):
                return NotYet(f"{group}: the SyncStateSet does not hold every replica yet: {brief}")
        return True

    wait_for(settled, timeout_s, "every replica to run and confirm its master's log", interval_s=0.2)


def verify(cluster: Cluster, workload: Workload) -> dict:
    """Consume the workload's topic with a fresh consumer group (every acknowledged msg_id must be
    delivered) and compare every group's replicas byte for byte up to their common confirm offset."""
    delivered = workload.consume_all()
    lost = sum(len(acked - delivered.keys()) for acked in workload.acked.values())
    consistent = True
    digests: dict[str, list] = {}
    for group in cluster.spec.groups:
        statuses = [s for s in cluster.group_status(group) if s is not None]
        if len(statuses) != len(cluster.spec.brokers_of(group)):
            raise ClusterError(f"{group}: a replica did not answer its status, its log cannot be compared")
        upto = min(s.confirm_offset for s in statuses)
        start = max(s.min_offset for s in statuses)
        refs = [cluster.broker(group, b.replica).digest.remote(start, upto) for b in cluster.spec.brokers_of(group)]
        group_digests = ray.get(refs, timeout=60)
        digests[group] = group_digests
        consistent = consistent and len(set(group_digests)) == 1
    return {"lost": lost, "consistent": consistent, "digests": digests, "delivered": len(delivered),
            "redelivered": sum(n - 1 for n in delivered.values())}


def run(cluster: Cluster, messages: int, progress_factory=None, say: Callable[[str], None] = print,
        nodes: NodeControl | None = None) -> dict:
    """The whole pipeline against a running cluster; returns the summary (see module doc).

    With ``nodes`` (a multi-node cluster on labelled rocketray nodes) a node-loss step follows the
    controller kill: the node holding the first group's master dies and comes back
    (``lose_node_and_time``); its figures and checks join the summary."""
    started = now_ms()
    workload = Workload(cluster)
    try:
        figures = _run_steps(cluster, workload, messages, progress_factory, say, nodes)
    finally:
        workload.close()
    return _summary(cluster, workload, figures, started)


def _run_steps(cluster: Cluster, workload: Workload, messages: int, progress_factory,
               say: Callable[[str], None], nodes: NodeControl | None) -> dict:
    """Produce, kill, produce, verify; returns what ``_summary`` reports."""
    group = cluster.spec.groups[0]
    third = max(BATCH, messages // 3)
    bar = progress_factory(total=messages) if progress_factory else None
    say(f"producing {messages} messages to topic {workload.topic} ({len(workload.route.queues)} queues over "
        f"{len(cluster.spec.groups)} group(s)) through rocketray.client")
    workload.produce(third, bar)
    settle(cluster, in_sync=True)   # another replica must be electable (see the node step below)
    say(f"killing the master broker of {group}")
    broker_failover_ms, old_master, new_master = kill_master_and_time(cluster, workload, group)
    say(f"writes resumed after {broker_failover_ms:.0f} ms (replica {new_master} acknowledged)")
    workload.produce(third, bar)
    say("killing the controller leader")
    controller_failover_ms = kill_controller_leader_and_time(cluster)
    say(f"a controller leader served again after {controller_failover_ms:.0f} ms")
    node_step = None
    old_status = None
    if nodes is not None:
        # the node step starts from a settled cluster whose SyncStateSets hold every replica (a
        # master lost while its set is itself alone has no electable successor: after the controller
        # kill, the set's expansion can still be waiting for the new leader); the killed master's
        # rejoin is judged here, as the node loss may legitimately make it master again
        settle(cluster, in_sync=True)
        old_status = cluster.broker_status(group, old_master)
        node_step = lose_node_and_time(cluster, workload, nodes, group, produce_while_down=third // 2, say=say)
    workload.produce(max(BATCH, messages - 2 * third), bar)
    if bar is not None:
        bar.close()
    say("waiting for the cluster to settle")
    settle(cluster)
    if nodes is None:  # with a node step it was judged before the node loss (above)
        old_status = cluster.broker_status(group, old_master)
    say("consuming the topic with a new consumer group")
    return {"broker_failover_ms": broker_failover_ms, "controller_failover_ms": controller_failover_ms,
            "old_master": old_master, "new_master": new_master, "old_status": old_status, "node_step": node_step,
            "verified": verify(cluster, workload)}


def _summary(cluster: Cluster, workload: Workload, figures: dict, started: float) -> dict:
    """The summary dict (the demo's JSON contract) from the steps' figures."""
    result, old_status, node_step = figures["verified"], figures["old_status"], figures["node_step"]
    checks = {
        "writes_resumed_after_master_kill": figures["broker_failover_ms"] > 0,
        "another_replica_became_master": figures["new_master"] is not None
        and figures["new_master"] != figures["old_master"],
        "controller_served_after_leader_kill": figures["controller_failover_ms"] > 0,
        "old_master_rejoined_as_slave": old_status is not None and old_status.is_running_slave,
        "every_acked_message_readable": result["lost"] == 0,   # delivered to a consumer group
        "replicas_consistent": result["consistent"],
        "some_messages_acked": workload.acked_count > 0,
    }
    extra: dict = {}
    if node_step is not None:
        lost = node_step["lost_brokers"]
        rejoined = [cluster.broker_status(g, r) for g, r in node_step["lost_broker_keys"]]
        checks.update({
            "replicas_on_distinct_nodes": replicas_on_distinct_nodes(cluster),
            "node_loss_killed_its_actors": node_step["unreachable_while_down"],
            "writes_resumed_after_node_loss": node_step["node_failover_ms"] > 0,
            "master_moved_off_lost_node": node_step["new_master_off_lost_node"],
            "lost_node_brokers_rejoined_as_slaves": all(st is not None and st.is_running_slave for st in rejoined),
        })
        extra = {"node_failover_ms": round(node_step["node_failover_ms"], 1),
                 "node_rejoin_ms": round(node_step["node_rejoin_ms"], 1), "node_lost": node_step["node"],
                 "node_lost_actors": [f"controller-{i}" for i in node_step["lost_controllers"]] + lost}
    return {**extra,
        "topic": workload.topic,
        "queues": len(workload.route.queues),
        "messages_sent": workload.sent,
        "messages_acked": workload.acked_count,
        "messages_unknown": workload.unknown,
        "messages_delivered": result["delivered"],
        "messages_redelivered": result["redelivered"],
        "messages_lost": result["lost"],
        "replicas_consistent": result["consistent"],
        "broker_failover_ms": round(figures["broker_failover_ms"], 1),
        "controller_failover_ms": round(figures["controller_failover_ms"], 1),
        "groups": len(cluster.spec.groups),
        "replicas": len(cluster.spec.brokers_of(cluster.spec.groups[0])),
        "controllers": len(cluster.spec.controllers),
        "elapsed_ms": round(now_ms() - started, 1),
        "checks": checks,
        "ok": all(checks.values()),
    }
