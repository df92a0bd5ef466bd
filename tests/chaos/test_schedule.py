"""Nemesis schedules: deterministic from the seed, one fault at a time, targets drawn from the topology."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketray.verify.history import NEMESIS_KINDS
from rocketray.verify.nemesis import CLOCK_JUMPS_S, FAULT_KINDS, KILL_KINDS, SCHEDULE_KINDS, NemesisStep, make_schedule
from rocketray.verify.nemesis import NET_KINDS, REPLICA_FILE_KINDS

GROUPS = {"broker-b": [1, 2, 3], "broker-a": [1, 2, 3]}


def schedule(kind="all", seed=7, **kw):
    args = dict(groups=GROUPS, controllers=3, run_ms=120_000)
    args.update(kw)
    return make_schedule(kind, seed, **args)


def test_same_seed_same_schedule_and_seeds_matter():
    """Replaying a seed gives the identical schedule; other seeds give other schedules."""
    assert schedule(seed=42) == schedule(seed=42)
    assert len({schedule(seed=s) for s in range(10)}) > 1


def test_group_order_does_not_change_the_schedule():
    """The topology mapping's insertion order must not leak into the draw."""
    reordered = {"broker-a": [3, 2, 1], "broker-b": [2, 1, 3]}
    assert schedule(seed=3) == schedule(seed=3, groups=reordered)


def test_fixed_seed_gives_a_stable_plan():
    """Pin one schedule so an accidental change of the draw order shows up (replays of old seeds)."""
    steps = make_schedule("kill-master", 1, groups={"g0": [1, 2]}, controllers=1, run_ms=40_000,
                          interval_ms=10_000, jitter_ms=0)
    assert [(s.at_ms, s.kind, s.group, s.duration_ms) for s in steps] == [
        (10_000, "kill-master", "g0", 0), (20_000, "kill-master", "g0", 0),
        (30_000, "kill-master", "g0", 0), (40_000, "kill-master", "g0", 0)]


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_single_kind_schedules(kind):
    """Each kind yields only that kind, with the target fields that kind needs and no others."""
    steps = schedule(kind)
    assert steps and all(s.kind == kind for s in steps)
    for s in steps:
        assert s.kind in NEMESIS_KINDS
        if kind == "kill-master":
            assert s.group in GROUPS and s.broker_id is None and s.target == f"master:{s.group}"
        elif kind in ("kill-broker", "pause-broker", "partition-ha"):
            assert s.broker_id in GROUPS[s.group] and s.target == f"broker:{s.group}/{s.broker_id}"
        elif kind in REPLICA_FILE_KINDS:   # one replica's files, then its restart: instantaneous
            assert s.broker_id in GROUPS[s.group] and s.target == f"broker:{s.group}/{s.broker_id}"
            assert (s.file_class is None) == (kind == "lose-unsynced") and s.duration_ms == 0
            continue
        elif kind in NET_KINDS:
            assert s.group in GROUPS and s.net is not None and s.net.kind == kind
            assert s.target == f"net:{s.net.shape}:{s.group}"
        elif kind == "kill-controller-leader":
            assert (s.group, s.controller, s.target) == (None, None, "controller-leader")
        elif kind == "kill-node":
            assert s.group in GROUPS and s.broker_id is None and s.target == f"node-of-master:{s.group}"
        elif kind == "clock-broker":   # a replica, or the group's master resolved at run time
            assert s.clock_offset_s in CLOCK_JUMPS_S and s.group in GROUPS
            assert s.target == (f"master:{s.group}" if s.broker_id is None else f"broker:{s.group}/{s.broker_id}")
            assert s.broker_id is None or s.broker_id in GROUPS[s.group]
        else:
            assert s.controller in range(3) and s.target == f"controller:{s.controller}"
        if kind in KILL_KINDS:
            assert s.duration_ms == 0
        else:
            assert 2_500 <= s.duration_ms <= 5_000


def test_all_mixes_every_kind():
    """Over a long run, 'all' draws every fault kind but the whole-node ones (they need --ray-nodes)."""
    steps = schedule("all", run_ms=3_600_000)
    assert {s.kind for s in steps} == set(FAULT_KINDS) - {"kill-node"}


