"""The chaos checker: a pure verdict on a saved run (did anything acknowledged get lost?).

Theory of operation. A chaos run directory (``docs/contracts.md``, "chaos run directory") holds
what the clients did (``history.jsonl``), what the nemesis did (``nemesis.jsonl``), periodic
replica samples and the replicas' state after the final heal. ``check(run)`` reduces them to a
``Verdict`` without IO, clock or Ray; ``check_run_dir(path)`` reads then checks. Each property is
one small function so a failing run points at one rule:

- **final reads**: the heal time ``heal_at_ms`` is the largest ``time_ms`` in ``nemesis.jsonl`` (the
  runner's final ``heal``); ok reads that started at or after it are the *final reads*. With no
  nemesis events every read is final. The JSON's ``heal_ms`` is a duration: from the run's first
  record to that heal.
- **lost**: payloads of ok sends (acknowledged) that no final read returned. Must be 0 with
  all-ack on and unclean election off; a payload read mid-run but absent after heal is lost too.
- **unseen**: payloads whose sends were all failed/unknown and that no read ever returned
  (allowed: the client never heard yes).
- **duplicates**: payloads that reads returned at two or more distinct ``(group, queue_id,
  queue_offset)`` positions (allowed, e.g. a client retry; reported).
- **inconsistent_offsets**: positions ``(group, queue_id, queue_offset)`` claimed by two different
  payloads, counting ok reads (any replica, any time) and ok sends that report their offset.
- **nonmonotonic**: a read pass is one process's ok reads of one ``(group, queue_id)`` within one
  phase (before heal / final), in ``(start_ms, file order)``; each step to a smaller
  ``queue_offset`` than the previous read is one anomaly. A runner that wants to sweep a queue
  again from the start must do it under a new ``process`` name.
- **masters_per_epoch_max**: the most distinct broker ids seen in a master role for one
  ``(group, master_epoch)``, over samples and replicas. Must be <= 1.
- **epochs_monotonic**: per ``(group, broker_id)``, samples in time order followed by the
  replica's final state never show ``master_epoch`` decrease, and every replica's
  ``epoch_entries`` have strictly increasing epochs and non-decreasing start offsets. Restarts are
  modelled by ignoring ``master_epoch <= 0``: a restarted broker reports no epoch until the
  controller tells it one, so only a drop between two known (positive) epochs is a regression.
- **replicas_converged**: per group, every replica carries the same ``digest_to_confirm`` (SHA-256
  of commit-log bytes ``[0, min confirm_offset of the group)``). A group where no replica carries
  a digest is not compared (``replicas_checked`` counts the groups compared); a group where only
  some do is not converged.
- **failover_ms**: for each ``kill-master`` ``start`` event, the time from the event to the end of
  the first ok send on that group that started at or after it. ``p50`` is the lower median
  (nearest rank, ``sorted[ceil(n/2) - 1]``); kills never followed by an ok send count as
  ``unrecovered``.

``valid`` = lost == 0, inconsistent_offsets == 0, masters_per_epoch_max <= 1, epochs monotonic,
replicas converged, and every consumer group's report valid: with the consumer-group workload on,
``rocketray.verify.groups`` checks each group (undelivered acknowledged messages, redeliveries,
re-reads below an acknowledged commit, committed offsets gone back). Example lists are capped at
``EXAMPLES_MAX`` per anomaly.
"""

from __future__ import annotations

import bisect
import math
import os
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from rocketray.verify.history import Ident, NemesisEvent, Number, OpRecord, ReplicaSnapshot, Sample
from rocketray.verify.run_dir import RunData, read_run_dir
from rocketray.verify.groups import GroupReport, check_groups
from rocketray.verify.nemesis import clock_windows

EXAMPLES_MAX = 10

Position = tuple[str, int, int]  # (group, queue_id, queue_offset)


@dataclass(frozen=True, slots=True)
class FailoverStats:
    """Kill-master to first acknowledged write, over all kills that recovered."""

    p50: Number | None
    max: Number | None
    count: int
    unrecovered: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"p50": self.p50, "max": self.max, "count": self.count, "unrecovered": self.unrecovered}


