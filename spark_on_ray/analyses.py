"""Offset and epoch analytics as pure DataFrame -> DataFrame transformations.

Theory of operation. Inputs are the DataFrames of ``collect.py`` (one per record kind, fixed
schemas); every function here only composes Spark transformations and returns a new DataFrame,
so each can be tested on a few constructed rows and nothing runs until a caller collects. The
domain rules come from the reference (sections 1, 12, 13, 19):

- A group's *authoritative* replica is its master after heal (highest master epoch, then longest
  log, if there is no single one). Its epoch entries are the group's epoch history; an entry's end
  is the next entry's start, the last one ends at the replica's max offset.
- Every replica's entry for an epoch must start at the same offset as the authoritative one
  (``find_consistent_point`` relies on it). Two start offsets for one epoch across replicas, or two
  brokers reporting the master role in one epoch, is a *split-brain* finding.
- A replica's max offset only decreases by truncation (a slave cutting its divergent tail in the
  handshake, or a torn tail): consecutive samples with a smaller max offset are truncations.
- Replication lag is the master's max offset minus the replica's, as of the same moment (the
  latest master sample at or before the replica's sample); confirm lag is the master's max offset
  minus the replica's confirm offset (what consumers cannot see yet).
- A failover is what the checker calls one: a master lost (``kill-master``), lasting until the
  earliest acknowledgement of a send of that group started at or after the kill. Other faults
  (slave kills, controller kills, pauses, partitions) are measured the same way and reported under
  their own kind (``other_faults``; a fault without a group counts against every group).
- An acknowledged send that no read returned is *lost*; a payload returned at two different queue
  positions (or read twice when positions are unknown) is *duplicated*.
- Consumer-group lag over time and redeliveries around each failover are ``consumer_groups.py``'s.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from rocketray.broker.role_io import Role
from rocketray.spark_on_ray.consumer_groups import (consumer_lag, consumer_lag_summary, redeliveries_around_failovers,
                                                     redelivery_totals)

#: End offsets at or above this are "open-ended" (Java Long.MAX_VALUE in epoch files).
OPEN_END = 2**62


def is_master_role(role: Column) -> Column:
    """True where ``role`` is ``MASTER``: records hold a role by its one spelling (a saved run's
    legacy spellings are normalised by its reader, ``rocketray.verify.history``)."""
    return F.coalesce(role == Role.MASTER.value, F.lit(False))


# -- epochs ----------------------------------------------------------------------------------------

def epoch_entries(replicas: DataFrame) -> DataFrame:
    """One row per (replica, epoch entry); open-ended or missing ends become the replica's max offset."""
    exploded = replicas.select(
        "group", "broker_id", "role", is_master_role(F.col("role")).alias("is_master"),
        F.col("max_offset").alias("replica_max_offset"), F.posexplode("epoch_entries").alias("pos", "e"))
    w = Window.partitionBy("group", "broker_id").orderBy("pos")
    next_start = F.lead("e.start_offset").over(w)
    end = F.coalesce(F.when(F.col("e.end_offset") < OPEN_END, F.col("e.end_offset")), next_start,
                     F.col("replica_max_offset"))
    return exploded.select(
        "group", "broker_id", "role", "is_master", F.col("e.epoch").alias("epoch"),
        F.col("e.start_offset").alias("start_offset"), end.alias("end_offset"),
        (next_start.isNull()).alias("is_last"), "replica_max_offset")


def authoritative_replicas(replicas: DataFrame) -> DataFrame:
    """One replica per group: the master after heal (highest master epoch, then longest log, lowest id)."""
    w = Window.partitionBy("group").orderBy(
        is_master_role(F.col("role")).desc(), F.col("master_epoch").desc_nulls_last(),
        F.col("max_offset").desc_nulls_last(), F.col("broker_id").asc())
    return (replicas.withColumn("_rank", F.row_number().over(w)).where(F.col("_rank") == 1)
            .select("group", F.col("broker_id").alias("auth_broker_id"),
                    F.col("master_epoch").alias("auth_master_epoch"),
                    F.col("max_offset").alias("auth_max_offset")))


