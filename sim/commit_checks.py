"""Invariants 8 and 9: acknowledged offset commits are held, and committed offsets never go back (a
mixin of ``Invariants``, sim/invariants.py), but through an admin's reset.

Theory of operation. Each acknowledged commit is taken, in time order, into per-(consumer group,
topic, queue) lists of times and running values (``_take_commits``): the maximum, but an
acknowledged reset record sets the value (the fold's rule, ``rocketray.broker.offsets``; one
consumer's commits and resets are sent one at a time, so their acknowledgement order is their log
order). A reset is the one recorded regression: a reading or a log below the running value is
allowed down to the offset of a reset that may be in the log without being counted there yet
(sent and not acknowledged before the reading was asked, or forgiven by the loss oracle:
``_reset_floor``); anything else below it is a violation. 8: at every acknowledged commit
(and with ``check_logs``) every live SyncStateSet member's log, folded whole (``LogFold``, advanced
as the log grows), gives at least every acknowledged commit. 9: every answer the current master
gives, and at every step where its confirm offset reached its max offset (the wait rule holds) the
fold of its confirmed records, is at least every commit acknowledged before it was asked and every
value read before. The state lives in ``Invariants.__init__`` (``_committers``, ``_acked_commits``,
``_read_commits``, ``_read_marks``, ``_log_folds``).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

from rocketray.sim import offsets as sim_offsets
from rocketray.sim.broker import SimBroker
from rocketray.sim.offsets import LogFold
from rocketray.sim.world import Violation

__all__ = ["CommitChecks"]


class CommitChecks:
    """8 and 9 (see the module docstring)."""

    def _take_commits(self, group: str, keep=None) -> bool:
        """Take the commits acknowledged since the last step into ``_acked_commits``; True if any
        (``keep``: only those it accepts)."""
        new = False
        for entry in self._committers[group]:          # [consumer, commits already taken]
            c, taken = entry
            if taken == len(c.committed):
                continue
            acked = self._acked_commits.setdefault(group, {})
            for commit in c.committed[taken:]:
                if keep is not None and not keep(commit):
                    continue
                times, highest = acked.setdefault((commit.consumer_group, commit.topic, commit.queue_id), ([], []))
                times.append(commit.at_ms)
                highest.append(commit.offset if commit.reset else max(commit.offset, highest[-1] if highest else -1))
            self._acked_count[group] = self._acked_count.get(group, 0) + len(c.committed) - taken
            entry[1] = len(c.committed)
            new = True
        return new

    def _check_commits(self, group: str, brokers: list[SimBroker], m: SimBroker | None) -> None:
        """8 at every acknowledged commit (and with ``check_logs``); 9 at every step where what the
        master would answer may have changed. ``m``: the group's current master."""
        new = self._take_commits(group)
        for b in brokers:
            if b.answers:
                answers, b.answers = b.answers, []
                if b is m:      # a deposed master that does not know it yet may answer stale: not checked
                    for a in answers:
                        self._check_reading(group, lambda key, a=a: a.offsets.get((key[1], key[2])),
                                            a.asked_ms, False, f"{b.name} answered")
        if group not in self._acked_commits:
            return
        if m is not None and m.store is not None:
            store = m.store
            # what it would answer changes only with its confirm offset (the wait rule cannot start to
            # hold while the confirm offset stays; a truncation changes ``rewrites``)
            mark = (id(m), m.restarts, m.rewrites, store.confirm_offset, self._acked_count[group])
            if mark != self._read_marks.get(group):
                self._read_marks[group] = mark
                if sim_offsets.answerable(mark[3], store.max_offset):    # the wait rule holds: it would answer now
                    table = m.offset_table()
                    self._check_reading(group, lambda key: table.committed(*key), self.controller.world.now_ms,
                                        True, f"{m.name} reads")
        if new:
            self._check_held(group, brokers)

    def _reset_floor(self, group: str, key: tuple[str, str, int], since_ms: int) -> int | None:
        """The lowest offset of a reset of ``key`` that the log may hold without the running value
        counting it from ``since_ms``: sent, and not acknowledged before ``since_ms`` (or its
        acknowledged record forgiven by the loss oracle). None: no such reset."""
        oracle = self.oracle
        lows = [a.offset for c, _ in self._committers[group] for a in c.resets if a.key == key and (
            a.acked_ms is None or a.acked_ms >= since_ms
            or (oracle is not None and a.physical_offset is not None
                and oracle.forgiven(group, a.acked_ms, a.physical_offset)))]
        return min(lows) if lows else None

    def _check_reading(self, group: str, value_of, asked_ms: int, inclusive: bool, where: str) -> None:
        """9 for one reading (``value_of(key)``) of ``group``'s committed offsets, asked at ``asked_ms``."""
        acked = self._acked_commits.get(group, {})
        seen = self._read_commits.setdefault(group, {})
        for key in acked.keys() | seen.keys():
            value = value_of(key)
            value = -1 if value is None else value
            times, highest = acked.get(key, ((), ()))
            i = (bisect_right if inclusive else bisect_left)(times, asked_ms)
            if i and value < highest[i - 1]:
                floor = self._reset_floor(group, key, asked_ms)
                if floor is None or value < floor:
                    raise Violation("committed offset never goes back",
                                    f"{where} {key} = {value}, below {highest[i - 1]} acknowledged before {asked_ms}"
                                    f" (and below every reset that may be in the log: {floor})")
            before = seen.get(key)
            if before is not None and value < before[0]:
                floor = self._reset_floor(group, key, before[2])
                if floor is None or value < floor:
                    raise Violation("committed offset never goes back",
                                    f"{where} {key} = {value}, below {before[0]} ({before[1]}; resets since: {floor})")
            if before is None or value != before[0]:
                seen[key] = (value, f"{where} at {self.controller.world.now_ms}", asked_ms)

    def _check_held(self, group: str, brokers: list[SimBroker]) -> None:
        """8: every live SyncStateSet member's log folds to at least every acknowledged commit."""
        acked = self._acked_commits.get(group)
        if not acked:
            return
        members = self.controller.sync_state_set(group)
        for b in brokers:
            if b.id not in members or not b.up or b.store is None or self.exempt(b):
                continue
            key = (b.restarts, b.rewrites)
            fold = self._log_folds.get(b.name)
            if fold is None or fold.key != key:
                fold = self._log_folds[b.name] = LogFold(key)
            table = fold.advance(b.store)
            for (cg, topic, queue_id), (times, highest) in acked.items():
                held = table.committed(cg, topic, queue_id)
                floor = self._reset_floor(group, (cg, topic, queue_id), times[-1] + 1)
                if held is None or held < (highest[-1] if floor is None else min(floor, highest[-1])):
                    raise Violation("acknowledged commit lost",
                                    f"{b.name} (in the SyncStateSet {sorted(members)}): the commit records of "
                                    f"its log give {cg} {topic}/{queue_id} = {held}, below {highest[-1]} "
                                    f"acknowledged at {times[highest.index(highest[-1])]}")

