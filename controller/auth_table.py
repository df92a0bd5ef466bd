"""The replicated users and ACL table: users (name -> SCRAM record, superuser flag), each user's ACL
rules, and ``version``, which every applied change bumps.

Theory of operation. The table is controller state like the topic table: it changes only by
applying committed events (``PutUserEvent``, ``DeleteUserEvent``, ``SetAclEvent``), on every
controller in log order, and it is kept in its own snapshot section (``SECTION_AUTH``), so a
snapshot written before users existed loads with an empty table. It never holds a secret: a user
is stored as the ``ScramCredential`` the admin tool derived (salt, iterations, StoredKey,
ServerKey), enough to check a login, not to make one.

An ``AuthTable`` is immutable: ``applied(event)`` returns a new table (the dicts are never changed
after construction), so the controller's speculative copy, a batch rollback and a broker's cache
share one object safely. Members ask for it by version (``GetAuthTableRequest(since_version)``):
versions only grow along the log, so a member keeps the table with the highest version it has seen
and takes a newer one whole.

``to_plain``/``from_plain`` are the one plain (msgpack-safe) form, used by the snapshot section and
by the answer to GetAuthTable::

    {"version": 1, "auth_version": n,
     "users": [[name, superuser, salt, iterations, stored_key, server_key], ...],   # by name
     "acls":  [[user, [[resource, [actions], decision], ...]], ...]}                # by user

``from_plain`` trusts nothing: a malformed form raises ``ValueError``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rocketray.acl import AccessDecision, AclRule, Action, ResourceType, evaluate
from rocketray.controller.events import (AUTH_EVENTS, DeleteUserEvent, EventCodecError, PutUserEvent, SetAclEvent,
                                         decode_credential, decode_rules, encode_credential, encode_rules)
from rocketray.scram import ScramCredential

__all__ = ["AUTH_SNAPSHOT_VERSION", "AuthTable", "MAX_USERS", "UserRecord", "rule_rows", "sorted_rules"]

AUTH_SNAPSHOT_VERSION = 1
MAX_USERS = 10_000


@dataclass(frozen=True, slots=True)
class UserRecord:
    """One user as the controller keeps it (``repr`` shows no key)."""

    name: str
    credential: ScramCredential
    superuser: bool = False


def sorted_rules(rules: Any) -> tuple[AclRule, ...]:
    """A user's rules in their one stable order (by resource type, name, pattern kind)."""
    return tuple(sorted(rules, key=lambda r: r.resource.sort_key()))


def rule_rows(user: str, rules: tuple[AclRule, ...]) -> tuple[tuple[str, str, tuple[str, ...], str], ...]:
    """``(user, resource, actions, decision)`` rows as the admin tool prints them."""
    return tuple((user, str(r.resource), tuple(sorted(a.value for a in r.actions)), r.decision.value) for r in rules)


@dataclass(frozen=True, slots=True)
class AuthTable:
    """Users, their ACL rules and the table's version. Never mutated: ``applied`` builds a new one."""

    version: int = 0
    users: dict[str, UserRecord] = field(default_factory=dict)
    acls: dict[str, tuple[AclRule, ...]] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"AuthTable(version={self.version}, users={len(self.users)}, rules={sum(map(len, self.acls.values()))})"

    # -- what a broker asks -------------------------------------------------------------------
    def credential(self, user: str) -> ScramCredential | None:
        """The user's stored SCRAM record, or None: the ``lookup`` of ``rocketray.scram.ScramServer``."""
        record = self.users.get(user)
        return None if record is None else record.credential

    def rules(self, user: str) -> tuple[AclRule, ...]:
        return self.acls.get(user, ())

    def authorize(self, user: str, resource_type: ResourceType, name: str, action: Action) -> AccessDecision:
        """May ``user`` do ``action`` on ``resource_type:name``? An unknown user may do nothing."""
        record = self.users.get(user)
        if record is None:
            return AccessDecision(False, user, f"{resource_type.value}:{name}", action, None, "unknown user")
        return evaluate(user, record.superuser, self.rules(user), resource_type, name, action)

    # -- apply --------------------------------------------------------------------------------
    def applied(self, event: Any) -> AuthTable:
        """The table after one committed auth event. An event about a missing user (delete, set
        rules) changes nothing and keeps the version; every other one bumps it."""
        assert isinstance(event, AUTH_EVENTS), f"not an auth event: {event!r}"
        users, acls = self.users, self.acls
        if isinstance(event, PutUserEvent):
            users = {**users, event.name: UserRecord(event.name, event.credential, event.superuser)}
        elif isinstance(event, DeleteUserEvent):
            if event.name not in users:
                return self
            users = {n: r for n, r in users.items() if n != event.name}
            acls = {n: r for n, r in acls.items() if n != event.name}
        elif isinstance(event, SetAclEvent):
            if event.user not in users:
                return self
            acls = {n: r for n, r in acls.items() if n != event.user}
            if event.rules:
                acls[event.user] = sorted_rules(event.rules)
        return AuthTable(self.version + 1, users, acls)

    # -- plain form ---------------------------------------------------------------------------
    def to_plain(self) -> dict[str, Any]:
        """The snapshot section / GetAuthTable body (module docstring)."""
        users = [[r.name, r.superuser, *encode_credential(r.credential)] for _, r in sorted(self.users.items())]
        acls = [[user, encode_rules(rules)] for user, rules in sorted(self.acls.items())]
        return {"version": AUTH_SNAPSHOT_VERSION, "auth_version": self.version, "users": users, "acls": acls}

    @classmethod
    def from_plain(cls, data: Any) -> AuthTable:
        """Inverse of ``to_plain``; ``ValueError`` on anything malformed."""
        if not isinstance(data, dict) or data.get("version") != AUTH_SNAPSHOT_VERSION:
            raise ValueError("unsupported users and ACL section")
        version = data.get("auth_version")
        if type(version) is not int or version < 0:
            raise ValueError(f"bad auth_version {version!r:.40}")
        users: dict[str, UserRecord] = {}
        acls: dict[str, tuple[AclRule, ...]] = {}
        try:
            for row in data.get("users", ()):
                if type(row) is not list or len(row) != 6 or type(row[0]) is not str or type(row[1]) is not bool:
                    raise ValueError(f"malformed user row {row!r:.80}")
                users[row[0]] = UserRecord(row[0], decode_credential(row[2:]), row[1])
            for row in data.get("acls", ()):
                if type(row) is not list or len(row) != 2 or row[0] not in users:
                    raise ValueError(f"malformed ACL row, or rules of an unknown user: {row!r:.80}")
                acls[row[0]] = sorted_rules(decode_rules(row[1]))
        except EventCodecError as exc:
            raise ValueError(f"malformed users and ACL section: {exc}") from exc
        return cls(version, users, acls)

    def public_view(self) -> dict[str, Any]:
        """The table without any key (for admin views and logs): version, users with their flag and
        iteration count, rules as text."""
        return {"auth_version": self.version,
                "users": [[r.name, r.superuser, r.credential.iterations] for _, r in sorted(self.users.items())],
                "acls": [[user, [str(r) for r in rules]] for user, rules in sorted(self.acls.items())]}
