"""The answer to a put, as it travels from the master through the broker actor to the client.

A put result is typed: ``status`` says what happened, ``written`` whether the batch is in the
master's log (NO / YES / UNKNOWN) and ``retriable`` whether sending it again cannot duplicate it. A
put that wrote its batch and then lost the master role during the ack wait answers MASTER_CHANGED
with ``written=UNKNOWN`` (the new master may or may not have it), never NOT_MASTER. The rules that
choose a result live in ``rocketray.ha.ack``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["PutStatus", "Written", "PutResult"]


class PutStatus(enum.IntEnum):
    PUT_OK = 0
    FLUSH_SLAVE_TIMEOUT = 1
    IN_SYNC_REPLICAS_NOT_ENOUGH = 2
    SLAVE_NOT_AVAILABLE = 3
    NOT_MASTER = 4
    FENCED = 5
    MASTER_CHANGED = 6      # written locally, then the role changed before the acks came
    MESSAGE_ILLEGAL = 7     # a malformed batch (bad record, oversized): nothing written; sending it
                            # again cannot duplicate it, but it will be refused again
    ACCESS_DENIED = 8       # the user may not write a topic of the batch (its ACL): nothing written


class Written(str, enum.Enum):
    NO = "no"               # nothing of the batch is in any log: a retry cannot duplicate
    YES = "yes"             # in the master's log (may still be truncated by a failover)
    UNKNOWN = "unknown"     # may or may not be anywhere (role changed, call lost)


@dataclass(frozen=True, slots=True)
class PutResult:
    """The answer to a put, from the HA service through the broker actor to the client.

    ``offsets``: ``(queue_offset, physical_offset)`` per message when written; ``end_offset``: the
    commit-log end after the batch (-1 when nothing was written)."""

    status: PutStatus
    written: Written
    offsets: tuple[tuple[int, int], ...] = ()
    end_offset: int = -1
    broker_id: int | None = None

    def __post_init__(self) -> None:
        assert (self.status is PutStatus.PUT_OK) <= (self.written is Written.YES), self
        assert (self.written is Written.NO) <= (not self.offsets and self.end_offset < 0), self

    @property
    def ok(self) -> bool:
        """Acknowledged by the policy: the batch survives any legal failover."""
        return self.status is PutStatus.PUT_OK

    @property
    def retriable(self) -> bool:
        """Sending the same batch again cannot store it twice (nothing was written)."""
        return self.written is Written.NO
