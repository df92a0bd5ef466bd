"""Seeded nemesis schedules and the partition topologies they use (pure: no clock, no IO).

Theory of operation. A *grudge* is a frozenset of directed pairs ``(src, dst)``: messages from
``src`` to ``dst`` are dropped (the proxy network enforces it). The topology functions build the
grudges of the classic Jepsen partitions over nodes ``0..n-1``, drawing every random choice from the
``random.Random`` they are given:

- ``isolate_node``: one node hears no one and no one hears it;
- ``random_halves``: a random split into two halves, no traffic across;
- ``majorities_ring``: nodes on a shuffled ring; each node hears the majority-sized window of the
  ring around it (itself included), so every node sees a majority and no two see the same one
  (with 5 nodes the windows are symmetric; with 3 the grudge is necessarily one-way);
- ``bridge``: two halves that cannot talk, and one node that talks to both.

``make_schedule`` turns a seed, a list of nemesis kinds and a duration into an alternating plan of
quiet gaps and faults, each fault a ``start`` step and an ``end`` step (the heal, the restart of a
killed node, the SIGCONT of a paused one). The runner executes the plan and logs what it did with
wall-clock timestamps; re-running with the same seed replays the same plan.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

Grudge = frozenset[tuple[int, int]]

PARTITIONS = ("partition-random-node", "partition-random-halves", "partition-majorities-ring", "bridge")
PROCESS_FAULTS = ("kill", "pause")
NEMESES = PARTITIONS + PROCESS_FAULTS
LEADER = -1  # a kill/pause target resolved to the current Raft leader when the step runs
LEADER_SWAPPABLE = ("partition-random-node", "partition-random-halves")


class NemesisSpecError(ValueError):
    """An unknown nemesis name on the command line."""


def parse_nemeses(spec: str | Sequence[str]) -> tuple[str, ...]:
    """``"kill,bridge"`` -> ``("kill", "bridge")``; ``"all"`` expands to every kind; ``"none"`` is empty."""
    names = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    out: list[str] = []
    for name in names:
        expanded = NEMESES if name == "all" else () if name == "none" else (name,)
        for kind in expanded:
            if kind not in NEMESES:
                raise NemesisSpecError(f"unknown nemesis {kind!r}; choose from {', '.join(NEMESES + ('all',))}")
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


def views_of(grudge: Grudge, n: int) -> dict[int, frozenset[int]]:
    """Which nodes each node hears (itself included) under ``grudge``."""
    return {dst: frozenset(src for src in range(n) if src == dst or (src, dst) not in grudge) for dst in range(n)}


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
class NemesisStep:
    """One planned action. ``targets`` are node indexes (``LEADER`` = resolve at run time)."""

    at_s: float
    kind: str
    phase: str  # "start" | "end"
    targets: tuple[int, ...] = ()
    grudge: tuple[tuple[int, int], ...] = ()
    fault_id: int = 0
    #: partitions: at run time, swap node ``targets[0]`` with the current leader (so the leader is
    #: the isolated node, or in the minority half)
    leader_swap: bool = False

    def to_json(self) -> dict:
        return {"at_s": round(self.at_s, 3), "kind": self.kind, "phase": self.phase,
                "targets": list(self.targets), "grudge": [list(p) for p in self.grudge], "fault_id": self.fault_id,
                "leader_swap": self.leader_swap}


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
    if kind in PROCESS_FAULTS:
        return ((LEADER,) if rng.random() < 0.5 else (rng.randrange(n),)), frozenset()
    raise NemesisSpecError(kind)


def make_schedule(kinds: Sequence[str], n: int, duration_s: float, rng: random.Random,
                  quiet_s: tuple[float, float] = (1.0, 3.0), fault_s: tuple[float, float] = (2.0, 5.0),
                  settle_s: float = 1.0) -> list[NemesisStep]:
    """Quiet gap, fault start, fault end, quiet gap, ... all within ``duration_s - settle_s``.

    Each fault's ``end`` step heals exactly that fault; faults never overlap.
    """
    assert n >= 1 and duration_s >= 0 and quiet_s[0] <= quiet_s[1] and fault_s[0] <= fault_s[1]
    steps: list[NemesisStep] = []
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
        fault_id += 1
        ordered = tuple(sorted(grudge))
        steps.append(NemesisStep(t, kind, "start", targets, ordered, fault_id, leader_swap))
        steps.append(NemesisStep(t + length, kind, "end", targets, ordered, fault_id, leader_swap))
        t += length + rng.uniform(*quiet_s)
    return steps
