"""The chaos run directory: typed records (their files: ``rocketray.verify.run_dir``).

Theory of operation. A chaos run leaves a directory (format in ``docs/contracts.md``, "chaos run
directory") that the checker and the analytics read long after the cluster is gone. This module is
the one place that knows that format: one frozen dataclass per kind of line, a ``from_json`` that
validates a decoded object field by field, a ``to_json`` that gives back the contract's keys (and,
in ``run_dir``, readers and writers for whole files). Readers are strict: a line that is not a JSON object, lacks a
required key, or holds a value of the wrong type or outside its enum raises ``RunDirError`` naming
the file and the line (or, for ``replicas.json``, the line and list index), so a broken runner is
caught where it wrote, not by a confused checker. Keys the contract marks "null if unknown" may be
absent and default to null; keys the contract does not name are ignored (forward compatibility).
``history.jsonl`` also holds the consumer-group workload's rows (``f`` = ``deliver``, ``commit``,
``progress``, ``consumer``), whose records live in ``rocketray.verify.group_history``; the field
validators shared by every kind are ``rocketray.verify.fields``; whole files and run directories are
read and written by ``rocketray.verify.run_dir``. No clock, no Ray: plain files in, plain data out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rocketray.broker.role_io import Role
from rocketray.verify.fields import FieldError as _FieldError
from rocketray.verify.fields import Ident, Number
from rocketray.verify.fields import get as _get
from rocketray.verify.fields import get_ident as _ident
from rocketray.verify.fields import get_int as _int
from rocketray.verify.fields import get_number as _number
from rocketray.verify.fields import get_str as _str
from rocketray.verify.outcome import Outcome

HISTORY_FILE = "history.jsonl"
NEMESIS_FILE = "nemesis.jsonl"
REPLICAS_FILE = "replicas.json"
SAMPLES_FILE = "samples.jsonl"
CONTROLLER_EVENTS_FILE = "controller_events.jsonl"
VERDICT_FILE = "verdict.json"

OP_FUNCTIONS = ("send", "read")
ROLES = tuple(r.value for r in Role)
#: The lowercase spellings found in saved run directories, read as the one spelling so those runs
#: keep loading; nothing writes them, and no other spelling is accepted.
LEGACY_ROLES = {"master": Role.MASTER.value, "slave": Role.SLAVE.value}
OUTCOMES = tuple(o.value for o in Outcome)
#: The broker chaos run's fault kinds, declared once (``rocketray.verify.nemesis`` schedules them,
#: ``rocketray.chaos.broker_chaos`` executes them); ``nemesis.jsonl`` accepts these plus ``heal``.
FAULT_KINDS = (
    "kill-master",
    "kill-broker",
    "kill-controller-leader",
    "kill-controller",
    "pause-broker",
    "pause-controller",
    "partition-ha",
    "kill-node",
    # OS-level faults (docs/chaos.md): in the kernel, on the replica's files, of its unsynced writes,
    # of its wall clock
    "net-partition",
    "net-oneway",
    "net-loss",
    "corrupt-file",
    "truncate-file",
    "delete-queue",
    "lose-unsynced",
    "clock-broker",
)
NEMESIS_KINDS = (*FAULT_KINDS, "heal")
NEMESIS_PHASES = ("start", "end")


class RunDirError(ValueError):
    """A run-directory file that does not follow the contract; names the file and the line."""

    def __init__(self, file: str, line: int | None, message: str, index: int | None = None) -> None:
        where = file if line is None else f"{file}:{line}"
        if index is not None:
            where = f"{where} [item {index}]"
        super().__init__(f"{where}: {message}")
        self.file = file
        self.line = line
        self.index = index
        self.reason = message


# -- records ---------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class OpRecord:
    """One line of ``history.jsonl``: a send, or one message returned by a read."""

    op_id: Ident
    process: Ident
    f: str
    group: str
    queue_id: int
    payload_id: Ident | None
    queue_offset: int | None
    physical_offset: int | None
    start_ms: Number
    end_ms: Number
    outcome: Outcome
    broker_id: int | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "outcome", Outcome(self.outcome))  # a bad spelling raises ValueError

    @property
    def is_send(self) -> bool:
        return self.f == "send"

    @property
    def is_read(self) -> bool:
        return self.f == "read"

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "OpRecord":
        f = _str(obj, "f", choices=OP_FUNCTIONS)
        outcome = Outcome(_str(obj, "outcome", choices=OUTCOMES))
        payload_id = _ident(obj, "payload_id", nullable=True)
        queue_offset = _int(obj, "queue_offset", nullable=True, minimum=0, absent_is_null=True)
        if payload_id is None and (f == "send" or outcome is Outcome.OK):
            raise _FieldError("key 'payload_id' must not be null for a send or an ok read")
        if f == "read" and outcome is Outcome.OK and queue_offset is None:
            raise _FieldError("key 'queue_offset' must not be null for an ok read")
        start_ms = _number(obj, "start_ms")
        end_ms = _number(obj, "end_ms")
        if end_ms < start_ms:
            raise _FieldError(f"end_ms {end_ms} is before start_ms {start_ms}")
        return cls(
            op_id=_ident(obj, "op_id"),  # type: ignore[arg-type]
            process=_ident(obj, "process"),  # type: ignore[arg-type]
            f=f,  # type: ignore[arg-type]
            group=_str(obj, "group"),  # type: ignore[arg-type]
            queue_id=_int(obj, "queue_id", minimum=0),  # type: ignore[arg-type]
            payload_id=payload_id,
            queue_offset=queue_offset,
            physical_offset=_int(obj, "physical_offset", nullable=True, minimum=0, absent_is_null=True),
            start_ms=start_ms,
            end_ms=end_ms,
            outcome=outcome,
            broker_id=_int(obj, "broker_id", nullable=True, absent_is_null=True),
            error=_str(obj, "error", nullable=True, absent_is_null=True),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "op_id": self.op_id, "process": self.process, "f": self.f, "group": self.group,
            "queue_id": self.queue_id, "payload_id": self.payload_id, "queue_offset": self.queue_offset,
            "physical_offset": self.physical_offset, "start_ms": self.start_ms, "end_ms": self.end_ms,
            "outcome": self.outcome.value, "broker_id": self.broker_id, "error": self.error,
        }


@dataclass(frozen=True, slots=True)
class NemesisEvent:
    """One line of ``nemesis.jsonl``: the start or end of one fault (or of the final heal)."""

    time_ms: Number
    kind: str
    phase: str
    target: str | None
    group: str | None = None

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "NemesisEvent":
        return cls(
            time_ms=_number(obj, "time_ms"),
            kind=_str(obj, "kind", choices=NEMESIS_KINDS),  # type: ignore[arg-type]
            phase=_str(obj, "phase", choices=NEMESIS_PHASES),  # type: ignore[arg-type]
            target=_str(obj, "target", nullable=True, absent_is_null=True),
            group=_str(obj, "group", nullable=True, absent_is_null=True),
        )

    def to_json(self) -> dict[str, Any]:
        return {"time_ms": self.time_ms, "kind": self.kind, "phase": self.phase, "target": self.target,
                "group": self.group}


def _epoch_entries(obj: dict[str, Any]) -> tuple[tuple[int, int, int], ...]:
    raw = _get(obj, "epoch_entries")
    if not isinstance(raw, list):
        raise _FieldError(f"key 'epoch_entries' must be a list, got {raw!r}")
    entries = []
    for i, entry in enumerate(raw):
        if (not isinstance(entry, list) or len(entry) != 3
                or any(isinstance(x, bool) or not isinstance(x, int) for x in entry)):
            raise _FieldError(f"epoch_entries[{i}] must be [epoch, start, end] integers, got {entry!r}")
        entries.append((entry[0], entry[1], entry[2]))
    return tuple(entries)


_QUEUE_KEYS = ("topic", "queue_id", "min_offset", "max_offset", "visible_offset")


def _queues(obj: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    raw = obj.get("queues")
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _FieldError(f"key 'queues' must be a list, got {raw!r}")
    out = []
    for i, q in enumerate(raw):
        if not isinstance(q, dict) or not isinstance(q.get("topic"), str) or any(
                isinstance(q.get(k), bool) or not isinstance(q.get(k), int) or q[k] < 0 for k in _QUEUE_KEYS[1:]):
            raise _FieldError(f"queues[{i}] must be {{topic, queue_id, min_offset, max_offset, visible_offset}} "
                              f"with non-negative integers, got {q!r}")
        out.append({k: q[k] for k in _QUEUE_KEYS})
    return tuple(out)


def _digest(obj: dict[str, Any]) -> str | None:
    value = _str(obj, "digest_to_confirm", nullable=True, absent_is_null=True)
    if value is not None:
        if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
            raise _FieldError(f"key 'digest_to_confirm' must be 64 lowercase hex digits, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class ReplicaSnapshot:
    """One item of ``replicas.json``: a replica's state taken after heal.

    ``digest_to_confirm`` (optional) is the lowercase hex SHA-256 of the replica's commit-log bytes
    ``[0, C)`` where ``C`` is the minimum ``confirm_offset`` over all replicas of the same group in
    the same ``replicas.json``; ``None`` when the runner did not compute it. ``queues`` (optional)
    are its consume-queue positions (``MessageStore.queue_positions``).
    """

    group: str
    broker_id: int
    role: str
    master_epoch: int
    epoch_entries: tuple[tuple[int, int, int], ...]
    min_offset: int
    max_offset: int
    confirm_offset: int
    digest_to_confirm: str | None = None
    queues: tuple[dict[str, Any], ...] = ()

    @property
    def is_master(self) -> bool:
        return self.role == Role.MASTER

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "ReplicaSnapshot":
        return cls(
            group=_str(obj, "group"),  # type: ignore[arg-type]
            broker_id=_int(obj, "broker_id"),  # type: ignore[arg-type]
            role=_role(obj),
            master_epoch=_int(obj, "master_epoch"),  # type: ignore[arg-type]
            epoch_entries=_epoch_entries(obj),
            min_offset=_int(obj, "min_offset", minimum=0),  # type: ignore[arg-type]
            max_offset=_int(obj, "max_offset", minimum=0),  # type: ignore[arg-type]
            confirm_offset=_int(obj, "confirm_offset"),  # type: ignore[arg-type]
            digest_to_confirm=_digest(obj),
            queues=_queues(obj),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "group": self.group, "broker_id": self.broker_id, "role": self.role,
            "master_epoch": self.master_epoch, "epoch_entries": [list(e) for e in self.epoch_entries],
            "min_offset": self.min_offset, "max_offset": self.max_offset,
            "confirm_offset": self.confirm_offset,
        }
        if self.digest_to_confirm is not None:
            out["digest_to_confirm"] = self.digest_to_confirm
        if self.queues:
            out["queues"] = [dict(q) for q in self.queues]
        return out


@dataclass(frozen=True, slots=True)
class Sample:
    """One line of ``samples.jsonl``: a periodic observation of one replica."""

    time_ms: Number
    group: str
    broker_id: int
    role: str
    master_epoch: int
    max_offset: int
    confirm_offset: int

    @property
    def is_master(self) -> bool:
        return self.role == Role.MASTER

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "Sample":
        return cls(
            time_ms=_number(obj, "time_ms"),
            group=_str(obj, "group"),  # type: ignore[arg-type]
            broker_id=_int(obj, "broker_id"),  # type: ignore[arg-type]
            role=_role(obj),
            master_epoch=_int(obj, "master_epoch"),  # type: ignore[arg-type]
            max_offset=_int(obj, "max_offset"),  # type: ignore[arg-type]
            confirm_offset=_int(obj, "confirm_offset"),  # type: ignore[arg-type]
        )

    def to_json(self) -> dict[str, Any]:
        return {"time_ms": self.time_ms, "group": self.group, "broker_id": self.broker_id, "role": self.role,
                "master_epoch": self.master_epoch, "max_offset": self.max_offset,
                "confirm_offset": self.confirm_offset}


@dataclass(frozen=True, slots=True)
class ControllerEventRecord:
    """One line of ``controller_events.jsonl``: ``index``, ``time_ms``, ``type`` and the event's fields."""

    index: int
    time_ms: Number
    type: str
    fields: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "ControllerEventRecord":
        rest = {k: v for k, v in obj.items() if k not in ("index", "time_ms", "type")}
        return cls(index=_int(obj, "index", minimum=0), time_ms=_number(obj, "time_ms"),  # type: ignore[arg-type]
                   type=_str(obj, "type"), fields=rest)  # type: ignore[arg-type]

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "time_ms": self.time_ms, "type": self.type, **self.fields}


def _role(obj: dict[str, Any]) -> str:
    """The ``role`` key: a ``Role`` by its one spelling (``MASTER``, ``SLAVE``, ``NONE``), or a legacy one."""
    value = _str(obj, "role") or ""
    value = LEGACY_ROLES.get(value, value)
    if value not in ROLES:
        raise _FieldError(f"key 'role' must be one of {', '.join(ROLES)}; got {value!r}")
    return value
