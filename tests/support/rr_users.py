"""Users for tests of the client port: a users and ACL table, the broker's directory over it, and the
matching client login (``rocketray.scram`` with the minimum iteration count, for speed).

On pytest's ``pythonpath``: ``from rr_users import directory_of, login``.
"""

from __future__ import annotations


from rocketray.acl import parse_rules
from rocketray.actors.user_directory import UserDirectory, user_authenticator
from rocketray.client.connections import user_login
from rocketray.controller.auth_table import AuthTable, UserRecord
from rocketray.scram import MIN_ITERATIONS, ScramCredential

FAKE_KEY = b"k" * 32


def table_of(users: dict[str, str], superusers: tuple[str, ...] = (),
             rules: dict[str, list[tuple[str, str, str]]] | None = None, version: int = 1) -> AuthTable:
    """``users``: name -> secret; ``rules``: name -> [(resources, actions, decision)] in the CLI's form."""
    records = {name: UserRecord(name, ScramCredential.from_secret(secret, name.encode().ljust(16, b"."),
                                                                  MIN_ITERATIONS), name in superusers)
               for name, secret in users.items()}
    acls = {name: tuple(r for spec in specs for r in parse_rules(*spec)) for name, specs in (rules or {}).items()}
    return AuthTable(version, records, acls)


def directory_of(table: AuthTable) -> UserDirectory:
    """A broker's directory holding ``table`` (its refreshes find nothing newer)."""
    async def fetch(_since: int) -> list:
        return []
    directory = UserDirectory(fetch)
    directory.table = table
    return directory


def authenticator(directory: UserDirectory):
    return user_authenticator(directory, FAKE_KEY)


def login(user: str, secret: str):
    return user_login(user, secret)


__all__ = ["FAKE_KEY", "authenticator", "directory_of", "login", "table_of"]
