"""The deterministic simulator (rocketray.sim): replayable, silent on the current rules, and able to fail.

The simulator runs the real cores (controller decide/apply, heartbeat table and election; the broker
role machine; HA sessions and the master-side replication core; the message store over a simulated
disk) under seeded kills, power losses, crashes between IO steps, partitions, lost controller
commits and connection resets, and checks its invariants after every step. These tests pin:
- a seed replays exactly (same trace, same counts);
- a budget of seeds finds no violation with the rules as they are;
- runs in parallel give the same first failing seed as one process.
The named scenarios (each rule issue 15 fixed, patched back, is caught) are in test_scenarios.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rocketray.sim.run import CI_BUDGET as _CI_BUDGET
from rocketray.sim.run import EXTRA_FAULTS, FAULTS, PROFILES, SimConfig, run_seed, run_seeds, swarm


def test_a_seed_replays_exactly():
    """Same seed, same world: identical trace, step count and outcome counts."""
    a, b = run_seed(5, SimConfig()), run_seed(5, SimConfig())
    assert a.trace == b.trace and a.steps == b.steps
    assert (a.acked, a.read, a.faults, a.elections) == (b.acked, b.read, b.faults, b.elections)
    assert a.faults > 0 and a.acked > 0, "the run injected faults and acknowledged writes"


def test_different_seeds_differ():
    """The seed drives the world: two seeds do not produce the same run."""
    assert run_seed(1, SimConfig()).trace != run_seed(2, SimConfig()).trace


def test_quiet_run_acknowledges_and_reads_everything():
    """No faults: every acknowledged write is read back by the consumer; no violation."""
    r = run_seed(1, SimConfig(max_faults=0))
    assert r.ok, r.violation
    assert r.acked > 100 and r.read >= r.acked


def test_workers_find_the_same_seeds_as_one_process():
    """Seeds run in forked workers give the same results, in seed order, as one process."""
    one = run_seeds(range(1, 7), SimConfig(), stop_at_first=False)
    two = run_seeds(range(1, 7), SimConfig(), stop_at_first=False, workers=2)
    assert {k: one[k] for k in ("steps", "acked", "faults", "elections")} == \
           {k: two[k] for k in ("steps", "acked", "faults", "elections")}


@pytest.mark.parametrize("who", ["every replica", "slaves"])
def test_acknowledging_bytes_before_they_are_durable_is_caught(monkeypatch, who):
    """Invariant 4 counts durable bytes (sync flush): a store that skips its fsync (on every
    replica, or only on the slave path, i.e. a slave that acks what it has not synced) lets the
    confirm offset pass what a power loss would keep, and the checker says so."""
    from rocketray.broker.commitlog import CommitLog
    from rocketray.broker.store import MessageStore

    if who == "every replica":
        monkeypatch.setattr(CommitLog, "flush", lambda self: None)
    else:
        original = MessageStore.append_raw

        def append_without_fsync(self, offset, data):
            flush, self.commitlog.flush = self.commitlog.flush, lambda: None
            try:
                return original(self, offset, data)
            finally:
                self.commitlog.flush = flush
        monkeypatch.setattr(MessageStore, "append_raw", append_without_fsync)
    r = run_seed(1, SimConfig(max_faults=0))
    assert not r.ok and "durable end" in r.violation, r.violation


#: The CI budget: seeds per fault mix (2,000 in all), run on 2 processes (run.CI_BUDGET; the mutation
#: check in test_mutants.py hunts every mutant over the same schedule).
CI_BUDGET = _CI_BUDGET


@pytest.mark.slow
@pytest.mark.parametrize("profile", sorted(CI_BUDGET))
def test_ci_budget_of_seeds_finds_no_violation(profile):
    """Thousands of seeds over every fault mix, zero violations (a failure prints the replay command)."""
    n = CI_BUDGET[profile]
    summary = run_seeds(range(1, n + 1), PROFILES[profile], workers=2)
    assert summary["violations"] == 0, (f"rocketray simulate --seed {summary['first_failing_seed']} "
                                        f"--profile {profile}", summary["violation"],
                                        "\n".join(summary["trace"] or []))
    assert summary["seeds"] == n and summary["faults"] > n * 5 and summary["elections"] > n


def test_cli_json_and_replay():
    """`rocketray simulate --seeds 2 --json` prints the summary; `--seed S` replays one seed."""
    out = subprocess.run([sys.executable, "-m", "rocketray.cli", "simulate", "--seeds", "2", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["seeds"] == 2 and summary["violations"] == 0
    assert {"seeds_per_s", "steps", "first_failing_seed"} <= set(summary)
    one = subprocess.run([sys.executable, "-m", "rocketray.cli", "simulate", "--seed", "3"],
                         capture_output=True, text=True, timeout=300)
    assert one.returncode == 0 and "seeds 1, violations 0" in one.stdout, one.stdout + one.stderr


@pytest.mark.parametrize("sessions", [True, False])
def test_a_killed_master_is_replaced_on_its_session_close_before_any_heartbeat_expiry(sessions):
    """Issue 18 in the simulator: the kernel closes a killed master's controller session, so the
    controller elects within milliseconds of virtual time; without sessions (a power loss, a cut
    link) the same kill waits for the restarted master's new-term request or heartbeat expiry.
    Every invariant holds either way."""
    import dataclasses

    from rocketray.sim.disk import CrashMode
    from rocketray.sim.run import Sim

    base = SimConfig(max_faults=0, loss=0.0, commit_fault_p=0.0, duration_ms=6_000, settle_ms=6_000)
    config = dataclasses.replace(base, timings=dataclasses.replace(base.timings, controller_sessions=sessions))
    sim = Sim(7, config)
    killed: dict[str, int] = {}

    def script(s: Sim) -> None:
        def kill() -> None:
            master = s.serving_master("g0")
            killed["at_ms"], killed["epoch"] = s.world.now_ms, master.ha_epoch
            master.crash(CrashMode.KILL)
        s.when(lambda: s.world.now_ms >= 2_000 and s.serving_master("g0") is not None, kill)

    r = sim.run(script)
    assert r.ok, (r.violation, "\n".join(r.trace[-30:]))
    assert sim.controller.session_elections == (1 if sessions else 0)
    epochs = [epoch for _g, epoch, _m in sim.controller.elections]
    assert killed["epoch"] + 1 in epochs
    elected = [line for line in r.trace if f"epoch={killed['epoch'] + 1}" in line and "elected" in line]
    at_ms = int(elected[0].split()[0])
    if sessions:
        assert at_ms - killed["at_ms"] < 50, elected
    else:  # the earliest other path: the restarted master's new-term request, or heartbeat expiry
        assert at_ms - killed["at_ms"] >= config.timings.restart_min_ms, elected


def test_one_at_a_time_waits_for_an_armed_io_crash_to_fire():
    """The async profile's schedule promises one fault at a time: an io-crash armed on a broker
    and not yet fired is a fault in progress (seed 251 had a kill land on top of one)."""
    from rocketray.sim.disk import CrashMode
    from rocketray.sim.run import PROFILES, Sim

    sim = Sim(1, PROFILES["async"])
    for b in sim.brokers.values():
        b.boot()
    members = {"g0": frozenset({1, 2, 3})}
    sim.controller.sync_state_set = lambda group: members[group]
    assert sim._all_whole()
    broker = next(iter(sim.brokers.values()))
    broker.disk.crash_after(1_000_000, CrashMode.POWER_LOSS)
    assert broker.disk.armed and not sim._all_whole()
    broker.disk.set_hook(None)
    assert sim._all_whole()


def test_one_at_a_time_waits_for_two_members_in_the_sync_state_set():
    """A master alone in its SyncStateSet (after an election, until a slave catches up) holds what it
    acknowledges on one machine, which async flush does not keep through its power loss (seed 5228
    drew one then): the async profile's schedule waits for a second member."""
    from rocketray.sim.run import PROFILES, Sim

    sim = Sim(1, PROFILES["async"])
    for b in sim.brokers.values():
        b.boot()
    members = {"g0": frozenset({2})}
    sim.controller.sync_state_set = lambda group: members[group]
    assert not sim._all_whole()
    members["g0"] = frozenset({2, 3})
    assert sim._all_whole()


