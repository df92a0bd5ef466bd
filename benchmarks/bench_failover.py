"""Broker failover: kill the master broker actor, time until a write is acknowledged again.

For each profile (fast, default) a cluster of 3 controllers and one group of 3 replicas (all-ack on)
runs on an embedded local Ray (or the Ray already initialised). Each round waits for the group to
settle with every replica back in the SyncStateSet (a master killed while its set is itself alone
has no electable successor), kills the master actor and sends single messages through
``rocketray.client`` (a ``Producer`` on a topic whose queues live on the group: ``actors/workload.py``)
until one is acknowledged by the group's next master; the client finds that master itself (it
follows the controller's watch). The controller notices the death when the kernel closes the
master's session connection (``rocketray.controller.session``), not a heartbeat timeout later; Ray
restarts the killed actor meanwhile, and if it is back before the election it asks for a new term
and may itself be that next master under a higher epoch (``same_master_rounds`` counts those).

Hops (p50 over the kills): ``elected_p50_ms``, from the kill until the first controller to answer a
watch had applied the next master's epoch (the session close, the election commit), and ``after_election_p50_ms``,
the rest (the producer's watch fires, it moves the put to the new master, the new master takes its
role and acknowledges).

``kill_floor_ms`` (same run): ``ray.kill`` of a bare actor until a TCP connection to it closes, the
part of every failover measured here that is Ray delivering the kill and the kernel ending the
process, before anything of rocketray can notice (``kill_floor_ms()``).

Same-run floor: on the settled live group, the median of one controller round trip that commits in
Raft (a read behind a barrier) plus one acknowledged send of one message: what any failover
has to spend after detection (an election commit, then a write). Reported per profile: p50 (lower
median) and max of the failover times in ms, ``floor_ms``, ``ratio`` = p50 / floor (lower is
better), ``target_p50_ms`` (500) and, for reference, ``controller_heartbeat_timeout_ms``,
which a failover found only by heartbeat expiry would have to wait for. The top-level ``ratio`` is
the first profile's.

Node loss (``--node-loss-rounds``, fast profile): a Ray of three labelled nodes on this machine
(``actors/nodes.py``), each group's replicas on different nodes; each round kills the whole node
of the master (raylet and every process on it, none can restart elsewhere), times until a write is
acknowledged again (``node_failover`` p50/max; target: at most the heartbeat timeout + 0.5 s), brings
the node back and times until its actors rejoin (``node_rejoin``). When the lost node also held the
controller leader, the new leader has no sessions: the surviving replicas reopen theirs at once
(their controller clients follow the new leader) and the master, which cannot, is treated as dead a
grace window (2 broker heartbeat intervals) after the election, not at heartbeat expiry.
``leader_lost_rounds`` counts those rounds; ``node_failover_leader_lost_p50_ms`` and
``node_failover_leader_alive_p50_ms`` split the figure (target for the first:
``LEADER_LOST_TARGET_MS``). ``--node-loss-with-leader`` makes every round one of them: before each
round the controller moves the master (an admin election) to the replica on the controller leader's
node.

    python benchmarks/run.py failover [--kills 10] [--profiles fast,default] [--node-loss-rounds 3]
                                      [--node-loss-with-leader] [--json]
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time

GROUP = "broker-a"


def _p50(values: list[float]) -> float:
    s = sorted(values)
    return s[math.ceil(len(s) / 2) - 1]


FLOOR_SAMPLES = 20
TARGET_P50_MS = 500
LEADER_LOST_TARGET_MS = 1000


def master_beside_leader(cluster, group: str) -> None:
    """Move ``group``'s master to the replica on the controller leader's node (an admin election)
    and wait until it serves with every replica in sync: the next node loss takes both."""
    from rocketray.actors import pipeline
    from rocketray.actors.pipeline import node_label
    from rocketray.wire.controller_api import ElectMasterRequest
    from rocketray.waiting import wait_for

    leader = cluster.wait_for_leader(60)
    label = node_label(cluster.spec.controllers[leader].node_resource)
    beside = next(b for b in cluster.spec.brokers_of(group) if node_label(b.node_resource) == label)
    def moved() -> bool:
        if cluster.wait_for_master(group, 60) == beside.replica:
            return True
        pipeline.settle(cluster, timeout_s=180, in_sync=True)   # the designated replica must be in sync
        status = cluster.broker_status(group, beside.replica)
        assert status is not None and status.broker_id is not None, f"{group}-{beside.replica} did not answer"
        # MASTER_STILL_EXIST while the controller does not count it in the SyncStateSet yet: again
        cluster.call_controller(ElectMasterRequest.of_admin_trigger(cluster.spec.cluster_name, group,
                                                                     status.broker_id), timeout_s=10.0)
        return False
    wait_for(moved, 120, f"replica {beside.replica} to serve as master beside the controller leader", interval_s=0.5)
    pipeline.settle(cluster, timeout_s=180, in_sync=True)


def floor_ms(cluster, w) -> float:
    """Median of (a controller round trip with a Raft commit + one acknowledged put) on a live group."""
    from rocketray.wire.controller_api import GetReplicaInfoRequest

    samples = []
    for _ in range(FLOOR_SAMPLES):
        t0 = time.perf_counter()
        answer = cluster.call_controller(GetReplicaInfoRequest(broker_name=GROUP), timeout_s=10.0)
        assert answer.ok, answer
        w.send_until_acked(GROUP, timeout_s=10)
        samples.append((time.perf_counter() - t0) * 1000)
    return _p50(samples)


KILL_FLOOR_ROUNDS = 5


def kill_floor_ms(rounds: int = KILL_FLOOR_ROUNDS) -> float:
    """What Ray's kill costs before any failover can begin: ``ray.kill`` of a bare actor that holds
    a TCP connection from this process, until the kernel closes that connection (the actor's
    process is gone). The broker's session to the controller closes the same way, so a failover
    measured from ``ray.kill`` contains this. p50 over ``rounds`` kills (Ray restarts the actor)."""
    import socket

    import ray

    @ray.remote(max_restarts=-1, max_task_retries=-1, num_cpus=0)
    class Holder:
        def __init__(self) -> None:
            self.server = socket.create_server(("127.0.0.1", 0))
            self.held: list[socket.socket] = []

        def port(self) -> int:
            return self.server.getsockname()[1]

        def accept(self) -> bool:
            self.held.append(self.server.accept()[0])
            return True

    holder = Holder.remote()
    samples = []
    for _ in range(rounds):
        port = ray.get(holder.port.remote(), timeout=60)
        with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
            ray.get(holder.accept.remote(), timeout=60)
            t0 = time.perf_counter()
            ray.kill(holder, no_restart=False)
            try:
                conn.recv(1)                # EOF once the process is gone
            except ConnectionResetError:    # or a reset
                pass
            samples.append((time.perf_counter() - t0) * 1000)
    ray.get(holder.port.remote(), timeout=60)      # its last restart is over: no process start
    ray.kill(holder, no_restart=True)               # competes with what is measured next
    return _p50(samples)


class ElectionClock:
    """Arms a master watch on every controller now (``watch_master``); ``ms()``: how long after
    this (the kill follows at once) the first controller that answers had applied the next
    master's epoch: detection + election commit, one hop of the failover."""

    def __init__(self, cluster) -> None:
        import threading

        from rocketray.wire.controller_api import GetReplicaInfoRequest

        epoch = cluster.call_controller(GetReplicaInfoRequest(broker_name=GROUP), timeout_s=10.0).header.master_epoch
        refs = [cluster.controller(c.index).watch_master.remote(GROUP, epoch, 60) for c in cluster.spec.controllers]
        self.t0 = time.monotonic()
        self._at: list[float] = []
        self._thread = threading.Thread(target=self._wait, args=(refs, epoch), daemon=True)
        self._thread.start()

    def _wait(self, refs, epoch: int) -> None:
        import ray

        while refs:
            ready, refs = ray.wait(refs, num_returns=1, timeout=60)
            if not ready:
                return
            try:
                if ray.get(ready[0]).master_epoch > epoch:
                    self._at.append(time.monotonic())
                    return
            except ray.exceptions.RayError:
                continue  # that controller died (with the node)

    def ms(self) -> float:
        self._thread.join(60)
        return (self._at[0] - self.t0) * 1000.0 if self._at else float("nan")


