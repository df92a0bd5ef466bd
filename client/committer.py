"""Committing offsets: each broker group's entries as one replicated record, every group at once.

Theory of operation. A commit of many queues is split by the broker group that holds each queue;
each group's entries go to that group's master as one commit (a record replicated like a message,
acknowledged when every in-sync replica has it). The groups are committed concurrently, each
retrying refusals and unanswered calls (commits are idempotent: the brokers keep each queue's
highest offset) until the shared deadline, so one slow or leaderless broker group never keeps the
others from being acknowledged. A commit the broker refuses as invalid (an offset past the queue's
end) is not retried. The admin's reset goes the same way with ``reset=True``: reset records, which
the brokers apply as an assignment (``rocketray.broker.offsets``), idempotent as well.
"""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass, field
from typing import Mapping

from rocketray.client.errors import AccessDenied, CommitFailed
from rocketray.client.transport import Transport, Unanswered
from rocketray.client.types import TopicQueue
from rocketray.wire.put_result import PutResult, PutStatus

__all__ = ["CommitOutcome", "commit_offsets", "BACKOFF_MIN_S", "BACKOFF_MAX_S"]

BACKOFF_MIN_S = 0.02
BACKOFF_MAX_S = 1.0


@dataclass(frozen=True, slots=True)
class CommitOutcome:
    """What one commit achieved: per queue acknowledged or not, the broker groups that refused it as
    invalid, and those whose ACL denied it (the user may not Sub as the consumer group or its topic)."""

    done: Mapping[TopicQueue, int] = field(default_factory=dict)
    failed: Mapping[TopicQueue, int] = field(default_factory=dict)
    failed_groups: tuple[str, ...] = ()
    refused_groups: tuple[str, ...] = ()
    denied_groups: tuple[str, ...] = ()

    def error(self, consumer_group: str) -> AccessDenied | CommitFailed:
        """What a commit that left queues ``failed`` raises: AccessDenied when the ACL denied it, else
        CommitFailed (not retriable when a broker refused an offset as invalid)."""
        assert self.failed
        if self.denied_groups:
            return AccessDenied(f"{', '.join(self.denied_groups)} denied the commit of group {consumer_group!r}: "
                                f"the user may not Sub as it or to a topic committed",
                                resource=f"Group:{consumer_group}", action="Sub")
        if self.refused_groups:
            return CommitFailed(f"{', '.join(self.refused_groups)} refused the commit of group {consumer_group!r} "
                                f"as invalid (an offset past its queue's end?)", retriable=False,
                                committed=self.done, failed=self.failed)
        return CommitFailed(f"offsets of group {consumer_group!r} on {', '.join(self.failed_groups)} not "
                            f"acknowledged before the timeout; commit again", committed=self.done, failed=self.failed)


def commit_offsets(transport: Transport, consumer_group: str, by_group: Mapping[str, Mapping[TopicQueue, int]],
                   deadline: float, request_timeout_s: float,
                   pool: concurrent.futures.Executor | None, reset: bool = False) -> CommitOutcome:
    """Commit ``{broker_group: {queue: offset}}`` until each group acknowledged or ``deadline``
    (monotonic s); groups run concurrently on ``pool`` (None, or a single group: this thread).
    ``reset``: write reset records (the admin's reset of a stopped group) instead of commits."""
    groups = sorted(by_group)
    if pool is None or len(groups) <= 1:
        verdicts = [_commit_group(transport, consumer_group, g, by_group[g], deadline, request_timeout_s, reset)
                    for g in groups]
    else:
        futures = [pool.submit(_commit_group, transport, consumer_group, g, by_group[g], deadline, request_timeout_s,
                               reset) for g in groups]
        verdicts = [f.result() for f in futures]
    done: dict[TopicQueue, int] = {}
    failed: dict[TopicQueue, int] = {}
    failed_groups, refused_groups, denied_groups = [], [], []
    for group, verdict in zip(groups, verdicts):
        (done if verdict == "ok" else failed).update(by_group[group])
        if verdict == "refused":
            refused_groups.append(group)
        elif verdict == "denied":
            denied_groups.append(group)
        elif verdict != "ok":
            failed_groups.append(group)
    return CommitOutcome(done, failed, tuple(failed_groups), tuple(refused_groups), tuple(denied_groups))


def _commit_group(transport: Transport, consumer_group: str, broker_group: str, offsets: Mapping[TopicQueue, int],
                  deadline: float, request_timeout_s: float, reset: bool = False) -> str:
    """'ok', 'refused' (invalid: not retried), 'denied' (the ACL: not retried) or 'timeout' for one
    broker group's entries."""
    entries = [(q.topic, q.queue_id, o) for q, o in sorted(offsets.items())]
    backoff_s = BACKOFF_MIN_S
    while (left := deadline - time.monotonic()) > 0:
        reply = transport.commit(broker_group, consumer_group, entries, min(left, request_timeout_s), reset)
        if isinstance(reply, PutResult) and reply.ok:
            return "ok"
        if isinstance(reply, PutResult) and reply.status is PutStatus.MESSAGE_ILLEGAL:
            return "refused"
        if isinstance(reply, PutResult) and reply.status is PutStatus.ACCESS_DENIED:
            return "denied"
        if not (isinstance(reply, Unanswered) and reply.master_moved):
            transport.forget_master(broker_group)
            if not transport.await_new_master(broker_group, min(backoff_s, max(0.0, deadline - time.monotonic()))):
                backoff_s = min(backoff_s * 2, BACKOFF_MAX_S)
    return "timeout"
