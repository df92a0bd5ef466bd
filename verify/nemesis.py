"""Seeded nemesis schedules (pure: no clock, no IO): one module for both chaos runners.

Every random choice is drawn from ``random.Random(seed)``, so a failing run is replayed from its seed.

**Broker chaos** (``rocketray.chaos.broker_chaos``): ``make_schedule`` alternates quiet and faulty
periods: after a warm-up, one fault at a time begins, lasts ``duration_ms`` (zero for kills: Ray
restarts the actor by itself), and is followed by ``interval_ms`` plus a random jitter of quiet
before the next one; nothing is scheduled to end after ``run_ms``, when the runner heals everything
and does the final reads. Targets that only exist at run time (the current master of a group, the
controller leader) are left for the runner to resolve; fixed targets (a replica, a controller index)
are drawn here. The kinds are ``FAULT_KINDS``, declared once in ``rocketray.verify.history`` (the
run-directory format accepts exactly those plus ``heal``): ``kill-master`` (group), ``kill-broker`` /
``pause-broker`` / ``partition-ha`` (group and broker id; ``partition-ha`` cuts that replica's HA
connections), ``kill-controller-leader``, ``kill-controller`` / ``pause-controller`` (controller
index), ``clock-broker`` (a group's replica, or its master at run time when ``broker_id`` is None,
and a wall-clock offset from ``CLOCK_JUMPS_S``), and ``all``, which draws each step's kind from the
others.

**Controller chaos** (``rocketray.chaos.controller_chaos``, Raft nodes behind a proxy network):
``make_controller_schedule`` plans ``CONTROLLER_NEMESES`` as start/end pairs. A *grudge* is a frozenset
of directed pairs ``(src, dst)``: messages from ``src`` to ``dst`` are dropped (the proxy network
enforces it). The topology functions build the grudges of the classic Jepsen partitions over nodes
``0..n-1``:

- ``isolate_node``: one node hears no one and no one hears it;
- ``random_halves``: a random split into two halves, no traffic across;
- ``majorities_ring``: nodes on a shuffled ring; each node hears the majority-sized window of the
  ring around it (itself included), so every node sees a majority and no two see the same one
  (with 5 nodes the windows are symmetric; with 3 the grudge is necessarily one-way);
- ``bridge``: two halves that cannot talk, and one node that talks to both.

Each fault is a ``start`` step and an ``end`` step (the heal, the restart of a killed node, the
SIGCONT of a paused one); the runner logs what it did with wall-clock timestamps.

**Consumer churn** (the broker chaos run's consumer groups, ``rocketray.chaos.group_workload``):
``make_churn_schedule`` plans ``crash-consumer`` (abandon a consumer without leaving its group) and
``leave-consumer`` (close it) steps, each followed by a new consumer in the same slot, on a
generator of its own so a seed's broker fault schedule does not change when churn is added.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rocketray.verify.filefaults import BROKER_FILE_CLASSES, FILE_KINDS as _FILE_KINDS
from rocketray.verify.history import FAULT_KINDS, NemesisEvent, Number
from rocketray.verify.netfaults import NET_KINDS as _NET_KINDS, NetShape, draw_shape

#: ``all`` draws every kind below (not kill-node); ``process`` the kills, pauses and HA-proxy
#: partitions; ``os`` the OS-level kinds (kernel network, files, lost unsynced writes).
SCHEDULE_KINDS = (*FAULT_KINDS, "all", "process", "os")
KILL_KINDS = frozenset({"kill-master", "kill-broker", "kill-controller-leader", "kill-controller"})
NET_KINDS = frozenset(_NET_KINDS)
#: one replica's files damaged (or its unsynced writes dropped), then it restarts: instantaneous steps
REPLICA_FILE_KINDS = frozenset({*_FILE_KINDS, "lose-unsynced"})
#: one replica's wall clock jumped by ``clock_offset_s`` for the step's duration (libfaketime)
CLOCK_KINDS = frozenset({"clock-broker"})
BROKER_KINDS = frozenset({"kill-broker", "pause-broker", "partition-ha", *REPLICA_FILE_KINDS, *CLOCK_KINDS})
CONTROLLER_KINDS = frozenset({"kill-controller", "pause-controller"})
#: Whole-node faults: the node holding a group's master dies for the step's duration, then comes back.
#: They need a cluster on several labelled nodes (``rocketray chaos --ray-nodes N``), so ``all`` does
#: not draw them.
NODE_KINDS = frozenset({"kill-node"})
OS_DRAWS = (*_NET_KINDS, *_FILE_KINDS, "lose-unsynced", "clock-broker")
PROCESS_DRAWS = tuple(k for k in FAULT_KINDS if k not in NODE_KINDS and k not in OS_DRAWS)
ALL_DRAWS = (*PROCESS_DRAWS, *OS_DRAWS)
DRAWS = {"all": ALL_DRAWS, "process": PROCESS_DRAWS, "os": OS_DRAWS}

#: Bound on the number of steps of one schedule (TigerStyle: every loop bounded).
MAX_STEPS = 100_000
#: Wall-clock offsets (seconds) a clock fault jumps one member by (the broker run's ``clock-broker``,
#: the controller run's ``clock``): back and forward, by half a minute to an hour.
CLOCK_JUMPS_S = (-600, -30, 30, 600, 3600)


@dataclass(frozen=True, slots=True)
class NemesisStep:
    """One planned fault: what, on whom, when (ms from run start) and for how long."""

    at_ms: int
    kind: str
    group: str | None = None
    broker_id: int | None = None
    controller: int | None = None
    duration_ms: int = 0
    #: kernel network faults: the shape to resolve at run time
    net: NetShape | None = None
    #: file faults: the class of file damaged (``verify/filefaults.py``)
    file_class: str | None = None
    #: clock faults: the victim's wall clock is real time + this many seconds while the step lasts
    clock_offset_s: int | None = None

    @property
    def end_ms(self) -> int:
        return self.at_ms + self.duration_ms

    @property
    def target(self) -> str:
        """The planned target: ``master:<group>``, ``broker:<group>/<id>``, ``controller-leader``,
        ``controller:<index>``. Runners resolve ``master:`` and ``controller-leader`` when they act."""
        if self.kind == "kill-master" or (self.kind in CLOCK_KINDS and self.broker_id is None):
            return f"master:{self.group}"
        if self.kind in BROKER_KINDS:
            return f"broker:{self.group}/{self.broker_id}"
        if self.kind == "kill-controller-leader":
            return "controller-leader"
        if self.kind in NODE_KINDS:
            return f"node-of-master:{self.group}"
        if self.kind in NET_KINDS:
            assert self.net is not None
            return f"net:{self.net.shape}:{self.group}"
        return f"controller:{self.controller}"

    def event(self, phase: str, time_ms: Number, target: str | None = None) -> NemesisEvent:
        """The ``nemesis.jsonl`` record of this step's start or end, at the time it really happened;
        ``target`` overrides the planned one with the resolved actor (e.g. the killed master)."""
        assert phase in ("start", "end"), phase
        return NemesisEvent(time_ms, self.kind, phase, self.target if target is None else target, self.group)

    def to_json(self) -> dict[str, Any]:
        return {"at_ms": self.at_ms, "kind": self.kind, "group": self.group, "broker_id": self.broker_id,
                "controller": self.controller, "duration_ms": self.duration_ms, "target": self.target,
                **({"net": self.net.to_json()} if self.net else {}),
                **({"file_class": self.file_class} if self.file_class else {}),
                **({"clock_offset_s": self.clock_offset_s} if self.clock_offset_s is not None else {})}


def make_schedule(kind: str, seed: int, *, groups: Mapping[str, Sequence[int]], controllers: int, run_ms: int,
                  interval_ms: int = 10_000, fault_ms: int = 5_000, jitter_ms: int = 2_000,
                  warmup_ms: int | None = None) -> tuple[NemesisStep, ...]:
    """The fault steps of one run, in time order, never overlapping, all ending by ``run_ms``.

    ``groups`` maps broker-group name to its replicas' broker ids; ``controllers`` is the number of
    controller actors. Pauses and partitions last between ``fault_ms // 2`` and ``fault_ms``; the gap
    after each step is ``interval_ms`` plus up to ``jitter_ms``; the first step starts after
    ``warmup_ms`` (default ``interval_ms``) plus up to ``jitter_ms``.
    """
    if kind not in SCHEDULE_KINDS:
        raise ValueError(f"unknown nemesis kind {kind!r}; expected one of {', '.join(SCHEDULE_KINDS)}")
    if not groups or any(len(ids) == 0 for ids in groups.values()):
        raise ValueError("groups must name at least one group, each with at least one broker id")
    if controllers < 1:
        raise ValueError(f"controllers must be >= 1, got {controllers}")
    if run_ms <= 0 or interval_ms <= 0 or fault_ms < 0 or jitter_ms < 0:
        raise ValueError("run_ms and interval_ms must be > 0; fault_ms and jitter_ms >= 0")
    rng = random.Random(seed)
    group_names = sorted(groups)
    replicas = {g: sorted(groups[g]) for g in group_names}
    t = (interval_ms if warmup_ms is None else warmup_ms) + rng.randint(0, jitter_ms)
    steps: list[NemesisStep] = []
    for _ in range(MAX_STEPS):
        step_kind = rng.choice(DRAWS[kind]) if kind in DRAWS else kind
        step = _draw_step(rng, step_kind, t, group_names, replicas, controllers, fault_ms)
        if step.end_ms > run_ms:
            break
        steps.append(step)
        t = step.end_ms + interval_ms + rng.randint(0, jitter_ms)
    _assert_well_formed(steps, run_ms)
    return tuple(steps)


def _draw_step(rng: random.Random, kind: str, at_ms: int, group_names: Sequence[str],
               replicas: Mapping[str, Sequence[int]], controllers: int, fault_ms: int) -> NemesisStep:
    duration_ms = 0 if kind in KILL_KINDS or kind in REPLICA_FILE_KINDS else rng.randint(fault_ms // 2, fault_ms)
    if kind in REPLICA_FILE_KINDS:
        group = rng.choice(group_names)
        file_class = None if kind == "lose-unsynced" else \
            "consume-queue" if kind == "delete-queue" else rng.choice(BROKER_FILE_CLASSES)
        return NemesisStep(at_ms, kind, group=group, broker_id=rng.choice(replicas[group]), file_class=file_class)
    if kind in NET_KINDS:
        return NemesisStep(at_ms, kind, group=rng.choice(group_names), duration_ms=duration_ms,
                           net=draw_shape(rng, kind))
    if kind == "kill-master":
        return NemesisStep(at_ms, kind, group=rng.choice(group_names))
    if kind in CLOCK_KINDS:   # half the time the master: the scheduler's and the stamps' clock
        group = rng.choice(group_names)
        broker_id = None if rng.random() < 0.5 else rng.choice(replicas[group])
        return NemesisStep(at_ms, kind, group=group, broker_id=broker_id, duration_ms=duration_ms,
                           clock_offset_s=rng.choice(CLOCK_JUMPS_S))
    if kind in BROKER_KINDS:
        group = rng.choice(group_names)
        return NemesisStep(at_ms, kind, group=group, broker_id=rng.choice(replicas[group]),
                           duration_ms=duration_ms)
    if kind in CONTROLLER_KINDS:
        return NemesisStep(at_ms, kind, controller=rng.randrange(controllers), duration_ms=duration_ms)
    if kind in NODE_KINDS:
        return NemesisStep(at_ms, kind, group=rng.choice(group_names), duration_ms=duration_ms)
    assert kind == "kill-controller-leader", kind
    return NemesisStep(at_ms, kind)


def clock_target(member: str, offset_s: int) -> str:
    """The ``nemesis.jsonl`` target of a clock fault on ``member``: ``<member> clock <+/-N>s``
    (the checker reads the offset back with :func:`clock_offset_s`; more may follow after ``;``)."""
    return f"{member} clock {offset_s:+d}s"


_CLOCK_TARGET = re.compile(r" clock ([+-]\d+)s(?:;|$)")


def clock_offset_s(target: str | None) -> int | None:
    """The offset a clock fault's target names (see :func:`clock_target`), None if it names none."""
    match = _CLOCK_TARGET.search(target or "")
    return None if match is None else int(match.group(1))


