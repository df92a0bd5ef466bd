"""A stand-in of the HA service's port over a real store, for tests of the broker endpoints that
use it (``ConsumerPath``, the delayed-delivery scheduler): ``put`` appends as master and, when told
to, confirms; ``add_confirm_listener``."""

from __future__ import annotations

from rocketray.broker.store import MessageStore
from rocketray.wire.put_result import PutResult, PutStatus, Written


class FakeHA:
    """Appends as master; confirms at once unless ``auto_confirm`` is off (replicas not acking)."""

    def __init__(self, store: MessageStore) -> None:
        self.store, self.epoch, self.auto_confirm = store, 1, True
        self.listeners: list = []

    def add_confirm_listener(self, cb) -> None:
        self.listeners.append(cb)

    def confirm(self, offset: int) -> None:
        self.store.confirm_offset = offset
        for cb in self.listeners:
            cb(offset)

    async def put(self, batch, now_ms: int) -> PutResult:
        appended = self.store.put_batch(batch, now_ms)
        if not self.auto_confirm:
            return PutResult(PutStatus.FLUSH_SLAVE_TIMEOUT, Written.YES, appended.offsets(), appended.end_offset)
        self.confirm(appended.end_offset)
        return PutResult(PutStatus.PUT_OK, Written.YES, appended.offsets(), appended.end_offset)
