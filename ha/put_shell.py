"""The put shell: the IO around the put gate (``rocketray.ha.put_gate``), one copy that the broker's
HA service (``ha/service.py``, on its event loop) and the simulated broker (``sim/broker.py``, in
virtual time) both run.

Theory of operation. Nothing here decides: refusals, the hold during a promotion, the order of the
answers and every result are the gate's. The shell writes what the gate admits, arms the timers the
gate names and delivers the answers the gate returns, through three ports (typing Protocols below):

- ``Timers``: the clock of the deadlines and of the hold (``now_ms``: monotonic) and one-shot
  timers at an absolute time on that clock (``call_at``, ``cancel``). The broker's are the event
  loop's (``ha/service.py`` ``LoopTimers``), the simulator's the world's (``sim/broker_master.py``);
- ``ReplicaPort``: the replica around the shell: whether its HA endpoint is up, and what follows an
  append (the new bytes handed to every slave connection now, the confirm offset moved);
- the store: the real ``MessageStore`` (over real files, or over the simulated disk); its
  timestamps come from the replica's wall clock (``wall_ms``).

The rules the shell keeps (each broken by a mutant of ``sim/mutants.py``):

1. a refusal is answered at once and writes nothing; an admitted put is written, then registered
   as a wait, and answered only from ``settle`` (the acks, a role or epoch change, the deadline),
   never from its own write;
2. the held puts go before any new put: ``put_start`` releases them first once the switch ended,
   and the replica calls ``release_held`` after every role input; each is written only if the gate's
   verdict at its release is WRITE, else refused with that verdict;
3. one timer serves the ack waits: armed for the oldest wait's deadline whenever a wait exists and
   none is armed, and armed again for the new oldest one each time it fires;
4. one timer serves the held puts: armed for the oldest held put's expiry, armed again each time it
   fires; an expired held put is refused NOT_MASTER (nothing written);
5. one answer's failure never stops the others.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from rocketray.wire.batch import EncodedBatch, TopicRefused, encode_batch
from rocketray.wire.message import Message, MessageCodecError
from rocketray.wire.put_result import PutResult, PutStatus
from rocketray.ha.ack import refused
from rocketray.ha.put_gate import HELD, WRITE, PutGate, PutWait

if TYPE_CHECKING:
    from rocketray.broker.store import MessageStore

__all__ = ["PutShell", "Reply", "ReplicaPort", "Timer", "Timers"]

log = logging.getLogger("rocketray.ha.service")

#: How the shell answers a put (called once, with the put's result).
Reply = Callable[[PutResult], object]


class Timer(Protocol):
    """An armed timer."""

    def cancel(self) -> None:
        """It does not fire (a no-op once it fired)."""


class Timers(Protocol):
    """The clock and timers of the put shell (see the module docstring)."""

    def now_ms(self) -> int:
        """Now on the clock of the deadlines and of the hold (monotonic, ms)."""

    def call_at(self, at_ms: int, fn: Callable[[], object]) -> Timer:
        """Call ``fn()`` once, at ``at_ms`` on ``now_ms``'s clock or at once after it if that passed."""


class ReplicaPort(Protocol):
    """What the put shell needs of the replica it writes for (see the module docstring)."""

    def endpoint_up(self) -> bool:
        """The replica's HA endpoint is up (not closed, the process alive)."""

    def appended(self) -> None:
        """Bytes were just appended as master: hand them to every slave connection now and move
        the confirm offset (its listeners run before the puts it decides are answered)."""


