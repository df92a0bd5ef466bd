"""What async flush may lose, exactly: the simulator's oracle for overlapping faults.

Theory of operation. With ``flush_mode = async`` an acknowledged record is in the page cache of
every member of the SyncStateSet (or of the union view of a pending change) and on disk only after
each member's next flush. The promise (README, known limits) is that a record survives the power
loss of any one member *while another member still holds it*. So the one way async flush may lose
an acknowledged (or read, or committed) record is a power loss of a member that held it unflushed
at a moment when no other member of the group's SyncStateSet held it:

- the master alone in its SyncStateSet after an election (until the others catch up) loses power
  (``async`` seed 5228);
- a master is killed, the controller elects a slave at once (its SyncStateSet is then that slave
  alone) and the slave loses power before its next flush (``async`` seed 251);
- every member loses power before its flush, one after the other;
- a member that lost power is elected (or re-elected) while every replica that holds what it lost
  cannot be elected: outside the controller's SyncStateSet (a member only of the master's union
  view, a killed ex-master), or down, or cut off from the controller (its heartbeats expired).
  RocketMQ elects among the SyncStateSet members the controller hears from; so does rocketray
  (``async-overlap`` seeds 1, 24 and 36, docs/simulation.md). The same when a replica whose log
  contains that member's is elected in its stead (the new term a restarted master asks for,
  ``contains_log``): it loses no more than electing the member would (``async-overlap`` seed 255,
  ``tests/sim/test_loss.py``; the invariants call ``elected`` for such a member too,
  ``loss_checks._elected``). And a holder the controller had not heard from for two heartbeat
  intervals, whose last report ranked it below the elected broker's actual log, was not one it
  could have preferred (``async-overlap`` seed 710: a cut-off holder's row had not expired yet).

``LossOracle.power_lost`` is called at the step a broker lost power, with the world as it is at
that moment. The records that broker may have lost are those that end past its flushed end (the
end of its log at its last flush). Another member *holds* a record when its log reaches the
record's end and it is up and not itself exempt (a member that lost power and has not caught up
again, ``Invariants.exempt``), or when it is down from a kill with its log reaching that far when
it died (a kill keeps the page cache). Members are those of the controller's SyncStateSet and, if
the lost broker was master, of its union view. Every record acknowledged, read or committed before
that step whose end is past both the lost broker's flushed end and every other member's holding is
*forgiven*: the invariants stop requiring it (and only it).

``LossOracle.elected`` is called at the step the controller elected a master, with the world as it
is then and the set of replicas it could have elected instead (live in its heartbeat table and in
the SyncStateSet before the election, or, for a new term, holding the new master's last epoch).
If the new master held a record when it last lost power (the record starts below its log's end
then) and has not held it since (it starts at or past every end the broker has had since), and no
replica the controller could have elected holds it, the record (acknowledged or read before the
election: a record read after the loss was read from another replica) is forgiven.
Anything else lost is a violation, so a rule that loses a record any other way (an election of a
member that lacks it while one that holds it is electable, a truncation to a shorter log that was
not itself a permitted loss, a member let back into the set without the data) is still caught with
overlapping faults.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LossOracle", "Forgiven"]


@dataclass(frozen=True, slots=True)
class Forgiven:
    """Records of ``group`` acknowledged/read at or before ``at_ms`` starting at or after ``end`` (and
    before ``below``, when given) may be lost."""

    group: str
    at_ms: int
    end: int
    broker: str
    below: int | None = None


class LossOracle:
    def __init__(self) -> None:
        self.events: dict[str, list[Forgiven]] = {}
        self._seen_up: dict[str, tuple[int, int]] = {}     # name -> (log end, power losses) last seen up
        self._base: dict[str, tuple[tuple[int, int], int, int]] = {}   # name -> (key, flushed_end, end) at its start
        self._durable: dict[str, int] = {}                 # name -> durable end last seen up
        # name -> one [log end at a power loss, the longest log seen up since that loss] per power loss
        # whose tail it has not held again since (seed 394: a second loss with a shorter log must not
        # hide what the first one lost)
        self._losses: dict[str, list[list[int]]] = {}

    def seen_up(self, b, durable_end) -> None:
        """Called every step for every live broker (a SimBroker): the end a kill would keep, and the
        end a power loss would keep for certain. That is ``flushed_end`` (its log's end at its last
        async flush) once this process flushed since its log was last rewritten; before that, the
        durable end read from its disk (``durable_end(b)``) when the log was recovered or truncated
        (``flushed_end`` is the broker's and survives both)."""
        key = (b.restarts, b.rewrites)
        base = self._base.get(b.name)
        if base is None or base[0] != key:
            base = self._base[b.name] = (key, b.flushed_end, durable_end(b))
        self._seen_up[b.name] = (b.store.max_offset, b.power_losses)
        for loss in self._losses.get(b.name, ()):
            if b.store.max_offset > loss[1]:
                loss[1] = b.store.max_offset
        self._durable[b.name] = b.flushed_end if b.flushed_end != base[1] else base[2]

    def forgiven(self, group: str, at_ms: int, offset: int) -> bool:
        """Whether a record of ``group`` acknowledged (or read) at ``at_ms`` at physical ``offset`` may
        be lost. (Logs end on record boundaries, so a record is held whole or starts at or past
        the held end.)"""
        for f in self.events.get(group, ()):
            if at_ms <= f.at_ms and offset >= f.end and (f.below is None or offset < f.below):
                return True
        return False

    def power_lost(self, group: str, lost, brokers, members: set[int], now_ms: int, exempt) -> Forgiven | None:
        """``lost`` (a SimBroker) lost power at ``now_ms``; ``members``: the SyncStateSet ids then.
        Records the forgiveness this creates and returns it (None: ``lost`` was no member)."""
        kept = [loss for loss in self._losses.get(lost.name, ()) if loss[1] < loss[0]]   # not held again
        self._losses[lost.name] = kept + [[lost.end_before_power_loss, -1]]
        if lost.id not in members:
            return None
        held = self._durable.get(lost.name, 0)
        for b in brokers:
            if b is lost or b.id not in members:
                continue
            if b.up and b.store is not None and not exempt(b):
                held = max(held, b.store.max_offset)
            elif not b.up:
                end, losses = self._seen_up.get(b.name, (0, -1))
                if losses == b.power_losses:           # down from a kill: its page cache is kept
                    held = max(held, end)
        f = Forgiven(group, now_ms, held, lost.name)
        self.events.setdefault(group, []).append(f)
        return f

    def held_end(self, b) -> int:
        """The end of ``b``'s log it would bring back to an election: its log if up; if down, what it
        had when last seen up after a kill (the page cache survives), or its durable end after a
        power loss."""
        if b.up and b.store is not None:
            return b.store.max_offset
        end, losses = self._seen_up.get(b.name, (0, -1))
        return end if losses == b.power_losses else self._durable.get(b.name, 0)

    def elected(self, group: str, master, electable, now_ms: int) -> list[Forgiven]:
        """The controller elected ``master`` (a SimBroker) at ``now_ms``; ``electable``: the other
        brokers it could have elected instead. For each power loss of ``master`` whose tail it has not
        held since, forgives the records it lost then (starting below its log's end then and at or
        past every end it has had since) that no electable broker holds; returns those (empty:
        nothing). A record read after the loss from another replica counts: the bound is the
        election, not the loss."""
        out = []
        held = max([0] + [self.held_end(b) for b in electable if b is not master])
        for lost_end, since in self._losses.get(master.name, ()):
            if master.up and master.store is not None:
                since = max(since, master.store.max_offset)
            start = max(since, held)
            if start >= lost_end:
                continue
            f = Forgiven(group, now_ms, start, master.name, below=lost_end)
            self.events.setdefault(group, []).append(f)
            out.append(f)
        return out