@dataclass(frozen=True, slots=True)
class Verdict:
    """The checker's result; ``to_json()`` is what ``verdict.json`` and ``rocketray chaos --json`` hold."""

    ops: int
    sends: int
    reads: int
    final_reads: int
    acked: int
    lost: int
    unseen: int
    duplicates: int
    inconsistent_offsets: int
    nonmonotonic: int
    masters_per_epoch_max: int
    epochs_monotonic: bool
    replicas_converged: bool
    replicas_checked: int
    failover_ms: FailoverStats
    heal_at_ms: Number | None  #: the final heal, on the history's clock
    start_ms: Number | None  #: the run's first record (op start or nemesis event), same clock
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    groups: tuple[GroupReport, ...] = ()  #: one per consumer group of the workload (none if it was off)

    @property
    def valid(self) -> bool:
        return (self.lost == 0 and self.inconsistent_offsets == 0 and self.masters_per_epoch_max <= 1
                and self.epochs_monotonic and self.replicas_converged and all(g.valid for g in self.groups))

    @property
    def heal_duration_ms(self) -> Number | None:
        """How long after the run's first record the final heal came (a duration, not a timestamp)."""
        if self.heal_at_ms is None or self.start_ms is None:
            return None
        return self.heal_at_ms - self.start_ms

    def to_json(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "ops": self.ops, "sends": self.sends, "reads": self.reads, "final_reads": self.final_reads,
            "acked": self.acked, "lost": self.lost, "unseen": self.unseen, "duplicates": self.duplicates,
            "inconsistent_offsets": self.inconsistent_offsets, "nonmonotonic": self.nonmonotonic,
            "masters_per_epoch_max": self.masters_per_epoch_max, "epochs_monotonic": self.epochs_monotonic,
            "replicas_converged": self.replicas_converged, "replicas_checked": self.replicas_checked,
            "failover_ms": self.failover_ms.to_json(), "heal_ms": self.heal_duration_ms,
            "heal_at_ms": self.heal_at_ms,
            "consumer_groups": {g.consumer_group: g.to_json() for g in self.groups},
            "examples": {k: list(v) for k, v in self.examples.items()},
        }


