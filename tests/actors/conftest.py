"""One local Ray for every real-actor test in this directory; each test starts its own cluster."""

from __future__ import annotations

import itertools

import pytest

_names = itertools.count()


@pytest.fixture(scope="session")
def ray_local():
    import ray

    ray.init(include_dashboard=False, logging_level="ERROR", log_to_driver=False,
             object_store_memory=300 * 1024 * 1024, namespace="rocketray-tests")
    yield ray
    ray.shutdown()


@pytest.fixture
def make_cluster(ray_local, tmp_path):
    """Start a fast-profile cluster on the shared Ray; stopped (data deleted) after the test."""
    from rocketray.actors.cluster import start_cluster

    started = []

    def make(**kwargs):
        kwargs.setdefault("controllers", 3)
        kwargs.setdefault("groups", 1)
        kwargs.setdefault("replicas", 3)
        cluster = start_cluster(f"t{next(_names)}", data_dir=str(tmp_path), profile="fast", **kwargs)
        started.append(cluster)
        return cluster

    yield make
    for cluster in started:
        cluster.stop(delete_data=True)
