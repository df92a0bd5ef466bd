"""Running commands as a user would, against a Ray started with `ray start --head` (tests/cluster).

On pytest's ``pythonpath``: ``from rr_cluster import BIN, REPO, run``; the ``ray_head`` fixture is
tests/cluster/conftest.py's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rocketray import ports

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def run(args: list, env: dict, timeout: float = 300, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """Run a command as a user would; fail the test with its output unless it exits 0."""
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(map(str, args))} exited {proc.returncode}\n{proc.stdout[-4000:]}\n" \
                                 f"{proc.stderr[-4000:]}"
    return proc


def ray_head_started():
    """`ray start --head` on a free port; ``(address, env)`` for the commands run against it
    (Ray 2.60's token auth: ``RAY_AUTH_MODE=token``); `ray stop --force` afterwards."""
    from ray.util import get_node_ip_address

    host = get_node_ip_address()          # what `ray start` binds and `ray.init` canonicalizes to
    port = ports.free_ports(1, host)[0]
    address = f"{host}:{port}"
    env = {**os.environ, "RAY_ADDRESS": address, "RAY_AUTH_MODE": "token", "PYTHONUNBUFFERED": "1"}
    run([BIN / "ray", "start", "--head", f"--port={port}", "--num-cpus=16", "--include-dashboard=false",
         "--disable-usage-stats"], env)
    try:
        yield address, env
    finally:
        subprocess.run([str(BIN / "ray"), "stop", "--force"], cwd=REPO, env=env, capture_output=True, timeout=120)
