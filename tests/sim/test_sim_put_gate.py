"""The simulated broker runs the product's put gate (``ha/put_gate.py``) over a world whose role
switches take time (``BrokerTimings.switch_ms``, on in the ``crashes`` profile): puts reach a replica
while it becomes master, are held, and are written once its switch ends, as in the broker actor."""

from __future__ import annotations

from rocketray.ha.promotion_hold import PromotionHold
from rocketray.ha.put_gate import WRITE, PutGate
from rocketray.sim import broker as sim_broker
from rocketray.sim.run import PROFILES, run_seed


def test_puts_reaching_a_promoting_replica_are_held_then_written(monkeypatch):
    held: list[int] = []
    released: list[object] = []
    hold, release = PromotionHold.hold, PutGate.release

    def counting_hold(self, item, size, now_ms):
        ok = hold(self, item, size, now_ms)
        if ok:
            held.append(now_ms)
        return ok

    def counting_release(self, ready):
        out = release(self, ready)
        released.extend(verdict for _item, verdict in out)
        return out

    monkeypatch.setattr(PromotionHold, "hold", counting_hold)
    monkeypatch.setattr(PutGate, "release", counting_release)
    assert PROFILES["crashes"].timings.switch_ms[1] > 0
    for seed in range(1, 25):
        assert run_seed(seed, PROFILES["crashes"]).ok, seed
        if WRITE in released:
            break
    assert held and WRITE in released, (held, released)


def test_a_world_without_switch_time_runs_each_switch_in_one_step(monkeypatch):
    """``switch_ms`` (0, 0): no simulated port suspends, so no input waits behind a switch."""
    assert PROFILES["default"].timings.switch_ms == (0, 0)
    paused: list[int] = []
    step = sim_broker.SimBroker._switch_step

    def recording(self):
        p = step(self)
        if p is not None:
            paused.append(p.ms)
        return p
    monkeypatch.setattr(sim_broker.SimBroker, "_switch_step", recording)
    assert run_seed(1, PROFILES["default"]).ok
    assert paused == []
