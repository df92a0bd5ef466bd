"""The broker's session connection to the controller leader (``rocketray.controller.session``).

A task on the broker actor's event loop. Once the broker has its id and knows the controller leader,
it connects to that controller's session port, authenticates with the cluster secret and sends its
hello; then it only holds the connection. If the broker's process dies the kernel closes it and the
leader re-elects at once. When another leader is known (``leader_of``: the broker's controller client
follows leadership with a long poll on every controller, ``actors/controller_client.py``) or the broker
id changes, the session says bye and moves within ``POLL_S``: a new leader treats a master that has
not reopened its session within a grace window as dead (``LeaderSessionGrace``). When the controller
end closes (the controller died or restarted), or a connect fails, it asks for the leader again and
retries with a bounded backoff, cut short as soon as another leader is known.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from rocketray.auth import SESSION_LABEL, AuthError, authenticate
from rocketray.controller.session import Hello, encode_bye, encode_hello
from rocketray.spec import ClusterSpec

log = logging.getLogger("rocketray.broker.session")

__all__ = ["ControllerSession"]

POLL_S = 0.05            # how often a held session checks whether the leader moved
CONNECT_TIMEOUT_S = 2.0
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 1.0

Target = tuple[str, str, int, Hello]  # (leader raft address, session host, session port, hello)


class ControllerSession:
    """``hello_of()`` is this broker's hello (None until it has an id), ``leader_of()`` the raft address
    of the controller it believes leads, ``refresh_leader()`` looks the leader up again."""

    def __init__(self, spec: ClusterSpec, hello_of: Callable[[], Hello | None], leader_of: Callable[[], str | None],
                 refresh_leader: Callable[[], Awaitable[object]], auth_timeout_ms: int = 5000) -> None:
        self._spec = spec
        self._hello_of = hello_of
        self._leader_of = leader_of
        self._refresh_leader = refresh_leader
        self._auth_timeout_ms = auth_timeout_ms
        self._task: asyncio.Task | None = None
        self.connected_to: str | None = None   # raft address of the controller holding the session

    def start(self) -> "ControllerSession":
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def _target(self) -> Target | None:
        hello, leader = self._hello_of(), self._leader_of()
        if hello is None or not leader:
            return None
        c = self._spec.controller_by_address(leader)
        if c is None or c.session_port is None:
            return None
        return leader, c.host, c.session_port, hello

    async def _run(self) -> None:
        backoff_s = BACKOFF_MIN_S
        while True:
            target = self._target()
            if target is None:
                await asyncio.sleep(POLL_S)
                continue
            try:
                held = await self._hold(target)
            except (OSError, AuthError, asyncio.TimeoutError) as exc:
                log.info("controller session to %s failed: %r", target[0], exc)
                held = False
            except Exception:  # noqa: BLE001 - a shell: log and keep trying
                log.exception("controller session to %s failed", target[0])
                held = False
            self.connected_to = None
            if held:
                backoff_s = BACKOFF_MIN_S
                continue
            if self._target() == target:
                try:
                    await self._refresh_leader()
                except Exception as exc:  # noqa: BLE001 - the next round retries
                    log.info("controller leader lookup failed: %r", exc)
            await self._backoff(target, backoff_s)
            backoff_s = min(backoff_s * 2, BACKOFF_MAX_S)

    async def _backoff(self, failed: Target, backoff_s: float) -> None:
        """Wait ``backoff_s`` before trying ``failed`` again, but no longer than until another leader
        is known: a new leader gets this broker's session at once (``LeaderSessionGrace``)."""
        loop = asyncio.get_running_loop()
        until = loop.time() + backoff_s
        while loop.time() < until:
            if self._target() not in (None, failed):
                return
            await asyncio.sleep(min(POLL_S, max(0.0, until - loop.time())))

    async def _hold(self, target: Target) -> bool:
        """Open the session and hold it. True: it moved on purpose (bye sent); False: the controller
        end closed it."""
        leader, host, port, hello = target
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), CONNECT_TIMEOUT_S)
        try:
            await authenticate(reader, writer, "client", self._spec.secret, self._auth_timeout_ms, SESSION_LABEL)
            writer.write(encode_hello(hello))
            await writer.drain()
            self.connected_to = leader
            log.info("controller session opened to %s group=%s broker_id=%d", leader, hello.group, hello.broker_id)
            closed = asyncio.ensure_future(reader.read(1))  # the controller sends nothing: EOF or reset
            try:
                while True:
                    done, _ = await asyncio.wait({closed}, timeout=POLL_S)
                    if done:
                        log.info("controller session to %s closed by the controller", leader)
                        return False
                    if self._target() != target:
                        writer.write(encode_bye())
                        await asyncio.wait_for(writer.drain(), CONNECT_TIMEOUT_S)
                        return True
            finally:
                closed.cancel()
        finally:
            writer.close()
