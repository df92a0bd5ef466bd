"""Collection: chaos run directories and live record lists -> Ray Datasets -> Spark DataFrames.

Theory of operation. A chaos run directory (docs/contracts.md) is read by the one reader the
checker uses, ``rocketray.verify.run_dir.read_run_dir`` (strict: a malformed line is a
``CollectError`` naming the file and the line), and its typed records become record lists like the
ones a live cluster hands over. Every record kind has one fixed Arrow schema here (``SCHEMAS``) and
one normaliser that turns a record (a dict shaped like a run-directory line) into a row of that
schema: identifiers that may be ints or strings become strings, wall-clock times become int64
milliseconds, missing "null if unknown" keys become nulls, epoch entries become structs, and
controller events keep the columns the analyses use plus the rest as a JSON string. The consumer-group
workload's rows of ``history.jsonl`` (``f`` = ``deliver``, ``progress``; docs/contracts.md) become
kinds of their own, ``deliveries`` and ``consumer_progress``, with their own schemas; its ``commit``
and ``consumer`` rows are not analysed here and are left out. The rows
become a Ray Dataset (``from_arrow``) and RayDP's ``Dataset.to_spark`` hands the blocks to Spark
through the Ray object store: no intermediate files. This module does not import ``actors``
(DESIGN.md: dependencies point from actors to spark_on_ray).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import pyarrow as pa

from rocketray.verify import history as run_format
from rocketray.verify.group_history import GROUP_FUNCTIONS
from rocketray.verify.run_dir import read_run_dir

HISTORY = "history"
NEMESIS = "nemesis"
REPLICAS = "replicas"
SAMPLES = "samples"
CONTROLLER_EVENTS = "controller_events"
DELIVERIES = "deliveries"
CONSUMER_PROGRESS = "consumer_progress"

#: record kind -> file name in a run directory
FILES = {
    HISTORY: run_format.HISTORY_FILE,
    NEMESIS: run_format.NEMESIS_FILE,
    REPLICAS: run_format.REPLICAS_FILE,
    SAMPLES: run_format.SAMPLES_FILE,
    CONTROLLER_EVENTS: run_format.CONTROLLER_EVENTS_FILE,
}

#: history rows of the consumer-group workload (``f``) -> the record kind they become (None: left out)
GROUP_ROWS = {**dict.fromkeys(GROUP_FUNCTIONS), "deliver": DELIVERIES, "progress": CONSUMER_PROGRESS}

EPOCH_ENTRY_TYPE = pa.struct([("epoch", pa.int64()), ("start_offset", pa.int64()), ("end_offset", pa.int64())])
QUEUE_TYPE = pa.struct([("topic", pa.string()), ("queue_id", pa.int64()), ("min_offset", pa.int64()),
                        ("max_offset", pa.int64()), ("visible_offset", pa.int64())])

SCHEMAS: dict[str, pa.Schema] = {
    HISTORY: pa.schema([
        ("op_id", pa.string()), ("process", pa.string()), ("f", pa.string()), ("group", pa.string()),
        ("queue_id", pa.int64()), ("payload_id", pa.string()), ("queue_offset", pa.int64()),
        ("physical_offset", pa.int64()), ("start_ms", pa.float64()), ("end_ms", pa.float64()),
        ("outcome", pa.string()), ("broker_id", pa.int64()), ("error", pa.string()),
    ]),
    NEMESIS: pa.schema([
        ("time_ms", pa.float64()), ("kind", pa.string()), ("phase", pa.string()), ("target", pa.string()),
        ("group", pa.string()),
    ]),
    REPLICAS: pa.schema([
        ("group", pa.string()), ("broker_id", pa.int64()), ("role", pa.string()), ("master_epoch", pa.int64()),
        ("epoch_entries", pa.list_(EPOCH_ENTRY_TYPE)), ("min_offset", pa.int64()), ("max_offset", pa.int64()),
        ("confirm_offset", pa.int64()), ("queues", pa.list_(QUEUE_TYPE)),
    ]),
    SAMPLES: pa.schema([
        ("time_ms", pa.int64()), ("group", pa.string()), ("broker_id", pa.int64()), ("role", pa.string()),
        ("master_epoch", pa.int64()), ("max_offset", pa.int64()), ("confirm_offset", pa.int64()),
    ]),
    CONTROLLER_EVENTS: pa.schema([
        ("index", pa.int64()), ("seq", pa.int64()), ("time_ms", pa.int64()), ("type", pa.string()),
        ("broker_name", pa.string()), ("new_master_elected", pa.bool_()), ("new_master_broker_id", pa.int64()),
        ("master_broker_id", pa.int64()), ("master_epoch", pa.int64()), ("sync_state_set_epoch", pa.int64()),
        ("fields_json", pa.string()),
    ]),
    DELIVERIES: pa.schema([
        ("process", pa.string()), ("consumer_group", pa.string()), ("topic", pa.string()), ("queue_id", pa.int64()),
        ("queue_offset", pa.int64()), ("payload_id", pa.string()), ("msg_id", pa.string()),
        ("poll_start_ms", pa.float64()), ("time_ms", pa.float64()),
    ]),
    CONSUMER_PROGRESS: pa.schema([
        ("consumer_group", pa.string()), ("topic", pa.string()), ("queue_id", pa.int64()), ("committed", pa.int64()),
        ("max_offset", pa.int64()), ("start_ms", pa.float64()), ("end_ms", pa.float64()),
    ]),
}

#: Every record kind, in the order of ``Tables``.
KINDS = tuple(SCHEMAS)

#: Rows per Ray block made from live record lists (each block is fetched by Spark on its own).
ROWS_PER_BLOCK = 500_000


class CollectError(ValueError):
    """A record that does not follow the run-directory contract; names the kind and the record."""


@dataclass(frozen=True)
class Tables:
    """The collected inputs, one Spark DataFrame per record kind (empty with schema if absent)."""

    history: Any
    nemesis: Any
    replicas: Any
    samples: Any
    controller_events: Any
    deliveries: Any
    consumer_progress: Any

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


# -- normalisers (pure) ----------------------------------------------------------------------------

def _ident(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise CollectError(f"identifier must be a string or an integer, got {value!r}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def _int(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise CollectError(f"expected an integer, got {value!r}")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CollectError(f"expected a finite number, got {value!r}")
        return int(round(value))
    if isinstance(value, int):
        return value
    raise CollectError(f"expected an integer, got {value!r}")


def _time(value: Any) -> float | None:
    """A wall-clock time in ms, kept to the fraction: a send that started 0.4 ms before a kill
    must not sort with it (rounded to whole ms the analytics counted it as the failover's first
    write, 8 ms, where the checker rightly waits for one that started after the kill, 114 ms)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CollectError(f"expected a time in ms, got {value!r}")
    if not math.isfinite(value):
        raise CollectError(f"expected a finite time, got {value!r}")
    return float(value)


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def normalize_history(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "op_id": _ident(obj["op_id"]), "process": _ident(obj.get("process")), "f": _str(obj["f"]),
        "group": _str(obj["group"]), "queue_id": _int(obj.get("queue_id")),
        "payload_id": _ident(obj.get("payload_id")), "queue_offset": _int(obj.get("queue_offset")),
        "physical_offset": _int(obj.get("physical_offset")), "start_ms": _time(obj["start_ms"]),
        "end_ms": _time(obj["end_ms"]), "outcome": _str(obj["outcome"]), "broker_id": _int(obj.get("broker_id")),
        "error": _str(obj.get("error")),
    }