def measure(profile: str, kills: int, data_dir: str) -> dict:
    from rocketray.actors import pipeline
    from rocketray.actors.cluster import start_cluster
    from rocketray.config import load_config

    overrides = {"ha.all_ack_in_sync_state_set": "true"}
    detection_ms = load_config(profile, overrides).broker.controller_heartbeat_timeout_ms
    cluster = start_cluster(f"bench-failover-{profile}-{int(time.time())}", controllers=3, groups=1, replicas=3,
                            data_dir=data_dir, profile=profile, overrides=overrides)
    samples: list[float] = []
    elections: list[float] = []
    same = 0  # rounds where Ray restarted the master before detection and it won a new term itself
    w = None
    try:
        w = pipeline.Workload(cluster)
        w.produce(200)
        pipeline.settle(cluster, timeout_s=180)
        kill_floor = kill_floor_ms()
        floor = floor_ms(cluster, w)
        for _ in range(kills):
            pipeline.settle(cluster, timeout_s=180, in_sync=True)
            elected = ElectionClock(cluster)
            ms, old, new = pipeline.kill_master_and_time(cluster, w, GROUP)
            same += int(new == old)
            samples.append(ms)
            elections.append(elected.ms())
        pipeline.settle(cluster, timeout_s=180)
        lost = pipeline.verify(cluster, w)["lost"]
    finally:
        if w is not None:
            w.close()
        cluster.stop(delete_data=True)
    p50 = _p50(samples)
    return {"kills": len(samples), "p50_ms": round(p50, 1), "max_ms": round(max(samples), 1),
            "floor_ms": round(floor, 1), "ratio": round(p50 / floor, 2), "target_p50_ms": TARGET_P50_MS,
            "elected_p50_ms": round(_p50(elections), 1), "after_election_p50_ms": round(
                _p50([t - e for t, e in zip(samples, elections)]), 1),
            "kill_floor_ms": round(kill_floor, 1),
            "controller_heartbeat_timeout_ms": detection_ms, "same_master_rounds": same, "lost": lost,
            "samples_ms": [round(x, 1) for x in samples]}


