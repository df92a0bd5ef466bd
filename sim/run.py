"""Build a simulated cluster for one seed, inject faults, check invariants, report.

``run_seed(seed, config)`` builds the world (the controller core, ``config.groups`` groups of
``config.replicas`` brokers, a producer and a consumer per group), schedules seeded faults for
``config.duration_ms`` (kills, power losses, crashes between two IO steps, partitions of every
shape, controller leader changes with lost commits, connection resets), then heals everything and
lets the cluster settle for ``config.settle_ms`` before the final checks. A violation stops the run
and comes back with the seed and the last events (``SimResult.trace``); ``--seed S`` replays it
exactly. ``shrink`` re-runs a failing seed with fewer faults and a shorter run and returns the
smallest configuration that still fails.
"""

from __future__ import annotations

import dataclasses
import functools
import multiprocessing
import random
import time
from dataclasses import dataclass, field
from typing import Callable

from rocketray.broker.config import FlushMode
from rocketray.broker.role import Role
from rocketray.sim.broker import SimBroker
from rocketray.sim.timings import BrokerTimings
from rocketray.sim.clients import SimConsumer, SimProducer
from rocketray.sim.controller import CONTROLLER, SimController
from rocketray.sim.disk import CrashMode
from rocketray.sim.invariants import Invariants
from rocketray.sim.net import Network
from rocketray.sim.windows import Windows
from rocketray.sim.world import Violation, World

__all__ = ["SimConfig", "SimResult", "Sim", "run_seed", "run_seeds", "shrink", "FAULTS", "PROFILES", "CI_BUDGET", "swarm"]

FAULTS = ("kill", "power-loss", "io-crash", "isolate", "one-way", "split", "controller-cut",
          "leader-change", "reset", "heal")
#: Fault kinds beyond the default mix (a profile lists them): ``slow`` congests one direction of
#: one link between two brokers (2-30 bytes/ms) until the next heal.
EXTRA_FAULTS = ("slow",)


@dataclass(frozen=True, slots=True)
class SimConfig:
    groups: int = 1
    replicas: int = 3
    duration_ms: int = 12_000
    settle_ms: int = 10_000
    fault_gap_ms: tuple[int, int] = (300, 1500)
    max_faults: int = 12
    faults: tuple[str, ...] = FAULTS
    loss: float = 0.01
    window_bytes: int = 64 * 1024
    commit_fault_p: float = 0.02
    one_at_a_time: bool = False         # a fault only when every broker is up, whole and connected and
                                        # every SyncStateSet has two members or more; partitions heal
                                        # by themselves after 0.3-2 s
    batch: int = 3
    producers: int = 1                  # per group, each with one batch in flight at a time
    produce_interval_ms: int = 30
    consume_interval_ms: int = 50
    commit_interval_ms: int = 500       # each consumer commits its cursor this often (0: never)
    stale_commit_p: float = 0.2         # a commit below one already acknowledged (rebalance, late commit)
    consumer_restart_p: float = 0.03    # per commit tick: the consumer restarts and resumes from the master
    consumer_reset_p: float = 0.0       # per commit tick: an admin resets the group's offset (a reset record)
    burst_p: float = 0.0                # after a fault, another one this likely within ``burst_ms``, at the
    burst_ms: tuple[int, int] = (5, 400)  # serving master half the time: the windows overlapping faults open
    swarm: bool = False                 # each seed draws its own fault mix and rates (``swarm``)
    window_p: float = 0.0               # a nemesis step waits for a rare window instead (sim/windows.py)
    in_flight_after_crash: bool = True  # a crashed node's sends still arrive (all after a kill, what was
                                        # on the wire after a power loss); False: dropped with it
    timings: BrokerTimings = field(default_factory=BrokerTimings)


