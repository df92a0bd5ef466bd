"""Broker liveness table (reference section 5.2), driven by an injected ``now_ms``.

Each controller node keeps its own table (liveness is not replicated). A broker heartbeat inserts
or refreshes the row of ``(broker_name, broker_id)``; a broker is alive while
``last_update_ms + heartbeat_timeout_ms >= now_ms``, and ``expire(now_ms)`` removes exactly the
rows for which that predicate has become false, returning their identities so the shell can fire
"broker inactive". Progress (epoch, max offset, confirm offset) is what the broker reported *last*:
the election ranks a replica by the data it holds now. (RocketMQ keeps the best progress ever seen,
replacing it only with a higher epoch or the same epoch and a higher max offset; then a master that
restarts with less data - a power loss, a torn tail, a slave truncation - is still ranked by data it
no longer has and can win the new-term election over a replica that holds more.)

Deliberate differences from RocketMQ (reference section 18, quirk 7, FIXED): a refresh also
updates the broker's address, and the confirm offset is stored on the first insert. The table is
keyed by broker name and id (the controller keys everything by broker name); the cluster name is
kept in the row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from rocketray.wire.controller_api import INT32_MAX, BrokerHeartbeatRequest, Response
from rocketray.wire.controller_codes import ResponseCode


@dataclass(frozen=True, slots=True)
class BrokerLiveInfo:
    """What the controller knows about one live replica; the election policy orders by it."""

    cluster_name: str
    broker_name: str
    broker_address: str
    broker_id: int
    last_update_ms: int
    heartbeat_timeout_ms: int = 10000
    epoch: int = -1
    max_offset: int = -1
    confirm_offset: int = -1
    election_priority: int = INT32_MAX

    def is_alive(self, now_ms: int) -> bool:
        return self.last_update_ms + self.heartbeat_timeout_ms >= now_ms


def _takes_report(old: BrokerLiveInfo, req: BrokerHeartbeatRequest) -> bool:
    """Does this heartbeat's progress replace the row's? Always: the last report is the broker's
    current state. (RocketMQ's rule, which the simulator's mutant ``heartbeat-keeps-best-progress``
    patches in: only a higher epoch, or the same epoch with a strictly higher max offset.)"""
    return True


class HeartbeatTable:
    """Per-node liveness of brokers, keyed by ``(broker_name, broker_id)``."""

    __slots__ = ("_rows",)

    def __init__(self) -> None:
        self._rows: dict[tuple[str, int], BrokerLiveInfo] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def on_heartbeat(self, req: BrokerHeartbeatRequest, now_ms: int) -> Response:
        """Insert or refresh a row; a heartbeat without a valid broker id is refused (2005)."""
        if not isinstance(req.broker_id, int) or req.broker_id < 1:
            return Response.error(ResponseCode.CONTROLLER_INVALID_REQUEST, "Heart beat with empty brokerId")
        key = (req.broker_name, req.broker_id)
        old = self._rows.get(key)
        # one constructor call, not ``dataclasses.replace`` twice: a leader takes one of these per
        # replica per heartbeat interval (900 a second for 300 groups of 3 at the default 1 s)
        report = old if old is not None and not _takes_report(old, req) else req
        self._rows[key] = BrokerLiveInfo(
            req.cluster_name, req.broker_name, req.broker_address, req.broker_id, now_ms,
            req.heartbeat_timeout_ms, report.epoch, report.max_offset, report.confirm_offset,
            req.election_priority)
        return Response(ResponseCode.SUCCESS, remark="Heart beat success")

    def is_alive(self, broker_name: str, broker_id: int | None, now_ms: int) -> bool:
        if broker_id is None:
            return False
        row = self._rows.get((broker_name, broker_id))
        return row is not None and row.is_alive(now_ms)

    def alive_predicate(self, now_ms: int) -> Callable[[str, int], bool]:
        """``alive(broker_name, broker_id)`` frozen at ``now_ms``, for the decide context."""
        return lambda name, broker_id: self.is_alive(name, broker_id, now_ms)

    def live_info(self, broker_name: str, broker_id: int) -> BrokerLiveInfo | None:
        return self._rows.get((broker_name, broker_id))

    def remove(self, broker_name: str, broker_id: int) -> BrokerLiveInfo | None:
        """Drop a row (e.g. its connection closed); returns it if it existed."""
        return self._rows.pop((broker_name, broker_id), None)

    def expire(self, now_ms: int) -> list[tuple[str, str, int]]:
        """Remove rows that are no longer alive at ``now_ms``; return their
        ``(cluster_name, broker_name, broker_id)`` sorted, for "broker inactive" notifications."""
        dead = [key for key, row in self._rows.items() if not row.is_alive(now_ms)]
        gone = [self._rows.pop(key) for key in dead]
        return sorted((r.cluster_name, r.broker_name, r.broker_id) for r in gone)

    def active_counts(self, now_ms: int) -> dict[str, dict[str, int]]:
        """cluster -> broker name -> number of alive replicas (metrics)."""
        out: dict[str, dict[str, int]] = {}
        for row in self._rows.values():
            if row.is_alive(now_ms):
                per = out.setdefault(row.cluster_name, {})
                per[row.broker_name] = per.get(row.broker_name, 0) + 1
        return out
