"""The invariants the simulator checks after every step (SIMULATION.md section 6).

``check_step`` runs after every event and is cheap: it checks only the group the event may have
changed (``World.actor``: the group of its owner or scope; an event with neither, or one of the
controller's, may change any group, and a group where the controller elected is checked too), so a
step costs the same whatever the number of groups, and in that group only the checks whose inputs
the step changed (sim/step_inputs.py: a check run again on the same inputs is a no-op, so this
accepts and rejects exactly what checking everything after every step does). ``check_logs`` reads
the replicas' logs (every acknowledged and every read message where it must be) and runs every
``full_every`` steps, for the groups an election changed, and at the end (sim/log_checks.py);
``check_settled`` runs once faults are healed and the cluster settled. Offset commits are messages,
so 1 covers their records; 8 folds each member's whole log at every acknowledged commit and with
``check_logs``; 9 runs every step where what the master would answer may have changed.

1. every acknowledged message is in the log of every live member of the group's current
   SyncStateSet, at the offset it was acknowledged with (so it survives every election, which
   picks among those members);
2. every message a consumer read is there too (what was visible never disappears);
3. at most one master per (group, epoch); a broker process's master epochs never go back;
4. the current master's confirm offset never exceeds the end of any live replica its union view
   counts (confirmed set or a proposal in flight), and a master's confirm offset never goes back
   within its term (consumers may already have read up to it);
5. after healing: replicas byte-identical up to the confirm offset, epoch files agree below it;
6. liveness: after healing, every group acknowledges writes again;
7. a batch the broker answered "not written" (``Written.NO``: the client may resend it as new) is in
   no log (else the resend duplicates it and the history calls an existing message failed);
8. every acknowledged offset commit (group, topic, queue, offset) is held by every live member of the
   broker group's current SyncStateSet: the fold of every commit record in that member's log
   (confirmed or not) gives at least that offset (and the record is where it was acknowledged: 1);
9. the committed offset a reader gets from the current master never goes back: every answer the
   master gives (after the wait rule) and, at every step where the master's confirm offset has
   reached its max offset, the fold of its confirmed records, is at least every commit acknowledged
   before it was asked and at least every value read before; an admin's reset record
   (``consumer_reset_p``) is the one allowed regression, in 8 and 9 alike: an acknowledged one sets
   the bound, one that may be in the log uncounted lowers it to its offset (sim/commit_checks.py);
10. liveness: after healing, every consumer group's commits are acknowledged again;
11. with ``min_in_sync_replicas`` N > 1 (sync flush), every PUT_OK a broker answers is held, as it
    answers, by N replicas, but in the admission rule's window (sim/ack_checks.py);
12. liveness of the put path: a live broker answers every put it wrote by the put's deadline
    (sim/put_checks.py), after every step of that broker.
"""

from __future__ import annotations

import contextlib
from typing import Iterator


from rocketray.broker.role import Role
from rocketray.sim.broker import SimBroker
from rocketray.sim.clients import SimConsumer, SimProducer
from rocketray.sim.controller import SimController
from rocketray.sim.loss import LossOracle
from rocketray.sim.ack_checks import AckChecks
from rocketray.sim.commit_checks import CommitChecks
from rocketray.sim.log_checks import LogChecks
from rocketray.sim.loss_checks import LossChecks, log_bytes as _log_bytes
from rocketray.sim.offsets import LogFold
from rocketray.sim.put_checks import PutChecks
from rocketray.sim.step_inputs import broker_step_inputs, group_inputs, verify_skip
from rocketray.sim.world import Violation

__all__ = ["Invariants", "full_checks"]


@contextlib.contextmanager
def full_checks(verify: bool = False) -> Iterator[None]:
    """Inside the block, runs check every invariant in full after every step (``verify``: instead,
    keep skipping and fail at any skipped check that would have changed something)."""
    before = Invariants.incremental, Invariants.verify_skips
    Invariants.incremental, Invariants.verify_skips = verify, verify
    try:
        yield
    finally:
        Invariants.incremental, Invariants.verify_skips = before