#: Fault mixes (``rocketray simulate --profile``). ``default`` draws every fault kind; the others
#: concentrate on one family, which is where random search finds most broken rules (sim/scenarios.py).
PROFILES: dict[str, SimConfig] = {
    "default": SimConfig(),
    # role switches take 5-60 ms a step, as production's do: puts reach a replica while it becomes
    # master (held by the put gate) or while a master switches away, and crashes land mid-switch
    "crashes": SimConfig(faults=("kill", "power-loss", "io-crash", "heal", "isolate"), fault_gap_ms=(150, 700),
                         max_faults=40, timings=BrokerTimings(switch_ms=(5, 60))),
    "network": SimConfig(faults=("reset", "one-way", "isolate", "controller-cut", "split", "heal",
                                 "leader-change", "slow"), fault_gap_ms=(100, 600), max_faults=40,
                         window_bytes=8 * 1024),
    "load": SimConfig(batch=8, produce_interval_ms=10, fault_gap_ms=(150, 700), max_faults=40,
                      timings=BrokerTimings(segment_bytes=1024, not_catchup_ms=1000)),
    "async": SimConfig(faults=("kill", "power-loss", "io-crash", "isolate", "reset", "controller-cut",
                               "leader-change"), fault_gap_ms=(200, 900), max_faults=30, one_at_a_time=True,
                       timings=BrokerTimings(flush_mode=FlushMode.ASYNC)),
    # async flush with overlapping faults and bursts: the invariants forgive exactly what async flush
    # may lose (sim/loss.py: a power loss, and an election of a broker that lost power while no
    # replica the controller could have elected holds what it lost; docs/simulation.md)
    "async-overlap": SimConfig(faults=("kill", "power-loss", "io-crash", "isolate", "reset", "controller-cut",
                                       "leader-change", "heal"), fault_gap_ms=(200, 900), max_faults=30,
                               burst_p=0.4, timings=BrokerTimings(flush_mode=FlushMode.ASYNC)),
    "controller": SimConfig(commit_fault_p=0.2, loss=0.05, fault_gap_ms=(150, 700), max_faults=40,
                            timings=BrokerTimings(not_catchup_ms=800, shrink_ms=100)),
    # each seed its own mix (``swarm``)
    "swarm": SimConfig(swarm=True),
    # half the faults wait for a rare window (sim/windows.py): a proposal at the controller, a
    # counted member behind or just restarted, an old master back
    "windows": SimConfig(window_p=0.5, fault_gap_ms=(150, 700), max_faults=30),
    # the controller at scale: dozens of groups, and ``node-loss`` takes a replica of every
    # group at once (the masters of a third of them), a third of the time with the controller leader
    # (a lighter load per group: the controller's work grows with the groups, the data path per group not)
    "scale": SimConfig(groups=24, faults=FAULTS + ("node-loss",), fault_gap_ms=(200, 800), max_faults=16,
                       duration_ms=8_000, settle_ms=8_000, produce_interval_ms=100, consume_interval_ms=200),
}
#: async flush with overlapping faults, half of them waiting for a window (a member that lost its
#: tail and is still counted is the window the election's ranking rules need)
PROFILES["async-windows"] = dataclasses.replace(PROFILES["async-overlap"], window_p=0.5)


def swarm(seed: int, base: SimConfig) -> SimConfig:
    """Swarm testing (as FoundationDB and TigerBeetle do): ``seed``'s own fault mix, drawn from a
    generator of its own so the run's schedule stays the seed's. A random subset of the fault kinds
    (a mix without some kinds reaches states the full mix interrupts: a long run of only resets, a
    congested link nobody heals), its rates, bursts of faults close together, the network's loss and
    window, the load, the shrink and catch-up limits, restart delays, whether brokers hold
    controller sessions and ``min_in_sync_replicas`` 1 or 2 (invariant 11, sim/ack_checks.py, checks
    what a PUT_OK promised) (sync flush: overlapping faults under async flush are ``async-overlap``'s)."""
    rng = random.Random(f"swarm-{seed}")
    kinds = [k for k in FAULTS + EXTRA_FAULTS if k != "heal"]
    chosen = tuple(k for k in kinds if rng.random() < 0.5) or (rng.choice(kinds),)
    if rng.random() < 0.6:
        chosen += ("heal",)
    low = rng.choice((60, 150, 300, 600))
    t = base.timings
    restart_min = rng.choice((100, 300, 300))
    return dataclasses.replace(
        base, swarm=False, faults=chosen, fault_gap_ms=(low, low * rng.choice((2, 4, 8))),
        max_faults=rng.choice((6, 12, 25, 50)), loss=rng.choice((0.0, 0.01, 0.05)),
        commit_fault_p=rng.choice((0.0, 0.02, 0.2)), window_bytes=rng.choice((1024, 8 * 1024, 64 * 1024)),
        batch=rng.choice((1, 3, 8)), produce_interval_ms=rng.choice((5, 10, 30)),
        producers=rng.choice((1, 1, 2, 4)), burst_p=rng.choice((0.0, 0.3, 0.6)),
        timings=dataclasses.replace(t, shrink_ms=rng.choice((100, 500)), not_catchup_ms=rng.choice((800, 1500, 3000)),
                                    segment_bytes=rng.choice((1024, 4096)),
                                    controller_sessions=rng.random() < 0.75,
                                    restart_min_ms=restart_min, restart_max_ms=restart_min * rng.choice((2, 8)),
                                    min_in_sync_replicas=rng.choice((1, 2))))