class PutShell:
    """Puts of one replica process (see the module docstring). ``wall_ms``: the clock of the
    store's timestamps; ``label``: how the logs name the replica."""

    def __init__(self, gate: PutGate[EncodedBatch, Reply], store: MessageStore, timers: Timers,
                 replica: ReplicaPort, wall_ms: Callable[[], int], label: str = "") -> None:
        self.gate = gate
        self.store = store
        self.timers = timers
        self.replica = replica
        self.wall_ms = wall_ms
        self.label = label
        self._wait_timer: Timer | None = None
        self._hold_timer: Timer | None = None

    def put_start(self, msgs: EncodedBatch | Sequence[Message], now_ms: int, done: Reply,
                  may_hold: bool = False) -> PutResult | None:
        """Refuse at once (the refusal is returned, nothing written), or append now, hand the new
        bytes to every slave connection at once, and return None; ``done(result)`` is then called
        once, from the event that decides it (the ack that meets the policy, the timeout, the role
        change). ``now_ms``: the put's wall-clock time (the store's timestamp). ``may_hold``: a put
        that arrives while this replica becomes master waits for the switch to end (the gate's hold)."""
        gate = self.gate
        if gate.held:
            self.release_held()     # the switch ended: the held puts go first, in their order
        up = self.replica.endpoint_up()
        verdict = gate.admit(up, msgs, done, len(msgs.data), self.timers.now_ms()) \
            if may_hold and isinstance(msgs, EncodedBatch) else gate.admit(up)
        if verdict is WRITE:
            return self._write(msgs, now_ms, done)
        if verdict is HELD:
            self._arm_hold_timer()
            return None
        assert isinstance(verdict, PutStatus)
        return refused(verdict)

    def _write(self, msgs: EncodedBatch | Sequence[Message], now_ms: int, done: Reply) -> PutResult | None:
        """Write a batch the gate admitted and register its ack wait (None), or refuse a batch the
        store refuses (nothing written)."""
        try:
            batch = msgs if isinstance(msgs, EncodedBatch) else encode_batch(msgs)
            appended = self.store.put_batch(batch, now_ms)
        except TopicRefused as exc:     # the sender's ACL: nothing was written
            log.info("ha %s: refused a batch: %s", self.label, exc)
            return refused(PutStatus.ACCESS_DENIED)
        except MessageCodecError as exc:  # MalformedBatch included: nothing was written
            log.warning("ha %s: refused a malformed batch: %s", self.label, exc)
            return refused(PutStatus.MESSAGE_ILLEGAL)
        now = self.timers.now_ms()
        self.gate.written(appended.end_offset, appended.offsets(), now, done)
        self.replica.appended()
        self.settle(now)
        if self._wait_timer is None and self.gate.waits:
            self._arm_wait_timer()
        return None

    def settle(self, now: int | None = None) -> bool:
        """Answer the waiting puts the gate now decides (acks, a role or epoch change, the endpoint
        closing, the deadline), oldest first; True when none is left waiting. The replica calls it
        on every input that can decide one."""
        for wait in self.gate.settle(self.timers.now_ms() if now is None else now, self.replica.endpoint_up()):
            _answer(wait)
        return not self.gate.waits

    def _arm_wait_timer(self) -> None:
        deadline = self.gate.next_deadline_ms()
        if deadline is not None:
            self._wait_timer = self.timers.call_at(deadline, self._wait_timer_fired)

    def _wait_timer_fired(self) -> None:
        self._wait_timer = None
        self.settle()
        self._arm_wait_timer()

    def release_held(self) -> None:
        """Once no switch to master runs: answer every held put, in arrival order, as the gate now
        says (written if this replica is writable, else refused). The replica calls it after every
        role input."""
        for (batch, done), verdict in self.gate.release(self.replica.endpoint_up()):
            result = self._write(batch, self.wall_ms(), done) if verdict is WRITE \
                else refused(verdict)  # type: ignore[arg-type]
            if result is not None:
                _deliver(done, result)

    def _arm_hold_timer(self) -> None:
        expiry = self.gate.next_hold_expiry_ms()
        if self._hold_timer is None and expiry is not None:
            self._hold_timer = self.timers.call_at(expiry, self._expire_held)

    def _expire_held(self) -> None:
        """A switch that outlasts the hold: refuse the puts held that long (nothing written)."""
        self._hold_timer = None
        expired = self.gate.expire(self.timers.now_ms())
        if expired:
            log.warning("promotion outlasted the put hold: %d put(s) refused NOT_MASTER %s",
                        len(expired), self.label)
        for _batch, done in expired:
            _deliver(done, refused(PutStatus.NOT_MASTER))
        self._arm_hold_timer()

    def cancel_timers(self) -> None:
        """The replica closed: no timer of this shell fires any more."""
        for timer in (self._wait_timer, self._hold_timer):
            if timer is not None:
                timer.cancel()
        self._wait_timer = self._hold_timer = None


def _deliver(done: Reply, result: PutResult) -> None:
    try:
        done(result)
    except Exception:  # noqa: BLE001 - one answer's failure must not stop the others
        log.exception("ha: a put's answer failed")


def _answer(wait: PutWait[Reply]) -> None:
    assert wait.result is not None
    _deliver(wait.reply, wait.result)
