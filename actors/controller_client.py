"""Reaching the controller leader through Ray, from a broker (async) or a driver (sync).

Controllers are actors named ``controller-<i>``. A request goes to the last known
leader; a ``CONTROLLER_NOT_LEADER`` answer carries the leader's Raft address,
which the cluster spec maps back to an actor; a dead, restarting or paused
controller (actor error or timeout) makes the client try the next one. Transport
failures surface as :class:`ControllerUnavailable` (``retriable = True``) once
every controller was tried, never as a bare Ray exception.

A call waits longer than the controller's own overall request deadline
(``request_timeout_ms``, see ``ControllerNode.handle``) plus a margin: a client
that gave up first would report an unknown outcome for a write the controller
still commits and answers (the broker's registrar used to orphan broker ids so).
"""

from __future__ import annotations

import asyncio
import time

import ray

from rocketray.config import load_config
from rocketray.spec import ClusterSpec
from rocketray.controller.api import Response
from rocketray.controller.codes import ResponseCode


class ControllerUnavailable(RuntimeError):
    """No controller answered as leader in time; worth retrying later."""

    retriable = True


CLIENT_MARGIN_S = 2.0


def call_timeout_for(spec: ClusterSpec) -> float:
    """The per-call timeout of a controller client: the controllers' request deadline + a margin."""
    node_config = load_config(spec.profile, dict(spec.config_overrides)).controller_node_config()
    return node_config.request_timeout_ms / 1000 + CLIENT_MARGIN_S


def _next_index(spec: ClusterSpec, response: Response, current: int) -> int:
    hint = (response.header or {}).get("leader_address")
    if hint:
        c = spec.controller_by_address(hint)
        if c is not None and c.index != current:
            return c.index
    return (current + 1) % len(spec.controllers)


class AsyncControllerClient:
    """Used inside a broker actor's event loop."""

    def __init__(self, spec: ClusterSpec, call_timeout_s: float | None = None):
        self._spec = spec
        self._timeout_s = call_timeout_for(spec) if call_timeout_s is None else call_timeout_s
        self._leader = 0
        self._handles: dict[int, object] = {}

    def _handle(self, index: int):
        h = self._handles.get(index)
        if h is None:
            h = ray.get_actor(self._spec.controller_actor_name(index), namespace=self._spec.namespace)
            self._handles[index] = h
        return h

    async def _call_one(self, index: int, method: str, *args):
        try:
            ref = getattr(self._handle(index), method).remote(*args)
            return await asyncio.wait_for(ref, self._timeout_s)
        except (asyncio.TimeoutError, ray.exceptions.RayError, ValueError):
            self._handles.pop(index, None)
            return None

    async def call(self, request, address: str | None = None) -> Response:
        """Send ``request`` to the leader; returns its Response or raises ControllerUnavailable."""
        index = self._leader
        if address:
            c = self._spec.controller_by_address(address)
            index = c.index if c is not None else index
        attempts = 2 * len(self._spec.controllers) + 1
        for _ in range(attempts):
            response = await self._call_one(index, "handle", request)
            if response is None:
                index = (index + 1) % len(self._spec.controllers)
                continue
            if response.code != ResponseCode.CONTROLLER_NOT_LEADER:
                self._leader = index
                return response
            index = _next_index(self._spec, response, index)
            await asyncio.sleep(0.05)
        raise ControllerUnavailable(f"no controller leader answered {type(request).__name__}")

    async def heartbeat(self, request) -> None:
        """Fire a heartbeat at every controller (liveness is local to each node)."""
        for c in self._spec.controllers:
            try:
                self._handle(c.index).heartbeat.remote(request)
            except (ray.exceptions.RayError, ValueError):
                self._handles.pop(c.index, None)

    async def metadata(self) -> list[dict]:
        out = []
        for c in self._spec.controllers:
            md = await self._call_one(c.index, "metadata")
            if md is not None:
                out.append(md)
        return out


def call_leader_sync(cluster, request, timeout_s: float = 10.0, call_timeout_s: float | None = None) -> Response:
    """Driver-side: the leader's answer to ``request``, retrying across controllers until ``timeout_s``."""
    spec: ClusterSpec = cluster.spec
    call_timeout_s = call_timeout_for(spec) if call_timeout_s is None else call_timeout_s
    deadline = time.monotonic() + timeout_s
    # The last leader first: starting at controller 0 made every call after losing that
    # controller's node wait for it to time out (a producer's failover took 1.5-2.1 s, not 70 ms).
    index = cluster.leader_hint
    last: Response | None = None
    while time.monotonic() < deadline:
        try:
            response = ray.get(cluster.controller(index).handle.remote(request), timeout=call_timeout_s)
        except (ray.exceptions.RayError, ValueError):
            index = (index + 1) % len(spec.controllers)
            time.sleep(0.05)
            continue
        if response.code != ResponseCode.CONTROLLER_NOT_LEADER:
            cluster.leader_hint = index
            return response
        last = response
        index = _next_index(spec, response, index)
        time.sleep(0.05)
    raise ControllerUnavailable(f"no controller leader answered in {timeout_s}s (last: {last})")
