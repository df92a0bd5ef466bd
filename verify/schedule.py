"""Seeded nemesis schedules for the broker chaos run.

Theory of operation. A chaos run alternates quiet and faulty periods: after a warm-up, one fault
at a time begins, lasts ``duration_ms`` (zero for kills: Ray restarts the actor by itself), and is
followed by ``interval_ms`` plus a random jitter of quiet before the next one; nothing is scheduled
to end after ``run_ms``, when the runner heals everything and does the final reads. The schedule is
a pure function of its arguments and ``random.Random(seed)``, so a failing run is replayed from its
seed. Targets that only exist at run time (the current master of a group, the controller leader)
are left for the runner to resolve; fixed targets (a replica, a controller index) are drawn here.

Kinds: ``kill-master`` (group), ``kill-broker`` / ``pause-broker`` / ``partition-ha`` (group and
broker id; ``partition-ha`` cuts that replica's HA connections), ``kill-controller-leader``,
``kill-controller`` / ``pause-controller`` (controller index), and ``all``, which draws each step's
kind from the others.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from rocketray.verify.history import NemesisEvent, Number

FAULT_KINDS = (
    "kill-master",
    "kill-broker",
    "kill-controller-leader",
    "kill-controller",
    "pause-broker",
    "pause-controller",
    "partition-ha",
)
SCHEDULE_KINDS = (*FAULT_KINDS, "all")
KILL_KINDS = frozenset({"kill-master", "kill-broker", "kill-controller-leader", "kill-controller"})
BROKER_KINDS = frozenset({"kill-broker", "pause-broker", "partition-ha"})
CONTROLLER_KINDS = frozenset({"kill-controller", "pause-controller"})

#: Bound on the number of steps of one schedule (TigerStyle: every loop bounded).
MAX_STEPS = 100_000


@dataclass(frozen=True, slots=True)
class NemesisStep:
    """One planned fault: what, on whom, when (ms from run start) and for how long."""

    at_ms: int
    kind: str
    group: str | None = None
    broker_id: int | None = None
    controller: int | None = None
    duration_ms: int = 0

    @property
    def end_ms(self) -> int:
        return self.at_ms + self.duration_ms

    @property
    def target(self) -> str:
        """The planned target: ``master:<group>``, ``broker:<group>/<id>``, ``controller-leader``,
        ``controller:<index>``. Runners resolve ``master:`` and ``controller-leader`` when they act."""
        if self.kind == "kill-master":
            return f"master:{self.group}"
        if self.kind in BROKER_KINDS:
            return f"broker:{self.group}/{self.broker_id}"
        if self.kind == "kill-controller-leader":
            return "controller-leader"
        return f"controller:{self.controller}"

    def event(self, phase: str, time_ms: Number, target: str | None = None) -> NemesisEvent:
        """The ``nemesis.jsonl`` record of this step's start or end, at the time it really happened;
        ``target`` overrides the planned one with the resolved actor (e.g. the killed master)."""
        assert phase in ("start", "end"), phase
        return NemesisEvent(time_ms, self.kind, phase, self.target if target is None else target, self.group)

    def to_json(self) -> dict[str, Any]:
        return {"at_ms": self.at_ms, "kind": self.kind, "group": self.group, "broker_id": self.broker_id,
                "controller": self.controller, "duration_ms": self.duration_ms, "target": self.target}


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
        step_kind = rng.choice(FAULT_KINDS) if kind == "all" else kind
        step = _draw_step(rng, step_kind, t, group_names, replicas, controllers, fault_ms)
        if step.end_ms > run_ms:
            break
        steps.append(step)
        t = step.end_ms + interval_ms + rng.randint(0, jitter_ms)
    _assert_well_formed(steps, run_ms)
    return tuple(steps)


def _draw_step(rng: random.Random, kind: str, at_ms: int, group_names: Sequence[str],
               replicas: Mapping[str, Sequence[int]], controllers: int, fault_ms: int) -> NemesisStep:
    duration_ms = 0 if kind in KILL_KINDS else rng.randint(fault_ms // 2, fault_ms)
    if kind == "kill-master":
        return NemesisStep(at_ms, kind, group=rng.choice(group_names))
    if kind in BROKER_KINDS:
        group = rng.choice(group_names)
        return NemesisStep(at_ms, kind, group=group, broker_id=rng.choice(replicas[group]),
                           duration_ms=duration_ms)
    if kind in CONTROLLER_KINDS:
        return NemesisStep(at_ms, kind, controller=rng.randrange(controllers), duration_ms=duration_ms)
    assert kind == "kill-controller-leader", kind
    return NemesisStep(at_ms, kind)


def _assert_well_formed(steps: Sequence[NemesisStep], run_ms: int) -> None:
    for a, b in zip(steps, steps[1:]):
        assert a.end_ms < b.at_ms, (a, b)
    for s in steps:
        assert 0 <= s.at_ms <= s.end_ms <= run_ms, s
