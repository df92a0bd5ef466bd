"""The nemesis's search bias (rocketray.sim.windows): a fault that waits for a rare window lands in
it, the windows open in ordinary runs, and a seed with windows replays exactly."""

from __future__ import annotations

import dataclasses

from rocketray.sim.disk import CrashMode
from rocketray.sim.run import PROFILES, Sim
from rocketray.sim.windows import Windows

SHORT = dataclasses.replace(PROFILES["windows"], duration_ms=6_000, settle_ms=6_000)


def _run(seed: int) -> Sim:
    sim = Sim(seed, SHORT)
    result = sim.run()
    assert result.ok, result.violation
    return sim


def test_a_seed_with_windows_replays_exactly():
    """Same seed, same run: the watches poll on virtual time and draw from the world's generator."""
    a, b = _run(2), _run(2)
    assert list(a.world.trace) == list(b.world.trace)
    assert a.windows.fired == b.windows.fired and a.world.steps == b.world.steps


def test_the_proposal_window_opens_and_its_fault_lands_inside_it():
    """A SyncStateSet proposal at the controller is the most common rare window: within the first
    seeds a watch sees one and injects its fault at that very poll (the trace shows the window
    opening and the fault on the next line)."""
    fired: dict[str, int] = {}
    for seed in (1, 2, 3):
        sim = _run(seed)
        for k, v in sim.windows.fired.items():
            fired[k] = fired.get(k, 0) + v
        lines = list(sim.world.trace)
        for i, line in enumerate(lines[:-1]):
            if " window " in line:
                assert " FAULT " in lines[i + 1], lines[i:i + 2]
                assert line.split()[0] == lines[i + 1].split()[0]       # the same virtual ms
    assert fired.get("proposal", 0) > 0, fired


def test_an_old_master_back_is_a_window():
    """Driven by hand: the serving master loses power; once it is up again (the controller still
    naming it or not), the next poll reports the old-master window at it."""
    sim = Sim(1, dataclasses.replace(SHORT, max_faults=0))
    for b in sim.brokers.values():
        b.boot()
    sim.controller.start()
    sim.world.run(3_000)
    master = sim.serving_master("g0")
    assert master is not None
    windows = Windows(sim)
    windows._restarts = {b.name: b.restarts for b in sim.brokers.values()}
    windows._was_master = {b.name: b.up and b is master for b in sim.brokers.values()}
    before = windows._open()
    assert before is None or before[0] != "old-master", before
    master.crash(CrashMode.POWER_LOSS)
    sim.world.run(sim.world.now_ms + 3_000)
    assert master.up
    opened = windows._open()
    assert opened is not None and opened[0] == "old-master" and opened[1] is master, opened