#: The CI budget: seeds per fault mix (2,064 in all); ``tests/sim/test_simulator.py`` runs them with
#: no violation allowed, ``sim/mutants.py`` runs them against every mutant until it is caught.
CI_BUDGET: dict[str, int] = {"default": 300, "windows": 200, "swarm": 250, "crashes": 250, "network": 250, "load": 250,
                             "controller": 250, "async": 250, "scale": 4, "async-overlap": 60}


@dataclass(slots=True)
class SimResult:
    seed: int
    ok: bool
    violation: str | None
    trace: list[str]
    steps: int
    sim_ms: int
    acked: int
    read: int
    faults: int
    elections: int
    commits: int = 0            # acknowledged offset commits


class Sim:
    """One simulated cluster; ``schedule`` adds scripted steps (the named scenarios use it)."""

    def __init__(self, seed: int, config: SimConfig) -> None:
        self.seed, self.config = seed, config
        self.world = World(seed)
        self.net = Network(self.world, loss=config.loss, window_bytes=config.window_bytes,
                           in_flight=config.in_flight_after_crash)
        self.net.power_lost = self._power_lost
        self._power_losses: dict[str, int] = {}
        t = config.timings
        self.controller = SimController(self.world, self.net, cluster="sim",
                                        heartbeat_timeout_ms=t.heartbeat_timeout_ms,
                                        scan_interval_ms=t.poll_ms, commit_fault_p=config.commit_fault_p,
                                        heartbeats_on_sessions=t.controller_sessions)
        self.groups: dict[str, list[SimBroker]] = {}
        self.brokers: dict[str, SimBroker] = {}
        for g in range(config.groups):
            group = f"g{g}"
            self.controller.assign_ids(group, list(range(1, config.replicas + 1)))
            members = [SimBroker(self.world, self.net, self.controller, cluster="sim", group=group, broker_id=i,
                                 timings=t, disk_seed=seed * 1000 + g * 10 + i)
                       for i in range(1, config.replicas + 1)]
            self.groups[group] = members
            for b in members:
                self.brokers[b.name] = b
        for b in self.brokers.values():
            b.peers = self.brokers
        self.controller.notify_to = self._notify
        self.controller.on_leader_change = self._reopen_sessions
        self.producers = [SimProducer(self.world, self.net, self.controller, self.brokers,
                                      name=f"producer-{g}" + (f"-{k}" if k else ""), group=g, batch=config.batch,
                                      interval_ms=config.produce_interval_ms, timeout_ms=t.slave_timeout_ms + 500)
                          for g in self.groups for k in range(config.producers)]
        self.consumers = [SimConsumer(self.world, self.net, self.controller, self.brokers, self.groups[g],
                                      name=f"consumer-{g}", group=g, interval_ms=config.consume_interval_ms,
                                      commit_interval_ms=config.commit_interval_ms,
                                      timeout_ms=t.slave_timeout_ms + 500, stale_p=config.stale_commit_p,
                                      restart_p=config.consumer_restart_p, reset_p=config.consumer_reset_p)
                          for g in self.groups]
        self.invariants = Invariants(self.controller, self.groups, self.producers, self.consumers,
                                     async_flush=t.flush_mode is FlushMode.ASYNC)
        self.faults = 0
        self.windows = Windows(self)

    def _power_lost(self, name: str) -> bool:
        """Asked by the network as ``name`` goes down: was it a power loss (not a kill)?"""
        b = self.brokers.get(name)
        if b is None:
            return False
        before, self._power_losses[name] = self._power_losses.get(name, 0), b.power_losses
        return b.power_losses != before

    def _notify(self, group: str, broker_id: int, info) -> None:
        b = self.brokers[f"{group}-{broker_id}"]
        self.net.notify(CONTROLLER, b.name, lambda: b.notified(info), owner=b)

    def _reopen_sessions(self) -> None:
        """A new controller leader: every live broker opens its session with it."""
        for b in self.brokers.values():
            if b.up:
                b.open_session()

    # -- scripts -----------------------------------------------------------------------------------
    def when(self, predicate: Callable[[], bool], action: Callable[[], None], every_ms: int = 5) -> None:
        """Run ``action`` once, at the first poll (every ``every_ms`` of virtual time) where
        ``predicate`` holds: how a scripted scenario waits for a state instead of a fixed time."""
        def poll() -> None:
            if predicate():
                action()
            else:
                self.world.at(every_ms, poll)
        self.world.at(every_ms, poll)

    def serving_master(self, group: str) -> SimBroker | None:
        """The broker the controller names master of ``group``, if it is up and serving that term."""
        master_id, epoch = self.controller.master_of(group)
        for b in self.groups[group]:
            if b.up and b.id == master_id and b.ha_role == Role.MASTER and b.ha_epoch == epoch:
                return b
        return None

    # -- faults ------------------------------------------------------------------------------------
    def inject(self, kind: str, target: SimBroker | None = None) -> None:
        """Apply one fault now (``target``: the broker, else one drawn by the seed)."""
        rng = self.world.rng
        b = target or rng.choice(list(self.brokers.values()))
        self.faults += 1
        self.world.note(f"FAULT {kind} {b.name if kind not in ('heal', 'leader-change') else ''}")
        names = list(self.brokers)
        if kind == "kill":
            b.crash(CrashMode.KILL)
        elif kind == "power-loss":
            b.crash(CrashMode.POWER_LOSS)
        elif kind == "io-crash":
            if b.up:
                b.disk.crash_after(rng.randint(1, 30), rng.choice((CrashMode.KILL, CrashMode.POWER_LOSS)))
        elif kind == "isolate":
            for other in names + [CONTROLLER]:
                if other != b.name:
                    self.net.cut(b.name, other)
                    self.net.cut(other, b.name)
        elif kind == "one-way":
            other = rng.choice([n for n in names + [CONTROLLER] if n != b.name])
            self.net.cut(b.name, other) if rng.random() < 0.5 else self.net.cut(other, b.name)
        elif kind == "split":
            rng.shuffle(names)
            half = set(names[: len(names) // 2])
            for x in names + [CONTROLLER]:
                for y in names + [CONTROLLER]:
                    if (x in half) != (y in half):
                        self.net.cut(x, y)
        elif kind == "controller-cut":
            self.net.cut(b.name, CONTROLLER)
            self.net.cut(CONTROLLER, b.name)
        elif kind == "leader-change":
            self.controller.change_leader()
        elif kind == "reset":
            live = [c for c in self.net.connections if c.alive]
            if live:
                rng.choice(live).reset("nemesis reset")
        elif kind == "slow":
            other = rng.choice([n for n in names if n != b.name])
            self.net.slow(b.name, other, rng.randint(2, 30))
        elif kind == "node-loss":
            self._node_loss()
        elif kind == "heal":
            self.net.heal()
        else:
            raise ValueError(f"unknown fault {kind!r}")

    def _node_loss(self) -> None:
        """One machine dies: replica ``r`` of group ``g`` sits on node ``(g + r) % replicas``, so one
        node holds a replica of every group. Killed (their sessions close) or, one time in four,
        powered off; one time in three the controller leader was on it too (it dies first, so the
        closes reach no one and the new leader's rules must find the dead masters)."""
        rng = self.world.rng
        node = rng.randrange(self.config.replicas)
        mode = CrashMode.POWER_LOSS if rng.random() < 0.25 else CrashMode.KILL
        if rng.random() < 1 / 3:
            self.controller.change_leader()
        self.world.note(f"node {node} lost ({mode.name})")
        for g, members in enumerate(self.groups.values()):
            members[(node - g) % len(members)].crash(mode)

    def _nemesis(self) -> None:
        if self.world.now_ms >= self.config.duration_ms or self.faults >= self.config.max_faults:
            return
        if not self.config.one_at_a_time or self._all_whole():
            if self.config.window_p > 0 and self.world.rng.random() < self.config.window_p:
                self.windows.arm()
                self.world.at(self.world.rng.randint(*self.config.fault_gap_ms), self._nemesis, what="")
                return
            kind = self.world.rng.choice(self.config.faults)
            self.inject(kind)
            if self.config.one_at_a_time and kind in ("isolate", "one-way", "split", "controller-cut", "slow"):
                self.world.at(self.world.rng.randint(300, 2000), self.net.heal, what="heal (one at a time)")
            elif self.config.burst_p > 0 and self.world.rng.random() < self.config.burst_p:
                self.world.at(self.world.rng.randint(*self.config.burst_ms), self._burst, what="")
        self.world.at(self.world.rng.randint(*self.config.fault_gap_ms), self._nemesis, what="")

    def _burst(self) -> None:
        """A second fault right after one (``burst_p``), at a group's serving master half the time:
        a member lost its tail and the master goes next, a slave is elected and loses power, a
        proposal waits while the controller's link is cut."""
        rng = self.world.rng
        if self.world.now_ms >= self.config.duration_ms or self.faults >= self.config.max_faults:
            return                          # past the fault window: everything is healed by now
        kind = rng.choice([k for k in self.config.faults if k != "heal"] or ["heal"])
        target = self.serving_master(rng.choice(list(self.groups))) if rng.random() < 0.5 else None
        self.inject(kind, target)

    def _all_whole(self) -> bool:
        # an io-crash armed but not yet fired is a fault still in progress, and so is a group whose
        # SyncStateSet is down to one member: what that member acknowledges alone is on one replica,
        # which async flush does not promise to keep through its power loss (README, known limits)
        return (not self.net.cuts() and all(b.up and not b.disk.armed and not self.invariants.exempt(b)
                                            for b in self.brokers.values())
                and all(len(self.controller.sync_state_set(g)) >= 2 for g in self.groups))

    def _heal_all(self) -> None:
        self.world.note("HEAL everything")
        self.net.heal()
        for b in self.brokers.values():
            b.disk.set_hook(None)

    # -- run ------------------------------------------------------------------------------------------
    def run(self, scripted: Callable[["Sim"], None] | None = None) -> SimResult:
        w, cfg = self.world, self.config
        for b in self.brokers.values():
            b.boot()
        self.controller.start()
        for p in self.producers:
            p.start()
        for c in self.consumers:
            c.start()
        if scripted is not None:
            scripted(self)
        elif cfg.max_faults > 0:
            w.at(w.rng.randint(*cfg.fault_gap_ms), self._nemesis)
        violation = None
        try:
            w.run(cfg.duration_ms, self.invariants.check_step)
            self._heal_all()
            heal_ms = w.now_ms
            w.run(cfg.duration_ms + cfg.settle_ms, self.invariants.check_step)
            self.invariants.check_settled(heal_ms)
        except Violation as exc:
            violation = str(exc)
            w.note(f"VIOLATION {violation}")
        return SimResult(self.seed, violation is None, violation, list(w.trace), w.steps, w.now_ms,
                         sum(len(p.acked) for p in self.producers), sum(len(c.read) for c in self.consumers),
                         self.faults, len(self.controller.elections),
                         sum(len(c.committed) for c in self.consumers))


def run_seed(seed: int, config: SimConfig = SimConfig(),
             scripted: Callable[[Sim], None] | None = None) -> SimResult:
    return Sim(seed, swarm(seed, config) if config.swarm else config).run(scripted)


def run_seeds(seeds: range | list[int], config: SimConfig = SimConfig(), *,
              stop_at_first: bool = True, progress: Callable[[SimResult], None] | None = None,
              workers: int = 1) -> dict:
    """Run many seeds (in ``workers`` forked processes when > 1; results are taken in seed order,
    so the first failing seed is the same either way); the summary has ``seeds``, ``violations``,
    ``seeds_per_s``, ``steps`` and the first failing seed with its trace."""
    started = time.perf_counter()
    results = []
    first = None
    one = functools.partial(run_seed, config=config)
    pool = multiprocessing.get_context("fork").Pool(workers) if workers > 1 else None
    try:
        outcomes = pool.imap(one, seeds, chunksize=2) if pool is not None else map(one, seeds)
        for r in outcomes:
            results.append(r)
            if progress is not None:
                progress(r)
            if not r.ok and first is None:
                first = r
                if stop_at_first:
                    break
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
    wall = max(time.perf_counter() - started, 1e-9)
    sim_ms = sum(r.sim_ms for r in results)
    return {
        "seeds": len(results),
        "violations": sum(not r.ok for r in results),
        "seeds_per_s": round(len(results) / wall, 2),
        "sim_s_per_wall_s": round(sim_ms / 1000 / wall, 1),
        "workers": workers,
        "steps": sum(r.steps for r in results),
        "acked": sum(r.acked for r in results),
        "read": sum(r.read for r in results),
        "commits": sum(r.commits for r in results),
        "faults": sum(r.faults for r in results),
        "elections": sum(r.elections for r in results),
        "first_failing_seed": None if first is None else first.seed,
        "violation": None if first is None else first.violation,
        "trace": None if first is None else first.trace,
    }


def shrink(seed: int, config: SimConfig) -> SimConfig:
    """The smallest configuration (fewer faults, shorter run) under which ``seed`` still fails."""
    best = config
    for faults in range(0, config.max_faults):
        for duration in sorted({config.duration_ms // 4, config.duration_ms // 2, config.duration_ms}):
            candidate = dataclasses.replace(config, max_faults=faults, duration_ms=duration)
            if not run_seed(seed, candidate).ok:
                return candidate
    return best
