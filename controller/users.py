"""Pure decisions about users and their ACL rules (RocketMQ 5.3 ACL 2.0's shape).

Theory of operation. Users and rules live in the replicated ``ControllerState.auth``
(``rocketray.controller.auth_table``) and change only through the events decided here:
``PutUserEvent`` (create, or replace a record and flag), ``DeleteUserEvent`` (a user and its
rules), ``SetAclEvent`` (a user's whole rule list, the result of a create, update or delete). No
request carries a secret: the admin tool derives the SCRAM record first, and the controller checks
only the record's bounds.

Validation first, then existence, then the change, each with its code: INVALID_USER_NAME (3005),
INVALID_CREDENTIAL (3007), INVALID_POLICY (3006, with ``rocketray.acl``'s message), USER_NOT_EXIST
(3001), USER_ALREADY_EXIST (3003), POLICY_NOT_EXIST (3002), POLICY_ALREADY_EXIST (3004). A request
that would change nothing (a retried create of the same user or rules) is SUCCESS with no event, so
the admin tool can retry after an unknown outcome. ``decide_get_auth_table`` is what members read
the table with, by version. Each ``decide_*`` returns ``(Response, events)`` and mutates nothing.
"""

from __future__ import annotations

from typing import Any, Callable

from rocketray.acl import MAX_RULES_PER_USER, AclParseError, AclRule, parse_resources, parse_rules, user_name_problem
from rocketray.wire.controller_api import (CreateAclRequest, CreateUserRequest, DeleteAclRequest, DeleteUserRequest,
                                           GetAclRequest, GetAuthTableRequest, ListAclsRequest, ListUsersRequest,
                                           Response, UpdateAclRequest, UpdateUserRequest)
from rocketray.controller.auth_table import MAX_USERS, AuthTable, UserRecord, rule_rows, sorted_rules
from rocketray.wire.controller_codes import ResponseCode as C
from rocketray.controller.events import DeleteUserEvent, Event, PutUserEvent, SetAclEvent
from rocketray.wire.controller_headers import (AclRulesResponseHeader, AuthTableResponseHeader, ListUsersResponseHeader,
                                               UserResponseHeader)
from rocketray.controller.state import ControllerState
from rocketray.scram import ScramCredential

__all__ = ["DECISIONS", "WRITES", "auth_table_of", "decide_create_acl", "decide_create_user", "decide_delete_acl", "decide_delete_user",
           "decide_get_acl", "decide_get_auth_table", "decide_list_acls", "decide_list_users", "decide_update_acl",
           "decide_update_user"]

Decision = tuple[Response, list[Event]]


def _error(code: C, remark: str) -> Decision:
    return Response.error(code, remark), []


def _bad_name(name: object) -> Decision | None:
    problem = user_name_problem(name)
    return None if problem is None else _error(C.INVALID_USER_NAME, problem)


def _bad_credential(credential: object) -> Decision | None:
    if not isinstance(credential, ScramCredential):
        return _error(C.INVALID_CREDENTIAL, f"a user's credential is a SCRAM record, got {type(credential).__name__}")
    problem = credential.problem()
    return None if problem is None else _error(C.INVALID_CREDENTIAL, f"invalid SCRAM record: {problem}")


def _no_user(name: str) -> Decision:
    return _error(C.USER_NOT_EXIST, f"user {name!r} does not exist")


def _user_answer(record: UserRecord, changed: bool) -> Response:
    return Response(C.SUCCESS, UserResponseHeader(record.name, record.superuser, changed))