def reference_entries(replicas: DataFrame) -> DataFrame:
    """The authoritative replica's epoch entries: (group, epoch, ref_start_offset, ref_end_offset)."""
    auth = authoritative_replicas(replicas)
    entries = epoch_entries(replicas)
    return (entries.join(auth, (entries.group == auth.group) & (entries.broker_id == auth.auth_broker_id))
            .select(entries.group, "epoch", F.col("start_offset").alias("ref_start_offset"),
                    F.col("end_offset").alias("ref_end_offset"), F.col("auth_broker_id")))


def queue_positions(replicas: DataFrame) -> DataFrame:
    """Per replica and consume queue: first stored, dispatched and consumer-visible queue offsets;
    ``hidden_entries`` = dispatched but not yet visible (beyond the confirm offset); and
    ``behind_reference`` = how many visible entries the authoritative replica has that this one lacks."""
    q = replicas.select("group", "broker_id", "role", F.explode("queues").alias("q")).select(
        "group", "broker_id", "role", "q.topic", "q.queue_id", "q.min_offset", "q.max_offset", "q.visible_offset")
    auth = authoritative_replicas(replicas).select(F.col("group").alias("_g"), "auth_broker_id")
    ref = (q.join(auth, (q.group == auth._g) & (q.broker_id == auth.auth_broker_id))
           .select("group", "topic", "queue_id", F.col("visible_offset").alias("_ref_visible")))
    return (q.join(ref, ["group", "topic", "queue_id"], "left")
            .select("group", "broker_id", "role", "topic", "queue_id", "min_offset", "max_offset", "visible_offset",
                    (F.col("max_offset") - F.col("visible_offset")).alias("hidden_entries"),
                    (F.col("_ref_visible") - F.col("visible_offset")).alias("behind_reference"))
            .orderBy("group", "topic", "queue_id", "broker_id"))


def masters_by_epoch(samples: DataFrame) -> DataFrame:
    """Who reported the master role in each (group, epoch): first one, all of them, first/last seen."""
    masters = samples.where(is_master_role(F.col("role")))
    return (masters.groupBy("group", F.col("master_epoch").alias("epoch"))
            .agg(F.min_by("broker_id", "time_ms").alias("sampled_master_broker_id"),
                 F.array_sort(F.collect_set("broker_id")).alias("masters"),
                 F.min("time_ms").alias("master_first_seen_ms")))


def _elect_master_events(controller_events: DataFrame) -> DataFrame:
    norm = F.regexp_replace(F.lower(F.col("type")), "[^a-z]", "")
    return controller_events.where(norm.isin("electmasterevent", "electmaster"))


def elections(controller_events: DataFrame) -> DataFrame:
    """ElectMaster events with the master epoch each one set: the ``master_epoch`` the controller
    logged after the event, else (records without it) the n-th event of a group sets epoch n
    (reference 3.4: every ElectMasterEvent bumps the epoch)."""
    ev = _elect_master_events(controller_events)
    w = Window.partitionBy("broker_name").orderBy("index", "seq")
    counted = F.row_number().over(w).cast("long")
    return ev.select(F.col("broker_name").alias("group"), F.coalesce(F.col("master_epoch"), counted).alias("epoch"),
                     F.col("time_ms").alias("elected_ms"), "new_master_elected",
                     F.col("new_master_broker_id").alias("elected_broker_id"))


