"""Puts held while a replica becomes master, answered when its switch ends (``ha/put_gate.py``).

A client learns of a new master from the controller's watch at about the moment the elected replica
learns it from its notification. The replica then switches: it stops following and starts its epoch
durably, 8-60 ms on 2 cores (``role switch done ... stop_ms epoch_ms`` in its log). Refusing a put
that arrives meanwhile with NOT_MASTER would make the client ask again after a backoff that doubles
(2, 4, 8, 16 ms) and find the master ready 10-50 ms after it was (docs/client-design.md, "Where a
failover's time goes"). So the replica holds such a put and answers it the moment the switch ends:
written as master if the switch succeeded, refused NOT_MASTER if it did not.

Holding changes no rule about data: a held put is appended only once the replica is writable, the
same check every put passes, and a put refused after holding is refused with nothing written, like
any refused put. Bounded: at most ``max_puts`` puts and ``max_bytes`` bytes are held, each for at
most ``max_ms`` (then refused NOT_MASTER); beyond the bounds a put is refused NOT_MASTER at once.

Pure: the shell passes ``now_ms`` and answers what ``release`` and ``expired`` hand back.
"""

from __future__ import annotations

import collections
from typing import Generic, TypeVar

__all__ = ["PromotionHold", "HOLD_MAX_BYTES", "HOLD_MAX_MS", "HOLD_MAX_PUTS"]

T = TypeVar("T")

HOLD_MAX_PUTS = 1024
HOLD_MAX_BYTES = 64 * 1024 * 1024
#: Well under the client's request timeout (``client.request_timeout_ms``, 8 s): a held put is
#: answered before its client gives up on it and sends it again.
HOLD_MAX_MS = 1000


class PromotionHold(Generic[T]):
    """Items (puts) in arrival order with their size and the time they were held."""

    def __init__(self, max_puts: int = HOLD_MAX_PUTS, max_bytes: int = HOLD_MAX_BYTES,
                 max_ms: int = HOLD_MAX_MS) -> None:
        if max_puts < 0 or max_bytes < 0 or max_ms <= 0:
            raise ValueError(f"bad hold bounds: max_puts={max_puts} max_bytes={max_bytes} max_ms={max_ms}")
        self.max_puts, self.max_bytes, self.max_ms = max_puts, max_bytes, max_ms
        self._held: collections.deque[tuple[T, int, int]] = collections.deque()
        self._bytes = 0
        self.held_total = 0       # puts ever held (a counter for status and tests)
        self.expired_total = 0    # of those, refused because the switch outlasted max_ms

    def __len__(self) -> int:
        return len(self._held)

    @property
    def held_bytes(self) -> int:
        return self._bytes

    def hold(self, item: T, size: int, now_ms: int) -> bool:
        """Hold ``item`` (``size`` bytes); False (nothing held) when that would pass a bound."""
        if len(self._held) >= self.max_puts or self._bytes + size > self.max_bytes:
            return False
        self._held.append((item, size, now_ms))
        self._bytes += size
        self.held_total += 1
        return True

    def release(self) -> list[T]:
        """Everything held, in arrival order; the hold is empty after."""
        items = [item for item, _size, _at in self._held]
        self._held.clear()
        self._bytes = 0
        return items

    def expired(self, now_ms: int) -> list[T]:
        """The items held for ``max_ms`` or longer by ``now_ms``, in arrival order (removed)."""
        out: list[T] = []
        while self._held and now_ms - self._held[0][2] >= self.max_ms:
            item, size, _at = self._held.popleft()
            self._bytes -= size
            out.append(item)
        self.expired_total += len(out)
        return out

    def next_expiry_ms(self) -> int | None:
        """When the oldest held item expires (None: nothing is held)."""
        return self._held[0][2] + self.max_ms if self._held else None
