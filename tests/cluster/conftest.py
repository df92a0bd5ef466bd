"""Tests in this directory start their own Ray (a multi-node one, or a whole `ray up` cluster):
any Ray this pytest process is still connected to (e.g. the session Ray of tests/actors) is shut
down first, so the two never mix. ``ray_head`` starts one as a user does (`ray start --head`)."""

from __future__ import annotations

import pytest

from rr_cluster import ray_head_started


@pytest.fixture
def ray_head():
    """`ray start --head` on a free port (``rr_cluster.ray_head_started``)."""
    yield from ray_head_started()


@pytest.fixture(autouse=True)
def no_ray_connection():
    import ray

    if ray.is_initialized():
        ray.shutdown()
    yield
