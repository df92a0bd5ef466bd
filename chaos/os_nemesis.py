"""The broker chaos run's OS-level faults: kernel network faults, damaged files, lost unsynced writes.

Theory of operation (docs/chaos.md has the design). ``Nemesis`` (``chaos/broker_nemesis.py``) hands
the OS-level kinds here. Members are the run's processes: every controller and broker actor, named
``controller-<i>`` and ``<group>/r<replica>`` and owning the listening ports its spec gives it (a
broker's advertised HA port, which the HA proxy holds for it, and its client port; a controller's
Raft and session ports), and ``client``: the runner itself, whose threads are the producers and
consumers. A network fault resolves its shape against the roles of the moment (the group's master,
the controller leader), places every member's current process in its cgroup (a restarted actor is a
new process), and loads the drop or loss rules; its end heals. A file fault SIGSTOPs one replica,
damages one of its store's files (``verify/filefaults.py`` plans where), reads the damage back from
disk, and SIGKILLs it: Ray restarts it on the damaged files. ``lose-unsynced`` drops the replica's
trigger file (``rocketray.fs_undo``) and waits for the process to undo what it never fsynced and die.
``clock-broker`` rewrites one replica's libfaketime timestamp file (``chaos/faketime.py``: every
broker of a run that draws it runs under libfaketime, ``+0`` until then) and waits until the
replica's own wall clock (``BrokerService.wall_clock_ms``) shows the jump; its end sets it back.
Each action is bounded in time; a step that cannot act now (no master, no file of the class, an
actor restarting) is logged and skipped.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import time
from pathlib import Path
from typing import Any, Callable

import ray

from rocketray.actors.cluster import Cluster
from rocketray.broker.checkpoint import nonzero_end
from rocketray.chaos.broker_workload import RunLog
from rocketray.chaos.faketime import set_offset
from rocketray.chaos.replica_reader import now_ms
from rocketray.chaos.nft import KernelNet
from rocketray.fs_undo import LOST_REPORT, TRIGGER
from rocketray.spec import ClusterSpec
from rocketray.wire.controller_api import GetReplicaInfoRequest
from rocketray.verify import nemesis as sched
from rocketray.verify.damage_model import DamageLedger
from rocketray.verify.filefaults import FILE_ACTIONS, StoredFile, apply_fault, classify, plan_file_fault
from rocketray.verify.netfaults import NetFault, broker_grudge

log = logging.getLogger("rocketray.chaos.brokers")

CLIENT = "client"
PID_TIMEOUT_S = 3.0
LOSE_TIMEOUT_S = 15.0
#: how long a clock jump may take to show in the replica's wall clock (libfaketime re-reads its
#: file once a second), and how far from the asked offset the seen one may be
CLOCK_SEEN_TIMEOUT_S = 5.0
CLOCK_SEEN_SLACK_MS = 2_000

__all__ = ["CLIENT", "OsNemesis", "broker_name", "controller_name", "members_of"]


def broker_name(group: str, replica: int) -> str:
    return f"{group}/r{replica}"


def controller_name(index: int) -> str:
    return f"controller-{index}"


def members_of(spec: ClusterSpec) -> list[tuple[str, tuple[int, ...]]]:
    """The run's members and the ports each listens on (see the module docstring)."""
    out = [(controller_name(c.index), tuple(p for p in (c.raft_port, c.session_port) if p)) for c in spec.controllers]
    out += [(broker_name(b.group, b.replica), tuple(p for p in (b.ha_port, b.client_port) if p)) for b in spec.brokers]
    return out + [(CLIENT, ())]


def store_files(root: Path) -> list[StoredFile]:
    """The store's files a fault may target, with where their data ends."""
    files = []
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            cls = classify(rel)
            if cls is None:
                continue
            data = path.read_bytes()
            end = nonzero_end(data, 0, len(data)) if cls == "segment" else len(data)
            files.append(StoredFile(rel, len(data), end))
    return files


