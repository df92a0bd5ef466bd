"""Invariants 1 and 2 in full: every acknowledged and every read record where it must be (a mixin of
``Invariants``, sim/invariants.py).

Theory of operation. ``check_logs`` reads the logs of a group's live SyncStateSet members and
requires each acknowledged record (offset commits included) and each record a consumer read at the
offset it was given, whole, with its body. It is incremental without being weaker:

- A member's log only grows between two truncations of one process, so a record found intact stays
  intact until the member's (restarts, rewrites) key changes; what was found is kept per member
  under that key (``_found``), and so is how far each record list was walked (``_LogWalk``). The
  lists only grow, and a record passed over was either found or forgiven by the async-flush oracle,
  which never takes a forgiveness back, so walking only the new records checks the same records, in
  the same order, as walking them all.
- A record is read from its segment's bytes, read once per call (``_LogReader``). The first time
  an (offset, body) is found whole in some log its exact bytes are kept; a member whose log holds
  those very bytes at that offset holds that record (the decoder is a function of the bytes: same
  header, same physical offset, same body), so it is compared byte for byte instead of decoded; a
  record not seen yet is decoded where it lies, with the checks ``read_raw`` makes (its segment
  holds it whole, it names that offset). Anything else goes to ``_expect``, the store's own read,
  which decides, and raises the violation with its usual message.
"""

from __future__ import annotations

import struct
from itertools import islice

from rocketray.broker.commitlog import StoreError
from rocketray.wire.message import MessageCodecError, decode_record
from rocketray.sim.broker import SimBroker
from rocketray.sim.loss_checks import log_bytes
from rocketray.sim.world import Violation

__all__ = ["LogChecks"]

ACKED = "acknowledged message lost"
READ = "read message disappeared"
_SIZE = struct.Struct(">I")      # a record's first field: its total size


class _LogWalk:
    """What ``check_logs`` found in one member's log under one (restarts, rewrites) key: the records
    found intact, and how many of each record list it has walked."""

    __slots__ = ("key", "found", "done")

    def __init__(self, key: tuple[int, int], lists: int) -> None:
        self.key = key
        self.found: set[tuple[int, bytes]] = set()
        self.done = [0] * lists


