"""Invariant 12 of ``sim/invariants.py``: a live broker answers every put it wrote by the put's
deadline (``slave_timeout_ms`` after the write).

Theory of operation. The product's put shell (``ha/put_shell.py``) arms one timer for the oldest ack
wait's deadline and arms it again each time it fires; nothing else in the broker times a wait out.
A wait still held past its deadline is a put its producer hears nothing about (the client times
out: outcome unknown) although the broker knows it was written. Waits are registered oldest first
with one timeout, so the oldest has the earliest deadline: after any step of a live broker its
oldest wait's deadline is not in the past (at the deadline's own millisecond the timer may still be
due). Checked after every step whose actor is a broker, before the per-step checks are skipped, so
the incremental and the full checks judge alike.
"""

from __future__ import annotations

from rocketray.sim.broker import SimBroker
from rocketray.sim.world import Violation

__all__ = ["PutChecks"]


class PutChecks:
    """The put-deadline check, a base class of ``Invariants`` (which holds ``controller``)."""

    def _check_put_deadline(self) -> None:
        world = self.controller.world        # type: ignore[attr-defined]
        b = world.actor
        if type(b) is not SimBroker or not b.up:
            return
        waits = b.gate.waits
        if waits and waits[0].deadline_ms < world.now_ms:
            raise Violation("puts answered by their deadline",
                            f"{b.name}: the put written up to {waits[0].end} waits {world.now_ms - waits[0].deadline_ms} "
                            f"ms past its deadline ({len(waits)} waiting)")
