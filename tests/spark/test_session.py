"""Session sizing (pure), the missing-Java error, and the CLI's behaviour without Java (subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rocketray.spark_on_ray.session import (JDK17_JAVA_OPTIONS, JavaNotFoundError, SparkConfig, find_java, plan_resources,
                                  spark_configs)


@pytest.mark.parametrize("available, total, executors, actor_cpu", [
    (2.0, 2.0, 1, 1.0),     # idle 2-core box: 1 executor with a whole core
    (1.1, 2.0, 1, 0.85),    # a whole core is free but not the collection headroom: leave 0.25 for Ray Data
    (0.5, 2.0, 1, 0.25),    # next to a live cluster holding 1.5 cores: half of the free half
    (0.0, 2.0, 1, 0.01),    # nothing free: a token reservation so the executor can still be placed
    (8.0, 8.0, 1, 1.0),     # bigger cluster, default config still asks for one executor
])
def test_plan_resources_fits_the_cluster_found(available, total, executors, actor_cpu):
    # The executor's Ray CPU reservation never exceeds what is free; Spark still gets its task slots.
    plan = plan_resources(SparkConfig(), available, total)
    assert (plan.num_executors, plan.executor_actor_cpu, plan.executor_cores) == (executors, actor_cpu, 1)


def test_plan_caps_executors_at_what_the_cluster_could_hold():
    # Asking for 4 two-core executors on a 4-core cluster gets 2, sharing what is free after the headroom.
    plan = plan_resources(SparkConfig(num_executors=4, executor_cores=2), 4.0, 4.0)
    assert (plan.num_executors, plan.executor_actor_cpu) == (2, 1.88)
    assert plan_resources(SparkConfig(num_executors=4, executor_cores=2), 4.25, 4.0).executor_actor_cpu == 2.0


def test_every_jvm_gets_the_jdk17_add_opens_flags():
    # Driver, executors and the RayDP app master all need --add-opens on JDK 17 (ecosystem notes).
    conf = spark_configs(SparkConfig(), plan_resources(SparkConfig(), 2, 2))
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions",
                "spark.ray.raydp_app_master.extraJavaOptions"):
        assert conf[key] == JDK17_JAVA_OPTIONS
    assert "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED" in JDK17_JAVA_OPTIONS


def test_find_java_explains_what_to_install_when_there_is_none(tmp_path):
    # Neither JAVA_HOME nor PATH has java: the error says to install OpenJDK 17 and set JAVA_HOME.
    with pytest.raises(JavaNotFoundError, match="OpenJDK 17.*JAVA_HOME"):
        find_java({"PATH": str(tmp_path)})
    with pytest.raises(JavaNotFoundError, match="JAVA_HOME=.*no executable bin/java"):
        find_java({"PATH": os.environ.get("PATH", ""), "JAVA_HOME": str(tmp_path / "nowhere")})


def test_cli_without_java_fails_fast_with_a_clear_message(tmp_path):
    # The real command in a subprocess whose PATH and JAVA_HOME lead nowhere: exit 1, a typed error in the
    # JSON line and an install hint on stderr, before any Ray or Spark is started.
    run = tmp_path / "run"
    run.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "PATH")}
    env.update(PATH=str(tmp_path / "no-bin"), JAVA_HOME=str(tmp_path / "no-jdk"))
    proc = subprocess.run([sys.executable, "-m", "rocketray.cli", "analytics", "--run", str(run), "--json"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["ok"] is False and result["error_type"] == "JavaNotFoundError"
    assert "install OpenJDK 17" in proc.stderr and "JAVA_HOME" in proc.stderr


def test_start_is_retried_once_after_a_timeout_with_a_fresh_app_name():
    # First attempt times out, the second (under another app name) succeeds; two timeouts give up, retriable.
    from rocketray.spark_on_ray.session import SparkStartTimeout, start_with_retry

    config = SparkConfig(app_name="app")
    plan = plan_resources(config, 2, 2)
    names = []

    def flaky(cfg, pln, name):
        names.append(name)
        if len(names) == 1:
            raise SparkStartTimeout("stuck")
        return "session"

    assert start_with_retry(flaky, config, plan) == "session" and names == ["app", "app-retry1"]

    def stuck(cfg, pln, name):
        raise SparkStartTimeout("stuck")

    with pytest.raises(SparkStartTimeout, match="after 2 attempts") as exc:
        start_with_retry(stuck, config, plan)
    assert exc.value.retriable


def test_a_hung_raydp_start_is_cut_off_by_killing_its_master(monkeypatch):
    # init_spark blocks; after the deadline the RayDP master actor is killed, which unblocks it, and the
    # attempt ends in SparkStartTimeout instead of hanging.
    import threading

    import ray
    import raydp

    from rocketray.spark_on_ray import session

    unblocked = threading.Event()
    killed = []

    def hung_init(*args, **kwargs):
        if not unblocked.wait(30):
            raise AssertionError("never unblocked")
        raise RuntimeError("master actor died")

    monkeypatch.setattr(raydp, "init_spark", hung_init)
    monkeypatch.setattr(raydp, "stop_spark", lambda *a, **k: None)
    monkeypatch.setattr(ray, "get_actor", lambda name, *a, **k: name)
    monkeypatch.setattr(ray, "kill", lambda actor, *a, **k: (killed.append(actor), unblocked.set()))
    config = SparkConfig(start_timeout_s=0.2)
    with pytest.raises(session.SparkStartTimeout):
        session._start_once(config, plan_resources(config, 2, 2), "app")
    assert killed == ["app_SPARK_MASTER"]
