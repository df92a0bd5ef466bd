"""The controller actor's threading and its clients' timeouts (issue 16, problem 4), checked without
starting Ray: heartbeats run in their own concurrency group, and a client waits longer than the
controller's own request deadline."""

from __future__ import annotations

import pytest

from rocketray.actors.controller_client import AsyncControllerClient, call_timeout_for
from rocketray.actors.controller_service import NONBLOCKING_GROUP, ControllerService
from rocketray.actors.remote import controller_options
from rocketray.config import load_config
from rocketray.spec import ClusterSpec, ControllerSpec


def spec(profile: str, overrides=()) -> ClusterSpec:
    return ClusterSpec("t", "c", "/tmp/t", profile, (ControllerSpec(0, "127.0.0.1", 7000, "/tmp/t/c0"),), (),
                       tuple(overrides))


def test_heartbeats_and_status_have_their_own_concurrency_group_and_requests_do_not():
    group = "__ray_concurrency_group__"
    for method in (ControllerService.heartbeat, ControllerService.metadata, ControllerService.pid):
        assert getattr(method, group, None) == NONBLOCKING_GROUP
    assert getattr(ControllerService.handle, group, None) is None     # blocking: the default group
    options = controller_options(spec("default"), 0)
    assert options["concurrency_groups"][NONBLOCKING_GROUP] >= 1
    assert options["max_concurrency"] >= 1


@pytest.mark.parametrize("profile,overrides", [("default", ()), ("fast", ()),
                                               ("default", (("controller.request_timeout_ms", "9000"),))])
def test_the_client_waits_longer_than_the_controller_request_deadline(profile, overrides):
    s = spec(profile, overrides)
    deadline_s = load_config(profile, dict(overrides)).controller_node_config().request_timeout_ms / 1000
    assert call_timeout_for(s) > deadline_s
    assert AsyncControllerClient(s)._timeout_s == call_timeout_for(s)
