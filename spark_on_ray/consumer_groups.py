"""Consumer-group analytics: lag over time and redeliveries around each failover (DataFrame -> DataFrame).

Theory of operation. The inputs are the consumer-group workload's rows of a chaos run's
``history.jsonl`` as ``collect.py`` types them: ``consumer_progress`` (one row per queue of each
``Admin.consumer_progress`` sample) and ``deliveries`` (one row per message a consumer's poll
returned), plus the nemesis log. Like ``analyses.py``, every function only composes Spark
transformations, so each is tested on a few constructed rows. The rules:

- A consumer group's *lag* is, summed over its queues, the queue's max offset minus the group's
  committed offset (never below 0), as the progress samples reported it. Over time it is bucketed
  by the sample's ``end_ms`` (when the answer came): each queue counts with its latest sample at or
  before the end of the bucket, from the first bucket that sampled it. A queue not sampled in a
  bucket (its master was failing over and did not answer) keeps its last value and is counted as
  *stale*, so a failover shows as stale queues rather than as a dip in the lag; every bucket between
  a group's first and last sample has a row, all stale if no sample landed in it.
- A *redelivery* is a delivery to a consumer group of a payload already delivered to that group,
  in delivery-time order (at-least-once allows it: a consumer crash or a rebalance before the
  commit). The payloads delivered more than once are what the checker reports as ``redelivered``
  (``verify/groups.py``, which leaves out deliveries it flagged ``corrupt:``). A delivery without a
  payload id cannot be matched and is never one.
- Around each failover (a ``kill-master`` start, numbered as ``analyses.failovers`` numbers them)
  the deliveries and redeliveries whose time is in ``[kill - 2 s, kill + 10 s)`` are counted per
  consumer group. Windows of close failovers overlap, so the per-failover counts need not add up
  to the total; ``redelivery_totals`` counts each redelivery once.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

__all__ = ["LAG_BUCKET_MS", "REDELIVERY_BEFORE_MS", "REDELIVERY_AFTER_MS", "consumer_lag", "consumer_lag_summary",
           "numbered_deliveries", "failover_events", "redeliveries_around_failovers", "redelivery_totals"]

#: Width of a consumer-lag bucket.
LAG_BUCKET_MS = 1_000
#: The window around a failover in which redeliveries are counted: [kill - before, kill + after).
REDELIVERY_BEFORE_MS = 2_000
REDELIVERY_AFTER_MS = 10_000


def consumer_lag(progress: DataFrame, bucket_ms: int = LAG_BUCKET_MS) -> DataFrame:
    """Per consumer group and time bucket (``bucket_ms`` wide, by the sample's ``end_ms``; every
    bucket from the group's first sample to its last): ``lag`` = the sum over its queues of
    ``max(max_offset - committed, 0)``, each queue as of its latest sample at or before the bucket's
    end. ``queues`` counts the queues summed (each from the first bucket that sampled it),
    ``stale_queues`` those not sampled in this bucket (last value kept)."""
    assert bucket_ms > 0
    key = ["consumer_group", "topic", "queue_id"]
    p = progress.where(F.col("end_ms").isNotNull()).select(
        *key, (F.floor(F.col("end_ms") / bucket_ms) * bucket_ms).cast("long").alias("bucket_ms"),
        F.greatest(F.col("max_offset") - F.coalesce(F.col("committed"), F.lit(0)), F.lit(0)).alias("queue_lag"),
        "committed", "max_offset", "end_ms", "start_ms")
    latest_w = Window.partitionBy(*key, "bucket_ms").orderBy(
        F.col("end_ms").desc(), F.col("start_ms").desc_nulls_last(), F.col("committed").desc_nulls_last())
    latest = (p.withColumn("_rank", F.row_number().over(latest_w)).where(F.col("_rank") == 1)
              .select(*key, "bucket_ms", "queue_lag", "committed", "max_offset",
                      F.col("bucket_ms").alias("sampled_bucket_ms")))
    # every bucket from the group's first sample to its last: one where no queue answered (the
    # sampler's call failed during a failover) is all stale rather than missing
    span = p.groupBy("consumer_group").agg(F.min("bucket_ms").alias("_first"), F.max("bucket_ms").alias("_last"))
    buckets = span.select("consumer_group", F.explode(F.sequence(
        "_first", "_last", F.lit(bucket_ms).cast("long"))).alias("bucket_ms"))
    queues = p.groupBy(*key).agg(F.min("bucket_ms").alias("first_bucket_ms"))
    grid = (queues.join(buckets, "consumer_group")
            .where(F.col("bucket_ms") >= F.col("first_bucket_ms")).select(*key, "bucket_ms"))
    carry = (Window.partitionBy(*key).orderBy("bucket_ms")
             .rowsBetween(Window.unboundedPreceding, Window.currentRow))
    filled = grid.join(latest, [*key, "bucket_ms"], "left").select(
        *key, "bucket_ms", *(F.last(c, ignorenulls=True).over(carry).alias(c)
                             for c in ("queue_lag", "committed", "max_offset", "sampled_bucket_ms")))
    return (filled.groupBy("consumer_group", "bucket_ms")
            .agg(F.sum("queue_lag").cast("long").alias("lag"), F.count("*").alias("queues"),
                 F.sum((F.col("sampled_bucket_ms") < F.col("bucket_ms")).cast("long")).alias("stale_queues"),
                 F.sum("committed").cast("long").alias("committed"),
                 F.sum("max_offset").cast("long").alias("max_offset"))
            .orderBy("consumer_group", "bucket_ms"))


def consumer_lag_summary(lag: DataFrame) -> DataFrame:
    """Per consumer group: buckets, the largest lag and when, and the lag in the last bucket."""
    last = Window.partitionBy("consumer_group").orderBy(F.col("bucket_ms").desc())
    top = Window.partitionBy("consumer_group").orderBy(F.col("lag").desc(), F.col("bucket_ms"))
    return (lag.withColumn("_last", F.row_number().over(last)).withColumn("_top", F.row_number().over(top))
            .groupBy("consumer_group")
            .agg(F.count("*").alias("buckets"), F.max("lag").alias("max_lag"),
                 F.max(F.when(F.col("_top") == 1, F.col("bucket_ms"))).alias("max_lag_bucket_ms"),
                 F.max(F.when(F.col("_last") == 1, F.col("lag"))).alias("final_lag"),
                 F.max("queues").alias("queues"))
            .orderBy("consumer_group"))


def numbered_deliveries(deliveries: DataFrame) -> DataFrame:
    """Deliveries with ``nth``: the how-many-th delivery of its payload to its consumer group (by
    time), and ``redelivery`` = ``nth > 1``. Rows without a payload id cannot be matched: ``nth`` and
    ``redelivery`` are null there."""
    w = Window.partitionBy("consumer_group", "payload_id").orderBy(
        "time_ms", "poll_start_ms", "process", "topic", "queue_id", "queue_offset", "msg_id")
    known = F.col("payload_id").isNotNull()
    nth = F.when(known, F.row_number().over(w))
    return deliveries.withColumn("nth", nth).withColumn("redelivery", F.when(known, F.col("nth") > 1))


def failover_events(nemesis: DataFrame) -> DataFrame:
    """The failovers of ``failovers``: ``kill-master`` starts, with the same ``fault_id``."""
    kills = nemesis.where((F.col("kind") == "kill-master") & F.coalesce(F.col("phase") == "start", F.lit(True)))
    return kills.select(F.row_number().over(Window.orderBy("time_ms", "kind", "target")).alias("fault_id"),
                        F.col("time_ms").alias("kill_ms"), "target", "group")


def redeliveries_around_failovers(nemesis: DataFrame, deliveries: DataFrame,
                                  before_ms: float = REDELIVERY_BEFORE_MS,
                                  after_ms: float = REDELIVERY_AFTER_MS) -> DataFrame:
    """One row per (failover, consumer group): deliveries and redeliveries (``numbered_deliveries``)
    whose ``time_ms`` is in ``[kill_ms - before_ms, kill_ms + after_ms)``; every consumer group that
    received anything gets a row for every failover, zero if nothing fell in the window."""
    kills = failover_events(nemesis)
    groups = deliveries.select("consumer_group").distinct()
    pairs = kills.crossJoin(groups).select(
        "fault_id", "kill_ms", "target", "group", "consumer_group",
        (F.col("kill_ms") - before_ms).alias("window_start_ms"), (F.col("kill_ms") + after_ms).alias("window_end_ms"))
    d = numbered_deliveries(deliveries).select(
        F.col("consumer_group").alias("_cg"), F.col("time_ms").alias("_t"),
        F.coalesce(F.col("redelivery"), F.lit(False)).cast("long").alias("_redelivery"))
    inside = ((F.col("_cg") == F.col("consumer_group")) & (F.col("_t") >= F.col("window_start_ms"))
              & (F.col("_t") < F.col("window_end_ms")))
    return (pairs.join(d, inside, "left")
            .groupBy("fault_id", "kill_ms", "target", "group", "consumer_group", "window_start_ms", "window_end_ms")
            .agg(F.count("_t").alias("deliveries"), F.coalesce(F.sum("_redelivery"), F.lit(0)).alias("redeliveries"))
            .orderBy("fault_id", "consumer_group"))


def redelivery_totals(nemesis: DataFrame, deliveries: DataFrame, before_ms: float = REDELIVERY_BEFORE_MS,
                      after_ms: float = REDELIVERY_AFTER_MS) -> DataFrame:
    """Per consumer group over the whole run: deliveries, distinct payloads, redeliveries, payloads
    delivered more than once, and the redeliveries inside at least one failover window."""
    d = numbered_deliveries(deliveries)
    kills = failover_events(nemesis).select("kill_ms")
    redelivered = d.where(F.col("redelivery"))
    near = (redelivered.join(kills, (F.col("time_ms") >= F.col("kill_ms") - before_ms)
                             & (F.col("time_ms") < F.col("kill_ms") + after_ms), "left_semi")
            .groupBy("consumer_group").agg(F.count("*").alias("redeliveries_near_failovers")))
    per_group = d.groupBy("consumer_group").agg(
        F.count("*").alias("deliveries"), F.countDistinct("payload_id").alias("payloads"),
        F.sum(F.coalesce(F.col("redelivery"), F.lit(False)).cast("long")).alias("redeliveries"),
        F.countDistinct(F.when(F.col("redelivery"), F.col("payload_id"))).alias("redelivered_payloads"))
    return (per_group.join(near, "consumer_group", "left")
            .fillna(0, subset=["redeliveries_near_failovers"]).orderBy("consumer_group"))
