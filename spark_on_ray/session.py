"""The Spark session on Ray (RayDP): sizing, JDK 17 options, bounded start with one retry, shutdown.

Theory of operation. RayDP runs Spark's executors (and its app master) as Ray actors and the Spark
driver in this process; only one RayDP session can exist per process, so this module keeps it as
the package's one global (STYLE.md section 8) behind a re-entrant context manager: the outermost
``spark_session()`` starts it and stops it, inner ones (a CLI run inside a test that already holds a
session) reuse it. Start-up is bounded: ``raydp.init_spark`` plus a one-row warm-up job run in a
helper thread; if they do not finish within ``start_timeout_s`` the RayDP master actor is killed
(which unblocks the helper), the half-started session is torn down and the start is tried once
more. Sizing is a pure function of the Ray resources found (``plan_resources``), so a session fits
next to a live rocketray cluster on a 2-core machine: one executor, one core, ~1 GB by default,
with fractional executor CPU when fewer than the requested cores are free.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator

log = logging.getLogger(__name__)

#: JDK packages Spark reflects into; without these ``--add-opens`` JDK 17 kills the app master.
ADD_OPENS_PACKAGES = (
    "java.lang", "java.lang.invoke", "java.io", "java.net", "java.nio", "java.math", "java.text",
    "java.util", "java.util.concurrent", "java.util.concurrent.atomic", "sun.nio.ch", "sun.nio.cs",
    "sun.security.action", "sun.util.calendar",
)

JDK17_JAVA_OPTIONS = " ".join(
    ["-XX:+IgnoreUnrecognizedVMOptions"]
    + [f"--add-opens=java.base/{pkg}=ALL-UNNAMED" for pkg in ADD_OPENS_PACKAGES]
)

_MASTER_SUFFIX = "_SPARK_MASTER"  # raydp.spark.ray_cluster_master.RAYDP_SPARK_MASTER_SUFFIX


class SparkOnRayError(RuntimeError):
    """Spark on Ray could not be started or used; ``retriable`` says whether trying again may help."""

    retriable = False


class JavaNotFoundError(SparkOnRayError):
    """No usable ``java`` (Spark needs a JVM): install OpenJDK 17 or point JAVA_HOME at one."""


class SparkStartTimeout(SparkOnRayError):
    """RayDP did not bring Spark up within the deadline, twice."""

    retriable = True


@dataclass(frozen=True, slots=True)
class SparkConfig:
    """What to ask RayDP for. Defaults fit a 2-core machine shared with a live cluster."""

    app_name: str = "rocketray-analytics"
    num_executors: int = 1
    executor_cores: int = 1
    executor_memory: str = "1g"
    driver_memory: str = "768m"
    shuffle_partitions: int = 4
    start_timeout_s: float = 120.0
    start_attempts: int = 2
    # Ray used when none is running: small, to leave memory and cores for the others.
    local_num_cpus: int | None = None
    local_object_store_bytes: int = 500 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ResourcePlan:
    """The result of sizing: Spark's own numbers plus the Ray CPU each executor actor reserves."""

    num_executors: int
    executor_cores: int
    executor_actor_cpu: float
    executor_memory: str


