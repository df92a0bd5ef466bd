"""The put gate and the ack wait (reference 13.4), pure: the one copy the broker actor, a standalone
HA endpoint and the simulator all run.

Theory of operation. A producer's batch passes the *gate* before anything is written and, once
written, *waits* for its acks. Both are decided here, from the facts the caller hands in: the role
machine (``rocketray.broker.role``: fence, role, epoch, a switch under way), the master-side
replication core (``rocketray.ha.master``: in-sync count, acks), whether the replica's HA endpoint
is up, and ``now_ms``. Nothing here does IO, reads a clock or awaits; outputs are data. The shells
(``ha/service.py`` on an event loop, ``sim/broker.py`` in virtual time) write an admitted batch,
arm a timer for the deadline the gate names and deliver the answers it returns.

**The gate**, the first rule that applies decides (``PutGate.admit``):

1. the endpoint is down (no HA service yet, or it is closed) -> FENCED;
2. the role machine is fenced (not RUNNING: not registered, stopped, no master known) -> FENCED;
3. not writable (not master, or a switch is under way): if a switch to master is under way
   (``promoting``) and the caller may hold and the hold has room -> HELD, answered when the switch
   ends; else NOT_MASTER;
4. fewer replicas in sync than ``min_in_sync_replicas`` -> IN_SYNC_REPLICAS_NOT_ENOUGH;
5. WRITE.

A refusal writes nothing (``written`` NO).

**Held puts** (``ha/promotion_hold.py``): kept in arrival order within the hold's bounds. One held
``max_ms`` is refused NOT_MASTER (``expire``). Once no switch to master runs, ``release`` hands them
all back in arrival order, each with the gate's verdict at that moment: WRITE if the replica is now
writable, else a refusal. The shell releases the held puts before it admits a new one, so a put that
arrives after the switch never overtakes one held during it.

**Ack waits**: ``written`` registers a written batch (its end offset, the master epoch it was written
in, its messages' offsets, its deadline ``now_ms + slave_timeout_ms``). ``settle(now_ms)`` returns
the waits now decided, oldest first, each with its ``result`` (``ack.after_write``):

- the replica is no longer master of the epoch the batch was written in (a role change, a new epoch,
  the endpoint closed) -> MASTER_CHANGED, written UNKNOWN (the batch may survive on the next master);
- the batch is acknowledged by the policy -> PUT_OK;
- its deadline passed -> FLUSH_SLAVE_TIMEOUT, written YES (never PUT_OK).

A batch ends after every older one and every wait has the same timeout, so once the oldest wait is
undecided no newer one is: ``settle`` stops there. ``next_deadline_ms`` is when the oldest wait times
out (the shell arms one timer for it, not one per put).
"""

from __future__ import annotations

import collections
from typing import Generic, TypeVar

from rocketray.broker.role import Role, RoleMachine
from rocketray.ha import ack
from rocketray.ha.master import MasterReplication
from rocketray.ha.promotion_hold import PromotionHold
from rocketray.wire.put_result import PutResult, PutStatus

__all__ = ["PutGate", "PutWait", "Verdict", "WRITE", "HELD"]

R = TypeVar("R")
B = TypeVar("B")


class Verdict:
    """What the gate decided that is not a refusal (a refusal is its ``PutStatus``)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


WRITE = Verdict("WRITE")        # write the batch now, then register its wait
HELD = Verdict("HELD")          # kept until the switch to master ends (answered by release or expire)

_NOTHING: tuple = ()


class PutWait(Generic[R]):
    """One written batch waiting for its acks; ``reply`` is the shell's (how it answers the put)."""

    __slots__ = ("end", "epoch", "offsets", "deadline_ms", "reply", "result")

    def __init__(self, end: int, epoch: int, offsets: tuple[tuple[int, int], ...], deadline_ms: int,
                 reply: R) -> None:
        self.end, self.epoch, self.offsets, self.deadline_ms, self.reply = end, epoch, offsets, deadline_ms, reply
        self.result: PutResult | None = None


