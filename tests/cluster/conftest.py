"""Tests in this directory start their own Ray (a multi-node one, or a whole `ray up` cluster):
any Ray this pytest process is still connected to (e.g. the session Ray of tests/actors) is shut
down first, so the two never mix."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def no_ray_connection():
    import ray

    if ray.is_initialized():
        ray.shutdown()
    yield
