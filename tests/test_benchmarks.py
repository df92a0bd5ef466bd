"""Nothing rots unseen: every benchmark declares a smoke size and runs at it, end to end, through the
runner (``python benchmarks/run.py NAME --smoke --json``) with its figures and ratio in one JSON line."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = sorted(p.stem[len("bench_"):].replace("_", "-") for p in (ROOT / "benchmarks").glob("bench_*.py"))
#: Figures a benchmark's smoke run must report as positive numbers (its targets are never checked:
#: smoke figures are not measurements).
POSITIVE_FIGURES = {
    "client-e2e": ("sync_p50_ms", "sync_p99_ms", "async_msgs_per_s", "consume_msgs_per_s",
                   "filtered_consume_msgs_per_s", "e2e_p50_ms",
                   "ray_call_p50_ms", "ray_calls_per_s", "inprocess_put_p50_ms", "sync_vs_ray_call",
                   "async_vs_ray_calls", "consume_vs_async", "e2e_vs_sync", "p99_vs_p50"),
}


def smoke_args(name: str) -> list[str] | None:
    tree = ast.parse((ROOT / "benchmarks" / f"bench_{name.replace('-', '_')}.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "SMOKE_ARGS" for t in node.targets):
            return ast.literal_eval(node.value)
    return None


@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_benchmark_declares_a_smoke_size(name):
    args = smoke_args(name)
    assert isinstance(args, list) and all(isinstance(a, str) for a in args), \
        f"benchmarks/bench_{name.replace('-', '_')}.py must define SMOKE_ARGS = [...] (see benchmarks/run.py)"


@pytest.mark.slow
@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_benchmark_runs_at_smoke_size(name):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), name, "--smoke", "--json"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["benchmark"] == name and result["smoke"] is True
    assert isinstance(result["ratio"], (int, float)), result
    for key in POSITIVE_FIGURES.get(name, ()):
        assert isinstance(result.get(key), (int, float)) and result[key] > 0, f"{name}: {key} = {result.get(key)!r}"
    if name == "client-e2e":
        assert isinstance(result["targets_met"], bool) and result["transport"], result
