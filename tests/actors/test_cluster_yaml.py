"""cluster.yaml is a Ray cluster-launcher file that `ray up` accepts as shipped.

It is validated the way `ray up` does it (prepare_config fills the provider's defaults, then
validate_config checks the schema), plus the properties the walkthrough in docs/cluster.md relies on.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def raw() -> dict:
    return yaml.safe_load((REPO / "cluster.yaml").read_text())


def _validated(config: dict) -> dict:
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


def test_ray_up_accepts_it(raw):
    """What `ray up cluster.yaml` runs first: prepare_config + validate_config, no error."""
    prepared = _validated(raw)
    assert prepared["head_node_type"] in prepared["available_node_types"]
    assert prepared["max_workers"] == len(raw["provider"]["worker_ips"])


def test_local_provider_on_this_machine(raw):
    """Shipped for one node: local provider on 127.0.0.1, no workers, an ssh user."""
    assert raw["provider"] == {"type": "local", "head_ip": "127.0.0.1", "worker_ips": []}
    assert raw["auth"]["ssh_user"]


def test_real_nodes_variant_validates(raw):
    """The edit docs/cluster.md describes for real machines (head + 2 workers) is still valid."""
    config = copy.deepcopy(raw)
    config["provider"].update(head_ip="10.0.0.11", worker_ips=["10.0.0.12", "10.0.0.13"])
    config["max_workers"] = 2
    prepared = _validated(config)
    assert prepared["max_workers"] == 2


def test_schema_still_rejects_garbage(raw):
    """The validation above has teeth: an unknown top-level key is refused."""
    import jsonschema

    config = copy.deepcopy(raw)
    config["not_a_ray_key"] = 1
    with pytest.raises(jsonschema.ValidationError):
        _validated(config)


def test_installs_the_project_and_starts_ray_from_its_venv(raw):
    """The working tree is mounted and pip-installed; Ray starts from that environment."""
    assert raw["file_mounts"]["~/rocketray-src"] == "."  # not ~/rocketray: it would shadow the package in ~
    assert (REPO / "pyproject.toml").exists()  # `ray up` runs from the repository root
    # the server extra: cluster nodes need Ray, Spark and pysyncobj (the base install is the client only)
    assert any("pip install" in c and "$HOME/rocketray-src[server]" in c for c in raw["setup_commands"])
    # a job's entrypoint and `ray exec` commands get the virtualenv first on PATH (through ~/.bashrc,
    # which Ray's bash sources), so `python driver.py` in a job imports ray and rocketray
    assert any("source ~/rocketray-venv/bin/activate" in c and ".bashrc" in c for c in raw["setup_commands"])
    starts = raw["head_start_ray_commands"] + raw["worker_start_ray_commands"]
    assert all('PATH="$HOME/rocketray-venv/bin:$PATH"' in c for c in starts if " start " in c)
    assert all("~/rocketray-venv/bin/ray" in c for c in starts)
    assert any("--head" in c and "--dashboard-port=8265" in c for c in raw["head_start_ray_commands"])
    assert any("$RAY_HEAD_IP:6379" in c for c in raw["worker_start_ray_commands"])


def test_comments_say_what_to_change(raw):
    text = (REPO / "cluster.yaml").read_text()
    for needle in ("head_ip", "worker_ips", "ssh_user", "auth_token", "cloud provider", "docs/cluster.md"):
        assert needle in text


def test_walkthrough_covers_the_commands():
    """docs/cluster.md walks through up, token auth, job submit, killing actors and teardown."""
    doc = (REPO / "docs" / "cluster.md").read_text()
    for needle in ("ray up -y cluster.yaml", "RAY_AUTH_MODE=token", "ray job submit", "--working-dir .",
                   "python driver.py --json", "ray kill-actor", "ray.kill(", "ray down -y cluster.yaml",
                   "ray stop", "head_ip", "worker_ips", "cloud provider"):
        assert needle in doc, needle
