"""The HA rules issue 15 replaced, kept as functions so a test can monkeypatch one back and show
that a core test or a simulator scenario catches it (never a flag in the product).

- fix 1: ``monkeypatch.setattr(SyncStateTracker, "compute_confirm_offset", old_compute_confirm_offset)``
- fix 2: ``monkeypatch.setattr(SyncStateTracker, "maybe_shrink", old_maybe_shrink)``
- fix 4: ``monkeypatch.setattr(rocketray.ha.service, "after_write", old_after_write)`` (and/or
  ``rocketray.ha.ack.after_write`` for code that calls it through the module)
"""

from __future__ import annotations

from rocketray.wire.put_result import PutResult, PutStatus, Written


def old_compute_confirm_offset(self, max_offset, current_confirm_offset, acks, all_ack=True):
    """Old: a confirmed set of one confirms the master's max even while an expand is pending
    (the check lived in HAService.compute_confirm_offset), and a never-backwards floor keeps the
    confirm offset above what the members hold."""
    if not all_ack or len(self.local) <= 1:
        return max_offset
    floor = min(max(current_confirm_offset, 0), max_offset)
    result = max_offset
    for member in self.sync_state_set():
        if member == self.local_broker_id:
            continue
        ack = acks.get(member, -1)
        if ack < 0:
            return floor
        result = min(result, ack)
    return max(result, floor)


def old_maybe_shrink(self, now_ms):
    """Old: the candidate is built from the confirmed set only and overwrites a pending proposal."""
    candidate = set(self.local)
    for slave_id in list(candidate):
        if slave_id == self.local_broker_id:
            continue
        seen = self.caught_up_ms.get(slave_id)
        if seen is None or now_ms - seen > self.max_time_slave_not_catchup_ms:
            candidate.discard(slave_id)
    candidate.add(self.local_broker_id)
    result = frozenset(candidate)
    if result != self.local:
        self.pending = (result,)
    return result


def old_after_write(acked, still_master, offsets, end_offset):
    """Old: a role change during the ack wait answers NOT_MASTER, i.e. "nothing written"."""
    if acked:
        return PutResult(PutStatus.PUT_OK, Written.YES, offsets, end_offset)
    if not still_master:
        return PutResult(PutStatus.NOT_MASTER, Written.NO)
    return PutResult(PutStatus.FLUSH_SLAVE_TIMEOUT, Written.YES, offsets, end_offset)