def normalize_nemesis(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {"time_ms": _time(obj["time_ms"]), "kind": _str(obj["kind"]), "phase": _str(obj.get("phase")),
            "target": _ident(obj.get("target")), "group": _str(obj.get("group"))}


def _epoch_entry(entry: Any) -> dict[str, int | None]:
    if isinstance(entry, Mapping):
        return {"epoch": _int(entry["epoch"]), "start_offset": _int(entry.get("start_offset", entry.get("start"))),
                "end_offset": _int(entry.get("end_offset", entry.get("end")))}
    if not isinstance(entry, (list, tuple)) or len(entry) not in (2, 3):
        raise CollectError(f"epoch entry must be [epoch, start, end], got {entry!r}")
    end = entry[2] if len(entry) == 3 else None
    return {"epoch": _int(entry[0]), "start_offset": _int(entry[1]), "end_offset": _int(end)}


def normalize_replica(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "group": _str(obj["group"]), "broker_id": _int(obj["broker_id"]), "role": _str(obj["role"]),
        "master_epoch": _int(obj.get("master_epoch")),
        "epoch_entries": [_epoch_entry(e) for e in obj.get("epoch_entries") or []],
        "min_offset": _int(obj.get("min_offset")), "max_offset": _int(obj.get("max_offset")),
        "confirm_offset": _int(obj.get("confirm_offset")),
        "queues": [{"topic": _str(q["topic"]), "queue_id": _int(q["queue_id"]), "min_offset": _int(q.get("min_offset")),
                    "max_offset": _int(q.get("max_offset")), "visible_offset": _int(q.get("visible_offset"))}
                   for q in obj.get("queues") or []],
    }


def normalize_sample(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {"time_ms": _int(obj["time_ms"]), "group": _str(obj["group"]), "broker_id": _int(obj["broker_id"]),
            "role": _str(obj.get("role")), "master_epoch": _int(obj.get("master_epoch")),
            "max_offset": _int(obj.get("max_offset")), "confirm_offset": _int(obj.get("confirm_offset"))}


def normalize_controller_event(obj: Mapping[str, Any]) -> dict[str, Any]:
    """One event-log record; ``seq`` (position in its Raft batch) defaults to 0 and the group's
    state after the event (``master_broker_id``, ``master_epoch``, ...) to null when absent."""
    rest = {k: v for k, v in obj.items() if k not in ("index", "time_ms", "type")}
    elected = obj.get("new_master_elected")
    return {
        "index": _int(obj["index"]), "seq": _int(obj.get("seq")) or 0, "time_ms": _int(obj.get("time_ms")),
        "type": _str(obj["type"]), "broker_name": _str(obj.get("broker_name")),
        "new_master_elected": None if elected is None else bool(elected),
        "new_master_broker_id": _int(obj.get("new_master_broker_id")),
        "master_broker_id": _int(obj.get("master_broker_id")), "master_epoch": _int(obj.get("master_epoch")),
        "sync_state_set_epoch": _int(obj.get("sync_state_set_epoch")),
        "fields_json": json.dumps(rest, sort_keys=True, default=_json_default),
    }


def normalize_delivery(obj: Mapping[str, Any]) -> dict[str, Any]:
    """One ``deliver`` row: a message a consumer's poll returned (``time_ms``: when it returned)."""
    return {"process": _ident(obj.get("process")), "consumer_group": _str(obj["consumer_group"]),
            "topic": _str(obj.get("topic")), "queue_id": _int(obj.get("queue_id")),
            "queue_offset": _int(obj.get("queue_offset")), "payload_id": _ident(obj.get("payload_id")),
            "msg_id": _str(obj.get("msg_id")), "poll_start_ms": _time(obj.get("poll_start_ms")),
            "time_ms": _time(obj["time_ms"])}


def normalize_consumer_progress(obj: Mapping[str, Any]) -> dict[str, Any]:
    """One ``progress`` row: one queue of one ``Admin.consumer_progress`` sample."""
    return {"consumer_group": _str(obj["consumer_group"]), "topic": _str(obj["topic"]),
            "queue_id": _int(obj["queue_id"]), "committed": _int(obj.get("committed")),
            "max_offset": _int(obj["max_offset"]), "start_ms": _time(obj.get("start_ms")),
            "end_ms": _time(obj["end_ms"])}


def _json_default(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return str(value)


NORMALIZERS: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    HISTORY: normalize_history,
    NEMESIS: normalize_nemesis,
    REPLICAS: normalize_replica,
    SAMPLES: normalize_sample,
    CONTROLLER_EVENTS: normalize_controller_event,
    DELIVERIES: normalize_delivery,
    CONSUMER_PROGRESS: normalize_consumer_progress,
}


def split_history(records: Mapping[str, list[Mapping[str, Any]]]) -> dict[str, list[Mapping[str, Any]]]:
    """``records`` with the consumer-group rows of ``history`` (``GROUP_ROWS``) moved to their own
    kinds (after any rows of those kinds given directly); the workload's other rows dropped."""
    out: dict[str, list[Mapping[str, Any]]] = {kind: list(rows or []) for kind, rows in records.items()}
    history = []
    for row in out.get(HISTORY, []):
        f = row.get("f")
        if f in GROUP_ROWS:
            kind = GROUP_ROWS[f]
            if kind is not None:
                out.setdefault(kind, []).append(row)
        else:
            history.append(row)
    out[HISTORY] = history
    return out


def records_to_arrow(kind: str, records: Iterable[Mapping[str, Any]]) -> pa.Table:
    """Normalise ``records`` of one kind into an Arrow table of that kind's schema."""
    normalize = NORMALIZERS[kind]
    rows = []
    for i, obj in enumerate(records):
        try:
            rows.append(normalize(obj))
        except (KeyError, TypeError, ValueError) as exc:
            raise CollectError(f"{kind} record {i}: {exc!r} in {dict(obj)!r}"[:500]) from exc
    return pa.Table.from_pylist(rows, schema=SCHEMAS[kind])


# -- Ray Data -> Spark -----------------------------------------------------------------------------
#
# PySpark 3.5's Arrow conversion inside RayDP's reader (mapInPandas) fails on array<struct> columns
# once a block holds more than a few rows ("Expected Array, got ChunkedArray"), so nested columns
# cross into Spark as JSON text and are parsed back with ``from_json`` on the Spark side.

NESTED_COLUMNS = {REPLICAS: ("epoch_entries", "queues")}


def to_transport(kind: str, table: pa.Table) -> pa.Table:
    """The Arrow table that travels through Ray into Spark: nested columns as JSON strings."""
    for name in NESTED_COLUMNS.get(kind, ()):
        i = table.schema.get_field_index(name)
        text = pa.array([None if v is None else json.dumps(v) for v in table.column(name).to_pylist()],
                        pa.string())
        table = table.set_column(i, pa.field(name, pa.string()), text)
    return table


def _from_transport(kind: str, df: Any) -> Any:
    from pyspark.sql import functions as F

    names = NESTED_COLUMNS.get(kind, ())
    if not names:
        return df.select(*SCHEMAS[kind].names)
    fields_by_name = {f.name: f for f in spark_schema(kind).fields}
    return df.select(*[F.from_json(F.col(n), fields_by_name[n].dataType).alias(n) if n in names else F.col(n)
                       for n in SCHEMAS[kind].names])


def dataset_to_spark(spark: Any, kind: str, ds: Any) -> Any:
    """Materialise ``ds`` (blocks in the transport schema) and hand it to Spark through RayDP.

    Returns a DataFrame of the kind's schema (nested columns parsed back); empty -> empty with schema.
    """
    ds = ds.materialize()
    if ds.count() == 0:
        return spark.createDataFrame([], spark_schema(kind))
    return _from_transport(kind, ray_dataset_to_spark(ds, spark))


def ray_dataset_to_spark(ds: Any, spark: Any) -> Any:
    """RayDP's ``Dataset.to_spark``, with each block's columns combined into one Arrow chunk.

    Same mechanism as RayDP 1.6.5 (the block refs are parked in the RayDP master actor, the JVM's
    ``ObjectStoreReader`` makes one row per block, and a ``mapInPandas`` on the executors fetches
    the blocks from the object store), with one fix: under pandas 3 a multi-chunk Arrow column
    becomes a chunked pandas string array, which PySpark 3.5 cannot turn back into Arrow
    ("Expected Array, got ChunkedArray"), so every block is ``combine_chunks()``-ed first and
    handed over on its own instead of ``pd.concat``-ed with its neighbours.
    """
    import logging
    import uuid

    import ray
    from pyspark.sql import DataFrame
    from pyspark.sql.pandas.types import from_arrow_schema
    from raydp.spark.dataset import get_locations
    from raydp.spark.ray_cluster_master import RAYDP_SPARK_MASTER_SUFFIX

    arrow_schema = ds.schema().base_schema
    refs = ds.to_arrow_refs()
    locations = get_locations(refs)
    holder_name = spark.sparkContext.appName + RAYDP_SPARK_MASTER_SUFFIX
    holder = ray.get_actor(holder_name)
    df_id = uuid.uuid4()
    ray.get(holder.add_objects.remote(df_id, refs))
    ray_address = ray.get(holder.get_ray_address.remote())
    namespace = ray.get_runtime_context().namespace
    reader = spark.sparkContext._jvm.org.apache.spark.sql.raydp.ObjectStoreReader
    blocks_df = DataFrame(reader.createRayObjectRefDF(spark._jsparkSession, locations), spark)

    def fetch_blocks(batches: Any) -> Any:
        import ray as ray_worker

        if not ray_worker.is_initialized():
            ray_worker.init(address=ray_address, namespace=namespace, logging_level=logging.WARNING)
        parked = ray_worker.get_actor(holder_name)
        for batch in batches:
            for idx in batch["idx"]:
                table = ray_worker.get(ray_worker.get(parked.get_object.remote(df_id, idx)))
                yield table.combine_chunks().to_pandas()

    return blocks_df.mapInPandas(fetch_blocks, from_arrow_schema(arrow_schema))


def _spark(spark: Any) -> Any:
    if spark is not None:
        return spark
    from rocketray.spark_on_ray.session import active_spark

    return active_spark()


def run_dir_records(path: str | Path) -> dict[str, list[dict[str, Any]]]:
    """A chaos run directory as record lists, read by the checker's reader (``verify/run_dir.py``).

    ``history.jsonl`` and ``replicas.json`` are required; the other files may be absent (empty).
    The consumer-group rows of ``history.jsonl`` come back as ``deliveries`` and
    ``consumer_progress`` (the reader's ``RunData.groups``).
    """
    root = Path(path)
    if not root.is_dir():
        raise CollectError(f"{root} is not a directory")
    if not (root / FILES[REPLICAS]).is_file():
        raise CollectError(f"{root / FILES[REPLICAS]} is missing: a chaos run directory needs {FILES[REPLICAS]}")
    try:
        run = read_run_dir(root)
    except run_format.RunDirError as exc:
        raise CollectError(f"{root}: {exc}") from exc
    parts = {HISTORY: run.ops, NEMESIS: run.nemesis, REPLICAS: run.replicas, SAMPLES: run.samples,
             CONTROLLER_EVENTS: run.controller_events, DELIVERIES: run.groups.deliveries,
             CONSUMER_PROGRESS: run.groups.progress}
    return {kind: [record.to_json() for record in records] for kind, records in parts.items()}


def collect_run_dir(path: str | Path, spark: Any = None) -> Tables:
    """A chaos run directory's records as Spark DataFrames (``run_dir_records`` then ``collect_records``)."""
    return collect_records(run_dir_records(path), spark)


def collect_records(records: Mapping[str, list[dict[str, Any]]], spark: Any = None) -> Tables:
    """Record lists (a run directory's, or gathered through Ray from a live cluster) as DataFrames.

    ``records`` maps each kind (``history``, ``nemesis``, ``replicas``, ``samples``,
    ``controller_events``, ``deliveries``, ``consumer_progress``) to a list of dicts shaped like the
    run directory's lines; missing kinds are empty. Consumer-group rows inside ``history`` go to
    their own kinds (``split_history``). Rows are normalised in this process and become a Ray
    Dataset (``from_arrow``) before Spark reads them from the object store. ``spark`` defaults to
    the session of ``rocketray.spark_on_ray.session.spark_session``.
    """
    import ray.data

    spark = _spark(spark)
    unknown = set(records) - set(KINDS)
    if unknown:
        raise CollectError(f"unknown record kinds {sorted(unknown)}; expected {sorted(KINDS)}")
    records = split_history(records)
    frames: dict[str, Any] = {}
    for kind in KINDS:
        table = to_transport(kind, records_to_arrow(kind, records.get(kind) or []))
        ds = ray.data.from_arrow([table.slice(i, ROWS_PER_BLOCK) for i in range(0, max(1, table.num_rows),
                                                                             ROWS_PER_BLOCK)])
        frames[kind] = dataset_to_spark(spark, kind, ds)
    return Tables(**frames)


def spark_schema(kind: str) -> Any:
    """The Spark StructType of a record kind (for empty frames and constructed test inputs)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(SCHEMAS[kind])