def epoch_timeline(replicas: DataFrame, samples: DataFrame, controller_events: DataFrame) -> DataFrame:
    """Per group and epoch: master broker, start/end offsets, bytes, wall-clock start/end/duration.

    An epoch is a master term the controller elected: the ``(group, master_epoch)`` of an
    ElectMasterEvent that elected a master. Every master epoch a replica records in its epoch file
    or reports as master was so elected, so with the controller's whole event log the timeline has
    exactly one row per such election (an event that logged its epoch); the epochs in the replicas'
    epoch files and master samples count too, for a log with gaps or without logged epochs. Epoch 0 is no epoch: a replica reports it until it learns the
    first one (a restarted broker between its identity and its registration). Offsets come from
    the authoritative replica's entry (else the smallest start any replica recorded); the master is
    the broker that sampled as master in that epoch (else the controller's elected broker). The
    epoch starts when it is first seen (sample or election) and ends when the next one starts.
    """
    entries = epoch_entries(replicas)
    per_epoch = entries.groupBy("group", "epoch").agg(
        F.min("start_offset").alias("min_start_offset"), F.count("*").alias("replicas_with_entry"),
        F.countDistinct("start_offset").alias("distinct_start_offsets"))
    seen = (samples.groupBy("group", F.col("master_epoch").alias("epoch"))
            .agg(F.min("time_ms").alias("first_sample_ms")))
    elected = (_elect_master_events(controller_events)
               .where(F.coalesce(F.col("new_master_elected"), F.lit(False)) & F.col("master_epoch").isNotNull())
               .select(F.col("broker_name").alias("group"), F.col("master_epoch").alias("epoch")))
    mastered = masters_by_epoch(samples).select("group", "epoch")
    keys = per_epoch.select("group", "epoch").unionByName(mastered).unionByName(elected).distinct()
    keys = keys.where(F.col("epoch").isNotNull() & (F.col("epoch") >= 1))
    ref = reference_entries(replicas)
    elect = elections(controller_events)
    t = (keys.join(per_epoch, ["group", "epoch"], "left").join(seen, ["group", "epoch"], "left")
         .join(ref, ["group", "epoch"], "left").join(masters_by_epoch(samples), ["group", "epoch"], "left")
         .join(elect, ["group", "epoch"], "left"))
    # Trust the controller's election only where it agrees with what the brokers reported (a log
    # without logged epochs may start after a snapshot, which would shift the count).
    elect_ok = F.col("elected_broker_id").isNotNull() & (
        F.col("sampled_master_broker_id").isNull()
        | (F.col("elected_broker_id") == F.col("sampled_master_broker_id")))
    start_ms = F.least(F.col("first_sample_ms"), F.when(elect_ok, F.col("elected_ms")))
    start_off = F.coalesce(F.col("ref_start_offset"), F.col("min_start_offset"))
    w = Window.partitionBy("group").orderBy("epoch")
    t = t.withColumn("start_ms", start_ms).withColumn("start_offset", start_off)
    t = t.withColumn("end_ms", F.lead("start_ms").over(w))
    t = t.withColumn("end_offset", F.coalesce(F.col("ref_end_offset"), F.lead("start_offset").over(w)))
    return t.select(
        "group", "epoch",
        F.coalesce(F.col("sampled_master_broker_id"), F.when(elect_ok, F.col("elected_broker_id")))
        .alias("master_broker_id"),
        "start_offset", "end_offset", (F.col("end_offset") - F.col("start_offset")).alias("bytes"),
        "start_ms", "end_ms", (F.col("end_ms") - F.col("start_ms")).alias("duration_ms"),
        F.coalesce("replicas_with_entry", F.lit(0)).alias("replicas_with_entry"),
        F.coalesce("distinct_start_offsets", F.lit(0)).alias("distinct_start_offsets"),
        F.coalesce(F.size("masters"), F.lit(0)).alias("masters_seen"),
    ).orderBy("group", "epoch")


def replica_agreement(replicas: DataFrame) -> DataFrame:
    """Each replica's epoch entries against the authoritative replica's.

    ``status``: ``agree`` (same start offset), ``diverged`` (different start: the logs forked),
    ``missing_on_master`` (an epoch the authoritative replica does not have).
    """
    entries = epoch_entries(replicas)
    ref = reference_entries(replicas)
    j = entries.join(ref, ["group", "epoch"], "left")
    status = (F.when(F.col("ref_start_offset").isNull(), "missing_on_master")
              .when(F.col("start_offset") == F.col("ref_start_offset"), "agree").otherwise("diverged"))
    return j.select("group", "broker_id", "role", "epoch", "start_offset", "end_offset",
                    "ref_start_offset", "ref_end_offset",
                    (F.col("broker_id") == F.col("auth_broker_id")).alias("is_authoritative"),
                    status.alias("status")).orderBy("group", "broker_id", "epoch")


