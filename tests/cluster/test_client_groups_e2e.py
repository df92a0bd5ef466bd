"""The client issue's done-when, for real: the user guide's program and two consumer groups of two
consumer processes each, against `rocketray start --name demo --groups 2` on `ray start --head`,
survive killing each broker group's master and one consumer mid-run: every acknowledged message is
delivered to both groups and no acknowledged commit is lost (the committed offsets the cluster
reports are at or past every commit a consumer saw acknowledged).

Everything runs as a user would: `ray start`, the `rocketray` CLI (start, admin update-topic, stop),
the user guide's examples (quickstart, produce, consume_loop, replay, replay_by_time, filters,
delayed, asyncio_app, retries) and
examples/consumer_group.py as separate processes; this test only
produces (through ``rocketray.client.Producer``), kills, and checks. Run it under the shared lock
(it starts a Ray that a concurrent ``ray.init()`` could join):
``flock /tmp/rocketray-heavy.lock python -m pytest -q -p no:cacheprovider tests/cluster/test_client_groups_e2e.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from rr_cluster import BIN, REPO, run

from rocketray.waiting import wait_for

pytestmark = pytest.mark.slow

NAME = "demo"
GROUPS = ("billing", "audit")
TOPIC = "payments"


def lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:   # a line cut by the SIGKILL
            pass
    return out


def test_two_groups_survive_master_kills_and_a_consumer_kill(ray_head, tmp_path):
    """At-least-once per group and no lost commit across both masters' kills and a consumer's SIGKILL."""
    address, env = ray_head
    # short retry delays (the clients read them from the cluster): the retries example waits 1 s and 2 s,
    # not the default schedule's 10 s and 30 s
    run([str(BIN / "rocketray"), "start", "--name", NAME, "--groups", "2", "--address", address,
         "--data-dir", str(tmp_path / "data"), "--set", "client.retry_delays=1s 2s"], env)

    # The user guide's example, unchanged, as a user runs it.
    quick = run([sys.executable, "examples/quickstart.py", "--cluster", NAME], env, timeout=180)
    assert "group billing received all 101" in quick.stdout, quick.stdout
    # The guide's other examples (docs/client.md), each as written.
    produced = run([sys.executable, "examples/produce.py", "--cluster", NAME, "--count", "300"], env, timeout=180)
    assert "sent 300, failed 0, unknown 0" in produced.stdout, produced.stdout
    loop = run([sys.executable, "examples/consume_loop.py", "--cluster", NAME, "--group", "loop",
                "--idle-exit-s", "3"], env, timeout=180)
    assert "handled 401 messages" in loop.stdout, loop.stdout
    replay = run([sys.executable, "examples/replay.py", "--cluster", NAME], env, timeout=180)
    assert "read every queue from its start" in replay.stdout and " -> 0" in replay.stdout, replay.stdout
    assert "a new member of the group read" in replay.stdout, replay.stdout
    by_time = run([sys.executable, "examples/replay_by_time.py", "--cluster", NAME], env, timeout=180)
    assert "messages stored in the last hour" in by_time.stdout and ": True" in by_time.stdout, by_time.stdout
    filters = run([sys.executable, "examples/filters.py", "--cluster", NAME], env, timeout=180)
    assert "payments received {'paid': 25, 'refunded': 25}, lag 0" in filters.stdout, filters.stdout
    delayed = run([sys.executable, "examples/delayed.py", "--cluster", NAME], env, timeout=180)
    assert "received 2 reminders, none early: True" in delayed.stdout, delayed.stdout
    aio = run([sys.executable, "examples/asyncio_app.py", "--cluster", NAME], env, timeout=180)
    assert "async-billing received all 100 sent" in aio.stdout, aio.stdout
    # three deliveries (1 s and 2 s between them, as the cluster was started), then the dead-letter topic
    retries = run([sys.executable, "examples/retries.py", "--cluster", NAME], env, timeout=240)
    assert "delivery 3 failed" in retries.stdout and "1 dead-lettered" in retries.stdout, retries.stdout

    run([str(BIN / "rocketray"), "admin", "update-topic", "--name", NAME, "--address", address, "-t", TOPIC,
         "-q", "8"], env)
    consumers = {}
    for group in GROUPS:
        for i in (1, 2):
            out = tmp_path / f"{group}-{i}.jsonl"
            consumers[(group, i)] = (out, subprocess.Popen(
                [sys.executable, "examples/consumer_group.py", "--cluster", NAME, "--group", group, "--topic", TOPIC,
                 "--out", str(out)], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))

    try:
        driver = run([sys.executable, "tests/cluster/groups_driver.py", "--cluster", NAME, "--topic", TOPIC,
                      "--kill-pid", str(consumers[("billing", 1)][1].pid)], env, timeout=600)
        result = json.loads(driver.stdout.strip().splitlines()[-1])
        acked = set(result["acked"])
        assert len(result["kills"]) == 2 and len(acked) >= 700, result["kills"]

        def delivered(group: str) -> set[str]:
            return {r["msg_id"] for i in (1, 2) for r in lines(consumers[(group, i)][0]) if "msg_id" in r}

        for group in GROUPS:
            wait_for(lambda: acked <= delivered(group), 120,
                     f"group {group} to receive every acknowledged message ({len(acked)})")

        progress = json.loads(run([str(BIN / "rocketray"), "admin", "consumer-progress", "--name", NAME,
                                   "--address", address, "--json", "-g", ",".join(GROUPS)], env).stdout)
        for group in GROUPS:
            acknowledged: dict[tuple[str, int], int] = {}
            for i in (1, 2):
                for r in lines(consumers[(group, i)][0]):
                    for topic, queue_id, offset in r.get("commit", []):
                        acknowledged[(topic, queue_id)] = max(offset, acknowledged.get((topic, queue_id), 0))
            now = {(q["topic"], q["queue_id"]): q["committed_offset"] for q in progress[group]}
            lost = {k: (o, now.get(k)) for k, o in acknowledged.items() if now.get(k, -1) < o}
            assert acknowledged and not lost, f"group {group}: acknowledged commits the cluster lost: {lost}"
    finally:
        for _out, proc in consumers.values():
            if proc.poll() is None:
                proc.terminate()
        for _out, proc in consumers.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    survivors = [p for (g, i), (_o, p) in consumers.items() if (g, i) != ("billing", 1)]
    assert [p.returncode for p in survivors] == [0, 0, 0], [p.stderr.read()[-2000:] for p in survivors]