class LogChecks:
    """``check_logs`` and ``_expect`` (see the module docstring); uses ``groups``, ``controller``, the
    clients of each group, ``exempt``, ``_check_held`` and the oracle's ``_forgiven_in``."""

    def _record_lists(self, group: str) -> list[tuple[list, str, object]]:
        """The group's record lists in the order they are checked: each producer's acknowledged
        messages, each consumer's acknowledged commits, each consumer's reads (only the first read
        of each queue offset counts: ``by_queue_offset``); as (list, invariant, consumer or None)."""
        lists = [(p.acked, ACKED, None) for p in self._producers_of[group]]
        lists += [(c.committed, ACKED, None) for c in self._consumers_of[group]]
        lists += [(c.read, READ, c) for c in self._consumers_of[group]]
        return lists

    def check_logs(self, groups: list[str] | None = None) -> None:
        """1, 2 (and 8) in full for ``groups`` (default: every group)."""
        for group in self.groups if groups is None else groups:
            brokers = self.groups[group]
            lists = self._record_lists(group)
            self._check_held(group, brokers)
            members = self.controller.sync_state_set(group)
            for b in brokers:
                if b.id not in members or not b.up or b.store is None or self.exempt(b):
                    continue
                key = (b.restarts, b.rewrites)
                walk = self._found.get(b.name)
                if walk is None or walk.key != key:
                    walk = self._found[b.name] = _LogWalk(key, len(lists))
                found, forgiven = walk.found, self._forgiven_in(group)
                log = _LogReader(b.store, self._record_bytes) if self.incremental else None
                for i, (records, invariant, consumer) in enumerate(lists):
                    end = len(records)
                    for r in islice(records, walk.done[i] if log is not None else 0, end):
                        if consumer is not None and consumer.by_queue_offset.get(r.queue_offset) is not r:
                            continue
                        if (r.physical_offset, r.body) not in found and not forgiven(r):
                            if log is None or not log.holds(r.physical_offset, r.body):
                                self._expect(b, r.physical_offset, r.body, invariant)
                            found.add((r.physical_offset, r.body))
                    walk.done[i] = end

    def _expect(self, b: SimBroker, offset: int, body: bytes, invariant: str) -> None:
        """``b``'s log holds, at ``offset``, a whole record with ``body`` (else a Violation), as the
        store reads it (``read_raw``: a record boundary, the record whole)."""
        store = b.store
        assert store is not None
        if offset < store.min_offset or offset >= store.max_offset:
            raise Violation(invariant, f"{b.name} (in the SyncStateSet) ends at {store.max_offset}, "
                            f"message {body!r} at {offset}")
        try:
            raw = store.read_raw(offset, 1)   # exactly the record at offset
            msg, _ = decode_record(raw)
        except (MessageCodecError, StoreError, ValueError) as exc:
            raise Violation(invariant, f"{b.name}: no whole record at {offset} ({exc}); expected {body!r}")
        if bytes(msg.body) != body:
            raise Violation(invariant, f"{b.name}: at {offset} holds {bytes(msg.body)!r}, expected {body!r}")
        self._record_bytes[(offset, body)] = bytes(raw)


    def _known_records(self) -> dict[int, list[tuple[bytes, bytes]]]:
        """offset -> (bytes, body) of every record found whole so far (``_record_bytes``)."""
        known: dict[int, list[tuple[bytes, bytes]]] = {}
        if self.incremental:
            for (offset, body), raw in self._record_bytes.items():
                known.setdefault(offset, []).append((raw, body))
        return known

    @staticmethod
    def _log_records(store, known: dict[int, list[tuple[bytes, bytes]]]):
        """(offset, body) of each record of ``store``'s whole log, as ``decode_record`` reads them one
        after the other (raising where it does); a record whose bytes are those of one found whole
        before at that offset is that record, and is not decoded again."""
        base = store.min_offset
        data = log_bytes(store, base, store.max_offset)
        pos = 0
        while pos < len(data):
            for raw, body in known.get(base + pos, ()):
                if data[pos:pos + len(raw)] == raw:
                    size = len(raw)
                    break
            else:
                msg, size = decode_record(data, pos)
                body = bytes(msg.body)
            yield base + pos, body
            pos += size


class _LogReader:
    """One member's log as one ``check_logs`` call reads it: each segment's bytes read once (nothing
    runs in the world during a check), and a record confirmed by its bytes (see the module
    docstring). ``holds`` is True only where ``Invariants._expect`` would find the record; False
    sends the record to ``_expect``, which decides."""

    __slots__ = ("log", "known", "lo", "hi", "base", "data")

    def __init__(self, store, known: dict[tuple[int, bytes], bytes]) -> None:
        self.log = store.commitlog
        self.known = known
        self.lo, self.hi = self.log.min_offset, self.log.max_offset
        self.base, self.data = 0, b""

    def _at(self, offset: int) -> int:
        """``offset``'s position in ``data``, the bytes of the segment holding it (to its data end)."""
        if not self.base <= offset < self.base + len(self.data):
            seg = self.log.segment_for(offset)
            self.base, self.data = seg.base_offset, bytes(self.log.read(seg.base_offset, seg.size))
        return offset - self.base

    def holds(self, offset: int, body: bytes) -> bool:
        if not self.lo <= offset < self.hi:
            return False
        pos = self._at(offset)
        data = self.data
        known = self.known.get((offset, body))
        if known is not None:
            # the very bytes that decoded to this record at this offset elsewhere
            return data[pos:pos + len(known)] == known
        # a record is whole when its segment holds all its bytes, it decodes (both CRCs) and it names
        # ``offset`` as its physical offset: what read_raw's boundary check and the decoder require
        if len(data) - pos < 4:
            return False
        total = _SIZE.unpack_from(data, pos)[0]
        if total > self.log.segment_size or pos + total > len(data):
            return False
        try:
            msg, _size = decode_record(data, pos)
        except (MessageCodecError, ValueError):
            return False
        if msg.physical_offset != offset or bytes(msg.body) != body:
            return False
        self.known[(offset, body)] = data[pos:pos + total]
        return True
