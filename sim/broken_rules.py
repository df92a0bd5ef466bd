"""The broken rules of the mutation check (``sim/mutants.py``): each function takes the rule as the
code that runs finds it and returns a plausible one-line bug in its place (``make(original)``).

Kept apart from the registry so that each reads as what it breaks; the registry names which
production target each one replaces and why it matters.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

Make = Callable[[Any], Any]

def rank_without(field: str) -> Make:
    def make(original):
        def rank_key(broker_id, info):
            return original(broker_id, None if info is None else dataclasses.replace(info, **{field: 0}))
        return rank_key
    return make


def old_takes_report(_original):
    return lambda old, req: req.epoch > old.epoch or (req.epoch == old.epoch and req.max_offset > old.max_offset)


def shrink_from_confirmed(_original):
    def maybe_shrink(self, now_ms):
        candidate = {self.local_broker_id} | {
            s for s in self.local if s != self.local_broker_id and self.caught_up_ms.get(s) is not None
            and now_ms - self.caught_up_ms[s] <= self.max_time_slave_not_catchup_ms}
        result = frozenset(candidate)
        if result != self.local:
            self.pending = (result,)        # overwrites a pending expand
        return result
    return maybe_shrink


def expand_on_any_ack(_original):
    def acked(self, key, event, confirm_offset_now, epoch_start):
        self._ack_of[key] = max(self._ack_of[key], event.offset)
        if event.caught_up_ms is not None:
            self.tracker.update_caught_up(event.slave_id, event.caught_up_ms)
        return self.tracker.maybe_expand(event.slave_id, event.offset, 0, 0)    # no catch-up required
    return acked


def vetting_admits_all(_original):
    def in_flight(self, proposal, confirm_offset, epoch_start):
        result = frozenset(proposal) | {self.self_id}
        return None if result == self.tracker.local else self.tracker.mark_in_flight(result)
    return in_flight


def confirmation_drops_all(_original):
    def set_sync_state_set(self, ids):
        ids = frozenset(ids)
        if self._confirmed is None:
            self._local = ids
        self.pending = ()                   # also the proposals the controller has not answered yet
    return set_sync_state_set


def stale_report_accepted(original):
    def decide_alter_sync_state_set(state, req, alive):
        if state.contains(req.broker_name):
            current = state.sync_state[req.broker_name].sync_state_set_epoch
            req = dataclasses.replace(req, sync_state_set_epoch=current)
        return original(state, req, alive)
    return decide_alter_sync_state_set


def acked_by_connected(_original):
    def batch_acked(policy, self_id, members, acks, end):
        return all(a >= end for m, a in acks.items() if m in members and m != self_id)
    return batch_acked


def acked_by_confirmed_set(_original):
    from rocketray.ha.ack import batch_acked

    def acked(self, end):
        return batch_acked(self.policy, self.self_id, frozenset(self.tracker.local), self.acks(), end)
    return acked


def old_after_write(_original):
    from rocketray.wire.put_result import PutResult, PutStatus, Written

    def after_write(acked, still_master, offsets, end_offset):
        if acked:
            return PutResult(PutStatus.PUT_OK, Written.YES, offsets, end_offset)
        if not still_master:
            return PutResult(PutStatus.NOT_MASTER, Written.NO)
        return PutResult(PutStatus.FLUSH_SLAVE_TIMEOUT, Written.YES, offsets, end_offset)
    return after_write


def confirm_ignores_unknown(_original):
    def confirm_offset(self_id, members, max_offset, current, acks, all_ack=True):
        known = [a for m, a in acks.items() if m in members and m != self_id and a >= 0]
        return min([max_offset] + known) if all_ack else max_offset
    return confirm_offset


def confirm_never_back(original):
    def confirm_offset(self_id, members, max_offset, current, acks, all_ack=True):
        return max(original(self_id, members, max_offset, current, acks, all_ack), min(current, max_offset))
    return confirm_offset


def confirm_alone_is_max(original):
    def compute_confirm_offset(self, max_offset, current, acks, all_ack=True):
        if len(self.local) <= 1:
            return max_offset               # ignores a pending expand
        return original(self, max_offset, current, acks, all_ack)
    return compute_confirm_offset


def reorder(first: str, then: str) -> Make:
    """A slave session whose actions put every ``first`` action before the ``then`` actions (a list
    without a ``then`` action is left as it is: moving ``first`` to its end would break another rule,
    as moving an ``Append`` behind the ``Send`` of its ack does)."""
    def make(original):
        def on_transfer(self, packet, local, now_ms):
            actions = original(self, packet, local, now_ms)
            early = [a for a in actions if type(a).__name__ == first]
            rest = [a for a in actions if type(a).__name__ != first]
            at = next((i for i, a in enumerate(rest) if type(a).__name__ == then), None)
            if not early or at is None:
                return actions
            return rest[:at] + early + rest[at:]
        return on_transfer
    return make


def consistent_point_max(_original):
    def find_consistent_point(local, master):
        by_epoch = {r.epoch: r for r in master}
        for mine in reversed(local):
            theirs = by_epoch.get(mine.epoch)
            if theirs is not None and theirs.start_offset == mine.start_offset:
                return max(mine.end_offset, theirs.end_offset)
        return None
    return find_consistent_point


def flush_without_dir(_original):
    from rocketray.broker import commitlog

    def flush(self):
        files, _dir_dirty = self.take_dirty_files()
        commitlog.sync_files(files, self.disk, None)
    return flush


def header_only(_original):
    from rocketray.wire import message

    def verify_record(buf, pos=0):
        fields = message._check_header(memoryview(buf), pos)
        return fields[0], fields[7]
    return verify_record


def keep_the_last(_original):
    def apply(self, c):
        self._offsets[(c.group, c.topic, c.queue_id)] = c.offset
    return apply


def commit_acked_on_own_write(original):
    from rocketray.wire.message import decode_record
    from rocketray.wire.offset_records import OFFSETS_TOPIC
    from rocketray.broker.role import Role
    from rocketray.ha import ack
    from rocketray.wire.put_result import PutStatus
    from rocketray.ha.ack import refused

    def put(self, batch, reply):
        if decode_record(batch.data)[0].topic != OFFSETS_TOPIC:
            original(self, batch, reply)
            return

        def run():
            if self.ha_role != Role.MASTER or not self.machine.writable:
                reply(refused(PutStatus.NOT_MASTER))
                return
            appended = self.store.put_batch(batch, self.world.now_ms)
            self._update_confirm()
            for key in list(self.sessions):
                self._pump(key)
            reply(ack.after_write(True, True, appended.offsets(), appended.end_offset))
        self.guard(run)
    return put


def fold_whole_log(_original):
    from rocketray.sim.offsets import LogFold

    def offset_table(self):
        key = (self.restarts, self.rewrites)
        fold = self.__dict__.get("_mutant_fold")
        if fold is None or fold.key != key:
            fold = self._mutant_fold = LogFold(key)
        return fold.advance(self.store)
    return offset_table


def unclean_context(original):
    def from_heartbeats(cls, table, now_ms, enable_elect_unclean_master=False):
        return original(table, now_ms, True)
    return from_heartbeats


def read_uncommitted(original):
    def __init__(self, root_dir, config=None, **disk):
        from rocketray.broker.config import StoreConfig
        original(self, root_dir, dataclasses.replace(config or StoreConfig(), read_uncommitted=True), **disk)
    return __init__


def append_unflushed(original):
    from rocketray.broker.config import FlushMode

    def append_raw(self, offset, data):
        config = self.config
        self.config = dataclasses.replace(config, flush_mode=FlushMode.ASYNC)
        try:
            return original(self, offset, data)
        finally:
            self.config = config
    return append_raw


def timeout_not_written(original):
    from rocketray.wire.put_result import PutResult, PutStatus, Written

    def after_write(acked, still_master, offsets, end_offset):
        result = original(acked, still_master, offsets, end_offset)
        if result.status is PutStatus.FLUSH_SLAVE_TIMEOUT:
            return PutResult(PutStatus.FLUSH_SLAVE_TIMEOUT, Written.NO)
        return result
    return after_write


def ack_untruncated_end(original):
    from rocketray.wire.ha_protocol import encode_slave_ack
    from rocketray.ha.session import Send, Truncate

    def on_handshake(self, packet, local, now_ms):
        actions = original(self, packet, local, now_ms)
        if not any(isinstance(a, Truncate) for a in actions):
            return actions
        self.reported_offset = local.max_offset        # the end before the cut
        return [a if not isinstance(a, Send) else Send(encode_slave_ack(local.max_offset)) for a in actions]
    return on_handshake


def write_in_place(_original):
    def write_durably(path, data, tmp_name=None, disk=None):
        f = disk.open(str(path), create=True, truncate=True)    # no temp file, no fsync, no rename
        try:
            f.pwrite(data, 0)
        finally:
            f.close()
    return write_durably


def const(value):
    return lambda _original: (lambda *args, **kwargs: value)


def gate_without(rule: str) -> Make:
    """The put gate (``PutGate.admit``) with one rule left out: ``isr`` admits however few replicas
    are in sync; ``fence`` writes on a master by role that is fenced or mid-switch (the role alone
    decides, as a gate that reads ``role`` instead of ``writable`` does)."""
    from rocketray.broker.role import Role
    from rocketray.ha.put_gate import HELD, WRITE
    from rocketray.wire.put_result import PutStatus

    def make(original):
        def admit(self, ready, batch=None, reply=None, size=0, now_ms=0):
            roles = self.roles
            if rule == "fence":
                if not ready:
                    return PutStatus.FENCED
                if roles.role != Role.MASTER:
                    hold = self.hold
                    if batch is not None and hold is not None and roles.promoting \
                            and hold.hold((batch, reply), size, now_ms):
                        return HELD
                    return PutStatus.NOT_MASTER
                return WRITE if self.replication.put_admitted() else PutStatus.IN_SYNC_REPLICAS_NOT_ENOUGH
            verdict = original(self, ready, batch, reply, size, now_ms)
            return WRITE if verdict is PutStatus.IN_SYNC_REPLICAS_NOT_ENOUGH else verdict
        return admit
    return make


def settle_ignoring_epoch(_original):
    """The ack wait asks only whether this replica is master, not of which epoch."""
    from rocketray.broker.role import Role
    from rocketray.ha import ack

    def settle(self, now_ms, ready=True):
        out = []
        master = ready and self.roles.role == Role.MASTER
        while self.waits:
            wait = self.waits[0]
            acked = master and self.replication.batch_acked(wait.end)
            if not acked and master and now_ms < wait.deadline_ms:
                break
            wait.result = ack.after_write(acked, master, wait.offsets, wait.end)
            out.append(self.waits.popleft())
        return out
    return settle


def timeout_put_ok(original):
    """A wait whose deadline passed is answered PUT_OK (as if acknowledged)."""
    from rocketray.ha import ack

    def settle(self, now_ms, ready=True):
        real = ack.after_write

        def after_write(acked, still_master, offsets, end_offset):
            return real(acked or still_master, still_master, offsets, end_offset)
        ack.after_write = after_write
        try:
            return original(self, now_ms, ready)
        finally:
            ack.after_write = real
    return settle


def release_reversed(_original):
    """Held puts are released newest first."""
    def release(self, ready):
        hold = self.hold
        if hold is None or not len(hold) or self.roles.promoting:
            return []
        return [(item, self.admit(ready)) for item in reversed(hold.release())]
    return release


def release_writes_all(_original):
    """Held puts are all written once the switch ends, whether it made this replica writable or not."""
    from rocketray.ha.put_gate import WRITE

    def release(self, ready):
        hold = self.hold
        if hold is None or not len(hold) or self.roles.promoting:
            return []
        return [(item, WRITE) for item in hold.release()]
    return release