def clock_windows(events: Iterable[NemesisEvent]) -> list[tuple[Number, Number, int]]:
    """``(start_ms, end_ms, offset_ms)`` of every clock fault in a nemesis log: each start paired
    with the next end of the same kind and group (one without an end lasts to the last event)."""
    ordered = sorted(events, key=lambda e: e.time_ms)
    last = ordered[-1].time_ms if ordered else 0
    open_: dict[tuple[str, str | None], list[tuple[Number, int]]] = {}
    out: list[tuple[Number, Number, int]] = []
    for e in ordered:
        if e.kind not in CLOCK_KINDS:
            continue
        key = (e.kind, e.group)
        offset = clock_offset_s(e.target)
        if e.phase == "start" and offset is not None:
            open_.setdefault(key, []).append((e.time_ms, offset * 1000))
        elif e.phase == "end" and open_.get(key):
            start, offset_ms = open_[key].pop(0)
            out.append((start, e.time_ms, offset_ms))
    out += [(start, last, offset_ms) for starts in open_.values() for start, offset_ms in starts]
    return sorted(out)


def _assert_well_formed(steps: Sequence[NemesisStep], run_ms: int) -> None:
    for a, b in zip(steps, steps[1:]):
        assert a.end_ms < b.at_ms, (a, b)
    for s in steps:
        assert 0 <= s.at_ms <= s.end_ms <= run_ms, s