def test_swarm_draws_its_own_fault_mix_per_seed():
    """Swarm testing: each seed has its own subset of fault kinds and rates, the same every time it
    runs, drawn apart from the run's generator; a swarm seed replays exactly."""
    mixes = [swarm(seed, PROFILES["swarm"]) for seed in range(1, 21)]
    assert mixes[0] == swarm(1, PROFILES["swarm"])
    assert len({m.faults for m in mixes}) >= 15 and len({m.fault_gap_ms for m in mixes}) >= 4
    assert all(set(m.faults) <= set(FAULTS + EXTRA_FAULTS) and m.faults and not m.swarm for m in mixes)
    assert any(m.burst_p > 0 for m in mixes) and any(m.burst_p == 0 for m in mixes)
    a, b = run_seed(4, PROFILES["swarm"]), run_seed(4, PROFILES["swarm"])
    assert a.trace == b.trace and a.steps == b.steps and a.ok, a.violation


def _pair(in_flight: bool):
    from rocketray.sim.net import Network
    from rocketray.sim.world import World

    world = World(1)
    net = Network(world, in_flight=in_flight)
    got: list[tuple[int, object]] = []
    conn = net.connect("a", "b")
    conn.bind("a", lambda c, d: None, lambda c: None, owner=None)
    conn.bind("b", lambda c, d: got.append((world.now_ms, d)), lambda c: got.append((world.now_ms, "closed")),
              owner=None)
    return world, net, conn, got


