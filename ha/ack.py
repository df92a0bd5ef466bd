"""The master's ack policy and confirm offset, pure (reference 13.2, 13.4), on the union view.

Theory of operation. The controller owns the SyncStateSet; the master knows the set the controller
last *confirmed* and the proposals it sent that the controller has not answered yet. Until the
controller answers, it may hold either, so every rule that decides "is this committed?" decides on
the **union view** = confirmed set | every pending proposal (apache/rocketmq#5663): a joining member
must already ack, a leaving member still counts.

Confirm offset (what consumers may read; the slaves serve up to it too), with
``all_ack_in_sync_state_set`` on: the minimum of the master's max offset and the ack of every
other member of the union view. A member whose ack is unknown (not connected, or not acked yet on
this connection) freezes the confirm offset at its current value, capped by every known ack, so
the confirm offset never covers bytes a member of the union view may not hold -- even if that
means moving it back (a floor that keeps it up would count bytes a joining member lacks). With the
master alone in the union view everything written is confirmed. With ``all_ack_in_sync_state_set``
off the confirm offset is the max offset (upstream's quorum mode: consumers may read what a
failover can truncate; documented in docs/ha.md).

Ack policy (13.4): a put is admitted only if the in-sync count reaches ``min_in_sync_replicas``;
after writing it waits until every union member other than the master acked its end (all-ack), or
until ``in_sync_replicas`` replicas counting the master did (quorum), within ``slave_timeout_ms``.

Put results (``PutResult``, ``PutStatus``, ``Written``) are the format in ``rocketray.wire.put_result``;
``refused`` and ``after_write`` choose one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from rocketray.wire.put_result import PutResult, PutStatus, Written

__all__ = ["AckPolicy", "union_view", "confirm_offset", "put_admitted", "batch_acked", "refused", "after_write"]


def refused(status: PutStatus) -> PutResult:
    """A put refused before anything was written."""
    assert status in (PutStatus.NOT_MASTER, PutStatus.FENCED, PutStatus.SLAVE_NOT_AVAILABLE,
                      PutStatus.IN_SYNC_REPLICAS_NOT_ENOUGH, PutStatus.MESSAGE_ILLEGAL,
                      PutStatus.ACCESS_DENIED), status
    return PutResult(status, Written.NO)


def after_write(acked: bool, still_master: bool, offsets: tuple[tuple[int, int], ...],
                end_offset: int) -> PutResult:
    """The result of a put whose batch was written: acked -> PUT_OK; the role changed during the
    wait -> MASTER_CHANGED (written UNKNOWN); else FLUSH_SLAVE_TIMEOUT (written YES)."""
    if acked:
        return PutResult(PutStatus.PUT_OK, Written.YES, offsets, end_offset)
    if not still_master:
        return PutResult(PutStatus.MASTER_CHANGED, Written.UNKNOWN, offsets, end_offset)
    return PutResult(PutStatus.FLUSH_SLAVE_TIMEOUT, Written.YES, offsets, end_offset)


@dataclass(frozen=True, slots=True)
class AckPolicy:
    """The HA keys of reference section 8 that decide acks (``HAConfig`` carries them)."""

    all_ack_in_sync_state_set: bool = True
    in_sync_replicas: int = 1
    min_in_sync_replicas: int = 1

    @classmethod
    def from_config(cls, cfg) -> "AckPolicy":
        return cls(cfg.all_ack_in_sync_state_set, cfg.in_sync_replicas, cfg.min_in_sync_replicas)


def union_view(confirmed: Iterable[int], pending: Iterable[Iterable[int]] = ()) -> frozenset[int]:
    """The confirmed set together with every proposal the controller has not answered."""
    out = frozenset(confirmed)
    for proposal in pending:
        out |= frozenset(proposal)
    return out


def confirm_offset(self_id: int, members: frozenset[int], max_offset: int, current: int,
                   acks: Mapping[int, int], all_ack: bool = True) -> int:
    """The master's confirm offset over the union view ``members`` (see the module docstring).

    ``acks`` maps each *connected* slave to its last ack on that connection (-1: none yet);
    ``current`` is the confirm offset now (the value a frozen rule keeps)."""
    assert max_offset >= 0
    if not all_ack:
        return max_offset
    result = max_offset
    frozen = False
    for member in members:
        if member == self_id:
            continue
        ack = acks.get(member, -1)
        if ack < 0:
            frozen = True
        else:
            result = min(result, ack)
    if frozen:
        result = min(result, max(current, 0))
    return result


def put_admitted(policy: AckPolicy, in_sync_replicas_nums: int) -> bool:
    """13.4: refuse before writing when too few replicas are in sync."""
    return in_sync_replicas_nums >= policy.min_in_sync_replicas


def batch_acked(policy: AckPolicy, self_id: int, members: frozenset[int],
                acks: Mapping[int, int], end: int) -> bool:
    """Whether the batch ending at ``end`` is acknowledged by the policy (the master holds it)."""
    if policy.all_ack_in_sync_state_set:
        return all(acks.get(m, -1) >= end for m in members if m != self_id)
    if policy.in_sync_replicas <= 1:
        return True
    return 1 + sum(1 for m, a in acks.items() if m != self_id and a >= end) \
        >= policy.in_sync_replicas