# -- consumer churn: crashes, leaves and joins of consumer-group members ---------------------------

#: ``crash-consumer`` abandons a consumer without leaving its group (the controller expires it after
#: ``controller.consumer_heartbeat_timeout_ms``); ``leave-consumer`` closes it (it leaves at once).
#: Either way a new consumer (a new process name) joins in its place ``restart_after_ms`` later.
CHURN_KINDS = ("crash-consumer", "leave-consumer")


@dataclass(frozen=True, slots=True)
class ChurnStep:
    """One planned consumer action: at ``at_ms`` (from run start) stop slot ``slot`` of
    ``consumer_group`` (crash or clean leave) and start a new consumer there ``restart_after_ms`` later."""

    at_ms: int
    kind: str
    consumer_group: str
    slot: int
    restart_after_ms: int

    def to_json(self) -> dict[str, Any]:
        return {"at_ms": self.at_ms, "kind": self.kind, "consumer_group": self.consumer_group, "slot": self.slot,
                "restart_after_ms": self.restart_after_ms, "target": f"consumer:{self.consumer_group}/{self.slot}"}


def make_churn_schedule(seed: int, *, consumer_groups: Sequence[str], consumers: int, run_ms: int,
                        interval_ms: int = 5_000, jitter_ms: int = 3_000, warmup_ms: int = 2_000,
                        restart_ms: tuple[int, int] = (300, 3_000), crash_share: float = 2 / 3
                        ) -> tuple[ChurnStep, ...]:
    """Consumer crashes and leaves of one run, in time order, each restart due by ``run_ms``.

    Drawn from its own generator (the seed mixed with a constant), so adding churn to a run leaves
    that seed's broker fault schedule (``make_schedule``) unchanged. A crash is drawn with
    probability ``crash_share``, a clean leave otherwise; the slot's replacement starts between
    ``restart_ms[0]`` and ``restart_ms[1]`` later; steps are ``interval_ms`` plus up to ``jitter_ms``
    apart. Steps may overlap (one slot's restart pending while another slot churns), never on one slot."""
    if not consumer_groups or consumers < 1:
        return ()
    if run_ms <= 0 or interval_ms <= 0 or jitter_ms < 0 or not 0 <= restart_ms[0] <= restart_ms[1]:
        raise ValueError("run_ms and interval_ms must be > 0, jitter_ms >= 0, restart_ms an ordered range")
    rng = random.Random(seed * 1_000_003 + 7_919)
    names = sorted(consumer_groups)
    busy_until: dict[tuple[str, int], int] = {}
    t = warmup_ms + rng.randint(0, jitter_ms)
    steps: list[ChurnStep] = []
    for _ in range(MAX_STEPS):
        kind = CHURN_KINDS[0] if rng.random() < crash_share else CHURN_KINDS[1]
        step = ChurnStep(t, kind, rng.choice(names), rng.randrange(consumers), rng.randint(*restart_ms))
        if step.at_ms + step.restart_after_ms > run_ms:
            break
        if busy_until.get((step.consumer_group, step.slot), -1) < step.at_ms:
            steps.append(step)
            busy_until[(step.consumer_group, step.slot)] = step.at_ms + step.restart_after_ms
        t += interval_ms + rng.randint(0, jitter_ms)
    return tuple(steps)