class Invariants(LossChecks, LogChecks, CommitChecks, AckChecks, PutChecks):
    #: skip a group's per-step checks after a step that changed none of their inputs
    #: (sim/step_inputs.py), and read only what ``check_logs`` has not found yet (sim/log_checks.py);
    #: False: every check in full after every step (``full_checks``)
    incremental = True
    #: debug mode: run every skipped per-step check anyway and fail unless it changed nothing
    verify_skips = False

    def __init__(self, controller: SimController, groups: dict[str, list[SimBroker]],
                 producers: list[SimProducer], consumers: list[SimConsumer], full_every: int = 2000,
                 async_flush: bool = False) -> None:
        self.controller, self.groups = controller, groups
        # With async flush a power loss may cost one replica acknowledged bytes it had not flushed
        # (the guarantee is that the *other* members keep them): that replica is exempt from 1, 2
        # and 4 until its log again reaches what was acknowledged or read when it lost power, and
        # what it held then (an ack it sent before the loss may still be on its way).
        self.async_flush = async_flush
        self._power_losses: dict[str, int] = {}
        self._exempt_until: dict[str, int] = {}
        self.producers, self.consumers = producers, consumers
        self._producers_of = {g: [p for p in producers if p.group == g] for g in groups}
        self._consumers_of = {g: [c for c in consumers if c.group == g] for g in groups}
        self.full_every = full_every
        self._masters: dict[tuple[str, int], int] = {}
        self._epochs: dict[tuple[str, int], tuple[int, int]] = {}   # (name, restart) -> last epoch
        self._steps = 0
        self._elections = 0
        self._confirms: dict[tuple[str, int, int], int] = {}   # (name, restart, epoch) -> confirm
        # name -> what check_logs found in its log under its (restarts, rewrites) key (sim/log_checks.py)
        self._found: dict = {}
        self._record_bytes: dict[tuple[int, bytes], bytes] = {}   # (offset, body) -> the record found whole
        # name -> ((restarts, rewrites), segments found fully durable, durable end found)
        self._durable: dict[str, tuple[tuple[int, int], int, int]] = {}
        # offset commits (8, 9): per broker group, (consumer group, topic, queue) -> the acknowledged
        # commits in time order as (times, running maximum), and the highest value a reader got
        self._committers: dict[str, list[list]] = {g: [[c, 0] for c in consumers if c.group == g] for g in groups}
        self._acked_count: dict[str, int] = {}
        self._acked_commits: dict[str, dict[tuple[str, str, int], tuple[list[int], list[int]]]] = {}
        self._read_commits: dict[str, dict[tuple[str, str, int], tuple[int, str, int]]] = {}
        self._log_folds: dict[str, LogFold] = {}          # name -> fold of its whole log (8)
        self._read_marks: dict[str, tuple] = {}           # group -> what the last step's 9 read
        # async flush with overlapping faults: what a power loss may lose (sim/loss.py); records it
        # forgives are no longer required by 1, 2 and 8, and 9 restarts from the loss
        self.oracle = LossOracle() if async_flush else None
        self._ends: dict[str, tuple[tuple[int, ...], int]] = {}   # group -> (record counts, end) after a loss
        self._seen_elections = 0
        # group -> (offset, body) of the records an election forgave, as the live replicas held them
        # then (and a replica down then, once back up): one that has not heard of the election yet
        # may still serve them to a reader
        self._stale: dict[str, set[tuple[int, bytes]]] = {}
        self._down_since: dict[str, int] = {}      # name of a broker down -> its group's oracle events then
        # name -> (last epoch, log end) its store recovered with after its last power loss: what the
        # new term it asks for then carries (the controller's contains_log compares that)
        self._recovered: dict[str, tuple[int, int] | None] = {}
        self._before: dict[str, frozenset[int]] = {}   # group -> the controller's SyncStateSet at the last step
        self._inputs: dict[str, tuple] = {}            # group -> group_inputs at its last per-step check
        self._parts = {g: (groups[g], self._producers_of[g], self._consumers_of[g]) for g in groups}
        self._by_id = {g: {b.id: b for b in brokers} for g, brokers in groups.items()}
        self._index = {b: i for brokers in groups.values() for i, b in enumerate(brokers)}   # broker -> its place
        self._setup_ack_checks()      # 11 (sim/ack_checks.py)

    # -- after every step ---------------------------------------------------------------------------
    def exempt(self, b: SimBroker) -> bool:
        """An async-flush replica that lost power and has not caught up again (see __init__)."""
        target = self._exempt_until.get(b.name)
        if target is None:
            return False
        if b.up and b.store is not None and b.store.max_offset >= target:
            del self._exempt_until[b.name]
            return False
        return True

    def _group_end(self, group: str) -> int:
        if self.oracle is not None and group in self.oracle.events:
            return self._end_after_loss(group)
        end = 0
        for p in self._producers_of[group]:
            end = max(end, p.acked_end)
        for c in self._consumers_of[group]:
            end = max(end, c.read_end, c.commit_end)
        return end

    def _touched(self) -> tuple[str] | dict[str, list[SimBroker]]:
        """The groups the step that just ran may have changed (see the module docstring)."""
        group = getattr(self.controller.world.actor, "group", None)
        return (group,) if group in self.groups else self.groups

    def check_step(self) -> None:
        self._steps += 1
        self._check_put_deadline()
        if self._isr_n > 1:
            if not self.controller.world.quiet:
                self._sample_isr()
            if self._answered:
                self._check_answers()
        elections = self.controller.elections
        if self.controller.world.quiet and self.incremental and len(elections) == self._seen_elections \
                and len(self._inputs) == len(self.groups):
            # the step changed nothing a check reads (``World.quiet``), and every group was checked
            # before: its inputs are what they were at its last check
            if self.verify_skips:
                self._verify_quiet()
            if self._steps % self.full_every == 0:
                self._elections = len(elections)
                self.check_logs()
            return
        new_elections: list = []
        elected: set[str] = set()
        if len(elections) != self._seen_elections:
            new_elections = elections[self._seen_elections:]
            self._seen_elections = len(elections)
            elected = {g for g, _epoch, _master in new_elections}
        touched = self._touched()
        if elected and elected - set(touched):
            touched = [g for g in self.groups if g in elected or g in touched]
        incremental, last = self.incremental, self._inputs
        actor = self.controller.world.actor
        for group in touched:
            if incremental and group not in elected:
                before = last.get(group)
                index = self._index.get(actor) if before is not None and getattr(actor, "group", None) == group else None
                if index is None:
                    inputs = group_inputs(self.controller, *self._parts[group], group)
                else:           # a step of one broker: only it and the controller can have changed
                    inputs = broker_step_inputs(self.controller, group, before, index, actor)
                    if self.verify_skips and inputs != group_inputs(self.controller, *self._parts[group], group):
                        raise AssertionError(f"step {self.controller.world.steps}: a step of {actor.name} "
                                             f"changed more than {actor.name} and the controller")
                last[group] = inputs
                if before is not None and inputs[0] == before[0]:
                    # neither the controller nor a broker changed: the checks that read only them
                    # would be no-ops (sim/step_inputs.py)
                    if inputs[1] != before[1] or inputs[2]:
                        brokers = self.groups[group]
                        self._check_clients(group, brokers, self._current_master(group, brokers))
                        self._read_answers(group, inputs)
                    if self.verify_skips:
                        verify_skip(self, group, inputs[1] == before[1] and not inputs[2])
                    continue
            self._check_group(group, self.groups[group],
                              [m for g, _epoch, m in new_elections if g == group] if self.oracle is not None else [])
            if incremental:     # an election's check ran without reading the inputs: read them now
                self._read_answers(group, None if group in elected else last[group])
        if self._steps % self.full_every == 0:
            self._elections = len(elections)
            self.check_logs()
        elif elected:
            self._elections = len(elections)
            self.check_logs(sorted(elected))

    def _read_answers(self, group: str, inputs: tuple | None) -> None:
        """After a check that read the committed-offset answers given (and emptied the brokers'
        lists), or ran without ``inputs``, the group's inputs are those it left."""
        if inputs is None or inputs[2]:
            self._inputs[group] = group_inputs(self.controller, *self._parts[group], group)

    def _verify_quiet(self) -> None:
        """Debug mode: a quiet step left the inputs of the groups it may have touched as they were."""
        for group in self._touched():
            if group_inputs(self.controller, *self._parts[group], group) != self._inputs[group]:
                raise AssertionError(f"step {self.controller.world.steps}: a quiet step changed the inputs of {group}")
            verify_skip(self, group, True)

    def _check_group(self, group: str, brokers: list[SimBroker], elected: list[int | None]) -> None:
        """Every per-step check of one group; ``elected``: the masters the controller elected in it
        at this step (async flush: the oracle's election rule)."""
        self._check_brokers(group, brokers, elected)
        master = self._check_confirm(group, brokers)
        self._check_clients(group, brokers, master)

    def _check_clients(self, group: str, brokers: list[SimBroker], master: SimBroker | None) -> None:
        """The per-step checks that read the clients' histories (the only ones to run after a step
        that changed nothing else: ``check_step``); ``master``: the group's current master."""
        self._check_ends(group, brokers)
        self._check_commits(group, brokers, master)

    def _check_brokers(self, group: str, brokers: list[SimBroker], elected: list[int | None]) -> None:
        """3 (one master per epoch, epochs never go back); power losses and elections for the async
        flush oracle."""
        for b in brokers:
            if b.power_losses != self._power_losses.get(b.name, 0):
                self._power_losses[b.name] = b.power_losses
                if self.async_flush:   # what was acked or read, and what it may have acked
                    self._power_lost(group, b, brokers)
                    self._exempt_until[b.name] = max(self._group_end(group), b.end_before_power_loss)
                    self._recovered[b.name] = None
            if self.oracle is not None:
                self._stale_after_restart(group, b)
            if not b.up:
                continue
            if self.oracle is not None and b.store is not None:
                self.oracle.seen_up(b, self.durable_end)
                if b.name in self._recovered and self._recovered[b.name] is None:
                    self._recovered[b.name] = (b.store.epoch_file.last_epoch(), b.store.max_offset)
            m = b.machine
            if m.is_master:
                key = (group, m.master_epoch)
                holder = self._masters.setdefault(key, b.id)
                if holder != b.id:
                    raise Violation("one master per epoch", f"{group} epoch {m.master_epoch}: "
                                    f"brokers {holder} and {b.id}")
            pkey = (b.name, b.restarts)
            if m.master_epoch < self._epochs.get(pkey, (m.master_epoch,))[0]:
                raise Violation("epochs never go back", f"{b.name}: {m.master_epoch} after "
                                f"{self._epochs[pkey][0]}")
            self._epochs[pkey] = (m.master_epoch, 0)
        if self.oracle is not None:
            for master_id in elected:
                self._elected(group, master_id, brokers)
            self._before[group] = self.controller.sync_state_set(group)

    def _check_ends(self, group: str, brokers: list[SimBroker]) -> None:
        """Cheap form of 1 and 2 for every step: each live SyncStateSet member's log reaches past
        the last acknowledged or read message (``check_logs`` compares the bytes)."""
        end = self._group_end(group)
        members = self.controller.sync_state_set(group)
        for b in brokers:
            if b.id in members and b.up and b.store is not None and b.store.commitlog.max_offset < end \
                    and not self.exempt(b):
                raise Violation("acknowledged or read message lost",
                                f"{b.name} (in the SyncStateSet {sorted(members)}) ends at "
                                f"{b.store.max_offset} < {end}, the end of what was acknowledged or read")

    def _current_master(self, group: str, brokers: list[SimBroker]) -> SimBroker | None:
        master_id, epoch = self.controller.master_of(group)
        for b in brokers:
            if b.up and b.id == master_id and b.ha_role == Role.MASTER and b.ha_epoch == epoch:
                return b
        return None

    def durable_end(self, b: SimBroker, at_least: int = -1) -> int:
        """The end of ``b``'s log that a power loss now would keep for certain (invariant 4 with
        sync flush). Between two truncations of one process it only grows, so a value already at
        ``at_least`` is not computed again, and sealed segments found fully durable are not read
        again."""
        store = b.store
        if store is None:
            return 0
        key = (b.restarts, b.rewrites)
        cached_key, done, end = self._durable.get(b.name, (None, 0, 0))
        if cached_key != key:
            done, end = 0, 0
        elif end >= at_least >= 0:
            return end
        segments = store.commitlog.segments
        end = segments[-1].end_offset if segments else store.commitlog.max_offset
        for i in range(done, len(segments)):
            seg = segments[i]
            kept = b.disk.durable_prefix(seg.path)
            if kept < seg.size or i == len(segments) - 1:
                end = seg.base_offset + min(kept, seg.size)
                break
            done = i + 1
        self._durable[b.name] = (key, done, end)
        return end

    def _check_confirm(self, group: str, brokers: list[SimBroker]) -> SimBroker | None:
        """4; returns the group's current master (or None)."""
        for b in brokers:
            if b.up and b.ha_role == Role.MASTER and b.store is not None:
                key = (b.name, b.restarts, b.ha_epoch)
                confirm = b.store.confirm_offset
                # async flush: a member that lost unflushed bytes acks less when it comes back; the
                # confirm offset follows it down (what was read stays on the other members: 2)
                if confirm < self._confirms.get(key, confirm) and \
                        not any(self.exempt(p) for p in brokers if p.id in b.master.view() and p is not b):
                    raise Violation("confirm offset never goes back in a term",
                                    f"{b.name} epoch {b.ha_epoch}: {confirm} after {self._confirms[key]}")
                self._confirms[key] = confirm
        m = self._current_master(group, brokers)
        if m is None or m.store is None:
            return m
        confirm = m.store.confirm_offset
        if not self.async_flush and confirm > self.durable_end(m, confirm):
            raise Violation("confirm offset within every counted member",
                            f"{group}: master {m.id} confirm {confirm} > its own durable end {self.durable_end(m)}")
        by_id = self._by_id[group]
        view = m.master.view()
        for member in view:
            peer = by_id.get(member)
            if peer is None or peer is m or not peer.up or peer.store is None or self.exempt(peer):
                continue
            if confirm > peer.store.commitlog.max_offset and peer.slave is not None and peer.slave.master == m.name:
                raise Violation("confirm offset within every counted member",
                                f"{group}: master {m.id} confirm {confirm} > member {member} end "
                                f"{peer.store.max_offset} (view {sorted(view)})")
            if not self.async_flush and confirm > self.durable_end(peer, confirm) and peer.slave is not None \
                    and peer.slave.master == m.name:
                raise Violation("confirm offset within every counted member",
                                f"{group}: master {m.id} confirm {confirm} > member {member} durable end "
                                f"{self.durable_end(peer)} (view {sorted(view)})")
        return m

    # -- after healing ---------------------------------------------------------------------------------
    def check_settled(self, heal_ms: int) -> None:
        self.check_logs()
        self._check_not_written()
        for group, brokers in self.groups.items():
            m = self._current_master(group, brokers)
            if m is None or m.store is None:
                raise Violation("liveness", f"{group}: no serving master after healing")
            producers = [p for p in self.producers if p.group == group]
            if producers and not any(p.last_ok_ms > heal_ms for p in producers):
                raise Violation("liveness", f"{group}: no write acknowledged after healing at {heal_ms}")
            committers = [c for c in self.consumers if c.group == group and c.commit_interval_ms > 0]
            if committers and not any(c.last_commit_ok_ms > heal_ms for c in committers):
                raise Violation("liveness", f"{group}: no offset commit acknowledged after healing at {heal_ms}")
            confirm = m.store.confirm_offset
            ref = _log_bytes(m.store, m.store.min_offset, confirm)
            for b in brokers:
                if b is m or not b.up or b.store is None or b.id not in m.master.view():
                    continue
                if b.store.max_offset < confirm:
                    raise Violation("replicas identical after healing",
                                    f"{b.name} ends at {b.store.max_offset} < confirm {confirm}")
                if _log_bytes(b.store, m.store.min_offset, confirm) != ref:
                    raise Violation("replicas identical after healing", f"{b.name} differs below {confirm}")
                mine = [(e.epoch, e.start_offset) for e in m.store.epoch_file.entries() if e.start_offset < confirm]
                theirs = [(e.epoch, e.start_offset) for e in b.store.epoch_file.entries()
                          if e.start_offset < confirm]
                if mine != theirs:
                    raise Violation("epoch files agree", f"{b.name} {theirs} vs master {mine}")


    def _check_not_written(self) -> None:
        for group, brokers in self.groups.items():
            failed = set().union(*[p.failed_bodies for p in self.producers if p.group == group])
            if not failed:
                continue
            known = self._known_records()
            for b in brokers:
                if not b.up or b.store is None:
                    continue
                for offset, body in self._log_records(b.store, known):
                    if body in failed:
                        raise Violation("not-written batches are not in the log",
                                        f"{b.name} holds {body!r} at {offset}, answered as not written")
