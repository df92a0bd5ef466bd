"""A fixture of real 3-node controller clusters (pysyncobj nodes in this process) for the node tests."""

from __future__ import annotations

import pytest

from rocketray.controller.config import ControllerConfig
from rocketray.controller.proc import InProcessControllers


def everyone_alive(name, broker_id):
    return True


@pytest.fixture
def make_cluster(tmp_path, port_factory):
    """``make(**config)`` -> a InProcessControllers of 3 nodes on fresh ports (closed after the test)."""
    made = []

    def make(**config):
        cluster = InProcessControllers(tmp_path / f"c{len(made)}", [port_factory() for _ in range(3)],
                               ControllerConfig.for_tests(**config), "s3cret", alive=everyone_alive)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.close()
