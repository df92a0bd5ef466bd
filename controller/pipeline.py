"""The ready leader's write pipeline: many requests in flight, each decided on what precedes it.

Theory of operation. ``ControllerNode.handle`` decides a request under its pipeline lock, hands the
payload to Raft and releases the lock *before* the entry commits; it answers once the entry is
committed and applied on the leader. So that the next request still decides on a state that
contains its predecessor, decisions are taken on a ``Speculation``: the applied state plus the
events of every proposal still in flight, in proposal order. Concurrent writers then share Raft
round trips and fsyncs (group commit) instead of waiting one commit each.

Why an answer is never wrong. A proposal P decided in term T on a speculation that contains an
earlier proposal A (also term T, this leader) can only take effect if A did:

* pysyncobj takes commands from its queue in order, on the tick thread. While this node leads T,
  A is appended before P; once it no longer leads T, neither is appended in T (they are forwarded
  to, or appended by, a leader of a later term and fenced at apply because their decided term is
  not the entry's term, see ``controller/raft.py``). A node leads a term at most once.
* If P's entry (index j, term T) commits, every entry before it in the leader's log of term T
  commits with it (Raft's log matching), A's included.
* A command refused synchronously (pysyncobj's queue full) fails inside ``propose``, under the
  pipeline lock, before anyone decides on it: the speculation is dropped at once.

An answer is given only after its own entry (or, for a read or an event-less write, a barrier
entry behind everything it saw) committed and applied here, so it reflects only committed
state: the history stays linearizable. When any proposal fails or times out (outcome unknown),
when an entry this pipeline did not propose changes the applied state (a test injecting raw
entries, a bug) or when applying to the speculation raises, the speculation is invalid: the next
request commits a barrier first (every earlier entry is then resolved) and the speculation is
rebuilt from the applied state.

Threading: ``Speculation`` is read and changed under the node's pipeline lock, except
``applied``, which the tick thread calls for every applied entry (a deque append/popleft pair
and attribute writes, safe under the GIL).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import fields
from typing import Any

from rocketray.controller.events import Event
from rocketray.controller.state import ControllerState

log = logging.getLogger(__name__)

__all__ = ["Proposal", "Speculation", "copy_state"]

_MUTABLE = (dict, set, list)
_ROW_FIELDS: dict[type, tuple[str, ...]] = {}


def _copy_row(row: Any) -> Any:
    names = _ROW_FIELDS.get(type(row))
    if names is None:
        names = _ROW_FIELDS[type(row)] = tuple(f.name for f in fields(row))
    return type(row)(*[type(v)(v) if isinstance(v, _MUTABLE) else v for v in (getattr(row, n) for n in names)])


def copy_state(state: ControllerState) -> ControllerState:
    """A copy that no ``apply`` on it can make the original see: each row rebuilt from its fields,
    its dicts and sets copied (their contents are ints, strings and tuples). ``copy.deepcopy``
    took 0.8 s for 2000 groups on the busy VM, this 50 ms; it runs when a leader becomes ready."""
    out = ControllerState()
    out.replica_info = {name: _copy_row(row) for name, row in state.replica_info.items()}
    out.sync_state = {name: _copy_row(row) for name, row in state.sync_state.items()}
    out.topics = dict(state.topics)
    out.auth = state.auth  # immutable (AuthTable): shared, never changed in place
    return out


class Proposal:
    """One payload handed to Raft; pysyncobj calls it back (tick thread) with ``(result, error)``."""

    __slots__ = ("_done", "result", "error")

    def __init__(self) -> None:
        self._done = threading.Event()
        self.result: Any = None
        self.error: Any = None

    def __call__(self, result: Any, error: Any) -> None:
        self.result, self.error = result, error
        self._done.set()

    def wait(self, timeout_s: float) -> bool:
        """True once the outcome is known (within ``timeout_s``)."""
        return self._done.wait(timeout_s)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def ok(self) -> bool:
        """Committed and applied by this node in the term it was decided in."""
        return self.error == 0 and self.result is True


class Speculation:
    """The applied state plus the events of this leader's proposals in flight (module docstring)."""

    def __init__(self) -> None:
        self.state: ControllerState | None = None
        self.term: int | None = None
        self.last: Proposal | None = None           # the newest proposal that carried events
        self._inflight: deque[bytes] = deque()      # their payloads, oldest first
        self.rebuilds = 0
        self.invalidations = 0

    def valid_for(self, term: int) -> bool:
        return self.term == term and self.state is not None

    def reset(self, term: int, applied: ControllerState) -> None:
        """Start from a copy of the applied state (pipeline lock held, nothing in flight: the
        caller's barrier committed behind every earlier proposal)."""
        self.state = copy_state(applied)
        self.term = term
        self.last = None
        self._inflight.clear()
        self.rebuilds += 1

    def invalidate(self, why: str) -> None:
        if self.term is not None:
            self.invalidations += 1
            log.info("speculative state dropped (%s); the next request re-barriers", why)
        self.term = None

    def add(self, events: list[Event], payload: bytes) -> None:
        """Apply a decided batch to the speculation and expect its payload back from the log. A
        batch whose apply raises will fail the same way on every replica (rolled back there): the
        speculation, now partly changed, is dropped."""
        assert self.state is not None
        self._inflight.append(payload)
        try:
            for event in events:
                self.state.apply(event)
        except Exception:
            log.exception("applying a decided batch to the speculative state failed")
            self.invalidate("apply raised")

    def applied(self, payload: bytes, changed_state: bool) -> None:
        """Tick thread: an entry was applied. Ours are expected in order; anything else that
        changed the state makes the speculation stale."""
        inflight = self._inflight
        if inflight and inflight[0] == payload:
            inflight.popleft()
        elif changed_state:
            self.invalidate("an entry this pipeline did not propose changed the state")

    @property
    def in_flight(self) -> int:
        return len(self._inflight)
