"""The simulated world's clock and scheduler: one seed, one thread, virtual time.

Theory of operation. Everything that happens in a simulated run is an event in one priority queue
ordered by (virtual time, sequence number); ``World.run`` pops them in order, advances ``now_ms``
and calls them. One ``random.Random(seed)`` makes every choice, so a seed replays exactly. Timers
belong to a *generation* of their owner: a crashed node bumps its generation and every timer it
scheduled before the crash is dropped when it comes due. The last events are kept in a bounded
trace, printed when an invariant fails. ``current`` is the event being run (or just run): its
``owner``, or its ``scope`` when it has none (a request arriving at its server, a broker's restart),
says whose state it may change, so the invariants check only that group after it
(``Invariants.check_step``); an event with neither (the nemesis, a script) may change anything.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from dataclasses import dataclass
from typing import Callable

__all__ = ["World", "Violation"]


class Violation(AssertionError):
    """An invariant of the simulated system does not hold (the message names it)."""

    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"{invariant}: {detail}")
        self.invariant = invariant
        self.detail = detail


@dataclass(slots=True)
class _Event:
    fn: Callable[[], None]
    owner: object
    generation: int
    what: str
    scope: object = None     # whose state it changes when that is not its owner's (None: the owner's)

    @property
    def actor(self) -> object:
        """The object whose state this event may change (None: anything)."""
        return self.owner if self.scope is None else self.scope


class World:
    """Virtual time, the seeded random source, the event queue and the trace."""

    def __init__(self, seed: int, trace_len: int = 60) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now_ms = 0
        self.steps = 0
        self._queue: list[tuple[int, int, _Event]] = []   # (virtual ms, sequence, event)
        self._seq = 0
        self._generations: dict[int, int] = {}
        self.trace: deque[str] = deque(maxlen=trace_len)
        self.current: _Event | None = None

    # -- owners and generations (a crash invalidates an owner's pending timers) -------------------
    def generation(self, owner: object) -> int:
        return self._generations.get(id(owner), 0)

    def bump(self, owner: object) -> None:
        self._generations[id(owner)] = self.generation(owner) + 1

    # -- scheduling -----------------------------------------------------------------------------
    def at(self, delay_ms: int, fn: Callable[[], None], owner: object = None, what: str = "",
           scope: object = None) -> None:
        """Run ``fn`` ``delay_ms`` from now (unless ``owner`` crashed in between). ``scope``: whose
        state ``fn`` changes, for an event without an owner (see the module docstring)."""
        assert delay_ms >= 0, delay_ms
        self._seq += 1
        generation = self._generations.get(id(owner), 0) if owner is not None else 0
        heapq.heappush(self._queue, (self.now_ms + int(delay_ms), self._seq,
                                     _Event(fn, owner, generation, what, scope)))

    def note(self, text: str) -> None:
        self.trace.append(f"{self.now_ms:>8} {text}")

    def run(self, until_ms: int, after_step: Callable[[], None] | None = None) -> None:
        """Process events up to ``until_ms``; ``after_step`` (the invariant checks) after each."""
        queue, generations, pop = self._queue, self._generations, heapq.heappop
        while queue and queue[0][0] <= until_ms:
            at_ms, _seq, ev = pop(queue)
            owner = ev.owner
            if owner is not None and ev.generation != generations.get(id(owner), 0):
                continue
            self.now_ms = at_ms
            self.steps += 1
            if ev.what:
                self.trace.append(f"{at_ms:>8} {ev.what}")
            self.current = ev
            ev.fn()
            if after_step is not None:
                after_step()
        self.now_ms = max(self.now_ms, until_ms)