def split_brain(replicas: DataFrame, samples: DataFrame) -> DataFrame:
    """Epochs with two start offsets across replicas, or two brokers in the master role."""
    starts = (epoch_entries(replicas).groupBy("group", "epoch")
              .agg(F.array_sort(F.collect_set("start_offset")).alias("start_offsets")))
    masters = masters_by_epoch(samples).select("group", "epoch", "masters")
    j = starts.join(masters, ["group", "epoch"], "full_outer")
    n_starts = F.coalesce(F.size("start_offsets"), F.lit(0))
    n_masters = F.coalesce(F.size("masters"), F.lit(0))
    reason = F.concat_ws("; ", F.when(n_starts > 1, F.lit("two start offsets")),
                         F.when(n_masters > 1, F.lit("two masters")))
    return (j.where((n_starts > 1) | (n_masters > 1))
            .select("group", "epoch", "start_offsets", "masters", reason.alias("reason"))
            .orderBy("group", "epoch"))


def truncations(samples: DataFrame) -> DataFrame:
    """Samples where a replica's max offset went down: when, from, to, and the bytes cut."""
    w = Window.partitionBy("group", "broker_id").orderBy("time_ms")
    s = samples.withColumn("prev_max_offset", F.lag("max_offset").over(w)) \
        .withColumn("prev_time_ms", F.lag("time_ms").over(w))
    return (s.where(F.col("max_offset") < F.col("prev_max_offset"))
            .select("group", "broker_id", "time_ms", "prev_time_ms", "master_epoch",
                    F.col("prev_max_offset").alias("from_offset"), F.col("max_offset").alias("to_offset"),
                    (F.col("prev_max_offset") - F.col("max_offset")).alias("bytes_truncated"))
            .orderBy("group", "broker_id", "time_ms"))


def truncation_summary(truncs: DataFrame) -> DataFrame:
    """Per replica: how many truncations and how many bytes in total."""
    return (truncs.groupBy("group", "broker_id")
            .agg(F.count("*").alias("truncations"), F.sum("bytes_truncated").alias("bytes_truncated"))
            .orderBy("group", "broker_id"))


# -- replication lag -------------------------------------------------------------------------------

def replication_lag(samples: DataFrame) -> DataFrame:
    """Per sample: the master's max offset as of that moment, bytes behind it, confirm-offset lag."""
    master = is_master_role(F.col("role"))
    w = (Window.partitionBy("group").orderBy(F.col("time_ms"), master.desc(), F.col("broker_id"))
         .rowsBetween(Window.unboundedPreceding, Window.currentRow))
    s = samples.withColumn("master_max_offset", F.last(F.when(master, F.col("max_offset")), True).over(w))
    known = F.col("master_max_offset").isNotNull()  # greatest() would turn "no master yet" into 0
    behind = F.when(known, F.greatest(F.col("master_max_offset") - F.col("max_offset"), F.lit(0)))
    confirm = F.when(known, F.greatest(F.col("master_max_offset") - F.col("confirm_offset"), F.lit(0)))
    return s.select("time_ms", "group", "broker_id", "role", "master_epoch", "max_offset", "confirm_offset",
                    "master_max_offset", behind.alias("lag_bytes"), confirm.alias("confirm_lag_bytes"))


def lag_summary(lag: DataFrame) -> DataFrame:
    """Per replica: max and mean bytes behind and confirm lag over the run."""
    return (lag.where(F.col("master_max_offset").isNotNull()).groupBy("group", "broker_id")
            .agg(F.count("*").alias("samples"), F.max("lag_bytes").alias("max_lag_bytes"),
                 F.avg("lag_bytes").alias("mean_lag_bytes"),
                 F.max("confirm_lag_bytes").alias("max_confirm_lag_bytes"),
                 F.avg("confirm_lag_bytes").alias("mean_confirm_lag_bytes"))
            .orderBy("group", "broker_id"))


# -- failovers -------------------------------------------------------------------------------------