def measure_node_loss(rounds: int, data_dir: str, with_leader: bool = False) -> dict:
    """Kill the master's whole node ``rounds`` times on a local three-node Ray (fast profile)."""
    from rocketray.actors import pipeline
    from rocketray.actors.cluster import start_cluster
    from rocketray.actors.nodes import LocalNodes
    from rocketray.config import load_config

    detection_ms = load_config("fast").broker.controller_heartbeat_timeout_ms
    nodes = LocalNodes(3, namespace="rocketray-bench")
    failover: list[float] = []
    rejoin: list[float] = []
    elections: list[tuple[bool, float]] = []   # (the leader died with the node, ms until elected)
    leader_lost = 0
    split: list[tuple[bool, float]] = []   # (the leader died with the node, failover ms)
    try:
        cluster = start_cluster(f"bench-node-loss-{int(time.time())}", controllers=3, groups=1, replicas=3,
                                data_dir=data_dir, profile="fast")
        w = None
        try:
            w = pipeline.Workload(cluster)
            w.produce(200)
            for _ in range(rounds):
                pipeline.settle(cluster, timeout_s=180, in_sync=True)
                if with_leader:
                    master_beside_leader(cluster, GROUP)
                leader = cluster.wait_for_leader(60)
                elected = ElectionClock(cluster)
                r = pipeline.lose_node_and_time(cluster, w, nodes, GROUP, produce_while_down=100, say=lambda m: None)
                leader_lost += int(leader in r["lost_controllers"])
                failover.append(r["node_failover_ms"])
                split.append((leader in r["lost_controllers"], r["node_failover_ms"]))
                elections.append((leader in r["lost_controllers"], round(elected.ms(), 1)))
                rejoin.append(r["node_rejoin_ms"])
            pipeline.settle(cluster, timeout_s=180)
            lost = pipeline.verify(cluster, w)["lost"]
        finally:
            if w is not None:
                w.close()
            cluster.stop(delete_data=True)
    finally:
        nodes.shutdown()
    p50 = _p50(failover)
    gone = [ms for lost_leader, ms in split if lost_leader]
    kept = [ms for lost_leader, ms in split if not lost_leader]
    return {"rounds": rounds, "node_failover_p50_ms": round(p50, 1), "node_failover_max_ms": round(max(failover), 1),
            "node_failover_leader_lost_p50_ms": round(_p50(gone), 1) if gone else None,
            "node_failover_leader_lost_max_ms": round(max(gone), 1) if gone else None,
            "node_failover_leader_alive_p50_ms": round(_p50(kept), 1) if kept else None,
            "leader_lost_target_ms": LEADER_LOST_TARGET_MS,
            "leader_lost_target_met": (_p50(gone) <= LEADER_LOST_TARGET_MS) if gone else None,
            "node_rejoin_p50_ms": round(_p50(rejoin), 1), "controller_heartbeat_timeout_ms": detection_ms,
            "target_ms": detection_ms + 500, "leader_lost_rounds": leader_lost, "lost": lost,
            "elected_ms": [e for _lost, e in elections],
            "elected_leader_alive_p50_ms": round(_p50([e for gone, e in elections if not gone]), 1)
            if any(not gone for gone, _e in elections) else None,
            "samples_ms": [round(x, 1) for x in failover]}


#: ``benchmarks/run.py failover --smoke``: a size that finishes in seconds (CI runs it).
SMOKE_ARGS = ["--kills", "1", "--profiles", "fast", "--node-loss-rounds", "1"]


def run(argv: list[str]) -> dict:
    import ray

    parser = argparse.ArgumentParser(prog="failover")
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--profiles", default="fast,default")
    parser.add_argument("--node-loss-rounds", type=int, default=3)
    parser.add_argument("--node-loss-with-leader", action="store_true",
                        help="every node-loss round also takes the controller leader")
    args = parser.parse_args(argv)
    profiles = [p.strip() for p in args.profiles.split(",") if p.strip()]
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", include_dashboard=False, logging_level="ERROR", log_to_driver=False,
                 object_store_memory=300 * 1024 * 1024, namespace="rocketray-bench")
    out: dict = {}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp:
            for profile in profiles:
                out[profile] = measure(profile, args.kills, tmp)
    finally:
        if started:
            ray.shutdown()
    if args.node_loss_rounds > 0:
        if ray.is_initialized():
            ray.shutdown()  # the node-loss case runs its own Ray of several nodes
        with tempfile.TemporaryDirectory(prefix="bench-node-loss-") as tmp:
            out["node_loss"] = measure_node_loss(args.node_loss_rounds, tmp, args.node_loss_with_leader)
    return {**out, "ratio": out[profiles[0]]["ratio"], "baseline": "floor_ms", "unit": "ms"}