def plan_resources(config: SparkConfig, available_cpu: float, total_cpu: float,
                   headroom_cpu: float = 0.25) -> ResourcePlan:
    """Size the session for the Ray cluster found.

    Spark always gets ``executor_cores`` task slots per executor; the Ray CPU reservation of each
    executor actor is what has to fit. Executors are capped at what the cluster could ever hold
    (``total_cpu // executor_cores``, at least 1). When the free CPU cannot cover the request plus
    ``headroom_cpu`` (left for the Ray Data tasks that collect the inputs), because a live cluster's
    actors hold the cores, each executor reserves a share of what is free minus the headroom,
    never more than it asked for and never below 0.01.
    """
    assert config.num_executors >= 1
    assert config.executor_cores >= 1
    assert headroom_cpu >= 0
    max_executors = max(1, int(total_cpu // config.executor_cores)) if total_cpu > 0 else 1
    executors = min(config.num_executors, max_executors)
    actor_cpu = float(config.executor_cores)
    if available_cpu < executors * actor_cpu + headroom_cpu:
        share = (available_cpu - headroom_cpu) / executors
        actor_cpu = max(0.01, min(actor_cpu, round(share, 2)))
    return ResourcePlan(num_executors=executors, executor_cores=config.executor_cores,
                        executor_actor_cpu=actor_cpu, executor_memory=config.executor_memory)


def spark_configs(config: SparkConfig, plan: ResourcePlan) -> dict[str, str]:
    """The Spark properties handed to ``raydp.init_spark`` (JDK 17 flags on every JVM)."""
    return {
        "spark.executor.extraJavaOptions": JDK17_JAVA_OPTIONS,
        "spark.driver.extraJavaOptions": JDK17_JAVA_OPTIONS,
        "spark.ray.raydp_app_master.extraJavaOptions": JDK17_JAVA_OPTIONS,
        # The app master is a light JVM; reserving a whole core for it would starve a 2-core box.
        "spark.ray.raydp_spark_master.actor.resource.CPU": "0",
        "spark.ray.raydp_spark_executor.actor.resource.cpu": f"{plan.executor_actor_cpu:g}",
        "spark.driver.memory": config.driver_memory,
        "spark.sql.shuffle.partitions": str(config.shuffle_partitions),
        "spark.default.parallelism": str(max(1, plan.num_executors * plan.executor_cores)),
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
    }


def find_java(env: dict[str, str] | None = None) -> str:
    """Path of the ``java`` Spark will run: ``$JAVA_HOME/bin/java`` if JAVA_HOME is set, else PATH.

    Raises ``JavaNotFoundError`` with what to install when there is none, or when it does not run.
    """
    env = dict(os.environ if env is None else env)
    java_home = env.get("JAVA_HOME")
    candidate: str | None
    if java_home:
        candidate = os.path.join(java_home, "bin", "java")
        if not os.access(candidate, os.X_OK):
            raise JavaNotFoundError(
                f"JAVA_HOME={java_home!r} has no executable bin/java; Spark on Ray needs a Java runtime: "
                "install OpenJDK 17 (e.g. `apt-get install openjdk-17-jre-headless`) and set JAVA_HOME "
                "to it (e.g. /usr/lib/jvm/java-17-openjdk-amd64), or unset JAVA_HOME to use java on PATH")
    else:
        candidate = shutil.which("java", path=env.get("PATH"))
        if candidate is None:
            raise JavaNotFoundError(
                "no `java` on PATH and JAVA_HOME is not set; Spark on Ray needs a Java runtime: "
                "install OpenJDK 17 (e.g. `apt-get install openjdk-17-jre-headless`) and set JAVA_HOME "
                "to it (e.g. /usr/lib/jvm/java-17-openjdk-amd64) or put its bin/ on PATH")
    try:
        subprocess.run([candidate, "-version"], capture_output=True, timeout=30, check=True, env=env)
    except (OSError, subprocess.SubprocessError) as exc:
        raise JavaNotFoundError(
            f"{candidate} -version failed ({exc}); install OpenJDK 17 and set JAVA_HOME to it") from exc
    return candidate


def ensure_ray(address: str | None = "auto", config: SparkConfig = SparkConfig()) -> str:
    """Connect to the Ray this process should use; returns "existing", "connected" or "local".

    Already initialised: keep it. Otherwise try ``ray.init(address=address)`` (``"auto"`` finds a
    running cluster); when there is none, start a small local Ray.
    """
    import ray

    if ray.is_initialized():
        return "existing"
    if address:
        try:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
            return "connected"
        except ConnectionError:
            log.info("no running Ray found at %s; starting a local one", address)
    ray.init(num_cpus=config.local_num_cpus, include_dashboard=False,
             object_store_memory=config.local_object_store_bytes,
             logging_level=logging.WARNING, log_to_driver=False)
    return "local"


def _quiet_ray_data() -> None:
    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    with contextlib.suppress(AttributeError):
        ctx.print_on_execution_start = False


def _start_once(config: SparkConfig, plan: ResourcePlan, app_name: str) -> Any:
    """One bounded attempt; returns the SparkSession or raises ``SparkStartTimeout``."""
    import ray
    import raydp

    box: dict[str, Any] = {}

    def target() -> None:
        try:
            spark = raydp.init_spark(app_name, plan.num_executors, plan.executor_cores,
                                     plan.executor_memory, configs=spark_configs(config, plan))
            box["spark"] = spark
            spark.sparkContext.setLogLevel("ERROR")
            spark.range(1).count()  # waits until an executor actually runs a task
            box["ok"] = True
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="raydp-init", daemon=True)
    thread.start()
    thread.join(config.start_timeout_s)
    if box.get("ok"):
        return box["spark"]
    if thread.is_alive():
        log.warning("raydp start exceeded %.0fs; tearing it down", config.start_timeout_s)
        if "spark" in box:
            with contextlib.suppress(Exception):
                box["spark"].sparkContext.cancelAllJobs()
        with contextlib.suppress(Exception):
            ray.kill(ray.get_actor(app_name + _MASTER_SUFFIX))
        thread.join(30)
        with contextlib.suppress(Exception):
            raydp.stop_spark()
        raise SparkStartTimeout(f"Spark on Ray did not start within {config.start_timeout_s:.0f}s")
    with contextlib.suppress(Exception):
        raydp.stop_spark()
    error = box.get("error")
    if isinstance(error, FileNotFoundError) or "JAVA_HOME" in str(error):
        raise JavaNotFoundError(f"Spark could not start its JVM ({error}); install OpenJDK 17 and set "
                                "JAVA_HOME") from error
    raise SparkOnRayError(f"Spark on Ray failed to start: {error!r}") from error


class _Holder:
    """The one RayDP session of this process and how many ``spark_session`` blocks use it."""

    lock = threading.Lock()
    spark: Any = None
    started_ray = False
    start_seconds: float | None = None
    plan: ResourcePlan | None = None


def start_spark(config: SparkConfig = SparkConfig(), ray_address: str | None = "auto") -> Any:
    """Start (or return the running) Spark session on Ray. Prefer the ``spark_session`` manager."""
    import ray

    with _Holder.lock:
        if _Holder.spark is not None:
            return _Holder.spark
        find_java()
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        how = ensure_ray(ray_address, config)
        _Holder.started_ray = how == "local"
        _quiet_ray_data()
        plan = plan_resources(config, float(ray.available_resources().get("CPU", 0.0)),
                              float(ray.cluster_resources().get("CPU", 0.0)))
        t0 = time.monotonic()
        try:
            spark = start_with_retry(_start_once, config, plan)
        except BaseException:
            if _Holder.started_ray:
                ray.shutdown()
                _Holder.started_ray = False
            raise
        _Holder.spark, _Holder.plan = spark, plan
        _Holder.start_seconds = time.monotonic() - t0
        log.info("spark on ray up in %.1fs (plan %s)", _Holder.start_seconds, plan)
        return spark


def start_with_retry(start_once: Callable[[SparkConfig, ResourcePlan, str], Any], config: SparkConfig,
                     plan: ResourcePlan) -> Any:
    """Call ``start_once`` up to ``config.start_attempts`` times while it times out.

    Each retry uses a fresh app name, so a half-dead RayDP master of the previous attempt cannot be
    confused with the new one. Errors other than ``SparkStartTimeout`` are not retried.
    """
    last: SparkStartTimeout | None = None
    for attempt in range(config.start_attempts):
        app_name = config.app_name if attempt == 0 else f"{config.app_name}-retry{attempt}"
        try:
            return start_once(config, plan, app_name)
        except SparkStartTimeout as exc:
            last = exc
            log.warning("spark start attempt %d of %d failed: %s", attempt + 1, config.start_attempts, exc)
    assert last is not None
    raise SparkStartTimeout(f"{last} (after {config.start_attempts} attempts)") from last


def stop_spark() -> None:
    """Stop the session (and the local Ray this module started, if any)."""
    import ray
    import raydp

    with _Holder.lock:
        if _Holder.spark is None:
            return
        _Holder.spark = None
        with contextlib.suppress(Exception):
            raydp.stop_spark()
        if _Holder.started_ray:
            ray.shutdown()
            _Holder.started_ray = False


def active_spark() -> Any:
    """The running session; raises ``SparkOnRayError`` when none was started."""
    if _Holder.spark is None:
        raise SparkOnRayError("no Spark session: wrap the work in spark_on_ray.session.spark_session()")
    return _Holder.spark


def start_seconds() -> float | None:
    """How long the last successful start took (seconds), for reports and benchmarks."""
    return _Holder.start_seconds


@contextlib.contextmanager
def spark_session(config: SparkConfig | None = None, ray_address: str | None = "auto") -> Iterator[Any]:
    """``with spark_session() as spark:`` -- starts Spark on Ray unless it is already up.

    Only the block that started the session stops it, so a CLI run inside a test (or a driver) that
    already holds a session reuses it and leaves it running.
    """
    with _Holder.lock:
        owner = _Holder.spark is None
    spark = start_spark(config or SparkConfig(), ray_address)
    try:
        yield spark
    finally:
        if owner:
            stop_spark()


def with_overrides(config: SparkConfig, **changes: Any) -> SparkConfig:
    """A copy of ``config`` with some fields changed (CLI flags)."""
    return replace(config, **changes)
