"""The event-loop scaffolding both chaos proxies share (``chaos/proxy.py``, ``chaos/ha_proxy.py``).

A proxy runs its asyncio listeners on a loop in a daemon thread of the chaos runner; the runner's
threads call in with ``_call(coro)`` (thread-safe, waits for the result). ``close()`` closes the
listeners, aborts the proxy's connections (``_abort_connections``, the subclass's), cancels what is
left on the loop, then stops the loop and joins its thread. Idempotent; a proxy never started has
nothing to close.
"""

from __future__ import annotations

import abc
import asyncio
import socket
import threading
from typing import Any, Awaitable, Callable, Coroutine

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class ProxyLoop(abc.ABC):
    def __init__(self, thread_name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=thread_name, daemon=True)
        self._servers: list[asyncio.AbstractServer] = []

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _start_loop(self, setup: Coroutine[Any, Any, Any]) -> None:
        """Start the loop thread, then run ``setup`` (which opens the listeners) on it."""
        assert not self._thread.is_alive() and not self._loop.is_closed(), "a proxy starts once"
        self._thread.start()
        self._call(setup)

    def _call(self, coro: Coroutine[Any, Any, Any], timeout_s: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    async def _listen(self, handler: Handler, *, sock: socket.socket | None = None, host: str | None = None,
                      port: int | None = None) -> None:
        """One listener: on a pre-bound ``sock`` if given, else on ``host:port``."""
        if sock is not None:
            sock.setblocking(False)
            server = await asyncio.start_server(handler, sock=sock)
        else:
            server = await asyncio.start_server(handler, host, port, reuse_address=True)
        self._servers.append(server)

    @abc.abstractmethod
    def _abort_connections(self) -> None:
        """Abort every proxied connection (called on the loop by ``close``)."""

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        try:
            self._call(self._shutdown())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)

    async def _shutdown(self) -> None:
        for server in self._servers:
            server.close()
        self._abort_connections()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()
