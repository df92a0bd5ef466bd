"""The chaos run directory's files: reading and writing whole files of the records in
``rocketray.verify.history`` (one JSON object per line, ``replicas.json`` a list with one object per
line). Readers are strict: a line that is not a JSON object or fails its record's ``from_json``
raises ``RunDirError`` naming the file and the line (for ``replicas.json``, the line and list
index). ``read_run_dir`` / ``write_run_dir`` take a whole run directory (``docs/contracts.md``)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypeVar

from rocketray.verify.fields import FieldError as _FieldError
from rocketray.verify.group_history import GROUP_FUNCTIONS, GroupHistory, GroupRecord, parse_group_row
from rocketray.verify.history import (CONTROLLER_EVENTS_FILE, HISTORY_FILE, NEMESIS_FILE, OP_FUNCTIONS,
                                      REPLICAS_FILE, SAMPLES_FILE, ControllerEventRecord, NemesisEvent,
                                      OpRecord, ReplicaSnapshot, RunDirError, Sample)

R = TypeVar("R")


def _iter_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    with open(path, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                yield line_no, json.loads(line)
            except json.JSONDecodeError as exc:
                raise RunDirError(path.name, line_no, f"not valid JSON: {exc.msg}") from None


def read_jsonl(path: str | os.PathLike[str], parse: Callable[[dict[str, Any]], R]) -> list[R]:
    """Read a JSONL file of objects with ``parse`` (a ``from_json``); errors name file and line."""
    path = Path(path)
    out: list[R] = []
    for line_no, obj in _iter_jsonl(path):
        if not isinstance(obj, dict):
            raise RunDirError(path.name, line_no, f"expected a JSON object, got {type(obj).__name__}")
        try:
            out.append(parse(obj))
        except _FieldError as exc:
            raise RunDirError(path.name, line_no, str(exc)) from None
    return out


def write_jsonl(path: str | os.PathLike[str], records: Iterable[Any]) -> None:
    """Write records (anything with ``to_json()``) one JSON object per line."""
    with open(path, "w", encoding="utf-8") as fh:
        for record in records:
            fh.write(json.dumps(record.to_json(), separators=(",", ":")) + "\n")


def _history_row(obj: dict[str, Any]) -> OpRecord | GroupRecord:
    if obj.get("f") in GROUP_FUNCTIONS:
        return parse_group_row(obj)
    if obj.get("f") not in OP_FUNCTIONS:
        raise _FieldError(f"key 'f' must be one of {', '.join(OP_FUNCTIONS + GROUP_FUNCTIONS)}; "
                          f"got {obj.get('f')!r}")
    return OpRecord.from_json(obj)


def read_history_all(path: str | os.PathLike[str]) -> tuple[list[OpRecord], GroupHistory]:
    """Every line of ``history.jsonl``: the sends and reads, and the consumer-group rows."""
    rows = read_jsonl(path, _history_row)
    return ([r for r in rows if isinstance(r, OpRecord)],
            GroupHistory.of([r for r in rows if not isinstance(r, OpRecord)]))


def read_history(path: str | os.PathLike[str]) -> list[OpRecord]:
    """The sends and reads of ``history.jsonl`` (every line is validated; consumer-group rows are
    left out: :func:`read_history_all` returns them too)."""
    return read_history_all(path)[0]


def read_nemesis(path: str | os.PathLike[str]) -> list[NemesisEvent]:
    return read_jsonl(path, NemesisEvent.from_json)


def read_samples(path: str | os.PathLike[str]) -> list[Sample]:
    return read_jsonl(path, Sample.from_json)


def read_controller_events(path: str | os.PathLike[str]) -> list[ControllerEventRecord]:
    return read_jsonl(path, ControllerEventRecord.from_json)


def read_replicas(path: str | os.PathLike[str]) -> list[ReplicaSnapshot]:
    """Read ``replicas.json`` (a JSON list); errors name the file, the line and the list index."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RunDirError(path.name, exc.lineno, f"not valid JSON: {exc.msg}") from None
    if not isinstance(raw, list):
        raise RunDirError(path.name, 1, f"expected a JSON list, got {type(raw).__name__}")
    item_lines = _item_lines(text, len(raw))
    out = []
    for i, obj in enumerate(raw):
        line = item_lines[i] if i < len(item_lines) else None
        if not isinstance(obj, dict):
            raise RunDirError(path.name, line, f"expected a JSON object, got {type(obj).__name__}", index=i)
        try:
            out.append(ReplicaSnapshot.from_json(obj))
        except _FieldError as exc:
            raise RunDirError(path.name, line, str(exc), index=i) from None
    return out


def _item_lines(text: str, count: int) -> list[int]:
    """Line number where each top-level item of a JSON list starts (best effort, for error messages)."""
    decoder = json.JSONDecoder()
    lines: list[int] = []
    pos = text.index("[") + 1
    for _ in range(count):
        while text[pos] in " \t\r\n,":
            pos += 1
        lines.append(text.count("\n", 0, pos) + 1)
        _, pos = decoder.raw_decode(text, pos)
    return lines


def write_replicas(path: str | os.PathLike[str], replicas: Iterable[ReplicaSnapshot]) -> None:
    """Write ``replicas.json``: a list with one object per line."""
    items = [json.dumps(r.to_json(), separators=(",", ":")) for r in replicas]
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("[\n" + ",\n".join(items) + ("\n" if items else "") + "]\n")


@dataclass(frozen=True, slots=True)
class RunData:
    """Everything a chaos run directory holds, parsed. Absent optional files read as empty."""

    ops: tuple[OpRecord, ...]
    nemesis: tuple[NemesisEvent, ...] = ()
    replicas: tuple[ReplicaSnapshot, ...] = ()
    samples: tuple[Sample, ...] = ()
    controller_events: tuple[ControllerEventRecord, ...] = ()
    #: the consumer-group rows of ``history.jsonl`` (deliveries, commits, progress, consumer events)
    groups: GroupHistory = GroupHistory()


def read_run_dir(path: str | os.PathLike[str]) -> RunData:
    """Parse a run directory. ``history.jsonl`` is required; the other files are optional."""
    root = Path(path)
    history = root / HISTORY_FILE
    if not history.is_file():
        raise RunDirError(HISTORY_FILE, None, f"required file is missing from {root}")

    def optional(name: str, reader: Callable[[Path], list[R]]) -> tuple[R, ...]:
        p = root / name
        return tuple(reader(p)) if p.is_file() else ()

    ops, groups = read_history_all(history)
    return RunData(
        ops=tuple(ops),
        nemesis=optional(NEMESIS_FILE, read_nemesis),
        replicas=optional(REPLICAS_FILE, read_replicas),
        samples=optional(SAMPLES_FILE, read_samples),
        controller_events=optional(CONTROLLER_EVENTS_FILE, read_controller_events),
        groups=groups,
    )


def write_run_dir(path: str | os.PathLike[str], run: RunData) -> None:
    """Write every file of a run directory (creating the directory); the inverse of ``read_run_dir``."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    write_jsonl(root / HISTORY_FILE, [*run.ops, *run.groups.records()])
    write_jsonl(root / NEMESIS_FILE, run.nemesis)
    write_replicas(root / REPLICAS_FILE, run.replicas)
    write_jsonl(root / SAMPLES_FILE, run.samples)
    write_jsonl(root / CONTROLLER_EVENTS_FILE, run.controller_events)
