"""The soak's table: per nemesis kind, how many faults, what was acknowledged while they were in force,
what was lost, and how long writes took to come back. Pure: reads nothing, prints nothing.

Theory of operation. A fault's *window* is ``[start, end]`` of its ``nemesis.jsonl`` events (an
instantaneous fault, a kill or a file fault, spans from its start to its end record). A send
*overlaps* a window when its ``[start_ms, end_ms]`` meets it; ``acked`` counts the acknowledged
sends that overlap a window of the kind, ``lost`` the lost payloads (the checker's) whose send did.
*Recovery* of one fault is the time from its end to the end of the first acknowledged send of its
group (any group for a fault without one) that started at or after that end: how long until that
group took writes again; a fault after which no send of its group started has none. The table has
one row per kind that acted, in ``FAULT_KINDS`` order.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rocketray.verify.history import FAULT_KINDS, NemesisEvent, OpRecord

__all__ = ["SoakRow", "format_table", "soak_table", "windows"]


@dataclass(frozen=True, slots=True)
class SoakRow:
    kind: str
    faults: int
    acked: int
    lost: int
    recovery_p50_ms: float | None
    recovery_max_ms: float | None
    unrecovered: int

    def to_json(self) -> dict:
        return {"kind": self.kind, "faults": self.faults, "acked": self.acked, "lost": self.lost,
                "recovery_ms": {"p50": self.recovery_p50_ms, "max": self.recovery_max_ms},
                "unrecovered": self.unrecovered}


def windows(events: Iterable[NemesisEvent]) -> list[tuple[str, str | None, float, float]]:
    """``(kind, group, start, end)`` of every fault: each start paired with the next end of the same
    kind and target (a start without an end lasts until the last event)."""
    ordered = sorted(events, key=lambda e: e.time_ms)
    last = ordered[-1].time_ms if ordered else 0.0
    open_: dict[tuple[str, str | None], list[tuple[float, str | None]]] = {}
    out: list[tuple[str, str | None, float, float]] = []
    for e in ordered:
        if e.kind == "heal":
            continue
        key = (e.kind, e.group)
        if e.phase == "start":
            open_.setdefault(key, []).append((e.time_ms, e.group))
        elif open_.get(key):
            start, group = open_[key].pop(0)
            out.append((e.kind, group, start, e.time_ms))
    for (kind, _group), starts in open_.items():
        out += [(kind, group, start, last) for start, group in starts]
    return sorted(out, key=lambda w: w[2])


def _percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def soak_table(events: Iterable[NemesisEvent], ops: Sequence[OpRecord], lost_payloads: Iterable[str]
               ) -> list[SoakRow]:
    """The per-kind rows (see the module docstring)."""
    sends = [op for op in ops if op.is_send]
    acked = sorted((op for op in sends if op.ok), key=lambda op: op.start_ms)
    starts = [op.start_ms for op in acked]
    lost = set(lost_payloads)
    rows = []
    spans = windows(events)
    for kind in FAULT_KINDS:
        mine = [w for w in spans if w[0] == kind]
        if not mine:
            continue
        overlapping = {op.op_id for op in sends for _k, _g, s, e in mine if op.start_ms <= e and op.end_ms >= s}
        recovery, unrecovered = [], 0
        for _k, group, _s, end in mine:
            i = bisect.bisect_left(starts, end)
            nxt = next((op for op in acked[i:] if group is None or op.group == group), None)
            if nxt is None:
                unrecovered += 1
            else:
                recovery.append(max(0.0, nxt.end_ms - end))
        rows.append(SoakRow(kind, len(mine), sum(1 for op in acked if op.op_id in overlapping),
                            sum(1 for op in sends if op.op_id in overlapping and op.ok and op.payload_id in lost),
                            _percentile(recovery, 0.5), _percentile(recovery, 1.0) if recovery else None,
                            unrecovered))
    return rows


def format_table(rows: Sequence[SoakRow]) -> str:
    """The table as Markdown (what the soak prints and docs/chaos.md quotes)."""
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:,.0f}"
    lines = ["| nemesis | faults | acked during | lost | recovery p50 ms | recovery max ms |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.kind} | {r.faults} | {r.acked:,} | {r.lost} | {ms(r.recovery_p50_ms)} | "
                     f"{ms(r.recovery_max_ms)}{f' ({r.unrecovered} none)' if r.unrecovered else ''} |")
    return "\n".join(lines)
