"""The broker chaos run's fault executor: plays seeded schedule steps against a live cluster.

Theory of operation. ``rocketray.verify.nemesis`` plans the steps (pure, from the seed); this shell
resolves the targets that only exist at run time (the current master of a group, the controller
leader, a broker id's replica), acts (``ray.kill``, SIGSTOP/SIGCONT, the HA proxies' cut or stall,
a whole node taken down), and records each fault's start and end in the run's ``nemesis.jsonl``
through the :class:`~rocketray.chaos.broker_workload.RunLog`. A step that fails to act is logged and
the run goes on; :meth:`Nemesis.heal_all` undoes whatever is still in force at the end.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Sequence

import ray

from rocketray.actors.cluster import Cluster
from rocketray.actors.pipeline import NodeControl, node_label
from rocketray.chaos.broker_workload import RunLog
from rocketray.chaos.ha_proxy import HaProxies
from rocketray.chaos.os_nemesis import OsNemesis
from rocketray.chaos.replica_reader import now_ms
from rocketray.wire.controller_api import GetReplicaInfoRequest
from rocketray.verify import nemesis as sched

log = logging.getLogger("rocketray.chaos.brokers")

__all__ = ["Nemesis", "run_schedule"]


@dataclass
class Nemesis:
    """Executes schedule steps against a live cluster and records them in ``runlog``."""

    cluster: Cluster
    runlog: RunLog
    proxies: HaProxies | None
    seed: int
    paused: dict[str, int] = field(default_factory=dict)  # target -> pid stopped and not yet resumed
    acted: int = 0
    _partition_target: str = ""
    #: whole rocketray nodes (``--ray-nodes N``): ``kill-node`` needs them
    nodes: NodeControl | None = None
    #: (label, target, group) of the node ``kill-node`` took down and has not restored yet
    down_node: tuple[str, str, str | None] | None = None
    #: the OS-level kinds (kernel network, files, lost unsynced writes): ``chaos/os_nemesis.py``
    os_faults: OsNemesis | None = None

    # --- resolving targets ------------------------------------------------------------------
    def replica_of(self, group: str, broker_id: int) -> int | None:
        for b, st in zip(self.cluster.spec.brokers_of(group), self.cluster.group_status(group)):
            if st is not None and st.broker_id == broker_id:
                return b.replica
        return None

    def master_of(self, group: str) -> int | None:
        try:
            resp = self.cluster.call_controller(GetReplicaInfoRequest(broker_name=group), timeout_s=3.0)
            address = resp.header.master_address if resp.ok else None
            b = self.cluster.spec.broker_by_ha_address(address) if address else None
            if b is not None:
                return b.replica
        except Exception:  # noqa: BLE001 - ask the replicas instead
            pass
        return self.cluster.master_of(group)

    # --- acting -----------------------------------------------------------------------------
    def start(self, step: sched.NemesisStep) -> None:
        kind, group = step.kind, step.group
        if kind == "kill-master":
            replica = self.master_of(group)
            if replica is None:
                log.warning("kill-master: no master in %s right now; skipped", group)
                return
            self.runlog.event(kind, "start", f"broker:{group}/r{replica}", group)
            self.cluster.kill_broker(group, replica, wait_restart=False)
            self.runlog.event(kind, "end", f"broker:{group}/r{replica}", group)
        elif kind in ("kill-broker", "pause-broker"):
            replica = self.replica_of(group, step.broker_id)
            replica = (step.broker_id - 1) % len(self.cluster.spec.brokers_of(group)) if replica is None else replica
            target = f"broker:{group}/r{replica}"
            self.runlog.event(kind, "start", target, group)
            if kind == "kill-broker":
                self.cluster.kill_broker(group, replica, wait_restart=False)
                self.runlog.event(kind, "end", target, group)
            else:
                self.paused[target] = self.cluster.pause(self.cluster.broker(group, replica))
        elif kind == "kill-controller-leader":
            leader = self.cluster.leader_index()
            if leader is None:
                log.warning("kill-controller-leader: no leader right now; skipped")
                return
            self.runlog.event(kind, "start", f"controller:{leader}", None)
            self.cluster.kill_controller(leader, wait_restart=False)
            self.runlog.event(kind, "end", f"controller:{leader}", None)
        elif kind in ("kill-controller", "pause-controller"):
            target = f"controller:{step.controller}"
            self.runlog.event(kind, "start", target, None)
            if kind == "kill-controller":
                self.cluster.kill_controller(step.controller, wait_restart=False)
                self.runlog.event(kind, "end", target, None)
            else:
                self.paused[target] = self.cluster.pause(self.cluster.controller(step.controller))
        elif kind == "partition-ha":
            self._partition(step)
        elif kind == "kill-node":
            if not self._kill_node(step):
                return
        elif kind in sched.OS_DRAWS:
            if not self._os(step):
                return
        else:
            raise AssertionError(kind)
        self.acted += 1

    def _os(self, step: sched.NemesisStep) -> bool:
        if self.os_faults is None:
            log.warning("%s needs the OS-level nemeses; skipped", step.kind)
            return False
        if step.kind in sched.NET_KINDS:
            return self.os_faults.start_net(step)
        if step.kind == "lose-unsynced":
            return self.os_faults.lose_unsynced(step)
        if step.kind in sched.CLOCK_KINDS:
            return self.os_faults.start_clock(step)
        return self.os_faults.damage(step)

    def _kill_node(self, step: sched.NemesisStep) -> bool:
        """Take down the whole node holding ``step.group``'s master (every actor on it dies and none
        can restart elsewhere until ``end`` brings the node back)."""
        if self.nodes is None:
            log.warning("kill-node needs a cluster on several rocketray nodes (--ray-nodes N); skipped")
            return False
        replica = self.master_of(step.group)
        spec = next((b for b in self.cluster.spec.brokers_of(step.group) if b.replica == replica), None)
        label = None if spec is None else node_label(spec.node_resource)
        if label is None:
            log.warning("kill-node: no master of %s on a labelled node right now; skipped", step.group)
            return False
        target = f"node:{label}"
        self.runlog.event("kill-node", "start", target, step.group)
        self.nodes.remove(label)
        self.down_node = (label, target, step.group)
        return True

    def _restore_node(self) -> None:
        if self.down_node is None or self.nodes is None:
            return
        label, target, group = self.down_node
        self.down_node = None
        self.nodes.restore(label)
        self.runlog.event("kill-node", "end", target, group)

    def _partition(self, step: sched.NemesisStep) -> None:
        group = step.group
        if self.proxies is None:
            log.warning("partition-ha needs the HA proxies; skipped")
            return
        mode = random.Random(self.seed * 31 + step.at_ms).choice(("cut", "stall"))
        victim = self.replica_of(group, step.broker_id)
        master = self.master_of(group)
        if victim is None or master is None:
            log.warning("partition-ha: %s has no master or broker %s is unknown; skipped", group, step.broker_id)
            return
        if victim == master:  # isolate the master's replication from every slave
            target = f"broker:{group}/r{master} {mode} all links"
            t = now_ms()
            self.proxies.fault((group, master), mode)
            self.runlog.event("partition-ha", "start", target, group, time_ms=t)
        else:  # only the link victim -> master
            pid = ray.get(self.cluster.broker(group, victim).pid.remote(), timeout=5)
            target = f"broker:{group}/r{victim} {mode} link to r{master}"
            t = now_ms()
            self.proxies.fault((group, master), mode, peer_pids=[pid])
            self.runlog.event("partition-ha", "start", target, group, time_ms=t)
        self.paused["partition-ha"] = -1
        self._partition_target = target

    def end(self, step: sched.NemesisStep) -> None:
        """Undo a pause, partition or node loss (kills need nothing: Ray restarts the actor)."""
        if step.kind == "kill-node":
            self._restore_node()
            return
        if step.kind in sched.NET_KINDS:
            if self.os_faults is not None:
                self.os_faults.end_net(step)
            return
        if step.kind in sched.CLOCK_KINDS:
            if self.os_faults is not None:
                self.os_faults.end_clock(step)
            return
        if step.kind == "partition-ha":
            if self.paused.pop("partition-ha", None) is not None and self.proxies is not None:
                self.proxies.heal()
                self.runlog.event("partition-ha", "end", self._partition_target, step.group)
            return
        for target, pid in list(self.paused.items()):
            if target == "partition-ha":
                continue
            self.cluster.resume_pid(pid)
            del self.paused[target]
            self.runlog.event(step.kind, "end", target, step.group)

    def heal_all(self) -> None:
        self._restore_node()
        if self.os_faults is not None and self.os_faults.kernel is not None:
            self.os_faults.kernel.heal()
        if self.os_faults is not None:
            self.os_faults.reset_clocks()
        for target, pid in list(self.paused.items()):
            if pid > 0:
                self.cluster.resume_pid(pid)
        self.paused.clear()
        if self.proxies is not None:
            self.proxies.heal()


def run_schedule(nemesis: Nemesis, steps: Sequence[sched.NemesisStep], t0: float, run_s: float,
                 stop: threading.Event) -> None:
    """Play ``steps`` (times relative to monotonic ``t0``) until the end of the run or ``stop``."""
    for step in steps:
        for phase, at_ms in (("start", step.at_ms), ("end", step.end_ms)):
            if phase == "end" and step.duration_ms == 0:
                continue
            delay = t0 + at_ms / 1000.0 - time.monotonic()
            if delay > 0 and stop.wait(delay):
                return
            try:
                (nemesis.start if phase == "start" else nemesis.end)(step)
            except Exception:  # noqa: BLE001 - one failed fault must not end the run
                log.exception("nemesis %s %s failed", step.kind, phase)
    remaining = t0 + run_s - time.monotonic()
    if remaining > 0:
        stop.wait(remaining)
