"""Offset and epoch analytics with PySpark running on Ray through RayDP.

- ``session``: ``spark_session(SparkConfig())`` context manager (one RayDP session per process,
  sized for the Ray cluster found, JDK 17 flags, bounded start with one retry), ``JavaNotFoundError``.
- ``collect``: ``collect_run_dir(path, spark)`` and ``collect_records(records, spark)`` -> ``Tables``
  of Spark DataFrames, through Ray Datasets.
- ``analyses``: the pure DataFrame -> DataFrame analyses; ``analyse(tables)`` runs them all.
- ``consumer_groups``: consumer-group lag over time and redeliveries around each failover.
- ``report`` / ``pipeline``: Parquet, CSV, PNG charts, HTML report and the JSON summary.

Nothing here imports ``actors``; see docs/analytics.md.
"""