def fault_recovery(nemesis: DataFrame, history: DataFrame) -> DataFrame:
    """One row per (fault start, group it hit): the fault time, the next acknowledged write, the gap.

    The checker's rule (``verify/checker.py`` ``failover_times``): the answer is the earliest end
    among the group's acknowledged sends that *started* at or after the fault (a send already in
    flight at the fault does not count). A fault without a group (a controller kill) counts against
    every group of the history. ``recovery_ms`` is null when no send started after the fault was
    acknowledged (the group never recovered within the run). ``heal`` events are not faults.
    """
    faults = nemesis.where((F.col("kind") != "heal") & F.coalesce(F.col("phase") == "start", F.lit(True)))
    faults = faults.withColumn("fault_id", F.row_number().over(Window.orderBy("time_ms", "kind", "target")))
    groups = history.select(F.col("group").alias("_g")).distinct()
    targeted = faults.join(groups, F.col("group").isNull() | (F.col("group") == F.col("_g")))
    targeted = targeted.select("fault_id", F.col("time_ms").alias("fault_ms"), "kind", "target",
                               F.col("_g").alias("group"))
    acks = history.where((F.col("f") == "send") & (F.col("outcome") == "ok")).select(
        F.lit(None).cast("long").alias("fault_id"), "group", F.col("start_ms").alias("t_ms"),
        F.col("end_ms").alias("ack_ms"))
    # One stream per group of sends (at their start) and faults in *descending* time; a fault's
    # answer is the smallest ack time among the rows before it in that order (the sends started at
    # or after it). A running frame (unbounded preceding) is computed incrementally. At equal times
    # sends sort first, so a send started at the fault's own millisecond counts, as in the checker.
    stream = targeted.select("fault_id", "group", F.col("fault_ms").alias("t_ms"),
                             F.lit(None).cast("double").alias("ack_ms")).unionByName(acks)
    w = (Window.partitionBy("group")
         .orderBy(F.col("t_ms").desc(), F.col("fault_id").isNotNull().asc(), F.col("fault_id"))
         .rowsBetween(Window.unboundedPreceding, -1))
    first = (stream.withColumn("first_ack_ms", F.min("ack_ms").over(w))
             .where(F.col("fault_id").isNotNull()).select("fault_id", "group", "first_ack_ms"))
    out = targeted.join(first, ["fault_id", "group"], "left")
    return out.select("fault_id", "fault_ms", "kind", "target", "group", "first_ack_ms",
                      (F.col("first_ack_ms") - F.col("fault_ms")).alias("recovery_ms"),
                      F.col("first_ack_ms").isNotNull().alias("recovered")).orderBy("fault_id", "group")


def failovers(nemesis: DataFrame, history: DataFrame) -> DataFrame:
    """What the checker calls a failover: a master lost (``kill-master``) -> the next acknowledged
    write in its group. Columns ``kill_ms`` and ``failover_ms``; see ``fault_recovery``."""
    fo = fault_recovery(nemesis.where(F.col("kind") == "kill-master"), history)
    return fo.withColumnRenamed("fault_ms", "kill_ms").withColumnRenamed("recovery_ms", "failover_ms")


def other_faults(nemesis: DataFrame, history: DataFrame) -> DataFrame:
    """Every other fault (slave and controller kills, pauses, HA partitions) under its own ``kind``,
    with the same recovery measure as ``failovers``."""
    return fault_recovery(nemesis.where(F.col("kind") != "kill-master"), history)


# -- acknowledged versus consumed -----------------------------------------------------------------

