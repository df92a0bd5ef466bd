"""The async-flush loss oracle inside the invariants (a mixin of ``Invariants``, sim/invariants.py).

Theory of operation. ``rocketray.sim.loss.LossOracle`` decides, from offsets alone, which records
async flush may have lost (at a power loss, and at an election of a broker that lost power). These
methods feed it from the world at the step a power loss or an election is seen, read the records
and logs it needs (which replicas the controller could have elected; the stale copies of records an
election forgave), and take what it forgives out of invariants 1, 2, 8 and 9. They use the state
``Invariants.__init__`` sets up (``oracle``, ``_ends``, ``_before``, ``_stale``, ``_down_since``,
``_recovered`` and the commit tables).
"""

from __future__ import annotations

from rocketray.broker.commitlog import StoreError
from rocketray.wire.message import MessageCodecError, decode_record
from rocketray.broker.role import Role
from rocketray.sim.broker import SimBroker
from rocketray.sim.clients import Read

__all__ = ["LossChecks", "log_bytes"]


class LossChecks:
    """Async flush: the oracle's two rules applied to the invariants' state (see the module docstring)."""

    def _records(self, group: str, start: tuple[int, ...] = ()):
        """Every acknowledged, read and committed record of ``group`` (from the counts in ``start``);
        and the counts now."""
        lists = [p.acked for p in self._producers_of[group]]
        for c in self._consumers_of[group]:
            lists += [c.read, c.committed]
        counts = tuple(len(x) for x in lists)
        begin = start or (0,) * len(lists)
        return [r for x, i in zip(lists, begin) for r in x[i:]], counts

    def _end_after_loss(self, group: str) -> int:
        """The group's end counting only records not forgiven (a record's end taken as its offset + 1,
        as a reader's is; the byte comparison of ``check_logs`` checks whole records)."""
        assert self.oracle is not None
        counts, end = self._ends.get(group, ((), 0))
        records, now = self._records(group, counts)
        if now != counts:
            end = max([end] + [r.physical_offset + 1 for r in records if not self._is_forgiven(group, r)])
            self._ends[group] = (now, end)
        return end

    def _power_lost(self, group: str, b: SimBroker, brokers: list[SimBroker]) -> None:
        """Async flush: ``b`` lost power at this step; forgive what no other member holds."""
        assert self.oracle is not None
        members = set(self.controller.sync_state_set(group))
        master = self._current_master(group, brokers)
        for m in (b, master):       # the union view of the master that lost power, or of the one serving
            if m is not None and m.ha_role == Role.MASTER:
                members |= m.master.view()
        f = self.oracle.power_lost(group, b, brokers, members, self.controller.world.now_ms, self.exempt)
        if f is None:
            return
        self.controller.world.note(f"oracle: {b.name} lost power; records of {group} from offset {f.end} "
                                   f"acknowledged so far may be lost")
        self._forgive(group)

    def _elected(self, group: str, master_id: int | None, brokers: list[SimBroker]) -> None:
        """Async flush: the controller elected ``master_id`` at this step. If it is up (a broker elected
        while down never takes that term: its restart asks for a new one, ``broker/role.py``), lost
        power earlier, and no replica the controller could have elected instead holds what it lost,
        forgive that.

        The same for a *stand-in*: a live SyncStateSet member that lost power and whose recovered
        log the new master's contains (``contains_log``: same last epoch, more bytes). The new term a
        restarted master asks for elects such a replica in its stead (``decide._elect_new_term``),
        and electing the member itself would have lost the same records. ``async-overlap`` seed 255
        (``tests/sim/test_loss.py``): master g0-1, alone in the set {1}, lost power holding 7729 and
        came back with 5537; restarted, it asked for a new term and g0-2 (log 6827, outside the set)
        was elected in its stead: [6827, 7729) is g0-1's loss."""
        assert self.oracle is not None
        master = next((b for b in brokers if b.id == master_id), None)
        if master is None or not master.up or master.store is None:
            return
        sss = self._before.get(group, frozenset())
        now = self.controller.world.now_ms
        hb = self.controller.heartbeats

        def recovered(b: SimBroker) -> tuple[int, int]:
            assert b.store is not None
            return self._recovered.get(b.name) or (b.store.epoch_file.last_epoch(), b.store.max_offset)

        def contains(b: SimBroker, of: SimBroker) -> bool:
            """``b``'s live log holds all of ``of``'s as it recovered (the controller's contains_log)."""
            last, end = recovered(of)
            return b.up and b.store is not None and b.store.epoch_file.last_epoch() == last and b.store.max_offset > end

        def heard_of(b: SimBroker, cand: SimBroker) -> bool:
            """Did the controller hear of ``b``'s log? Yes if ``b`` reported within two heartbeat
            intervals, or if its last report (cut off since) already ranked it at least as high as
            ``cand``'s actual log. A replica cut off from the controller whose row has not expired
            yet is ranked by what it last reported (RocketMQ's election too): passing it over for a
            restarted member that reports more is the ranking working, not a bug (``async-overlap``
            seed 710: g0-3, cut off at 990 ms with 7731 reported, held 13981; the restarted g0-1
            reported 13720 and was elected 28 ms before g0-3's row would have expired)."""
            info = hb.live_info(group, b.id)
            if info is None:
                return False
            if now - info.last_update_ms <= 2 * b.t.heartbeat_ms:
                return True
            assert cand.store is not None
            return (info.epoch, info.max_offset) >= (cand.store.epoch_file.last_epoch(), cand.store.max_offset)

        def electable(cand: SimBroker, b: SimBroker) -> bool:
            """Could the controller have elected ``b`` instead of ``cand``?"""
            if b is cand:
                return False
            if b is master:
                return True
            # a SyncStateSet member, or a live replica whose log contains the restarted master's as it
            # recovered (the new term a restarted broker asks for considers it: contains_log), that
            # the controller heard of
            return hb.is_alive(group, b.id, now) and (b.id in sss or contains(b, cand)) and heard_of(b, cand)

        stand_ins = [x for x in brokers if x is not master and x.id in sss and x.up and x.store is not None
                     and hb.is_alive(group, x.id, now) and contains(master, x)]
        for cand in [master] + stand_ins:
            for f in self.oracle.elected(group, cand, [b for b in brokers if electable(cand, b)], now):
                how = "elected" if cand is master else f"replaced by {master.name}, whose log contains its,"
                self.controller.world.note(f"oracle: {cand.name} {how} after losing power; records of {group} "
                                           f"in [{f.end}, {f.below}) acknowledged or read so far may be lost")
                stale = self._stale.setdefault(group, set())
                for b in brokers:
                    if b.up and b.store is not None and f.below is not None:
                        stale.update(_records_in(b.store, f.end, min(f.below, b.store.max_offset)))
                self._forgive(group)

    def _stale_after_restart(self, group: str, b: SimBroker) -> None:
        """What ``b``, back up, holds of a range an election forgave while it was down is a stale copy
        too, as a replica up at that election holds one: until it follows the new master it may serve
        it to a reader (a killed broker keeps its page cache). ``async-overlap`` seed 558: g0-2,
        killed holding 11374, was down when the restarted g0-1 was elected with 10591; back up, it
        served [10591, 11374) to a consumer before it followed g0-1. State changes only as ``b``
        goes down and comes up (steps the incremental checks never skip)."""
        assert self.oracle is not None
        events = self.oracle.events.get(group, [])
        if not b.up:
            self._down_since.setdefault(b.name, len(events))
            return
        if b.store is None or b.name not in self._down_since:
            return
        stale = self._stale.setdefault(group, set())
        for f in events[self._down_since.pop(b.name):]:
            if f.below is not None:
                stale.update(_records_in(b.store, f.end, min(f.below, b.store.max_offset)))

    def _forgive(self, group: str) -> None:
        """What the oracle forgave in ``group`` leaves the checks from now on."""
        assert self.oracle is not None
        self._ends.pop(group, None)
        # 8 and 9 restart from the loss: commits forgiven leave the history, readings before it no
        # longer bind (a reader may have been answered a forgiven commit)
        acked = self._acked_commits.pop(group, None)
        if acked is not None:
            for entry in self._committers[group]:
                entry[1] = 0
            self._acked_count[group] = 0
            self._take_commits(group, keep=lambda c: not self.oracle.forgiven(group, c.at_ms, c.physical_offset))
        self._read_commits.pop(group, None)
        self._read_marks.pop(group, None)

    def _forgiven_in(self, group: str):
        """A predicate on records of ``group``: may async flush have lost it (sim/loss.py)?"""
        oracle = self.oracle
        if oracle is None or group not in oracle.events:
            return lambda r: False
        return lambda r: self._is_forgiven(group, r)

    def _is_forgiven(self, group: str, r) -> bool:
        """A record (acknowledged, read or committed) async flush may have lost: the oracle's rule, or
        a read, after the election that lost it, of a record a stale replica still held then."""
        assert self.oracle is not None
        if self.oracle.forgiven(group, r.at_ms, r.physical_offset):
            return True
        return isinstance(r, Read) and (r.physical_offset, r.body) in self._stale.get(group, ())


def _records_in(store, start: int, end: int) -> list[tuple[int, bytes]]:
    """(offset, body) of the whole records of ``store``'s log from ``start`` (a record boundary of
    another replica's log: nothing when it is not one here) to ``end``."""
    if start < store.min_offset or start >= end:
        return []
    try:
        data, out, pos = log_bytes(store, start, end), [], 0
    except StoreError:       # ``start`` is inside a record of this log (it went another way)
        return []
    while pos < len(data):
        try:
            msg, size = decode_record(data, pos)
        except (MessageCodecError, ValueError):
            break
        out.append((start + pos, bytes(msg.body)))
        pos += size
    return out


def log_bytes(store, start: int, end: int) -> bytes:
    """The log's bytes in [start, end), read whole records at a time across segments."""
    out = bytearray()
    offset = start
    while offset < end:
        chunk = store.read_raw(offset, end - offset)
        if not chunk:
            break
        out += chunk
        offset += len(chunk)
    return bytes(out)