@pytest.mark.parametrize("power_loss", [False, True])
def test_what_a_crashed_node_sent_still_arrives_before_the_close(power_loss):
    """In-flight delivery: a kill delivers every send already written to the socket, then the close;
    a power loss delivers a prefix of them (what was on the wire), in order, then the close. Before
    (``in_flight=False``) none arrived: a rule "send only after the durable step" was invisible."""
    world, net, conn, got = _pair(True)
    net.power_lost = lambda node: power_loss
    for i in range(5):
        conn.send("a", b"m%d" % i)
    net.set_down("a", True)
    world.run(10_000)
    data = [d for _t, d in got if d != "closed"]
    assert got[-1][1] == "closed" and [t for t, d in got if d == "closed"] == [got[-1][0]]
    if power_loss:
        assert data == [b"m%d" % i for i in range(len(data))]
    else:
        assert data == [b"m%d" % i for i in range(5)]
    assert sum(1 for seed in range(1, 30) if _prefix_len(seed) < 5) > 0, "a power loss can cut what is in flight"
    world, net, conn, got = _pair(False)
    conn.send("a", b"m0")
    net.set_down("a", True)
    world.run(10_000)
    assert [d for _t, d in got] == ["closed"]


def _prefix_len(seed: int) -> int:
    world, net, conn, got = _pair(True)
    world.rng.seed(seed)
    net.power_lost = lambda node: True
    for i in range(5):
        conn.send("a", b"m%d" % i)
    net.set_down("a", True)
    world.run(10_000)
    return sum(1 for _t, d in got if d != "closed")


def test_bytes_sent_to_a_crashed_node_are_lost():
    """What was sent *to* the node that crashed never arrives (its process is gone)."""
    world, net, conn, got = _pair(True)
    conn.send("b", b"to a")
    seen = []
    conn.bind("a", lambda c, d: seen.append(d), lambda c: None, owner=None)
    net.set_down("a", True)
    world.run(10_000)
    assert seen == []
