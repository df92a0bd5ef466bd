"""A stand-in for ``rocketray.actors.cluster.Cluster`` in the admin CLI's tests: ``call_controller`` is the
pure controller core (decide, then apply), so what a test checks is the command, not a copy of it."""

from __future__ import annotations

from rocketray.wire.controller_api import Response
from rocketray.controller.decide import DecideContext, decide
from rocketray.controller.events import ApplyBrokerIdEvent
from rocketray.controller.state import ControllerState


class CoreCluster:
    """The part of ``Cluster`` the admin commands use, over the pure core; ``groups`` are registered."""

    def __init__(self, groups=()) -> None:
        self.state = ControllerState()
        for name in groups:
            self.state.apply(ApplyBrokerIdEvent("c", name, f"{name}:1", f"{name}:1;1", 1))
        self.requests: list[object] = []

    def call_controller(self, request) -> Response:
        self.requests.append(request)
        response, events = decide(self.state, request, DecideContext(lambda name, broker_id: True))
        self.state.apply_all(events)
        return response


def install(monkeypatch, cluster):
    """Make every admin command of this test talk to ``cluster``."""
    from rocketray.cli import admin_common

    monkeypatch.setattr(admin_common, "connect_cluster", lambda address, name: cluster)
    return cluster
