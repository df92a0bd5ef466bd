"""The server actors' CPU priority (``actors/priority.py``): Ray starts workers at nice 15, and a
broker or controller asks for its ``process_niceness`` (default 0) on every thread of its process.

The unit tests run ``set_process_niceness`` in a child process started at nice 15 with threads of
its own (Linux keeps a niceness per thread); the refusal test drops root's privilege first. The end
to end test reads the niceness of every thread of a real cluster's actor processes."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import textwrap

import pytest
import ray

from rocketray.actors.priority import thread_niceness

CHILD = textwrap.dedent("""
    import json, logging, os, sys, threading
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    from rocketray.actors.priority import set_process_niceness, thread_niceness
    if sys.argv[2] == "drop":
        os.setgid(65534); os.setuid(65534)       # nobody: no CAP_SYS_NICE, RLIMIT_NICE 0
    stop = threading.Event()
    workers = [threading.Thread(target=stop.wait, daemon=True) for _ in range(4)]
    for t in workers:
        t.start()
    target = None if sys.argv[1] == "none" else int(sys.argv[1])
    result = set_process_niceness(target, "test")
    late = threading.Thread(target=stop.wait, daemon=True)   # started after: inherits its starter's
    late.start()
    print(json.dumps({"changed": result.changed, "refused": result.refused,
                      "nice": sorted(thread_niceness().values())}))
    stop.set()
""")


def run_child(target: str, drop: bool = False) -> tuple[dict, str]:
    if os.geteuid() != 0:
        pytest.fail("these tests start a process at nice 15 and lower it: run them as root (CI does)")
    proc = subprocess.run([sys.executable, "-c", CHILD, target, "drop" if drop else "keep"], capture_output=True,
                          text=True, timeout=60, preexec_fn=lambda: os.nice(15 - os.nice(0)),
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_every_thread_of_a_process_started_at_ray_s_niceness_moves_to_the_target():
    out, _ = run_child("0")
    assert out["changed"] == 5, out                       # the main thread and the four started before
    assert out["nice"] == [0] * 6, f"a thread kept Ray's niceness: {out}"


def test_none_keeps_ray_s_niceness():
    out, _ = run_child("none")
    assert out["changed"] == 0 and out["nice"] == [15] * 6, out


def test_an_unprivileged_process_keeps_its_niceness_and_logs_the_remedy():
    out, err = run_child("0", drop=True)
    assert out["refused"] == 5 and out["nice"] == [15] * 6, out
    assert "RAY_worker_niceness=0" in err, err


@pytest.mark.slow
def test_a_cluster_s_broker_and_controller_processes_run_at_niceness_0(make_cluster):
    cluster = make_cluster()
    cluster.wait_for_master("broker-a", 60)
    actors = [cluster.controller(c.index) for c in cluster.spec.controllers]
    actors += [cluster.broker(b.group, b.replica) for b in cluster.spec.brokers_of("broker-a")]
    for actor in actors:
        pid = ray.get(actor.pid.remote(), timeout=30)
        nice = collections.Counter(thread_niceness(pid).values())
        assert set(nice) == {0}, f"pid {pid}: threads by niceness {dict(nice)} (Ray starts workers at 15)"


@pytest.mark.parametrize("section", ["broker", "controller"])
def test_a_niceness_outside_the_kernel_s_range_is_a_config_error(section):
    from rocketray.config import ConfigError, load_config

    with pytest.raises((ConfigError, ValueError), match="process_niceness"):
        cfg = load_config("default", {f"{section}.process_niceness": "40"})
        cfg.controller_node_config().validate()      # the controller's own check (at its start)
    assert load_config("default", {f"{section}.process_niceness": "none"}) is not None
