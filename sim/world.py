"""The simulated world's clock and scheduler: one seed, one thread, virtual time.

Theory of operation. Everything that happens in a simulated run is an event in one priority queue
ordered by (virtual time, sequence number); ``World.run`` pops them in order, advances ``now_ms``
and calls them. One ``random.Random(seed)`` makes every choice, so a seed replays exactly. Timers
belong to a *generation* of their owner: a crashed node bumps its generation and every timer it
scheduled before the crash is dropped when it comes due. The last events are kept in a bounded
trace, printed when an invariant fails. ``actor`` is whose state the event being run (or just run)
may change: its ``owner``, or its ``scope`` when it has none (a request arriving at its server, a
broker's restart), so the invariants check only that group after it (``Invariants.check_step``);
None for an event with neither (the nemesis, a script), which may change anything. An event is a
plain tuple in the queue, (virtual ms, sequence, fn, owner, owner's generation, trace text, scope):
the sequence number is unique, so the heap never compares beyond it. An event that only read state
or scheduled events (a request's timeout after its answer, a producer's tick) returns ``QUIET``.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from typing import Callable

__all__ = ["World", "Violation", "QUIET"]

#: What an event may return when it changed nothing any invariant reads (it only read state, or
#: scheduled events): ``World.quiet`` tells the invariants after it (``Invariants.check_step``).
QUIET = object()


class Violation(AssertionError):
    """An invariant of the simulated system does not hold (the message names it)."""

    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"{invariant}: {detail}")
        self.invariant = invariant
        self.detail = detail


class World:
    """Virtual time, the seeded random source, the event queue and the trace."""

    def __init__(self, seed: int, trace_len: int = 60) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now_ms = 0
        self.steps = 0
        self._queue: list[tuple] = []   # (virtual ms, sequence, fn, owner, generation, what, scope)
        self._seq = 0
        self._generations: dict[int, int] = {}
        self.trace: deque[str] = deque(maxlen=trace_len)
        self.actor: object = None       # whose state the current event may change (None: anything)
        self.quiet = False              # the current event returned QUIET

    # -- owners and generations (a crash invalidates an owner's pending timers) -------------------
    def generation(self, owner: object) -> int:
        return self._generations.get(id(owner), 0)

    def bump(self, owner: object) -> None:
        self._generations[id(owner)] = self.generation(owner) + 1

    # -- scheduling -----------------------------------------------------------------------------
    def at(self, delay_ms: int, fn: Callable[[], object], owner: object = None, what: str = "",
           scope: object = None) -> None:
        """Run ``fn`` ``delay_ms`` from now (unless ``owner`` crashed in between). ``scope``: whose
        state ``fn`` changes, for an event without an owner (see the module docstring)."""
        assert delay_ms >= 0, delay_ms
        self._seq += 1
        generation = self._generations.get(id(owner), 0) if owner is not None else 0
        heapq.heappush(self._queue, (self.now_ms + int(delay_ms), self._seq, fn, owner, generation, what, scope))

    def note(self, text: str) -> None:
        self.trace.append(f"{self.now_ms:>8} {text}")

    def run(self, until_ms: int, after_step: Callable[[], None] | None = None) -> None:
        """Process events up to ``until_ms``; ``after_step`` (the invariant checks) after each."""
        queue, generations, pop = self._queue, self._generations, heapq.heappop
        while queue and queue[0][0] <= until_ms:
            at_ms, _seq, fn, owner, generation, what, scope = pop(queue)
            if owner is not None and generation != generations.get(id(owner), 0):
                continue
            self.now_ms = at_ms
            self.steps += 1
            if what:
                self.trace.append(f"{at_ms:>8} {what}")
            self.actor = owner if scope is None else scope
            self.quiet = fn() is QUIET
            if after_step is not None:
                after_step()
        self.now_ms = max(self.now_ms, until_ms)
