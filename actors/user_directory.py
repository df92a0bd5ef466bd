"""The broker's copy of the users and ACL table, and the client port's user authentication.

The table is controller state (``rocketray.controller.auth_table``: users' SCRAM records, their
rules, a version every change bumps). A broker, a member, reads it from the controllers' applied
state (``ControllerService.applied_auth_table``: no Raft round trip; the highest version among the
answers wins, so it never goes back) every ``REFRESH_S``, and at once, at most every
``EAGER_REFRESH_S``, when a client names a user it does not know (a user created a moment ago logs
in on its first try). Every operation of every open connection is checked against the newest
table: a deleted user or a removed rule takes effect on the next operation.

:func:`user_authenticator` is the client port's ``ClientAuthenticator``: SCRAM-SHA-256
(``rocketray.scram``) against the table; an unknown user is answered like a known one (salts from a
key derived from the members' secret, the same on every broker and across restarts) and fails at the
proof, so the port does not tell who exists.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import time
from typing import Any, Awaitable, Callable

from rocketray.acl import AccessDecision, Action, ResourceType
from rocketray.actors.client_port import ClientAuthenticator, Principal
from rocketray.controller.auth_table import AuthTable
from rocketray.controller.users import auth_table_of
from rocketray.scram import NONCE_SIZE, ScramServer, ServerState

__all__ = ["UserDirectory", "user_authenticator", "fake_key_of"]

log = logging.getLogger("rocketray.broker")

REFRESH_S = 1.0
EAGER_REFRESH_S = 0.2
READ_BYTES = 4096


def fake_key_of(members_secret: str) -> bytes:
    """The key unknown users' salts come from: the same on every broker of the cluster."""
    return hmac.new(members_secret.encode(), b"rocketray-scram-unknown-users", hashlib.sha256).digest()


class UserDirectory:
    """See the module docstring. ``fetch(since_version)``: the answers of the controllers'
    ``applied_auth_table`` (``Response`` or None for a controller that did not answer)."""

    def __init__(self, fetch: Callable[[int], Awaitable[list[Any]]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._fetch = fetch
        self._clock = clock
        self.table = AuthTable()
        self._known_version = -1
        self._last_refresh = float("-inf")
        self._refreshing: asyncio.Future | None = None
        self._task: asyncio.Task | None = None

    def start(self) -> "UserDirectory":
        self._task = asyncio.get_running_loop().create_task(self._loop())
        return self

    async def _loop(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(REFRESH_S)

    async def refresh(self) -> None:
        """Take the newest table the controllers applied (one fetch at a time; callers share it)."""
        if self._refreshing is not None:
            await asyncio.shield(self._refreshing)
            return
        self._refreshing = asyncio.get_running_loop().create_future()
        try:
            self._last_refresh = self._clock()
            for response in await self._fetch(self._known_version):
                try:
                    table = None if response is None else auth_table_of(response)
                except ValueError as exc:
                    log.warning("a controller's users and ACL table does not decode: %s", exc)
                    continue
                if table is not None and table.version > self.table.version:
                    self.table = table
            self._known_version = self.table.version
        except Exception:  # noqa: BLE001 - the next refresh tries again; the table in hand stays
            log.exception("users and ACL table not refreshed")
        finally:
            self._refreshing.set_result(None)
            self._refreshing = None

    async def ensure_known(self, user: str) -> None:
        """Refresh now if ``user`` is not in the table (rate-limited): it may have just been created."""
        if self.table.credential(user) is None and self._clock() - self._last_refresh >= EAGER_REFRESH_S:
            await self.refresh()

    def authorize(self, principal: Principal, resource_type: ResourceType, name: str,
                  action: Action) -> AccessDecision:
        return self.table.authorize(principal.user, resource_type, name, action)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()


def _claimed_user(data: bytes) -> str | None:
    """The user name a SCRAM CLIENT_FIRST frame names, if ``data`` holds one (peeked, not consumed)."""
    if len(data) < 5 or data[0] != 1:
        return None
    name_len = data[4]
    if len(data) < 5 + name_len:
        return None
    try:
        return bytes(data[5:5 + name_len]).decode("utf-8")
    except UnicodeDecodeError:
        return None


def user_authenticator(directory: UserDirectory, fake_key: bytes) -> ClientAuthenticator:
    """The client port's authentication of a user (module docstring); raises on failure after
    sending the server's refusal."""

    async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[Principal, bytes]:
        server = ScramServer(lambda name: directory.table.credential(name), os.urandom(NONCE_SIZE), fake_key)
        first = True
        while server.state in (ServerState.WAIT_CLIENT_FIRST, ServerState.WAIT_CLIENT_FINAL):
            data = await reader.read(READ_BYTES)
            if not data:
                raise ConnectionResetError("the client closed the connection during authentication")
            if first and (name := _claimed_user(data)) is not None:
                first = False
                await directory.ensure_known(name)
            server.receive_data(data)
            out = server.data_to_send()
            if out:
                writer.write(out)
                await writer.drain()
        if server.state is not ServerState.DONE or server.user is None:
            raise PermissionError(f"user {server.claimed_user!r:.80} failed authentication")
        record = directory.table.users.get(server.user)
        return Principal(server.user, superuser=bool(record and record.superuser)), server.trailing_data

    return run
