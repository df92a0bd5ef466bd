"""The put path of an ``HAService``: what the put gate (``rocketray.ha.put_gate``) admits is written
here, the timers it names are armed here and its answers delivered from here.

Part of ``HAService`` (its base class; the service module's docstring is the theory of operation).
Nothing here decides: refusals, the hold during a promotion, the order of answers and every result
are the gate's. One timer serves the ack waits (armed for the oldest wait's deadline, re-armed when
it fires) and one the held puts (the oldest held put's expiry).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Callable, Sequence

from rocketray.broker.batch import EncodedBatch, TopicRefused, encode_batch
from rocketray.broker.message import Message, MessageCodecError
from rocketray.ha.ack import PutResult, PutStatus, refused
from rocketray.ha.put_gate import HELD, WRITE, PutGate, PutWait

if TYPE_CHECKING:
    from rocketray.broker.store import MessageStore
    from rocketray.ha.transport import MasterConnection

__all__ = ["PutShell", "monotonic_ms"]

log = logging.getLogger("rocketray.ha.service")


class PutShell:
    """Puts (see the module docstring); the attributes below are the service's."""

    broker_id: int
    group: str
    store: MessageStore
    loop: asyncio.AbstractEventLoop | None
    now_ms: Callable[[], int]
    connections: set[MasterConnection]
    gate: PutGate[EncodedBatch, Callable[[PutResult], object]]
    _wait_timer: asyncio.TimerHandle | None
    _hold_timer: asyncio.TimerHandle | None
    _closed: bool

    if TYPE_CHECKING:
        def _update_confirm_offset(self) -> None: ...

    async def put(self, msgs: EncodedBatch | Sequence[Message], now_ms: int) -> PutResult:
        """Append ``msgs`` (a producer's encoded batch, or messages encoded here) as master and wait
        for the replica acks the policy asks for (``put_start``'s result, awaited).

        Refusals (NOT_MASTER, FENCED, IN_SYNC_REPLICAS_NOT_ENOUGH, MESSAGE_ILLEGAL) write nothing;
        after the write the answer is PUT_OK, FLUSH_SLAVE_TIMEOUT (written, not acked in time) or MASTER_CHANGED
        (written, then the role or term changed during the wait: outcome unknown).
        """
        fut: asyncio.Future[PutResult] = asyncio.get_running_loop().create_future()
        refusal = self.put_start(msgs, now_ms, lambda result: fut.done() or fut.set_result(result))
        return refusal if refusal is not None else await fut

    def put_start(self, msgs: EncodedBatch | Sequence[Message], now_ms: int,
                  done: Callable[[PutResult], object], may_hold: bool = False) -> PutResult | None:
        """``put`` without a task: refuse at once (the refusal is returned, nothing written), or
        append now, hand the new bytes to every slave connection at once, and return None;
        ``done(result)`` is then called once, on the loop, from the event that decides it (the
        ack that meets the policy, the timeout, the role change). ``may_hold``: a put that arrives
        while this replica becomes master waits for the switch to end (the gate's hold)."""
        if self.gate.held:
            self.release_held()     # the switch ended: the held puts go first, in their order
        gate = self.gate
        verdict = gate.admit(not self._closed, msgs, done, len(msgs.data), now_ms) \
            if may_hold and isinstance(msgs, EncodedBatch) else gate.admit(not self._closed)
        if verdict is WRITE:
            return self._write(msgs, now_ms, done)
        if verdict is HELD:
            self._arm_hold_timer()
            return None
        assert isinstance(verdict, PutStatus)
        return refused(verdict)

    def _write(self, msgs: EncodedBatch | Sequence[Message], now_ms: int,
               done: Callable[[PutResult], object]) -> PutResult | None:
        """Write a batch the gate admitted and register its ack wait (None), or refuse a batch the
        store refuses (nothing written)."""
        try:
            batch = msgs if isinstance(msgs, EncodedBatch) else encode_batch(msgs)
            appended = self.store.put_batch(batch, now_ms)
        except TopicRefused as exc:     # the sender's ACL: nothing was written
            log.info("ha %s: refused a batch: %s", self.broker_id, exc)
            return refused(PutStatus.ACCESS_DENIED)
        except MessageCodecError as exc:  # MalformedBatch included: nothing was written
            log.warning("ha %s: refused a malformed batch: %s", self.broker_id, exc)
            return refused(PutStatus.MESSAGE_ILLEGAL)
        now = monotonic_ms()
        self.gate.written(appended.end_offset, appended.offsets(), now, done)
        for conn in self.connections:
            conn.send_now()
        self._update_confirm_offset()
        self._notify_ack_waiters(now)
        if self._wait_timer is None and self.gate.waits:
            self._arm_wait_timer()
        return None

    def _notify_ack_waiters(self, now: int | None = None) -> bool:
        """Answer the waiting puts the gate now decides (acks, a role or epoch change, the
        deadline), oldest first; True when none is left waiting."""
        for wait in self.gate.settle(monotonic_ms() if now is None else now, not self._closed):
            _answer(wait)
        return not self.gate.waits

    def _arm_wait_timer(self) -> None:
        deadline = self.gate.next_deadline_ms()
        if deadline is not None:
            loop = self.loop or asyncio.get_running_loop()
            self._wait_timer = loop.call_later(max(0, deadline - monotonic_ms()) / 1000, self._wait_timer_fired)

    def _wait_timer_fired(self) -> None:
        self._wait_timer = None
        self._notify_ack_waiters()
        self._arm_wait_timer()

    def release_held(self) -> None:
        """Once no switch to master runs: answer every held put, in arrival order, as the gate now
        says (written if this replica is writable, else refused). The broker calls it after every
        role input."""
        for (batch, done), verdict in self.gate.release(not self._closed):
            result = self._write(batch, self.now_ms(), done) if verdict is WRITE \
                else refused(verdict)  # type: ignore[arg-type]
            if result is not None:
                _deliver(done, result)

    def _arm_hold_timer(self) -> None:
        expiry = self.gate.next_hold_expiry_ms()
        if self._hold_timer is None and expiry is not None:
            loop = self.loop or asyncio.get_running_loop()
            self._hold_timer = loop.call_later(max(0, expiry - self.now_ms()) / 1000, self._expire_held)

    def _expire_held(self) -> None:
        """A switch that outlasts the hold: refuse the puts held that long (nothing written)."""
        self._hold_timer = None
        expired = self.gate.expire(self.now_ms())
        if expired:
            log.warning("promotion outlasted the put hold: %d put(s) refused NOT_MASTER group=%s broker_id=%s",
                        len(expired), self.group, self.broker_id)
        for _batch, done in expired:
            _deliver(done, refused(PutStatus.NOT_MASTER))
        self._arm_hold_timer()


def monotonic_ms() -> int:
    """The clock of the ack waits' deadlines (the event loop's clock)."""
    return int(time.monotonic() * 1000)


def _deliver(done: Callable[[PutResult], object], result: PutResult) -> None:
    try:
        done(result)
    except Exception:  # noqa: BLE001 - one answer's failure must not stop the others
        log.exception("ha: a put's answer failed")


def _answer(wait: PutWait) -> None:
    assert wait.result is not None
    _deliver(wait.reply, wait.result)
