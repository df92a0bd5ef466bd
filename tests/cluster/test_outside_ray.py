"""The security issue's done-when, for real: an application on a host with neither Ray nor Spark
installed (a venv holding only ``pip install rocketray``, the base install), holding only a user
credential file, produces and consumes what its ACL allows against a cluster started as a user
would (`ray start --head`, `rocketray start`), is refused a topic and a group its ACL denies, and
cannot open the members' ports (Raft, session, HA): they want a member certificate.

The operator's side runs as a user would too: `rocketray admin user create ... --client-config`,
`rocketray admin acl create`, `rocketray admin update-topic`. Run under the shared lock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from rr_cluster import BIN, REPO, run


pytestmark = pytest.mark.slow

NAME = "outside"
#: Where the members listen (an operator knows; the application does not, but an attacker might).
SPEC_PORTS = """
import json, sys, ray
from rocketray.actors.cluster import connect
ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
spec = connect(sys.argv[1]).spec
c, b = spec.controllers[0], spec.brokers[0]
print(json.dumps({"raft": [c.host, c.raft_port], "session": [c.host, c.session_port], "ha": [b.host, b.ha_port]}))
"""


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory) -> Path:
    """A venv with the base install only (``pip install <repo>``: msgpack and cryptography)."""
    path = tmp_path_factory.mktemp("client-venv")
    venv.create(path, with_pip=True)
    python = path / "bin" / "python"
    run([str(python), "-m", "pip", "install", "-q", str(REPO)], {**os.environ}, timeout=900, cwd=path)
    return python


def test_an_application_outside_ray_gets_only_what_its_acl_allows(ray_head, client_venv, tmp_path):
    address, env = ray_head
    missing = subprocess.run([str(client_venv), "-c", "import ray"], capture_output=True, timeout=60)
    assert missing.returncode != 0, "the application's venv must not have Ray"
    rr = str(BIN / "rocketray")
    run([rr, "start", "--name", NAME, "--address", address, "--data-dir", str(tmp_path / "data")], env)
    for topic in ("orders", "secret"):
        run([rr, "admin", "update-topic", "--name", NAME, "--address", address, "-t", topic, "-q", "4"], env)
    config = tmp_path / "app.rocketray.toml"
    run([rr, "admin", "user", "create", "app", "--name", NAME, "--address", address, "--client-config", str(config)],
        env)
    assert oct(config.stat().st_mode & 0o777) == "0o600"
    for resources, actions in (("Topic:orders", "Pub,Sub"), ("Group:billing", "Sub")):
        run([rr, "admin", "acl", "create", "--name", NAME, "--address", address, "-u", "app", "-r", resources,
             "-a", actions, "-d", "allow"], env)

    members = json.loads(run([sys.executable, "-c", SPEC_PORTS, NAME], env).stdout.strip().splitlines()[-1])
    app_env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "PYTHONPATH"))}
    out = run([str(client_venv), str(REPO / "tests" / "cluster" / "outside_ray_app.py"), str(config),
               json.dumps(members)], app_env, timeout=600, cwd=tmp_path)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["acked"] == 200 and result["received"] == 200, result
    assert result["secret"].startswith("AccessDenied") and "Pub" in result["secret"], result
    assert result["other_group"].startswith("AccessDenied") and "Group:fraud" in result["other_group"], result
    assert all(v.startswith(("refused", "closed")) for v in result["member_ports"].values()), result
    assert result["heavy_modules"] == [], result
