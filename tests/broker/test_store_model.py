"""Hypothesis stateful test: MessageStore against an in-memory model.

Appends (master and slave path), reads, confirm-offset moves, truncations, clean and crash
restarts, retention and epoch entries; after every step the store and the model agree and no
consume queue exposes a message beyond the confirm offset.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from rocketray.broker.config import StoreConfig
from rocketray.broker.epoch_file import MAX_END_OFFSET
from rocketray.wire.message import Message, decode_record, encode_record
from rocketray.broker.store import MessageStore

SEG = 1024
CFG = StoreConfig(segment_size_bytes=SEG, background_thread=False, retention_max_bytes=2500, retention_ms=None)
QUEUES = 3

batches = st.lists(st.tuples(st.integers(0, QUEUES - 1), st.integers(0, 300)), min_size=1, max_size=6)


class StoreModel(RuleBasedStateMachine):
    """The model: the full list of stored messages (index = order), min/max, confirm, epochs."""

    @initialize()
    def setup(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="store-model-"))
        self.store = MessageStore(self.dir / "m", CFG)
        self.log: list[Message] = []      # every message ever kept (retention-deleted ones included)
        self.min = 0
        self.confirm = 0
        self.persisted_confirm = 0
        self.epochs: list[tuple[int, int]] = []
        self.now = 0

    def teardown(self) -> None:
        if hasattr(self, "store"):
            self.store.abandon()
            shutil.rmtree(self.dir, ignore_errors=True)

    # ---------------------------------------------------------------- model helpers
    @property
    def max(self) -> int:
        return self.log[-1].physical_offset + len(encode_record(self.log[-1])) if self.log else self.min

    def end(self, m: Message) -> int:
        return m.physical_offset + len(encode_record(m))

    def live(self) -> list[Message]:
        return [m for m in self.log if m.physical_offset >= self.min]

    def boundaries(self) -> list[int]:
        return [m.physical_offset for m in self.live()] + [self.max]

    # ---------------------------------------------------------------- rules
    @rule(batch=batches)
    def put(self, batch: list[tuple[int, int]]) -> None:
        self.now += 1
        msgs = [Message("T", q, bytes([n % 256]) * n, {"TAGS": f"t{q}"}, born_timestamp_ms=self.now)
                for q, n in batch]
        stored = self.store.put_messages(msgs, now_ms=self.now)
        pos = self.max
        for msg, got in zip(msgs, stored):
            prev = [m.queue_offset for m in self.log if m.queue_id == msg.queue_id]
            assert got == msg.with_position(prev[-1] + 1 if prev else 0, pos, self.now)
            self.log.append(got)
            pos = self.end(got)

    @rule(frac=st.floats(0, 1))
    def set_confirm(self, frac: float) -> None:
        target = self.min + int((self.max - self.min) * frac)
        self.store.confirm_offset = target
        self.confirm = target

    @rule(data=st.data())
    def truncate(self, data) -> None:
        p = data.draw(st.sampled_from(self.boundaries()))
        self.store.truncate(p)
        if p < self.max:  # truncating at the end is a no-op (no checkpoint written)
            self.confirm = min(self.confirm, p)
            self.persisted_confirm = self.confirm
        self.log = [m for m in self.log if m.physical_offset < p]
        self.epochs = [e for e in self.epochs if e[1] <= p]

    @rule(data=st.data())
    def truncate_off_boundary_refused(self, data) -> None:
        p = data.draw(st.integers(self.min, self.max))
        if p in self.boundaries():
            return
        try:
            self.store.truncate(p)
        except Exception as exc:  # noqa: BLE001 - the type is checked
            assert type(exc).__name__ == "StoreError"
        else:
            raise AssertionError(f"truncate({p}) off a boundary was accepted")

    @rule(crash=st.booleans())
    def restart(self, crash: bool) -> None:
        if crash:
            self.store.abandon()
            self.confirm = min(max(self.persisted_confirm, self.min), self.max)
        else:
            self.store.close()
            self.persisted_confirm = self.confirm
        self.store = MessageStore(self.dir / "m", CFG)

    @rule()
    def flush(self) -> None:
        self.store.flush()
        self.persisted_confirm = self.confirm

    @rule()
    def retention(self) -> None:
        dispatched = self.store.dispatched_offset
        deleted = self.store.delete_expired_segments(now_ms=0)
        new_min = self.store.min_offset
        assert new_min in self.boundaries()
        assert (deleted > 0) == (new_min > self.min)
        if deleted:
            assert new_min <= dispatched, "retention deleted records that were never dispatched"
            self.min = new_min
            self.confirm = max(self.confirm, new_min)
            self.persisted_confirm = self.confirm
            ends = [e[1] for e in self.epochs[1:]] + [MAX_END_OFFSET]
            self.epochs = [e for e, end in zip(self.epochs, ends) if end > new_min - 1]

    @rule()
    def new_epoch(self) -> None:
        epoch = self.epochs[-1][0] + 1 if self.epochs else 1
        ok = self.store.epoch_file.append(epoch, self.max)
        assert ok == (not self.epochs or self.epochs[-1][1] < self.max)
        if ok:
            self.epochs.append((epoch, self.max))

    @rule(data=st.data(), max_bytes=st.integers(1, 3000))
    def read_raw(self, data, max_bytes: int) -> None:
        live = self.live()
        if not live:
            return
        i = data.draw(st.integers(0, len(live) - 1))
        view = self.store.read_raw(live[i].physical_offset, max_bytes)
        got, pos = [], 0
        while pos < len(view):
            msg, size = decode_record(view, pos)
            got.append(msg)
            pos += size
        assert got and got == live[i:i + len(got)]
        assert len(got) == 1 or len(view) <= max_bytes

    @precondition(lambda self: self.log and self.max > self.min)
    @rule(chunk=st.integers(1, 1500))
    def replicate_to_slave(self, chunk: int) -> None:
        """A fresh slave fed through read_raw/append_raw from the master's min offset matches it."""
        slave = MessageStore(self.dir / "s", CFG)
        try:
            pos = self.min
            while pos < self.max:
                pos = slave.append_raw(pos, self.store.read_raw(pos, chunk))
            assert (slave.min_offset, slave.max_offset) == (self.min, self.max)
            slave.confirm_offset = slave.max_offset
            for q in range(QUEUES):  # a slave knows queue offsets only from the records it holds
                held = [m.queue_offset for m in self.live() if m.queue_id == q]
                assert slave.next_queue_offset("T", q) == (held[-1] + 1 if held else 0)
        finally:
            slave.close()
            shutil.rmtree(self.dir / "s")

    # ---------------------------------------------------------------- invariants
    @invariant()
    def offsets_agree(self) -> None:
        if not hasattr(self, "store"):
            return
        assert (self.store.min_offset, self.store.max_offset, self.store.confirm_offset) == \
            (self.min, self.max, self.confirm)
        assert [(e.epoch, e.start_offset) for e in self.store.epoch_file.entries()] == self.epochs

    @invariant()
    def queues_never_beyond_confirm(self) -> None:
        if not hasattr(self, "store"):
            return
        for q in range(QUEUES):
            expected = [m for m in self.live() if m.queue_id == q and self.end(m) <= self.confirm]
            got = self.store.get_messages("T", q, 0, 10_000)
            assert got == expected
            assert all(self.end(m) <= self.store.confirm_offset for m in got)
            nxt = [m.queue_offset for m in self.log if m.queue_id == q]
            assert self.store.next_queue_offset("T", q) == (nxt[-1] + 1 if nxt else 0)


StoreModel.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None,
                                        suppress_health_check=[HealthCheck.too_slow])
test_store_matches_model = StoreModel.TestCase