def decide_create_user(state: ControllerState, req: CreateUserRequest) -> Decision:
    """A new user; the same record and flag again is SUCCESS with no event."""
    refused = _bad_name(req.name) or _bad_credential(req.credential)
    if refused is not None:
        return refused
    record = UserRecord(req.name, req.credential, bool(req.superuser))
    existing = state.auth.users.get(req.name)
    if existing is not None:
        if existing == record:
            return _user_answer(record, False), []
        return _error(C.USER_ALREADY_EXIST, f"user {req.name!r} already exists (rocketray admin user update "
                                            "changes its secret or flag)")
    if len(state.auth.users) >= MAX_USERS:
        return _error(C.CONTROLLER_INVALID_REQUEST, f"the user table is full ({MAX_USERS} users)")
    return _user_answer(record, True), [PutUserEvent(record.name, record.credential, record.superuser)]


def decide_update_user(state: ControllerState, req: UpdateUserRequest) -> Decision:
    """A new record and/or flag for an existing user (None keeps the current one)."""
    refused = _bad_name(req.name) or (None if req.credential is None else _bad_credential(req.credential))
    if refused is not None:
        return refused
    if req.credential is None and req.superuser is None:
        return _error(C.CONTROLLER_INVALID_REQUEST, "nothing to update: give a new credential or a superuser flag")
    existing = state.auth.users.get(req.name)
    if existing is None:
        return _no_user(req.name)
    record = UserRecord(req.name, existing.credential if req.credential is None else req.credential,
                        existing.superuser if req.superuser is None else bool(req.superuser))
    if record == existing:
        return _user_answer(record, False), []
    return _user_answer(record, True), [PutUserEvent(record.name, record.credential, record.superuser)]


def decide_delete_user(state: ControllerState, req: DeleteUserRequest) -> Decision:
    """Forget a user and its rules."""
    refused = _bad_name(req.name)
    if refused is not None:
        return refused
    existing = state.auth.users.get(req.name)
    if existing is None:
        return _no_user(req.name)
    return _user_answer(existing, True), [DeleteUserEvent(req.name)]


def decide_list_users(state: ControllerState, req: ListUsersRequest) -> Decision:
    """Every user and its superuser flag, by name."""
    users = tuple((name, record.superuser) for name, record in sorted(state.auth.users.items()))
    return Response(C.SUCCESS, ListUsersResponseHeader(users)), []


# -- ACL rules ------------------------------------------------------------------------------------

def _rules_answer(user: str, rules: tuple[AclRule, ...]) -> Response:
    return Response(C.SUCCESS, AclRulesResponseHeader(rule_rows(user, sorted_rules(rules))))


def _known_user(state: ControllerState, user: str) -> Decision | None:
    refused = _bad_name(user)
    if refused is not None:
        return refused
    return None if user in state.auth.users else _no_user(user)


def _set_rules(user: str, before: tuple[AclRule, ...], after: dict[str, AclRule]) -> Decision:
    rules = sorted_rules(after.values())
    if len(rules) > MAX_RULES_PER_USER:
        return _error(C.INVALID_POLICY, f"user {user!r} would have {len(rules)} rules, over {MAX_RULES_PER_USER}")
    if rules == sorted_rules(before):
        return _rules_answer(user, rules), []
    return _rules_answer(user, rules), [SetAclEvent(user, rules)]


def _write_rules(state: ControllerState, req: CreateAclRequest | UpdateAclRequest, create: bool) -> Decision:
    refused = _known_user(state, req.user)
    if refused is not None:
        return refused
    try:
        parsed = parse_rules(req.resources, req.actions, req.decision)
    except AclParseError as exc:
        return _error(C.INVALID_POLICY, str(exc))
    before = state.auth.rules(req.user)
    current = {str(r.resource): r for r in before}
    for rule in parsed:
        existing = current.get(str(rule.resource))
        if create and existing is not None and existing != rule:
            return _error(C.POLICY_ALREADY_EXIST, f"user {req.user!r} already has a rule on {rule.resource} "
                                                  f"('{existing}'): use acl update to replace it")
        if not create and existing is None:
            return _error(C.POLICY_NOT_EXIST, f"user {req.user!r} has no rule on {rule.resource}: use acl create")
        current[str(rule.resource)] = rule
    return _set_rules(req.user, before, current)