def test_step_events_for_the_nemesis_log():
    """A step renders its nemesis.jsonl records; the runner may name the resolved target."""
    step = NemesisStep(1000, "kill-master", group="g0")
    assert step.event("start", 12345).to_json() == {
        "time_ms": 12345, "kind": "kill-master", "phase": "start", "target": "master:g0", "group": "g0"}
    assert step.event("end", 12400, target="broker:g0/2").target == "broker:g0/2"
    assert step.to_json()["target"] == "master:g0"


@pytest.mark.parametrize("kw, match", [
    (dict(kind="nuke"), "unknown nemesis kind"),
    (dict(groups={}), "groups"),
    (dict(groups={"g": []}), "groups"),
    (dict(controllers=0), "controllers"),
    (dict(interval_ms=0), "interval_ms"),
])
def test_bad_arguments_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        schedule(**kw)


def test_run_too_short_for_any_fault_is_empty():
    assert schedule(run_ms=5_000) == ()


@settings(max_examples=200, deadline=None)
@given(kind=st.sampled_from(SCHEDULE_KINDS), seed=st.integers(0, 2**32),
       run_ms=st.integers(1, 200_000), interval_ms=st.integers(1, 20_000), fault_ms=st.integers(0, 20_000),
       jitter_ms=st.integers(0, 5_000), controllers=st.integers(1, 5))
def test_schedule_invariants(kind, seed, run_ms, interval_ms, fault_ms, jitter_ms, controllers):
    """Property: steps are ordered, never overlap, end by run_ms, and are reproducible from the seed."""
    args = dict(groups=GROUPS, controllers=controllers, run_ms=run_ms, interval_ms=interval_ms,
                fault_ms=fault_ms, jitter_ms=jitter_ms)
    steps = make_schedule(kind, seed, **args)
    assert steps == make_schedule(kind, seed, **args)
    for a, b in zip(steps, steps[1:]):
        assert a.end_ms < b.at_ms
    assert all(0 <= s.at_ms <= s.end_ms <= run_ms for s in steps)
    assert all(s.controller is None or 0 <= s.controller < controllers for s in steps)


def test_fault_kinds_are_declared_once():
    """The schedule draws exactly the kinds the run-directory format accepts (plus its 'heal')."""
    from rocketray.verify import history

    assert FAULT_KINDS is history.FAULT_KINDS
    assert set(NEMESIS_KINDS) == set(FAULT_KINDS) | {"heal"}
    assert set(SCHEDULE_KINDS) == set(FAULT_KINDS) | {"all", "process", "os"}


# --- consumer churn ---------------------------------------------------------------------------------

def churn(seed=7, **kw):
    from rocketray.verify.nemesis import make_churn_schedule

    args = dict(consumer_groups=["cg-1", "cg-0"], consumers=2, run_ms=60_000)
    args.update(kw)
    return make_churn_schedule(seed, **args)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 120_000), st.integers(1, 4))
def test_churn_is_seeded_and_well_formed(seed, run_ms, consumers):
    """A churn schedule replays from its seed; every step names a real slot, restarts by the end of
    the run, and a slot is never stopped again before its replacement started."""
    from rocketray.verify.nemesis import CHURN_KINDS

    steps = churn(seed, run_ms=run_ms, consumers=consumers)
    assert steps == churn(seed, run_ms=run_ms, consumers=consumers)
    assert [s.at_ms for s in steps] == sorted(s.at_ms for s in steps)
    back: dict = {}
    for s in steps:
        assert s.kind in CHURN_KINDS and s.consumer_group in ("cg-0", "cg-1") and 0 <= s.slot < consumers
        assert 0 <= s.at_ms and s.at_ms + s.restart_after_ms <= run_ms, s
        assert back.get((s.consumer_group, s.slot), -1) < s.at_ms, s
        back[(s.consumer_group, s.slot)] = s.at_ms + s.restart_after_ms


def test_churn_draws_crashes_and_leaves():
    """A minute of churn (the CI run's seed) holds both kinds; no groups or no members, no churn."""
    kinds = {s.kind for s in churn(seed=10)}
    assert kinds == {"crash-consumer", "leave-consumer"}
    assert churn(consumer_groups=[]) == () and churn(consumers=0) == ()
