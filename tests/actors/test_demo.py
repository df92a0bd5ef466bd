"""`rocketray demo --json` as a user runs it: a subprocess on its own embedded Ray, all checks pass."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_demo_json_reports_every_check_passed(tmp_path):
    """The one-command demo: produce, kill the master broker, kill the controller leader, verify.
    Exit code 0 and the last stdout line is one JSON object whose checks are all true."""
    proc = subprocess.run([sys.executable, "-m", "rocketray.cli", "demo", "--json", "--messages", "900",
                           "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=600)
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no stdout; stderr:\n{proc.stderr[-3000:]}"
    summary = json.loads(lines[-1])
    assert proc.returncode == 0, f"{summary}\n{proc.stderr[-3000:]}"
    for key in ("messages_acked", "messages_lost", "replicas_consistent", "broker_failover_ms",
                "controller_failover_ms", "checks"):
        assert key in summary, key
    assert summary["messages_acked"] > 0 and summary["messages_lost"] == 0
    assert summary["replicas_consistent"] is True
    assert summary["checks"] and all(summary["checks"].values()), summary["checks"]
    assert summary["broker_failover_ms"] > 0 and summary["controller_failover_ms"] > 0
