"""Shared fixtures: predicate waits with deadlines, free loopback ports (see tests/support/rr_testing.py)."""

from __future__ import annotations

from typing import Callable

import pytest
from rr_testing import free_port, wait_until


@pytest.fixture
def wait() -> Callable[..., object]:
    return wait_until


@pytest.fixture
def port_factory() -> Callable[[], int]:
    return free_port
