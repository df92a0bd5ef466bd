"""The ``kill-node`` nemesis: the node holding a group's master dies for a while and comes back.

Schedule (pure): ``kill-node`` steps name a group and last a fault's duration; ``all`` does not draw
them (they need several rocketray nodes). Runner (slow, real): ``rocketray chaos --target brokers
--nemesis kill-node --ray-nodes 3`` kills nodes under a recorded workload and the checker finds
nothing acknowledged lost.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rocketray.verify import nemesis
from rocketray.verify.history import FAULT_KINDS, NEMESIS_KINDS

GROUPS = {"broker-a": [1, 2, 3], "broker-b": [1, 2, 3]}


def test_kill_node_is_a_declared_kind_with_a_duration_and_a_group():
    assert "kill-node" in FAULT_KINDS and "kill-node" in NEMESIS_KINDS
    steps = nemesis.make_schedule("kill-node", 7, groups=GROUPS, controllers=3, run_ms=60_000, interval_ms=4000,
                                  fault_ms=4000)
    assert steps, "a minute holds several node losses"
    for s in steps:
        assert s.kind == "kill-node" and s.group in GROUPS
        assert 2000 <= s.duration_ms <= 4000, "the node stays down for a while, then comes back"
        assert s.target == f"node-of-master:{s.group}"
    assert steps == nemesis.make_schedule("kill-node", 7, groups=GROUPS, controllers=3, run_ms=60_000,
                                          interval_ms=4000, fault_ms=4000), "replayable from its seed"


def test_all_does_not_draw_kill_node():
    steps = nemesis.make_schedule("all", 3, groups=GROUPS, controllers=3, run_ms=600_000, interval_ms=1000,
                                  fault_ms=1000)
    kinds = {s.kind for s in steps}
    assert "kill-node" not in kinds and len(kinds) >= 5


def test_kill_node_without_nodes_is_a_usage_error():
    rocketray = Path(sys.executable).parent / "rocketray"
    proc = subprocess.run([str(rocketray), "chaos", "--target", "brokers", "--nemesis", "kill-node", "--duration", "1"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--ray-nodes" in proc.stderr


@pytest.mark.slow
def test_chaos_run_with_kill_node_loses_nothing(tmp_path):
    rocketray = Path(sys.executable).parent / "rocketray"
    out = tmp_path / "run"
    proc = subprocess.run([str(rocketray), "chaos", "--target", "brokers", "--nemesis", "kill-node", "--ray-nodes", "3",
                           "--groups", "1", "--duration", "25", "--seed", "5", "--rate", "50", "--producers", "2",
                           "--json", "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert proc.stdout.strip(), proc.stderr[-4000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["valid"], (summary, proc.stderr[-4000:])
    assert summary["nemesis_acted"] >= 1, summary
    assert summary["lost"] == 0
    events = [json.loads(line) for line in (out / "nemesis.jsonl").read_text().splitlines()]
    node_events = [e for e in events if e["kind"] == "kill-node"]
    assert {e["phase"] for e in node_events} == {"start", "end"}, "every node taken down was brought back"
    assert all(e["target"].startswith("node:n") for e in node_events)