def decide_create_acl(state: ControllerState, req: CreateAclRequest) -> Decision:
    """Add a rule per resource; a different rule already on one of them is POLICY_ALREADY_EXIST."""
    return _write_rules(state, req, create=True)


def decide_update_acl(state: ControllerState, req: UpdateAclRequest) -> Decision:
    """Replace the rule on each resource; a resource without one is POLICY_NOT_EXIST."""
    return _write_rules(state, req, create=False)


def decide_delete_acl(state: ControllerState, req: DeleteAclRequest) -> Decision:
    """Remove the rules on the named resources, or every rule of the user when none is named."""
    refused = _known_user(state, req.user)
    if refused is not None:
        return refused
    before = state.auth.rules(req.user)
    if not before:
        return _error(C.POLICY_NOT_EXIST, f"user {req.user!r} has no rules")
    if not req.resources:
        return _set_rules(req.user, before, {})
    try:
        resources = parse_resources(req.resources)
    except AclParseError as exc:
        return _error(C.INVALID_POLICY, str(exc))
    current = {str(r.resource): r for r in before}
    for resource in resources:
        if current.pop(str(resource), None) is None:
            return _error(C.POLICY_NOT_EXIST, f"user {req.user!r} has no rule on {resource}")
    return _set_rules(req.user, before, current)


def decide_get_acl(state: ControllerState, req: GetAclRequest) -> Decision:
    """One user's rules."""
    refused = _known_user(state, req.user)
    if refused is not None:
        return refused
    return _rules_answer(req.user, state.auth.rules(req.user)), []


def decide_list_acls(state: ControllerState, req: ListAclsRequest) -> Decision:
    """Every rule, of ``req.user`` only if given, whose resource text contains ``req.resource``."""
    rows: list[tuple[str, str, tuple[str, ...], str]] = []
    for user, rules in sorted(state.auth.acls.items()):
        if req.user and user != req.user:
            continue
        rows.extend(row for row in rule_rows(user, rules) if req.resource in row[1])
    return Response(C.SUCCESS, AclRulesResponseHeader(tuple(rows))), []


# -- members --------------------------------------------------------------------------------------

def decide_get_auth_table(state: ControllerState, req: GetAuthTableRequest) -> Decision:
    """The whole table when its version is above ``since_version``, else "unchanged"."""
    table = state.auth
    changed = table.version > req.since_version
    return Response(C.SUCCESS, AuthTableResponseHeader(table.version, changed),
                    {"table": table.to_plain()} if changed else None), []


def auth_table_of(response: Response) -> AuthTable | None:
    """The table a GetAuthTable answer carries, or None when it says "unchanged" (or is not a
    success). ``ValueError`` if the body is malformed."""
    header = response.header
    if not response.ok or not isinstance(header, AuthTableResponseHeader) or not header.changed:
        return None
    table = AuthTable.from_plain((response.body or {}).get("table"))
    if table.version != header.version:
        raise ValueError(f"table version {table.version} differs from the answer's {header.version}")
    return table


#: Each user and ACL request kind's decision (``decide`` dispatches through it), and the writes.
DECISIONS: dict[type, Callable[[ControllerState, Any], Decision]] = {
    CreateUserRequest: decide_create_user, UpdateUserRequest: decide_update_user,
    DeleteUserRequest: decide_delete_user, ListUsersRequest: decide_list_users,
    CreateAclRequest: decide_create_acl, UpdateAclRequest: decide_update_acl, DeleteAclRequest: decide_delete_acl,
    GetAclRequest: decide_get_acl, ListAclsRequest: decide_list_acls, GetAuthTableRequest: decide_get_auth_table,
}
WRITES = (CreateUserRequest, UpdateUserRequest, DeleteUserRequest, CreateAclRequest, UpdateAclRequest,
          DeleteAclRequest)