class OsNemesis:
    """Runs the OS-level steps of a broker chaos run (see the module docstring)."""

    def __init__(self, cluster: Cluster, runlog: RunLog, seed: int, kernel: KernelNet | None,
                 master_of: Callable[[str], int | None], replica_of: Callable[[str, int], int | None],
                 clock_files: dict[str, Path] | None = None) -> None:
        self.cluster, self.runlog, self.seed, self.kernel = cluster, runlog, seed, kernel
        self.master_of, self.replica_of = master_of, replica_of
        self.net_target: str | None = None
        self._dropped = 0
        #: each broker's libfaketime timestamp file, by ``broker_name`` (None: no broker runs under it)
        self.clock_files = clock_files
        self.clock_target: str | None = None
        self._clock_victim: tuple[str, int] | None = None
        #: replicas damaged and not yet back in their SyncStateSet (``verify/damage_model.py``)
        self.ledger = DamageLedger()

    # -- processes ---------------------------------------------------------------------------------
    def _pid(self, actor) -> int | None:
        try:
            return int(ray.get(actor.pid.remote(), timeout=PID_TIMEOUT_S))
        except Exception:  # noqa: BLE001 - restarting, or gone: not a member right now
            return None

    def place_all(self) -> int:
        """Put every member's current process in its cgroup; returns how many were placed."""
        assert self.kernel is not None
        placed = int(self.kernel.place(CLIENT, os.getpid()))
        spec = self.cluster.spec
        for c in spec.controllers:
            pid = self._pid(self.cluster.controller(c.index))
            placed += pid is not None and self.kernel.place(controller_name(c.index), pid)
        for b in spec.brokers:
            pid = self._pid(self.cluster.broker(b.group, b.replica))
            placed += pid is not None and self.kernel.place(broker_name(b.group, b.replica), pid)
        return placed

    # -- network ---------------------------------------------------------------------------------
    def start_net(self, step: sched.NemesisStep) -> bool:
        if self.kernel is None or step.net is None:
            log.warning("%s needs the kernel network faults (root, nftables); skipped", step.kind)
            return False
        spec = self.cluster.spec
        master = self.master_of(step.group)
        leader = self.cluster.leader_index()
        grudge = broker_grudge(
            step.net, group=step.group, master=None if master is None else broker_name(step.group, master),
            replicas={g: [broker_name(g, b.replica) for b in spec.brokers_of(g)] for g in spec.groups},
            controllers=[controller_name(c.index) for c in spec.controllers],
            leader=None if leader is None else controller_name(leader), client=CLIENT)
        if not grudge:
            log.warning("%s %s: no such roles right now; skipped", step.kind, step.net.shape)
            return False
        self.place_all()
        self._dropped = self.kernel.dropped()
        self.kernel.fault(NetFault(grudge, step.net.loss_percent))
        deaf = sorted({d for _s, d in grudge})
        self.net_target = (f"{step.net.shape} {len(grudge)} blocked directions, deaf: {','.join(deaf)}"
                           + (f", loss {step.net.loss_percent}%" if step.net.loss_percent else ""))
        self.runlog.event(step.kind, "start", self.net_target, step.group)
        return True

    def end_net(self, step: sched.NemesisStep) -> None:
        if self.kernel is not None and self.net_target is not None:
            self.kernel.heal()
            dropped = self.kernel.dropped() - self._dropped
            self.runlog.event(step.kind, "end", f"{self.net_target}; the kernel dropped {dropped} packets",
                              step.group)
        self.net_target = None

    # -- files -----------------------------------------------------------------------------------
    def _victim(self, step: sched.NemesisStep) -> tuple[int, Path, Any]:
        replica = self.replica_of(step.group, step.broker_id)
        if replica is None:
            replica = (step.broker_id - 1) % len(self.cluster.spec.brokers_of(step.group))
        spec = self.cluster.spec.brokers_of(step.group)[replica]
        return replica, Path(spec.store_dir), self.cluster.broker(step.group, replica)

    def _within_model(self, step: sched.NemesisStep, replica: int) -> tuple[int, int] | None:
        """(the victim's broker id, the SyncStateSet epoch) if damaging ``replica`` keeps a majority
        of its group's SyncStateSet undamaged (the fault model's precondition); None, logged, if it
        does not or the broker id or the set is unknown. The id is the replica's own (its status):
        the step's broker id names whom the schedule meant, and ``_victim`` falls back to a replica
        by index when that broker is not reachable."""
        status = self.cluster.broker_status(step.group, replica)
        if status is None or status.broker_id is None or status.broker_id < 0:
            log.warning("%s: %s/r%d: broker id unknown right now; skipped", step.kind, step.group, replica)
            return None
        victim = int(status.broker_id)
        try:
            resp = self.cluster.call_controller(GetReplicaInfoRequest(broker_name=step.group), timeout_s=3.0)
        except Exception as e:  # noqa: BLE001 - no answer: the precondition cannot be checked
            log.warning("%s: %s/r%d: no SyncStateSet from the controller (%s); skipped", step.kind, step.group,
                        replica, e)
            return None
        body = resp.body or {}
        if not resp.ok or "sync_state_set" not in body:
            log.warning("%s: %s/r%d: no SyncStateSet from the controller; skipped", step.kind, step.group, replica)
            return None
        sss, epoch = body["sync_state_set"], int(body["sync_state_set_epoch"])
        if not self.ledger.allows(step.group, sss, epoch, victim):
            log.warning("%s: %s/r%d (broker %d): SyncStateSet %s with %s damaged: outside the fault model; "
                        "skipped", step.kind, step.group, replica, victim, sorted(sss),
                        sorted(self.ledger.damaged(step.group)) or "none")
            return None
        return victim, epoch

    def damage(self, step: sched.NemesisStep) -> bool:
        """SIGSTOP the replica, damage one file, read it back, SIGKILL the replica (Ray restarts it)."""
        replica, root, actor = self._victim(step)
        pid = self._pid(actor)
        if pid is None:
            log.warning("%s: %s/r%d is restarting; skipped", step.kind, step.group, replica)
            return False
        checked = self._within_model(step, replica)
        if checked is None:
            return False
        victim, sss_epoch = checked
        os.kill(pid, signal.SIGSTOP)
        try:
            fault = plan_file_fault(random.Random(self.seed * 1_000_003 + step.at_ms), FILE_ACTIONS[step.kind],
                                    step.file_class, store_files(root))
            if fault is None:
                log.warning("%s: no %s with data in %s; skipped", step.kind, step.file_class, root)
                os.kill(pid, signal.SIGCONT)
                return False
            target = f"broker:{step.group}/r{replica} {fault.describe()}"
            self.runlog.event(step.kind, "start", target, step.group)
            on_disk = _apply(root / fault.path, fault)
            os.kill(pid, signal.SIGKILL)
            self.ledger.record(step.group, victim, sss_epoch)
        except BaseException:
            _signal(pid, signal.SIGCONT)
            raise
        self.runlog.event(step.kind, "end", f"{target}; on disk: {on_disk}; restarted", step.group)
        return True

    def lose_unsynced(self, step: sched.NemesisStep) -> bool:
        replica, root, actor = self._victim(step)
        pid = self._pid(actor)
        if pid is None:
            log.warning("lose-unsynced: %s/r%d is restarting; skipped", step.group, replica)
            return False
        checked = self._within_model(step, replica)
        if checked is None:
            return False
        victim, sss_epoch = checked
        target = f"broker:{step.group}/r{replica}"
        (root / LOST_REPORT).unlink(missing_ok=True)
        self.runlog.event(step.kind, "start", target, step.group)
        (root / TRIGGER).touch()
        self.ledger.record(step.group, victim, sss_epoch)
        deadline = time.monotonic() + LOSE_TIMEOUT_S
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        if _alive(pid):
            (root / TRIGGER).unlink(missing_ok=True)
            self.runlog.event(step.kind, "end", f"{target}: no undo disk answered (store.track_unsynced off?)",
                              step.group)
            return False
        report = json.loads((root / LOST_REPORT).read_text()) if (root / LOST_REPORT).exists() else {}
        self.runlog.event(step.kind, "end", f"{target}: dropped {report.get('records', '?')} unsynced changes, "
                          f"{report.get('bytes', '?')} bytes; restarted", step.group)
        return True


    # -- clocks ----------------------------------------------------------------------------------
    def start_clock(self, step: sched.NemesisStep) -> bool:
        """Jump one replica's wall clock by ``step.clock_offset_s`` and wait until it shows."""
        if self.clock_files is None or step.clock_offset_s is None:
            log.warning("clock-broker needs the brokers under libfaketime; skipped")
            return False
        replica = self.master_of(step.group) if step.broker_id is None else self.replica_of(step.group, step.broker_id)
        if replica is None:
            log.warning("clock-broker: %s has no %s right now; skipped", step.group,
                        "master" if step.broker_id is None else f"broker {step.broker_id}")
            return False
        offset = step.clock_offset_s
        written = now_ms()    # the fault is in force from the write (the checker's window starts here)
        set_offset(self.clock_files[broker_name(step.group, replica)], offset)
        self._clock_victim = (step.group, replica)
        seen = self._seen_offset_ms(step.group, replica, offset * 1000)
        self.clock_target = sched.clock_target(f"broker:{step.group}/r{replica}", offset)
        self.runlog.event(step.kind, "start", f"{self.clock_target}; {_seen(seen)}", step.group, time_ms=written)
        return True

    def end_clock(self, step: sched.NemesisStep) -> None:
        if self._clock_victim is None or self.clock_files is None:
            return
        group, replica = self._clock_victim
        set_offset(self.clock_files[broker_name(group, replica)], 0)
        self._clock_victim = None
        seen = self._seen_offset_ms(group, replica, 0)
        self.runlog.event(step.kind, "end", f"{self.clock_target}; back to real time: {_seen(seen)}", group)

    def reset_clocks(self) -> None:
        """Every broker back to real time (the run's final heal)."""
        for path in (self.clock_files or {}).values():
            set_offset(path, 0)
        self._clock_victim = None

    def _seen_offset_ms(self, group: str, replica: int, want_ms: int) -> float | None:
        """The replica's wall clock minus ours once it is within the slack of ``want_ms`` (bounded
        wait; None if it never answered: restarting or paused, it sees the file when it runs)."""
        actor = self.cluster.broker(group, replica)
        deadline = time.monotonic() + CLOCK_SEEN_TIMEOUT_S
        seen = None
        while time.monotonic() < deadline:
            try:
                before = time.time() * 1000
                theirs = ray.get(actor.wall_clock_ms.remote(), timeout=PID_TIMEOUT_S)
                seen = theirs - (before + time.time() * 1000) / 2
            except Exception:  # noqa: BLE001 - restarting: ask again
                seen = None
            if seen is not None and abs(seen - want_ms) <= CLOCK_SEEN_SLACK_MS:
                return seen
            time.sleep(0.1)
        return seen


def _seen(offset_ms: float | None) -> str:
    return "its clock did not answer" if offset_ms is None else f"seen {offset_ms / 1000:+.1f} s"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return _state(pid) != "Z"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "X"


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _apply(path: Path, fault) -> str:
    """Write the damage durably and read it back: what is on disk now (proof the fault happened)."""
    before = path.read_bytes()
    after = apply_fault(fault, before)
    if after is None:
        path.unlink()
        return "deleted" if not path.exists() else "STILL PRESENT"
    with open(path, "r+b") as fh:
        fh.truncate(len(after))
        fh.seek(0)
        fh.write(after)
        fh.flush()
        os.fsync(fh.fileno())
    now = path.read_bytes()
    if fault.action == "flip-bit":
        return f"byte {fault.offset} {before[fault.offset]:#04x} -> {now[fault.offset]:#04x}"
    return f"{len(now)} bytes (was {len(before)})"