# -- controller chaos: Jepsen partitions and process faults of Raft nodes ---------------------------

Grudge = frozenset[tuple[int, int]]

PARTITIONS = ("partition-random-node", "partition-random-halves", "partition-majorities-ring", "bridge")
PROCESS_FAULTS = ("kill", "pause")
#: The controller run's OS-level faults (``os``): random loss on one node's links (the kernel), one
#: node's wall clock jumped (libfaketime), one node's newest snapshot or journal damaged before it
#: restarts. ``all`` stays the partitions and process faults.
NODE_FILE_FAULTS = ("corrupt-snapshot", "truncate-snapshot", "corrupt-journal", "truncate-journal")
CONTROLLER_OS = ("loss", "clock") + NODE_FILE_FAULTS
CONTROLLER_NEMESES = PARTITIONS + PROCESS_FAULTS
CONTROLLER_KINDS_ALL = CONTROLLER_NEMESES + CONTROLLER_OS
LEADER = -1  # a kill/pause target resolved to the current Raft leader when the step runs
LEADER_SWAPPABLE = ("partition-random-node", "partition-random-halves")


class NemesisSpecError(ValueError):
    """An unknown controller-chaos nemesis name on the command line."""


def parse_nemeses(spec: str | Sequence[str]) -> tuple[str, ...]:
    """``"kill,bridge"`` -> ``("kill", "bridge")``; ``"all"`` expands to every kind; ``"none"`` is empty."""
    names = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    out: list[str] = []
    for name in names:
        expanded = {"all": CONTROLLER_NEMESES, "os": CONTROLLER_OS, "none": ()}.get(name, (name,))
        for kind in expanded:
            if kind not in CONTROLLER_KINDS_ALL:
                raise NemesisSpecError(f"unknown nemesis {kind!r}; choose from "
                                       f"{', '.join(CONTROLLER_KINDS_ALL + ('all', 'os'))}")
            if kind not in out:
                out.append(kind)
    return tuple(out)


