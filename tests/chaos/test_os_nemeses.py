"""CI: one minute of every OS-level nemesis of the broker run (seed 23 draws each kind: kernel
partitions, one-way partitions and loss, a flipped bit, a truncated file and a deleted consume queue
on one replica followed by its restart, lost unsynced writes under a real kill) with consumer churn,
through the CLI: valid, 0 acknowledged messages and 0 committed offsets lost, and the nemesis log
shows each fault was really applied (the kernel dropped packets, the damage was read back from
disk, the replica dropped unsynced bytes)."""

from __future__ import annotations

import json

import pytest

from rocketray.verify import nemesis as sched
from tests.chaos.test_broker_chaos import assert_groups_clean, run_chaos_cli


@pytest.mark.slow
def test_ci_chaos_run_os_nemeses_is_valid(tmp_path):
    out = tmp_path / "run"
    summary, proc = run_chaos_cli(out, "--duration", "60", "--seed", "23", "--nemesis", "os", "--groups", "2")
    assert summary["valid"] and proc.returncode == 0, (summary, proc.stderr[-3000:])
    assert summary["acked"] > 0 and summary["lost"] == 0, summary
    assert_groups_clean(summary)
    assert summary["nemesis_acted"] == summary["nemesis_steps"] >= len(sched.OS_DRAWS), summary
    events = [json.loads(line) for line in (out / "nemesis.jsonl").read_text().splitlines()]
    ends = {e["kind"]: e["target"] for e in events if e["phase"] == "end"}
    assert set(sched.OS_DRAWS) <= set(ends), ends
    for kind in sched.NET_KINDS:
        dropped = int(ends[kind].rsplit("dropped ", 1)[1].split()[0])
        assert dropped > 0, (kind, ends[kind])
    assert "0x" in ends["corrupt-file"] and "on disk: byte" in ends["corrupt-file"], ends["corrupt-file"]
    assert "on disk: deleted" in ends["delete-queue"] and "(was" in ends["truncate-file"], ends
    assert "dropped" in ends["lose-unsynced"] and "restarted" in ends["lose-unsynced"], ends["lose-unsynced"]
