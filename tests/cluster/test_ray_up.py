"""The cluster walkthrough of docs/cluster.md (the README points to it), for real, against 127.0.0.1.

``ray up -y cluster.yaml`` (the shipped file as is: local provider, head 127.0.0.1, ssh user root)
-> ``ray job submit --address http://127.0.0.1:8265 --working-dir . -- python driver.py --json
--keep --name walk --analytics`` (with ``RAY_AUTH_MODE=token``) -> ``ray kill-actor`` of a broker
and ``ray.kill`` of a controller from Python, each watched through ``ray exec cluster.yaml
'rocketray status --name walk --json'`` until it rejoined -> ``rocketray stop`` through ``ray exec``
-> ``ray down -y cluster.yaml`` and ``ray stop``.

What the machine needs comes from ``.ci/setup_ssh.sh start`` (openssh-server and rsync from apt
when missing, a login key, sshd on 127.0.0.1 with a pid file); this test stops that sshd by its pid.
Nothing is skipped: a missing piece fails the test. Everything it starts is torn down in a finally
and the test checks that no Ray process is left (a running ``ray start`` cluster would capture the
``ray.init()`` of later tests). Run it under the shared lock:
``flock /tmp/rocketray-heavy.lock python -m pytest -q -p no:cacheprovider tests/cluster/test_ray_up.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
NAME = "walk"
OUT = Path(f"/tmp/rocketray-out/{NAME}")
BASHRC = Path.home() / ".bashrc"


def run(args: list[str], timeout: float, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """One command of the walkthrough from the repository root; its output is kept for the failure message."""
    full_env = {**os.environ, "RAY_AUTH_MODE": "token", **(env or {})}
    full_env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(args, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(args)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n"
                    f"--- stderr\n{proc.stderr[-6000:]}")
    return proc


def ray(*args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    return run([str(BIN / "ray"), *args], timeout, check=check)


def last_json(text: str) -> dict:
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    raise AssertionError(f"no JSON line in:\n{text[-3000:]}")


def remote_status() -> dict:
    """``rocketray status --name walk --json`` on the head, through ``ray exec``."""
    return last_json(ray("exec", "cluster.yaml", f"rocketray status --name {NAME} --json", timeout=120).stdout)


def wait_status(predicate, what: str, timeout_s: float = 180) -> dict:
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            status = remote_status()
            if predicate(status):
                return status
            last = status
        except (AssertionError, subprocess.TimeoutExpired) as exc:
            last = exc
        time.sleep(2)
    pytest.fail(f"timed out after {timeout_s}s waiting for {what}; last status: {last!r}")


def all_replicas_running(status: dict) -> bool:
    reps = [r for g in status["groups"].values() for r in g["replicas"]]
    return bool(reps) and all(r["alive"] and r.get("running") for r in reps)


def ray_processes() -> list[str]:
    out = subprocess.run(["pgrep", "-a", "-f", "raylet/raylet|gcs_server"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.strip()]


def test_ray_up_job_submit_kill_status_analytics_down():
    setup = subprocess.run([str(REPO / ".ci" / "setup_ssh.sh"), "start"], capture_output=True, text=True,
                           timeout=600)
    assert setup.returncode == 0, f"setup_ssh.sh failed:\n{setup.stdout}\n{setup.stderr}"
    sshd = dict(kv.split("=", 1) for kv in setup.stdout.strip().splitlines()[-1].split())
    sshd_pid = int(sshd["pid"])
    bashrc_before = BASHRC.read_text() if BASHRC.exists() else None
    deadline = time.monotonic() + 30  # a Ray this process just shut down (conftest) takes a moment to exit
    while ray_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not ray_processes(), f"a Ray is already running on this machine: {ray_processes()}"
    shutil.rmtree(OUT, ignore_errors=True)
    times: dict[str, float] = {}
    try:
        t0 = time.monotonic()
        ray("up", "-y", "cluster.yaml", timeout=1200)
        times["ray_up_s"] = time.monotonic() - t0

        # The job's `python` is the head's virtualenv (it imports ray and the uploaded rocketray).
        t0 = time.monotonic()
        job = ray("job", "submit", "--address", "http://127.0.0.1:8265", "--working-dir", ".", "--",
                  "python", "driver.py", "--json", "--keep", "--name", NAME, "--messages", "600", "--analytics",
                  timeout=900)
        times["job_s"] = time.monotonic() - t0
        summary = last_json(job.stdout)
        assert summary["ok"], summary
        assert all(summary["checks"].values()), summary["checks"]
        assert summary["messages_lost"] == 0 and summary["messages_acked"] > 0
        assert summary["checks"]["analytics_report_written"]
        assert (OUT / "analytics" / "report.html").is_file(), "the analytics report sits next to the JSON"
        assert json.loads((OUT / "summary.json").read_text())["ok"]

        status = wait_status(all_replicas_running, "every replica running after the job")
        assert status["controller_leader"] is not None

        # ray kill-actor: Ray restarts the broker and it rejoins.
        ray("kill-actor", "--name", "broker-a-0", "--namespace", f"rocketray-{NAME}", "--force", timeout=120)
        t0 = time.monotonic()
        wait_status(lambda s: all_replicas_running(s) and s["controller_leader"] is not None,
                    "broker-a-0 to come back after ray kill-actor")
        times["broker_rejoin_s"] = time.monotonic() - t0

        # ray.kill from Python, in a script connected to the cluster.
        code = ("import ray; ray.init(address='auto', logging_level='ERROR'); "
                f"ray.kill(ray.get_actor('controller-1', namespace='rocketray-{NAME}'), no_restart=False); "
                "print('killed')")
        assert "killed" in run([sys.executable, "-c", code], 120).stdout
        wait_status(lambda s: s["controller_leader"] is not None and all(md is not None for md in s["controllers"])
                    and all_replicas_running(s), "controller-1 to come back after ray.kill")

        ray("exec", "cluster.yaml", f"rocketray stop --name {NAME} --delete-data", timeout=120)
        print(f"walkthrough timings: {json.dumps({k: round(v, 1) for k, v in times.items()})}")
    finally:
        ray("down", "-y", "cluster.yaml", timeout=300, check=False)
        ray("stop", "--force", timeout=120, check=False)
        try:
            os.kill(sshd_pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        if bashrc_before is not None:
            BASHRC.write_text(bashrc_before)
    deadline = time.monotonic() + 30
    while ray_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not ray_processes(), f"Ray processes left after ray down + ray stop: {ray_processes()}"
    while Path(f"/proc/{sshd_pid}").exists() and time.monotonic() < deadline + 10:
        time.sleep(0.2)
    assert not Path(f"/proc/{sshd_pid}").exists(), "sshd still running after the test stopped it"