def majority(n: int) -> int:
    return n // 2 + 1


def grudge_between(components: Iterable[Iterable[int]]) -> Grudge:
    """Block both directions between every two distinct components."""
    comps = [frozenset(c) for c in components]
    blocked: set[tuple[int, int]] = set()
    for a_index, a in enumerate(comps):
        for b_index, b in enumerate(comps):
            if a_index != b_index:
                blocked.update((src, dst) for src in a for dst in b)
    return frozenset(blocked)


def grudge_from_views(views: Mapping[int, Iterable[int]], n: int) -> Grudge:
    """Each node ``dst`` hears exactly ``views[dst]``: block every other ``(src, dst)``."""
    return frozenset((src, dst) for dst in range(n) for src in range(n)
                     if src != dst and src not in set(views[dst]))


def isolate_node(n: int, rng: random.Random) -> tuple[Grudge, tuple[int, ...]]:
    target = rng.randrange(n)
    return grudge_between([[target], [i for i in range(n) if i != target]]), (target,)


def random_halves(n: int, rng: random.Random) -> tuple[Grudge, tuple[int, ...]]:
    nodes = list(range(n))
    rng.shuffle(nodes)
    small = nodes[: n // 2]
    return grudge_between([small, nodes[n // 2:]]), tuple(sorted(small))


def majorities_ring(n: int, rng: random.Random) -> tuple[Grudge, tuple[int, ...]]:
    ring = list(range(n))
    rng.shuffle(ring)
    m = majority(n)
    back = (m - 1) // 2  # window starts this many places behind the node
    views = {ring[pos]: [ring[(pos - back + k) % n] for k in range(m)] for pos in range(n)}
    return grudge_from_views(views, n), tuple(ring)


def bridge(n: int, rng: random.Random) -> tuple[Grudge, tuple[int, ...]]:
    nodes = list(range(n))
    rng.shuffle(nodes)
    middle = n // 2
    hub = nodes[middle]
    left, right = nodes[:middle], nodes[middle + 1:]
    blocked = {(a, b) for a in left for b in right} | {(b, a) for a in left for b in right}
    return frozenset(blocked), (hub,)


TOPOLOGIES = {
    "partition-random-node": isolate_node,
    "partition-random-halves": random_halves,
    "partition-majorities-ring": majorities_ring,
    "bridge": bridge,
}


@dataclass(frozen=True, slots=True)
class ControllerStep:
    """One planned action of the controller chaos run. ``targets`` are node indexes (``LEADER`` = resolve at run time)."""

    at_s: float
    kind: str
    phase: str  # "start" | "end"
    targets: tuple[int, ...] = ()
    grudge: tuple[tuple[int, int], ...] = ()
    fault_id: int = 0
    #: partitions: at run time, swap node ``targets[0]`` with the current leader (so the leader is
    #: the isolated node, or in the minority half)
    leader_swap: bool = False
    #: ``loss``: the percentage dropped; ``clock``: the jump in seconds; file faults: the seed of
    #: the damage (``verify/filefaults.py``)
    param: int = 0

    def to_json(self) -> dict:
        return {"at_s": round(self.at_s, 3), "kind": self.kind, "phase": self.phase,
                "targets": list(self.targets), "grudge": [list(p) for p in self.grudge], "fault_id": self.fault_id,
                "leader_swap": self.leader_swap, "param": self.param}


def swap_nodes(grudge: Iterable[tuple[int, int]], targets: Sequence[int], a: int, b: int
               ) -> tuple[tuple[tuple[int, int], ...], tuple[int, ...]]:
    """Relabel nodes ``a`` <-> ``b`` in a grudge and a target list (same shape, other nodes)."""
    def swap(x: int) -> int:
        return b if x == a else a if x == b else x
    return tuple(sorted((swap(s), swap(d)) for s, d in grudge)), tuple(swap(t) for t in targets)


def plan_fault(kind: str, n: int, rng: random.Random) -> tuple[tuple[int, ...], Grudge]:
    """Targets and grudge of one fault of ``kind`` (process faults target the leader half the time)."""
    if kind in TOPOLOGIES:
        grudge, targets = TOPOLOGIES[kind](n, rng)
        return targets, grudge
    if kind in PROCESS_FAULTS or kind in CONTROLLER_OS:
        # a loss fault hits every link of its node, both ways: resolved with the target at run time
        return ((LEADER,) if rng.random() < 0.5 else (rng.randrange(n),)), frozenset()
    raise NemesisSpecError(kind)


def draw_param(kind: str, rng: random.Random) -> int:
    """The step's ``param`` (see ``ControllerStep``)."""
    if kind == "loss":
        return rng.randint(1, 30)
    if kind == "clock":
        return rng.choice(CLOCK_JUMPS_S)
    if kind in NODE_FILE_FAULTS:
        return rng.randrange(1 << 30)
    return 0


def make_controller_schedule(kinds: Sequence[str], n: int, duration_s: float, rng: random.Random,
                  quiet_s: tuple[float, float] = (1.0, 3.0), fault_s: tuple[float, float] = (2.0, 5.0),
                  settle_s: float = 1.0) -> list[ControllerStep]:
    """Quiet gap, fault start, fault end, quiet gap, ... all within ``duration_s - settle_s``.

    Each fault's ``end`` step heals exactly that fault; faults never overlap.
    """
    assert n >= 1 and duration_s >= 0 and quiet_s[0] <= quiet_s[1] and fault_s[0] <= fault_s[1]
    steps: list[ControllerStep] = []
    if not kinds:
        return steps
    t = rng.uniform(*quiet_s)
    fault_id = 0
    while True:
        length = rng.uniform(*fault_s)
        if t + length > duration_s - settle_s:
            break
        kind = rng.choice(list(kinds))
        targets, grudge = plan_fault(kind, n, rng)
        leader_swap = kind in LEADER_SWAPPABLE and rng.random() < 0.5
        param = draw_param(kind, rng) if kind in CONTROLLER_OS else 0
        fault_id += 1
        ordered = tuple(sorted(grudge))
        steps.append(ControllerStep(t, kind, "start", targets, ordered, fault_id, leader_swap, param))
        steps.append(ControllerStep(t + length, kind, "end", targets, ordered, fault_id, leader_swap, param))
        t += length + rng.uniform(*quiet_s)
    return steps
