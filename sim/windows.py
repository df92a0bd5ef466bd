"""Rare windows: faults that wait for a state instead of firing at a random time (search bias).

Theory of operation. A rule that guards data often matters only inside a window a few milliseconds
wide: while a SyncStateSet proposal is at the controller and another set is confirmed, while a
counted member's log ends short of what the master confirmed (it lost its tail) or it has just
restarted, right after an old master came back. Faults drawn at random times almost never land
there (docs/simulation.md, the mutation check). ``Windows`` is the nemesis's search bias, as
FoundationDB's buggify and swarm testing are: with probability ``SimConfig.window_p`` a nemesis
step *arms a watch* instead of faulting now; the world is polled every ``POLL_MS`` of virtual time
for at most ``WAIT_MS`` and at the first poll where a window is open, one fault of the nemesis's
own kinds, drawn by the seed, hits the broker that window names. If none opens, the watch expires
without a fault. Every choice comes from the world's generator, so a seed replays exactly.

The windows (the states, not a script of any one bug):

- ``proposal``: a serving master has a SyncStateSet report at the controller or a proposal in its
  union view -> the master's controller link is cut, the master is killed or loses power, the
  controller leader changes, or a member of the proposal is isolated;
- ``member-down``: a member the controller's SyncStateSet counts is down (its removal is on its way)
  -> the master is cut off from the controller or isolated, so the member may come back still
  counted with whatever its crash left;
- ``behind``: a live member of the controller's SyncStateSet ends before the master's confirm
  offset (it lost its tail) or has restarted since the last poll -> the master is killed, loses
  power, is isolated or cut off from the controller;
- ``old-master``: a broker that was master when it went down is up again -> it, or the group's
  serving master, takes the next fault (power loss, kill, isolation, controller cut).
"""

from __future__ import annotations

from typing import Mapping, Protocol, Sequence

from rocketray.broker.role import Role
from rocketray.sim.broker import SimBroker
from rocketray.sim.controller import SimController
from rocketray.sim.world import World

__all__ = ["Windows", "WindowedSim", "POLL_MS", "WAIT_MS"]


class FaultBudget(Protocol):
    @property
    def duration_ms(self) -> int: ...
    @property
    def max_faults(self) -> int: ...


class WindowedSim(Protocol):
    """The run whose faults the windows place (``rocketray.sim.run.Sim``)."""

    world: World
    controller: SimController
    faults: int

    @property
    def config(self) -> FaultBudget: ...
    @property
    def brokers(self) -> Mapping[str, SimBroker]: ...
    @property
    def groups(self) -> Mapping[str, Sequence[SimBroker]]: ...
    def serving_master(self, group: str) -> SimBroker | None: ...
    def inject(self, kind: str, target: SimBroker | None = None) -> None: ...

POLL_MS = 5
WAIT_MS = 4000

_AT_MASTER = ("kill", "power-loss", "isolate", "controller-cut")
_AWAY_FROM_CONTROLLER = ("controller-cut", "isolate")


class Windows:
    """The watches of one simulated run (see the module docstring)."""

    def __init__(self, sim: WindowedSim) -> None:
        self.sim = sim
        self.fired: dict[str, int] = {}            # window -> faults injected in it
        self._restarts: dict[str, int] = {}        # broker -> its restarts at the last poll
        self._was_master: dict[str, bool] = {}     # broker -> master at the last poll it was up
        self._armed = False

    def arm(self) -> None:
        """Watch for the next open window (one watch at a time: arming while one waits does nothing,
        so one nemesis step never becomes two faults)."""
        if self._armed:
            return
        self._armed = True
        sim = self.sim
        deadline = sim.world.now_ms + WAIT_MS
        self._restarts = {b.name: b.restarts for b in sim.brokers.values()}
        self._was_master = {b.name: b.up and b.ha_role == Role.MASTER for b in sim.brokers.values()}

        def poll() -> None:
            if sim.world.now_ms >= sim.config.duration_ms or sim.faults >= sim.config.max_faults:
                self._armed = False
                return
            opened = self._open()
            if opened is not None:
                self._armed = False
                self._fire(*opened)
            elif sim.world.now_ms >= deadline:
                self._armed = False
            else:
                sim.world.at(POLL_MS, poll)
        sim.world.at(POLL_MS, poll)

    # -- the states --------------------------------------------------------------------------------
    def _open(self) -> tuple[str, "SimBroker", tuple[str, ...], list["SimBroker"]] | None:
        """The first open window as (name, broker, fault kinds, other brokers it may hit)."""
        sim = self.sim
        restarted, old_masters = [], []
        for b in sim.brokers.values():
            if b.restarts != self._restarts[b.name] and b.up:
                self._restarts[b.name] = b.restarts
                restarted.append(b)
                if self._was_master[b.name] or sim.controller.master_of(b.group)[0] == b.id:
                    old_masters.append(b)
            if b.up and b.restarts == self._restarts[b.name]:
                self._was_master[b.name] = b.ha_role == Role.MASTER
        for group, members in sim.groups.items():
            master = sim.serving_master(group)
            for b in old_masters:
                if b.group == group:
                    hit = [master] if master is not None and master is not b else []
                    return "old-master", b, _AT_MASTER, hit
            if master is None or master.store is None:
                continue
            counted = sim.controller.sync_state_set(group)
            for b in members:
                if b is master or b.id not in counted:
                    continue
                if not b.up:
                    return "member-down", master, _AWAY_FROM_CONTROLLER, []
                if b.store is None:
                    continue
                if b in restarted or b.store.max_offset < master.store.confirm_offset:
                    return "behind", master, _AT_MASTER, []
            pending = master.master.tracker.pending
            if master.machine.report_in_flight is not None or pending:
                joining = sorted({i for p in pending for i in p} - {master.id})
                hit = [b for b in members if b.id in joining and b.up]
                return "proposal", master, _AT_MASTER + ("leader-change",), hit
        return None

    def _fire(self, window: str, broker: "SimBroker", kinds: tuple[str, ...], others: list["SimBroker"]) -> None:
        rng = self.sim.world.rng
        kind = rng.choice(kinds)
        target = rng.choice(others) if others and rng.random() < 0.5 else broker
        self.fired[window] = self.fired.get(window, 0) + 1
        self.sim.world.note(f"window {window} open at {broker.name}")
        self.sim.inject(kind, target)
