"""``rocketray admin user ...`` and ``rocketray admin acl ...``: users and their ACL rules, in the shape of
mqadmin's ACL 2.0 commands (createUser, deleteUser, listUser; createAcl, updateAcl, deleteAcl, getAcl,
listAcl), sent to the controller leader like the other admin commands.

A secret never travels and is never an argument: ``user create`` generates one (256 random bits,
printed once) or reads it from ``--secret-file PATH`` (``-`` for stdin; one trailing newline is
dropped), then derives the SCRAM record (``rocketray.scram``: a random 16-byte salt,
``--iterations`` rounds) and sends only that. The cluster cannot show the secret again: ``user
list`` prints names and types, never a key. ``acl`` takes mqadmin's ``-r`` resources
(``Topic:orders,Group:billing-*``), ``-a`` actions (``Pub,Sub,Admin`` or ``All``) and ``-d``
``allow|deny`` for ``-u USER``; the controller parses and checks them (``rocketray.acl``) and
answers with the user's rules after the change.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from typing import Any, Callable

from rocketray.cli import admin_format as fmt
from rocketray.cli.admin_common import EXIT_USAGE, add_common_flags, call, response_json, run, run_request
from rocketray.wire.controller_headers import header_fields
from rocketray.scram import DEFAULT_ITERATIONS, DEFAULT_SALT_BYTES, MAX_ITERATIONS, MIN_ITERATIONS, ScramCredential

__all__ = ["GENERATED_SECRET_BYTES", "MIN_SECRET_CHARS", "SecretError", "add_auth_parsers", "read_secret"]

GENERATED_SECRET_BYTES = 32      # token_urlsafe: 43 characters
MIN_SECRET_CHARS = 16            # a secret from a file: anything shorter is refused


class SecretError(ValueError):
    """A secret file that cannot be used (missing, empty, too short)."""


def read_secret(path: str, stdin: Any = None) -> str:
    """The secret in ``path`` (``-``: standard input) without one trailing newline."""
    try:
        if path == "-":
            text = (stdin or sys.stdin).read()
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise SecretError(f"cannot read the secret from {path!r}: {exc}") from exc
    for ending in ("\r\n", "\n"):
        if text.endswith(ending):
            text = text[:-len(ending)]
            break
    if len(text) < MIN_SECRET_CHARS:
        raise SecretError(f"the secret in {path!r} has {len(text)} characters; at least {MIN_SECRET_CHARS} are needed")
    return text


def _iterations(text: str) -> int:
    value = int(text)
    if not MIN_ITERATIONS <= value <= MAX_ITERATIONS:
        raise argparse.ArgumentTypeError(f"iterations must be in {MIN_ITERATIONS}..{MAX_ITERATIONS}")
    return value


def _secret_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--secret-file", metavar="PATH", default=None,
                   help="read the secret from PATH ('-': stdin) instead of generating one")
    p.add_argument("--iterations", type=_iterations, default=DEFAULT_ITERATIONS, metavar="N",
                   help=f"PBKDF2 rounds of the stored record (default {DEFAULT_ITERATIONS})")
    p.add_argument("--client-config", metavar="FILE", default=None,
                   help="write what an application needs (brokers' client addresses, the cluster's CA, the user and "
                        "its secret) to FILE, mode 0600, instead of printing the secret "
                        "(rocketray.client.Bootstrap.from_file reads it)")


def _rule_flags(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    p.add_argument("-u", "--user", required=True, help="the user the rules belong to")
    p.add_argument("-r", "--resources", required=required, metavar="RESOURCES",
                   help="comma-separated Topic:<name>, Group:<name> or Cluster:<name>; a trailing * is a prefix")
    if required:
        p.add_argument("-a", "--actions", required=True, metavar="ACTIONS", help="comma-separated Pub, Sub, Admin, or All")
        p.add_argument("-d", "--decision", required=True, metavar="allow|deny")


def add_auth_parsers(sub: argparse._SubParsersAction) -> None:
    user = sub.add_parser("user", help="users of the client port: create, update, delete, list")
    users = user.add_subparsers(dest="user_command", metavar="USER_COMMAND")
    user.set_defaults(func=lambda args: (user.print_help(), EXIT_USAGE)[1])
    # allow_abbrev=False: "--secret X" must not be taken for "--secret-file X" (a secret typed as a path)
    p = users.add_parser("create", help="create a user; its secret is generated and printed once (or --secret-file)",
                         allow_abbrev=False)
    add_common_flags(p)
    p.add_argument("user_name", metavar="NAME")
    p.add_argument("--superuser", action="store_true", help="may do everything (no ACL is checked)")
    _secret_flags(p)
    p.set_defaults(func=run_user_create)
    p = users.add_parser("update", help="give a user a new secret (--new-secret or --secret-file) or change its type",
                         allow_abbrev=False)
    add_common_flags(p)
    p.add_argument("user_name", metavar="NAME")
    p.add_argument("--superuser", action=argparse.BooleanOptionalAction, default=None,
                   help="make the user a superuser (--no-superuser: a normal user)")
    p.add_argument("--new-secret", action="store_true", help="generate a new secret and print it once")
    _secret_flags(p)
    p.set_defaults(func=run_user_update)
    p = users.add_parser("delete", help="delete a user and its ACL rules")
    add_common_flags(p)
    p.add_argument("user_name", metavar="NAME")
    p.set_defaults(func=run_user_delete)
    p = users.add_parser("list", help="every user and its type (never a key)")
    add_common_flags(p)
    p.set_defaults(func=run_user_list)

    acl = sub.add_parser("acl", help="ACL rules of users: create, update, delete, get, list")
    acls = acl.add_subparsers(dest="acl_command", metavar="ACL_COMMAND")
    acl.set_defaults(func=lambda args: (acl.print_help(), EXIT_USAGE)[1])
    for verb, help_text, func in (("create", "add a rule per resource", run_acl_create),
                                  ("update", "replace the user's rule on each resource", run_acl_update)):
        p = acls.add_parser(verb, help=help_text)
        add_common_flags(p)
        _rule_flags(p)
        p.set_defaults(func=func)
    p = acls.add_parser("delete", help="remove the user's rules on the resources (all rules without -r)")
    add_common_flags(p)
    _rule_flags(p, required=False)
    p.set_defaults(func=run_acl_delete)
    p = acls.add_parser("get", help="a user's rules")
    add_common_flags(p)
    p.add_argument("-u", "--user", required=True)
    p.set_defaults(func=run_acl_get)
    p = acls.add_parser("list", help="every rule, filtered by user and by resource text")
    add_common_flags(p)
    p.add_argument("-u", "--user", default="", help="only this user's rules")
    p.add_argument("-r", "--resource", default="", help="only rules whose resource contains this text")
    p.set_defaults(func=run_acl_list)


# -- users ----------------------------------------------------------------------------------------

def _credential(args: argparse.Namespace, generate: bool) -> tuple[ScramCredential | None, str | None, str | None]:
    """The record to send, the secret, and the secret to print (None when read from a file or
    written to the client configuration file), or (None, None, None)."""
    if args.secret_file is not None:
        secret, shown = read_secret(args.secret_file), None
    elif generate:
        secret = shown = secrets.token_urlsafe(GENERATED_SECRET_BYTES)
    else:
        return None, None, None
    if args.client_config is not None:
        shown = None
    return ScramCredential.from_secret(secret, os.urandom(DEFAULT_SALT_BYTES), args.iterations), secret, shown


def write_client_config(path: str, cluster: Any, user: str, secret: str) -> None:
    """The application's client configuration (``rocketray.client.Bootstrap``), mode 0600: every
    broker's client address, the cluster's CA (none when TLS is off), the user and its secret."""
    from rocketray.client.bootstrap import Bootstrap

    servers = tuple(f"{b.host}:{b.client_port}" for b in cluster.spec.brokers if b.client_port is not None)
    trust = cluster.access.trust
    text = Bootstrap(cluster.spec.name, servers, user, secret, None if trust is None else trust.trusted_ca_pem).to_toml()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def _user_command(args: argparse.Namespace, generate: bool, build: Callable[[ScramCredential | None], Any],
                  verb: str) -> int:
    try:
        credential, secret, shown = _credential(args, generate)
    except SecretError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    request = build(credential)

    def once(cluster):
        response = call(cluster, request)
        header = response.header
        obj = response_json(response)
        if shown is not None:
            obj["secret"] = shown
        if args.client_config is not None and secret is not None:
            write_client_config(args.client_config, cluster, header.name, secret)
            obj["client_config"] = args.client_config
        return fmt.format_user_change(verb, header.name, header.superuser, header.changed, shown), obj

    code = run(args, once)
    if shown is not None and code == 0 and not args.json:
        print("The secret is shown once: store it now. The cluster keeps only its salted SCRAM record.",
              file=sys.stderr)
    return code


def run_user_create(args: argparse.Namespace) -> int:
    from rocketray.wire.controller_api import CreateUserRequest

    return _user_command(args, True, lambda cred: CreateUserRequest(args.user_name, cred, args.superuser), "create")


def run_user_update(args: argparse.Namespace) -> int:
    from rocketray.wire.controller_api import UpdateUserRequest

    if args.new_secret and args.secret_file is not None:
        print("error: give --new-secret or --secret-file, not both", file=sys.stderr)
        return EXIT_USAGE
    if not args.new_secret and args.secret_file is None and args.superuser is None:
        print("error: nothing to update: give --new-secret, --secret-file or --[no-]superuser", file=sys.stderr)
        return EXIT_USAGE
    return _user_command(args, args.new_secret, lambda cred: UpdateUserRequest(args.user_name, cred, args.superuser),
                         "update")


def run_user_delete(args: argparse.Namespace) -> int:
    from rocketray.wire.controller_api import DeleteUserRequest

    return run_request(args, DeleteUserRequest(args.user_name), lambda response: fmt.format_user_deleted(args.user_name))


def run_user_list(args: argparse.Namespace) -> int:
    from rocketray.wire.controller_api import ListUsersRequest

    return run_request(args, ListUsersRequest(), lambda response: fmt.format_users(response.header.users))


# -- ACL rules ------------------------------------------------------------------------------------

def _split(text: str | None) -> tuple[str, ...]:
    return tuple(item.strip() for item in (text or "").split(",") if item.strip())


def _acl_command(args: argparse.Namespace, request: Any, first_line: str | None) -> int:
    return run_request(args, request,
                       lambda response: fmt.format_acl_rules(header_fields(response.header)["rules"], first_line))


def run_acl_create(args: argparse.Namespace) -> int:
    from rocketray.wire.controller_api import CreateAclRequest

    request = CreateAclRequest(args.user, _split(args.resources), _split(args.actions), args.decision)
    return _acl_command(args, request, "create acl to controller success.")


def run_acl_update(args: argparse.Namespace) -> int:
    from rocketray.wire.controller_api import UpdateAclRequest

    request = UpdateAclRequest(args.user, _split(args.resources), _split(args.actions), args.decision)
    return _acl_command(args, request, "update acl to controller success.")


def run_acl_delete(args: argparse.Namespace) -> int:
    from rocketray.wire.controller_api import DeleteAclRequest

    return _acl_command(args, DeleteAclRequest(args.user, _split(args.resources)), "delete acl from controller success.")


def run_acl_get(args: argparse.Namespace) -> int:
    from rocketray.wire.controller_api import GetAclRequest

    return _acl_command(args, GetAclRequest(args.user), None)


def run_acl_list(args: argparse.Namespace) -> int:
    from rocketray.wire.controller_api import ListAclsRequest

    return _acl_command(args, ListAclsRequest(args.user, args.resource), None)
