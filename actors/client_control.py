"""The broker's answers to the client port's control frames (``rocketray.wire.client_control``).

A client outside Ray asks any broker for the cluster's metadata, waits on a broker for a group's
next master, and sends its topic and consumer-group requests through a broker to the controller
leader. The broker knows the cluster spec (every group's replicas and client addresses) and reaches
the controllers through Ray, as a member.

Masters. For each group a client asks about, the broker keeps the newest master the controllers
applied: looked up once from every controller (``applied_master``: no Raft read, the highest epoch
wins), then kept current by one long poll per controller (``watch_master``), shared by every
client's WATCH on this broker, so a thousand waiting clients cost the controllers one watch per
group. A WATCH answers as soon as the group's epoch passes the client's, or at its wait's end.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

from rocketray.wire.client_control import GroupView, Metadata
from rocketray.wire.controller_api import Response
from rocketray.spec import ClusterSpec

__all__ = ["ClientControl"]

log = logging.getLogger("rocketray.broker")

WATCH_S = 30.0          # one controller watch's longest wait (ControllerService.WATCH_MAX_S)
RETRY_S = 0.5           # after a controller's watch failed (dead or restarting)


class _Group:
    """One group's newest known master and the clients waiting for a newer one (loop only)."""

    def __init__(self) -> None:
        self.epoch = -1
        self.master: int | None = None
        self.changed = asyncio.Event()
        self.watching = False


class ClientControl:
    """See the module docstring. ``controllers()``: the controller actor handles (Ray);
    ``call_controller(request)``: a request to the leader (the broker's controller client);
    ``client_config``: the cluster's ``client`` section as plain data."""

    def __init__(self, spec: ClusterSpec, controllers: Callable[[], list[Any]],
                 call_controller: Callable[[Any], Awaitable[Response]], client_config: dict[str, Any]) -> None:
        self._spec = spec
        self._controllers = controllers
        self._call_controller = call_controller
        self._client_config = client_config
        self._groups: dict[str, _Group] = {}
        self._tasks: set[asyncio.Task] = set()

    def _apply(self, name: str, view: Any) -> None:
        group = self._groups[name]
        if view is None or view.master_epoch <= group.epoch:
            return
        broker = self._spec.broker_by_ha_address(view.master_address or "")
        group.epoch, group.master = view.master_epoch, (None if broker is None else broker.replica)
        group.changed.set()
        group.changed = asyncio.Event()

    async def _group(self, name: str) -> _Group:
        """``name``'s view, looked up and watched from the first time a client asks."""
        group = self._groups.get(name)
        if group is None:
            group = self._groups[name] = _Group()
            views = await asyncio.gather(*(self._ask(c.applied_master.remote(name)) for c in self._controllers()))
            for view in views:
                self._apply(name, view)
        if not group.watching:
            group.watching = True
            for handle in self._controllers():
                task = asyncio.get_running_loop().create_task(self._watch(name, handle))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        return group

    @staticmethod
    async def _ask(ref: Any) -> Any:
        try:
            return await ref
        except Exception as exc:  # noqa: BLE001 - a dead or restarting controller answers nothing
            log.debug("controller did not answer: %r", exc)
            return None

    async def _watch(self, name: str, handle: Any) -> None:
        """One controller's long poll on ``name``'s master, for as long as the broker runs."""
        while True:
            view = await self._ask(handle.watch_master.remote(name, self._groups[name].epoch, WATCH_S))
            if view is None:
                await asyncio.sleep(RETRY_S)
            self._apply(name, view)

    async def metadata(self) -> Metadata:
        groups = []
        for name in self._spec.groups:
            group = await self._group(name)
            brokers = tuple((b.replica, b.host, b.client_port) for b in self._spec.brokers_of(name)
                            if b.client_port is not None)
            groups.append(GroupView(name, group.master, group.epoch, brokers))
        return Metadata(self._spec.name, tuple(groups), self._client_config)

    async def watch(self, name: str, known_epoch: int, wait_ms: int) -> tuple[int, int | None]:
        if name not in self._spec.groups:
            return -1, None
        group = await self._group(name)
        if group.epoch <= known_epoch:
            try:
                await asyncio.wait_for(group.changed.wait(), wait_ms / 1000)
            except asyncio.TimeoutError:
                pass
        return group.epoch, group.master

    async def control(self, request: Any) -> Response:
        return await self._call_controller(request)

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