def _cap(examples: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for ex in examples:
        if len(out) >= EXAMPLES_MAX:
            break
        out.append(ex)
    return out


def _id_key(value: Ident) -> tuple[str, str]:
    return (type(value).__name__, str(value))


# -- individual properties -------------------------------------------------------------------------

def heal_time_ms(nemesis: Sequence[NemesisEvent]) -> Number | None:
    """The final heal: the latest nemesis event time, or None without nemesis events."""
    return max((e.time_ms for e in nemesis), default=None)


def is_final_read(op: OpRecord, heal_ms: Number | None) -> bool:
    return op.is_read and op.ok and (heal_ms is None or op.start_ms >= heal_ms)


def lost_and_unseen(ops: Sequence[OpRecord], heal_ms: Number | None
                    ) -> tuple[list[OpRecord], list[OpRecord]]:
    """(first ok send of each lost payload, first send of each unseen payload), in payload order."""
    final_read = {op.payload_id for op in ops if is_final_read(op, heal_ms)}
    ever_read = {op.payload_id for op in ops if op.is_read and op.ok}
    acked: dict[Ident, OpRecord] = {}
    attempted: dict[Ident, OpRecord] = {}
    for op in ops:
        if not op.is_send:
            continue
        assert op.payload_id is not None
        if op.ok:
            acked.setdefault(op.payload_id, op)
        attempted.setdefault(op.payload_id, op)
    lost = [acked[p] for p in sorted(acked, key=_id_key) if p not in final_read]
    unseen = [attempted[p] for p in sorted(attempted, key=_id_key) if p not in acked and p not in ever_read]
    return lost, unseen


def duplicate_payloads(ops: Sequence[OpRecord]) -> dict[Ident, list[Position]]:
    """Payloads that ok reads returned at two or more distinct positions."""
    positions: dict[Ident, set[Position]] = defaultdict(set)
    for op in ops:
        if op.is_read and op.ok:
            assert op.payload_id is not None and op.queue_offset is not None
            positions[op.payload_id].add((op.group, op.queue_id, op.queue_offset))
    return {p: sorted(pos) for p, pos in positions.items() if len(pos) > 1}


def inconsistent_positions(ops: Sequence[OpRecord]) -> dict[Position, list[Ident]]:
    """Positions claimed by two or more payloads (ok reads, and ok sends that report an offset)."""
    payloads: dict[Position, set[Ident]] = defaultdict(set)
    for op in ops:
        if op.ok and op.queue_offset is not None:
            assert op.payload_id is not None
            payloads[(op.group, op.queue_id, op.queue_offset)].add(op.payload_id)
    return {pos: sorted(ps, key=_id_key) for pos, ps in payloads.items() if len(ps) > 1}


def nonmonotonic_reads(ops: Sequence[OpRecord], heal_ms: Number | None) -> list[dict[str, Any]]:
    """Every step backwards in queue_offset within one read pass (see the module docstring)."""
    passes: dict[tuple[Ident, str, int, bool], list[tuple[Number, int, OpRecord]]] = defaultdict(list)
    for index, op in enumerate(ops):
        if op.is_read and op.ok:
            passes[(op.process, op.group, op.queue_id, is_final_read(op, heal_ms))].append(
                (op.start_ms, index, op))
    anomalies = []
    for (process, group, queue_id, final), reads in passes.items():
        reads.sort(key=lambda t: (t[0], t[1]))
        previous: OpRecord | None = None
        for _, _, op in reads:
            assert op.queue_offset is not None
            if previous is not None and op.queue_offset < previous.queue_offset:  # type: ignore[operator]
                anomalies.append({"process": process, "group": group, "queue_id": queue_id, "final": final,
                                  "previous_offset": previous.queue_offset, "offset": op.queue_offset,
                                  "op_id": op.op_id})
            previous = op
    return anomalies


def masters_per_epoch(samples: Sequence[Sample], replicas: Sequence[ReplicaSnapshot]
                      ) -> dict[tuple[str, int], set[int]]:
    """(group, master_epoch) -> broker ids that reported a master role at that epoch."""
    masters: dict[tuple[str, int], set[int]] = defaultdict(set)
    states: list[Sample | ReplicaSnapshot] = [*samples, *replicas]
    for s in states:
        if s.is_master:
            masters[(s.group, s.master_epoch)].add(s.broker_id)
    return masters


def epoch_regressions(samples: Sequence[Sample], replicas: Sequence[ReplicaSnapshot]) -> list[dict[str, Any]]:
    """Drops of a broker's known master_epoch over time, and disordered epoch files."""
    series: dict[tuple[str, int], list[tuple[Number, int, int]]] = defaultdict(list)
    for index, s in enumerate(samples):
        series[(s.group, s.broker_id)].append((s.time_ms, index, s.master_epoch))
    for index, r in enumerate(replicas):  # the state after heal comes after every sample
        series[(r.group, r.broker_id)].append((math.inf, index, r.master_epoch))
    anomalies: list[dict[str, Any]] = []
    for (group, broker_id), points in series.items():
        points.sort(key=lambda t: (t[0], t[1]))
        highest = 0
        for time_ms, _, epoch in points:
            if epoch <= 0:
                continue  # unknown (fresh or just restarted)
            if epoch < highest:
                anomalies.append({"group": group, "broker_id": broker_id, "reason": "master_epoch decreased",
                                  "from": highest, "to": epoch,
                                  "time_ms": None if time_ms == math.inf else time_ms})
            highest = max(highest, epoch)
    for r in replicas:
        for (e1, s1, _), (e2, s2, _) in zip(r.epoch_entries, r.epoch_entries[1:]):
            if not (e2 > e1 and s2 >= s1):
                anomalies.append({"group": r.group, "broker_id": r.broker_id, "reason": "epoch file out of order",
                                  "entries": [[e1, s1], [e2, s2]]})
    return anomalies


def replica_divergence(replicas: Sequence[ReplicaSnapshot]) -> tuple[int, list[dict[str, Any]]]:
    """(groups compared, divergent groups) by ``digest_to_confirm``."""
    by_group: dict[str, list[ReplicaSnapshot]] = defaultdict(list)
    for r in replicas:
        by_group[r.group].append(r)
    compared = 0
    divergent = []
    for group in sorted(by_group):
        members = by_group[group]
        digests = {r.broker_id: r.digest_to_confirm for r in members}
        if all(d is None for d in digests.values()):
            continue
        compared += 1
        confirm = min(r.confirm_offset for r in members)
        if any(d is None for d in digests.values()):
            divergent.append({"group": group, "reason": "digest missing on some replicas",
                              "confirm_offset": confirm, "digests": digests})
        elif len(set(digests.values())) > 1:
            divergent.append({"group": group, "reason": "digests differ", "confirm_offset": confirm,
                              "digests": digests})
    return compared, divergent


def failover_times(ops: Sequence[OpRecord], nemesis: Sequence[NemesisEvent]
                   ) -> tuple[FailoverStats, list[dict[str, Any]]]:
    """Kill-master to the first ok send on that group started at or after the kill."""
    sends: dict[str | None, list[OpRecord]] = defaultdict(list)
    for op in ops:
        if op.is_send and op.ok:
            sends[op.group].append(op)
            sends[None].append(op)  # a kill without a group waits for any group
    index: dict[str | None, tuple[list[Number], list[Number]]] = {}
    for group, group_sends in sends.items():
        group_sends.sort(key=lambda op: op.start_ms)
        suffix_min_end: list[Number] = [0] * len(group_sends)
        best: Number = math.inf
        for i in range(len(group_sends) - 1, -1, -1):
            best = min(best, group_sends[i].end_ms)
            suffix_min_end[i] = best
        index[group] = ([op.start_ms for op in group_sends], suffix_min_end)
    times: list[Number] = []
    details = []
    unrecovered = 0
    for e in nemesis:
        if e.kind != "kill-master" or e.phase != "start":
            continue
        starts, suffix_min_end = index.get(e.group, ([], []))
        i = bisect.bisect_left(starts, e.time_ms)
        if i == len(starts):
            unrecovered += 1
            details.append({"group": e.group, "target": e.target, "kill_ms": e.time_ms, "failover_ms": None})
            continue
        elapsed = suffix_min_end[i] - e.time_ms
        times.append(elapsed)
        details.append({"group": e.group, "target": e.target, "kill_ms": e.time_ms, "failover_ms": elapsed})
    times.sort()
    p50 = times[math.ceil(len(times) / 2) - 1] if times else None
    return FailoverStats(p50=p50, max=times[-1] if times else None, count=len(times),
                         unrecovered=unrecovered), details


# -- the verdict -----------------------------------------------------------------------------------

def _op_example(op: OpRecord) -> dict[str, Any]:
    return {"payload_id": op.payload_id, "op_id": op.op_id, "process": op.process, "group": op.group,
            "queue_id": op.queue_id, "queue_offset": op.queue_offset, "outcome": op.outcome,
            "end_ms": op.end_ms}


def check(run: RunData) -> Verdict:
    """Check a parsed run; pure."""
    ops = run.ops
    heal_ms = heal_time_ms(run.nemesis)
    lost, unseen = lost_and_unseen(ops, heal_ms)
    duplicates = duplicate_payloads(ops)
    inconsistent = inconsistent_positions(ops)
    nonmonotonic = nonmonotonic_reads(ops, heal_ms)
    masters = masters_per_epoch(run.samples, run.replicas)
    two_masters = {k: v for k, v in masters.items() if len(v) > 1}
    regressions = epoch_regressions(run.samples, run.replicas)
    compared, divergent = replica_divergence(run.replicas)
    failover, failover_details = failover_times(ops, run.nemesis)
    examples = {
        "lost": _cap(_op_example(op) for op in lost),
        "unseen": _cap(_op_example(op) for op in unseen),
        "duplicates": _cap({"payload_id": p, "positions": [list(x) for x in pos]}
                           for p, pos in sorted(duplicates.items(), key=lambda kv: _id_key(kv[0]))),
        "inconsistent_offsets": _cap({"group": g, "queue_id": q, "queue_offset": o, "payload_ids": ps}
                                     for (g, q, o), ps in sorted(inconsistent.items())),
        "nonmonotonic": _cap(nonmonotonic),
        "masters_per_epoch": _cap({"group": g, "master_epoch": e, "broker_ids": sorted(ids)}
                                  for (g, e), ids in sorted(two_masters.items())),
        "epochs_monotonic": _cap(regressions),
        "replicas_converged": _cap(divergent),
        "failover": _cap(sorted(failover_details, key=lambda d: (d["failover_ms"] is not None,
                                                                 -(d["failover_ms"] or 0)))),
    }
    return Verdict(
        ops=len(ops),
        sends=sum(1 for op in ops if op.is_send),
        reads=sum(1 for op in ops if op.is_read and op.ok),
        final_reads=sum(1 for op in ops if is_final_read(op, heal_ms)),
        acked=len({op.payload_id for op in ops if op.is_send and op.ok}),
        lost=len(lost),
        unseen=len(unseen),
        duplicates=len(duplicates),
        inconsistent_offsets=len(inconsistent),
        nonmonotonic=len(nonmonotonic),
        masters_per_epoch_max=max((len(v) for v in masters.values()), default=0),
        epochs_monotonic=not regressions,
        replicas_converged=not divergent,
        replicas_checked=compared,
        failover_ms=failover,
        heal_at_ms=heal_ms,
        start_ms=min([*(op.start_ms for op in ops), *(e.time_ms for e in run.nemesis)], default=None),
        examples={k: v for k, v in examples.items() if v},
        groups=check_groups([op for op in ops if op.is_send], run.groups, clock_faults=clock_windows(run.nemesis)),
    )


def check_run_dir(path: str | os.PathLike[str]) -> Verdict:
    """Read a chaos run directory and check it (raises ``RunDirError`` on a malformed file)."""
    return check(read_run_dir(path))


def _yes(flag: bool) -> str:
    return "yes" if flag else "NO"


def format_verdict(verdict: Verdict) -> str:
    """A human summary: the verdict line, the counts, failover times, then capped examples."""
    v = verdict
    if v.valid:
        head = "VALID: no acknowledged write lost"
        if v.groups:
            head += f"; each of {len(v.groups)} consumer groups received every one, never behind an acked commit"
    else:
        reasons = []
        if v.lost:
            reasons.append(f"{v.lost} acknowledged writes lost")
        if v.inconsistent_offsets:
            reasons.append(f"{v.inconsistent_offsets} offsets with two payloads")
        if v.masters_per_epoch_max > 1:
            reasons.append(f"{v.masters_per_epoch_max} masters in one epoch")
        if not v.epochs_monotonic:
            reasons.append("epoch regression")
        if not v.replicas_converged:
            reasons.append("replicas diverge below the confirm offset")
        reasons.extend(f"consumer group {g.consumer_group} broke at-least-once" for g in v.groups if not g.valid)
        head = "INVALID: " + "; ".join(reasons)
    f = v.failover_ms
    failover = (f"failover after kill-master: {f.count} recovered, p50 {_ms(f.p50)}, max {_ms(f.max)}"
                f", {f.unrecovered} never recovered")
    converged = (f"{_yes(v.replicas_converged)} ({v.replicas_checked} groups compared)" if v.replicas_checked
                 else f"{_yes(v.replicas_converged)} (no digests to compare)")
    lines = [
        head,
        f"ops {v.ops}: sends {v.sends} (acked payloads {v.acked}), reads {v.reads} (final {v.final_reads})",
        f"lost {v.lost}  unseen {v.unseen}  duplicates {v.duplicates}  "
        f"inconsistent offsets {v.inconsistent_offsets}  nonmonotonic reads {v.nonmonotonic}",
        f"masters per epoch (max) {v.masters_per_epoch_max}  epochs monotonic {_yes(v.epochs_monotonic)}  "
        f"replicas converged {converged}",
        failover,
        *(g.summary() for g in v.groups),
    ]
    for name, items in [*v.examples.items(), *((f"{g.consumer_group} {k}", x) for g in v.groups
                                                for k, x in g.examples.items() if k != "redelivered")]:
        lines.append(f"{name}:")
        lines.extend(f"  {_format_example(item)}" for item in items)
    return "\n".join(lines)


def _ms(value: Number | None) -> str:
    if value is None:
        return "-"
    return f"{value:g} ms" if isinstance(value, float) else f"{value} ms"


def _format_example(item: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in item.items())