class PutGate(Generic[B, R]):
    """The gate, the held puts and the ack waits of one replica process (see the module docstring).

    ``roles`` and ``replication`` are read, never changed; ``hold`` None holds nothing (a standalone
    endpoint). ``B`` is the shell's batch, ``R`` how it answers a put (both only kept, never read)."""

    def __init__(self, roles: RoleMachine, replication: MasterReplication, slave_timeout_ms: int,
                 hold: PromotionHold[tuple[B, R]] | None = None) -> None:
        self.roles = roles
        self.replication = replication
        self.slave_timeout_ms = slave_timeout_ms
        self.hold = hold
        self.waits: collections.deque[PutWait[R]] = collections.deque()     # oldest first

    # ------------------------------------------------------------------ the gate
    def admit(self, ready: bool, batch: B | None = None, reply: R | None = None, size: int = 0,
              now_ms: int = 0) -> PutStatus | Verdict:
        """The verdict on a new put: a refusal's status, HELD (``(batch, reply)`` is kept: give
        ``batch`` only where the put may be held) or WRITE. ``ready``: the replica's HA endpoint is
        up; ``size`` and ``now_ms`` count against the hold's bounds."""
        roles = self.roles
        if not ready or roles.fenced:
            return PutStatus.FENCED
        if not roles.writable:
            hold = self.hold
            if batch is not None and hold is not None and roles.promoting \
                    and hold.hold((batch, reply), size, now_ms):  # type: ignore[arg-type]
                return HELD
            return PutStatus.NOT_MASTER
        if not self.replication.put_admitted():
            return PutStatus.IN_SYNC_REPLICAS_NOT_ENOUGH
        return WRITE

    @property
    def held(self) -> int:
        """How many puts are held."""
        return len(self.hold) if self.hold is not None else 0

    def release(self, ready: bool) -> list[tuple[tuple[B, R], PutStatus | Verdict]]:
        """Once no switch to master runs: every held put ``(batch, reply)`` in arrival order, each
        with its verdict now (WRITE or a refusal; never HELD again). Empty while a switch to master
        runs. The shell writes the WRITE ones in this order."""
        hold = self.hold
        if hold is None or not len(hold) or self.roles.promoting:
            return []
        return [(item, self.admit(ready)) for item in hold.release()]

    def expire(self, now_ms: int) -> list[tuple[B, R]]:
        """The held puts whose hold outlasted ``max_ms`` by ``now_ms``, oldest first: refuse each
        NOT_MASTER (nothing was written)."""
        return self.hold.expired(now_ms) if self.hold is not None else []

    def next_hold_expiry_ms(self) -> int | None:
        return self.hold.next_expiry_ms() if self.hold is not None else None

    # ------------------------------------------------------------------ the ack waits
    def written(self, end: int, offsets: tuple[tuple[int, int], ...], now_ms: int, reply: R) -> PutWait[R]:
        """Register a batch written (admitted WRITE) as master of the current epoch, ending at ``end``."""
        wait = PutWait(end, self.roles.master_epoch, offsets, now_ms + self.slave_timeout_ms, reply)
        self.waits.append(wait)
        return wait

    def settle(self, now_ms: int, ready: bool = True) -> list[PutWait[R]] | tuple:
        """The waits decided now, oldest first, removed, each with its ``result`` (see the module
        docstring); call on every input that can decide one: an ack, a confirmed or proposed
        SyncStateSet, a role or epoch change, the endpoint closing, the deadline timer."""
        waits = self.waits
        if not waits:
            return _NOTHING
        roles, replication = self.roles, self.replication
        master = ready and roles.role == Role.MASTER
        epoch = roles.master_epoch
        out: list[PutWait[R]] | tuple = _NOTHING
        while waits:
            wait = waits[0]
            still = master and epoch == wait.epoch
            acked = still and replication.batch_acked(wait.end)
            if not acked and still and now_ms < wait.deadline_ms:
                break
            wait.result = ack.after_write(acked, still, wait.offsets, wait.end)
            waits.popleft()
            if not out:
                out = []
            out.append(wait)      # type: ignore[union-attr]
        return out

    def next_deadline_ms(self) -> int | None:
        """When the oldest waiting put times out (None: nothing waits)."""
        return self.waits[0].deadline_ms if self.waits else None

    def drop(self) -> None:
        """The process ended: its waits and held puts are never answered (clients time out)."""
        self.waits.clear()
        if self.hold is not None:
            self.hold.release()
