"""One batch's way to its broker group's master: attempts, retries, and what the answers mean.

Theory of operation. :func:`send_with_retries` puts one encoded batch until it is acknowledged or
its deadline passes (the earliest deadline of the messages in it: each send has
``send_timeout_ms`` from its ``send``/``send_async`` call, however long it queued). The answers:

- acknowledged (``PUT_OK``) -> the batch's (queue_offset, physical_offset) pairs;
- refused before writing (no master, fenced, not enough in-sync replicas) -> wait on the
  controller's master watch with backoff and try again;
- refused as malformed -> :class:`InvalidMessage` (not resent);
- written but not acknowledged (``FLUSH_SLAVE_TIMEOUT``, the master changed during the wait) ->
  :class:`SendUnknown` at once, never resent (a resend would store a second copy);
- unanswered (timeout, lost connection, the master moved mid call) -> resent: the one case a message
  may be stored twice. Unanswered *and unsent* (no master known, no connection could be made)
  wrote nothing, like a refusal.

When the deadline passes (or the producer closes): :class:`SendUnknown` if any attempt may have written, else
:class:`SendFailed` (nothing was written, sending again is safe).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from rocketray.wire.batch import EncodedBatch
from rocketray.client.errors import AccessDenied, InvalidMessage, SendFailed, SendUnknown
from rocketray.client.metrics import Tally
from rocketray.client.transport import Transport, Unanswered
from rocketray.client.types import SendStatus
from rocketray.wire.put_result import PutResult, PutStatus

__all__ = ["send_with_retries", "BACKOFF_MIN_S", "BACKOFF_MAX_S", "BACKOFF_AFTER_ELECTION_S", "PROMOTION_WINDOW_S"]

BACKOFF_MIN_S = 0.02
BACKOFF_MAX_S = 1.0
#: The first wait after a watch named a new master: that master refuses (NOT_MASTER) only for the
#: moment it takes its role (its notification trails the watch: a role switch of 8-35 ms measured
#: on 2 cores), so it is asked again soon, then at doubling waits up to the usual backoff.
BACKOFF_AFTER_ELECTION_S = 0.002
#: For this long after a watch (or a lookup) named a new master, its NOT_MASTER refusals mean it is
#: still taking its role (or its notification has not reached it yet): it is asked again after
#: BACKOFF_AFTER_ELECTION_S each time, without doubling and without looking the master up again.
#: The replica holds a put that arrives during its switch and answers it when the switch ends
#: (``ha/put_gate.py``), so that second attempt is usually the one answered.
PROMOTION_WINDOW_S = 0.2

Attempt = Callable[[], Any]


def send_with_retries(transport: Transport, group: str, encoded: EncodedBatch, first: Attempt | BaseException | None,
                      request_timeout_s: float, deadline: float, tally: Tally,
                      abort: threading.Event) -> tuple[tuple[int, int], ...]:
    """Put one batch (messages of ``group``'s queues) until acknowledged or ``deadline`` (monotonic
    s); returns its (queue_offset, physical_offset) pairs in batch order (module docstring).
    ``first``: the first attempt, already sent (or the error starting it raised). ``abort`` set
    (the producer closed) ends the retries as the deadline does."""
    if isinstance(first, BaseException):
        raise first
    backoff_s, maybe_written, last = BACKOFF_MIN_S, False, "no attempt before the send timeout"
    elected_at = -PROMOTION_WINDOW_S     # when a watch last named a new master (monotonic s)
    # ... or a lookup did (a transport that knows: the master an attempt found may be one the
    # controller just elected, whose notification has not reached it yet)
    named_at = transport.named_at
    attempts = 0
    while (left := deadline - time.monotonic()) > 0 and not abort.is_set():
        if attempts:
            tally.add("retries")
        attempts += 1
        tally.add("puts")
        reply = first() if first is not None else transport.put(group, encoded, min(request_timeout_s, left))
        first = None
        promoting = False
        if isinstance(reply, PutResult):
            if reply.ok:
                if len(reply.offsets) != encoded.count:   # a broker answer that does not match the batch
                    raise SendUnknown(f"{group} acknowledged {len(reply.offsets)} offsets for "
                                      f"{encoded.count} messages", "")
                return reply.offsets
            last = reply.status.name
            if reply.status is PutStatus.MESSAGE_ILLEGAL:
                raise InvalidMessage(f"the broker refused the batch as malformed or oversized ({last})")
            if reply.status is PutStatus.ACCESS_DENIED:
                raise AccessDenied(f"{group} refused the batch: the user may not Pub to its topic (ACCESS_DENIED)",
                                   action="Pub")
            if not reply.retriable:
                status = SendStatus.FLUSH_SLAVE_TIMEOUT if reply.status is PutStatus.FLUSH_SLAVE_TIMEOUT else None
                raise SendUnknown(f"written to {group} but not acknowledged ({last}); not resent", "", status)
            promoting = (reply.status is PutStatus.NOT_MASTER
                         and time.monotonic() - max(elected_at, named_at(group)) < PROMOTION_WINDOW_S)
        else:
            assert isinstance(reply, Unanswered), reply
            maybe_written, last = maybe_written or not reply.unsent, reply.error
            if reply.master_moved:
                continue  # the watch named the new master: send there at once
        if promoting:
            backoff_s = BACKOFF_AFTER_ELECTION_S
        else:
            transport.forget_master(group)
        if transport.await_new_master(group, min(backoff_s, max(0.0, deadline - time.monotonic()))):
            # an election ends the wait and the backoff: the new master may refuse for the moment it
            # takes its role (its notification trails the watch), so the next wait is the shortest,
            # not the doubled wait of the outage before, nor a whole BACKOFF_MIN_S
            backoff_s, elected_at = BACKOFF_AFTER_ELECTION_S, time.monotonic()
        elif not promoting:
            backoff_s = min(backoff_s * 2, BACKOFF_MAX_S)
    if maybe_written:
        raise SendUnknown(f"no answer from {group}'s master before the send timeout ({last})", "")
    raise SendFailed(f"every attempt to send to {group} was refused before writing ({last})")