def message_fate(history: DataFrame) -> DataFrame:
    """One row per (group, payload_id): what the producers were told and what the consumers saw.

    ``status`` is one of ``ok``, ``lost`` (acknowledged, never read), ``duplicated`` (read at two
    queue positions, or read twice when positions are unknown), ``unknown_delivered``,
    ``unknown_absent``, ``failed_delivered``, ``failed_absent``, ``phantom`` (read, never sent).
    """
    h = history.where(F.col("payload_id").isNotNull())
    sends = (h.where(F.col("f") == "send").groupBy("group", "payload_id").agg(
        F.max((F.col("outcome") == "ok").cast("int")).alias("acked"),
        F.max((F.col("outcome") == "unknown").cast("int")).alias("unknown"),
        F.count("*").alias("send_attempts"),
        F.min(F.when(F.col("outcome") == "ok", F.col("end_ms"))).alias("ack_ms"),
        F.min_by("queue_id", F.when(F.col("outcome") == "ok", F.col("end_ms"))).alias("send_queue_id"),
        F.min_by("physical_offset", F.when(F.col("outcome") == "ok", F.col("end_ms"))).alias("send_physical_offset"),
        F.min_by("broker_id", F.when(F.col("outcome") == "ok", F.col("end_ms"))).alias("send_broker_id")))
    reads = (h.where((F.col("f") == "read") & (F.col("outcome") == "ok")).groupBy("group", "payload_id").agg(
        F.count("*").alias("reads"),
        F.countDistinct("queue_id", "queue_offset").alias("read_positions")))
    j = sends.join(reads, ["group", "payload_id"], "full_outer").fillna(
        0, subset=["acked", "unknown", "send_attempts", "reads", "read_positions"])
    sent = F.col("send_attempts") > 0
    read = F.col("reads") > 0
    dup = (F.col("read_positions") > 1) | ((F.col("read_positions") == 0) & (F.col("reads") > 1))
    status = (F.when(~sent, "phantom")
              .when(read & dup, "duplicated")
              .when((F.col("acked") == 1) & read, "ok")
              .when(F.col("acked") == 1, "lost")
              .when((F.col("unknown") == 1) & read, "unknown_delivered")
              .when(F.col("unknown") == 1, "unknown_absent")
              .when(read, "failed_delivered")
              .otherwise("failed_absent"))
    return j.withColumn("status", status)


def delivery_summary(fate: DataFrame) -> DataFrame:
    """Per group: acknowledged, consumed, lost, duplicated and the indeterminate counts."""
    def count_status(name: str) -> Column:
        return F.sum((F.col("status") == name).cast("long")).alias(name)

    return (fate.groupBy("group").agg(
        F.sum("acked").cast("long").alias("acknowledged"),
        F.sum((F.col("reads") > 0).cast("long")).alias("consumed"),
        count_status("lost"), count_status("duplicated"), count_status("unknown_delivered"),
        count_status("unknown_absent"), count_status("failed_delivered"), count_status("phantom"))
        .orderBy("group"))


def lost_messages(fate: DataFrame) -> DataFrame:
    """The acknowledged messages no read returned, with where the producer was told they went."""
    return (fate.where(F.col("status") == "lost")
            .select("group", "payload_id", F.col("send_queue_id").alias("queue_id"),
                    F.col("send_physical_offset").alias("physical_offset"),
                    F.col("send_broker_id").alias("broker_id"), "ack_ms")
            .orderBy("group", "ack_ms", "payload_id"))


def analyse(tables: Any, persist: bool = False) -> dict[str, DataFrame]:
    """Every analysis over collected ``Tables``, by output table name (still lazy).

    With ``persist`` the intermediate frames that feed two outputs are cached, so collecting every
    output computes each once.
    """
    fate = message_fate(tables.history)
    lag = replication_lag(tables.samples)
    truncs = truncations(tables.samples)
    group_lag = consumer_lag(tables.consumer_progress)
    if persist:
        fate, lag, truncs, group_lag = fate.persist(), lag.persist(), truncs.persist(), group_lag.persist()
    return {
        "epoch_timeline": epoch_timeline(tables.replicas, tables.samples, tables.controller_events),
        "elections": elections(tables.controller_events).orderBy("group", "epoch"),
        "queue_positions": queue_positions(tables.replicas),
        "replica_agreement": replica_agreement(tables.replicas),
        "split_brain": split_brain(tables.replicas, tables.samples),
        "truncations": truncs,
        "truncation_summary": truncation_summary(truncs),
        "replication_lag": lag,
        "lag_summary": lag_summary(lag),
        "failovers": failovers(tables.nemesis, tables.history),
        "other_faults": other_faults(tables.nemesis, tables.history),
        "delivery": delivery_summary(fate),
        "lost_messages": lost_messages(fate),
        "consumer_lag": group_lag,
        "consumer_lag_summary": consumer_lag_summary(group_lag),
        "redeliveries": redeliveries_around_failovers(tables.nemesis, tables.deliveries),
        "redelivery_totals": redelivery_totals(tables.nemesis, tables.deliveries),
    }
