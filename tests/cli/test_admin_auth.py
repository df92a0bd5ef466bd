"""``rocketray admin user ...`` and ``rocketray admin acl ...`` run in-process through ``rocketray.cli.main``:
their parsing, their lines and ``--json``, their refusals, and their effect. Most tests use the pure
controller core behind a stand-in for ``Cluster.call_controller``; the last ones send the same
commands to real pysyncobj controllers and log in with the printed secret against the table a
follower serves (the SCRAM exchange of ``rocketray.scram``)."""

from __future__ import annotations

import io
import json
import os

import pytest

from rocketray.cli import admin_common
from rocketray.cli.commands import admin_auth
from rocketray.wire.controller_api import CreateUserRequest, Response, UpdateUserRequest
from rocketray.controller.users import auth_table_of
from rocketray.scram import ClientState, ScramClient, ScramServer, ServerState, derive_keys

from controller_cluster import everyone_alive, make_cluster  # noqa: F401 - the shared fixture
from core_cluster import CoreCluster, install

FAST = ("--iterations", "4096")


@pytest.fixture
def core(monkeypatch):
    return install(monkeypatch, CoreCluster())


def cli(capsys, *argv):
    from rocketray.cli.main import main

    code = main(["admin", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def secret_of(out: str) -> str:
    return next(line.split("\t", 1)[1] for line in out.splitlines() if line.startswith("#Secret\t"))


def logs_in(credential_of, user: str, secret: str) -> bool:
    """A whole SCRAM exchange of ``user``/``secret`` against ``credential_of`` (a table's lookup)."""
    client = ScramClient(user, secret, os.urandom(32))
    server = ScramServer(credential_of, os.urandom(32), os.urandom(32))
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())
    if server.state is not ServerState.DONE:
        return False
    client.receive_data(server.data_to_send())
    return client.state is ClientState.DONE


def test_user_create_generates_a_secret_prints_it_once_and_sends_only_the_record(core, capsys):
    """The secret is generated, printed once, and never sent: the request holds a SCRAM record whose
    StoredKey is the printed secret's; that secret logs in; the note goes to stderr."""
    code, out, err = cli(capsys, "user", "create", "app", *FAST)
    assert code == 0 and "shown once" in err
    lines = out.splitlines()
    assert lines[:3] == ["create user app to controller success.", "#User\tapp", "#UserType\tNormal"]
    secret = secret_of(out)
    request = core.requests[-1]
    assert isinstance(request, CreateUserRequest) and secret not in repr(request)
    assert len(secret) == 43 and request.credential.iterations == 4096 and len(request.credential.salt) == 16
    assert derive_keys(secret, request.credential.salt, 4096).stored_key == request.credential.stored_key
    assert logs_in(core.state.auth.credential, "app", secret)
    assert not logs_in(core.state.auth.credential, "app", secret + "x")


def test_user_create_json_superuser_and_the_default_iterations(core, capsys):
    """--json: the controller's answer plus the generated secret; --superuser; 100,000 rounds by default."""
    code, out, _ = cli(capsys, "user", "create", "root", "--superuser", "--json")
    data = json.loads(out)
    assert code == 0 and data["header"] == {"name": "root", "superuser": True, "changed": True}
    assert data["code_name"] == "SUCCESS" and len(data["secret"]) == 43
    assert core.state.auth.users["root"].superuser and core.requests[-1].credential.iterations == 100_000


def test_secret_from_a_file_or_stdin_is_not_printed(core, capsys, tmp_path, monkeypatch):
    """--secret-file PATH and --secret-file - (stdin): one trailing newline dropped, nothing printed
    but the result; that secret logs in."""
    path = tmp_path / "secret"
    path.write_text("file-secret-0123456789\n")
    code, out, err = cli(capsys, "user", "create", "from-file", "--secret-file", str(path), *FAST)
    assert code == 0 and "#Secret" not in out and "file-secret" not in out + err
    assert logs_in(core.state.auth.credential, "from-file", "file-secret-0123456789")
    monkeypatch.setattr("sys.stdin", io.StringIO("stdin-secret-0123456789\r\n"))
    code, out, _ = cli(capsys, "user", "create", "from-stdin", "--secret-file", "-", *FAST)
    assert code == 0 and logs_in(core.state.auth.credential, "from-stdin", "stdin-secret-0123456789")


@pytest.mark.parametrize("content,message", [
    ("short\n", "has 5 characters; at least 16 are needed"),
    ("", "has 0 characters"),
    (None, "cannot read the secret"),
])
def test_unusable_secret_files_are_usage_errors_and_send_nothing(core, capsys, tmp_path, content, message):
    path = tmp_path / "secret"
    if content is not None:
        path.write_text(content)
    code, out, err = cli(capsys, "user", "create", "app", "--secret-file", str(path))
    assert (code, out, core.requests) == (2, "", []) and message in err


def test_the_secret_is_never_an_argument(core, capsys):
    """There is no flag that takes a secret on the command line, and "--secret X" is not taken for an
    abbreviation of "--secret-file X"."""
    for verb in ("create", "update"):
        with pytest.raises(SystemExit):
            cli(capsys, "user", verb, "app", "--secret", "abc")
        assert "unrecognized arguments: --secret abc" in capsys.readouterr().err
    assert core.requests == []


def test_user_update_list_and_delete(core, capsys):
    """update --new-secret replaces the record (the old secret stops working); --no-superuser /
    --superuser change the type; list shows names and types only; delete removes the user."""
    _, out, _ = cli(capsys, "user", "create", "app", *FAST)
    old = secret_of(out)
    code, out, _ = cli(capsys, "user", "update", "app", "--new-secret", *FAST)
    new = secret_of(out)
    assert code == 0 and out.startswith("update user app to controller success.")
    assert logs_in(core.state.auth.credential, "app", new) and not logs_in(core.state.auth.credential, "app", old)
    code, out, _ = cli(capsys, "user", "update", "app", "--superuser")
    assert code == 0 and "#UserType\tSuper" in out and "#Secret" not in out
    assert isinstance(core.requests[-1], UpdateUserRequest) and core.requests[-1].credential is None
    code, out, _ = cli(capsys, "user", "update", "app", "--superuser")
    assert code == 0 and out.startswith("user app unchanged.")
    cli(capsys, "user", "create", "bob", *FAST)
    code, out, _ = cli(capsys, "user", "list")
    assert code == 0 and out == "#User             #UserType\napp               Super\nbob               Normal\n"
    code, out, _ = cli(capsys, "user", "list", "--json")
    assert json.loads(out)["header"] == {"users": [["app", True], ["bob", False]]}
    stored = core.state.auth.users["bob"].credential
    assert stored.stored_key.hex() not in out and stored.salt.hex() not in out
    code, out, _ = cli(capsys, "user", "delete", "bob")
    assert (code, out) == (0, "delete user bob from controller success.\n")
    code, out, _ = cli(capsys, "user", "list")
    assert "bob" not in out


@pytest.mark.parametrize("argv,code,line", [
    (("user", "create", "-x"), 2, None),
    (("user", "create", "bad name", *FAST), 1, "error: INVALID_USER_NAME (3005): user name 'bad name' must start "
                                               "with a letter or digit and use only [A-Za-z0-9_.-]"),
    (("user", "delete", "ghost"), 1, "error: USER_NOT_EXIST (3001): user 'ghost' does not exist"),
    (("user", "update", "ghost", "--superuser"), 1, "error: USER_NOT_EXIST (3001): user 'ghost' does not exist"),
    (("user", "update", "app"), 2, "error: nothing to update: give --new-secret, --secret-file or --[no-]superuser"),
    (("user", "update", "app", "--new-secret", "--secret-file", "-"), 2,
     "error: give --new-secret or --secret-file, not both"),
    (("user", "create", "app", "--iterations", "10"), 2, None),
    (("acl", "create", "-u", "ghost", "-r", "Topic:o", "-a", "Pub", "-d", "allow"), 1,
     "error: USER_NOT_EXIST (3001): user 'ghost' does not exist"),
    (("acl", "create", "-u", "app", "-r", "Topic:o", "-a", "Pub", "-d", "perhaps"), 1,
     "error: INVALID_POLICY (3006): unknown decision 'perhaps': use one of Allow, Deny"),
    (("acl", "create", "-u", "app", "-r", "Group:g", "-a", "Pub", "-d", "allow"), 1,
     "error: INVALID_POLICY (3006): Pub does not apply to Group resources (Group:g); use Sub,Admin"),
    (("acl", "create", "-u", "app", "-r", "orders", "-a", "Pub", "-d", "allow"), 1,
     "error: INVALID_POLICY (3006): resource 'orders' needs a type: Topic:<name>, Group:<name> or Cluster:<name>"),
    (("acl", "update", "-u", "app", "-r", "Topic:o", "-a", "Pub", "-d", "allow"), 1,
     "error: POLICY_NOT_EXIST (3002): user 'app' has no rule on Topic:o: use acl create"),
    (("acl", "delete", "-u", "app"), 1, "error: POLICY_NOT_EXIST (3002): user 'app' has no rules"),
    (("acl", "create", "-u", "app", "-r", "Topic:o"), 2, None),
    (("user",), 2, None),
    (("acl",), 2, None),
])
def test_refusals_and_usage_errors(core, capsys, argv, code, line):
    """Controller refusals exit 1 with the code name and remark; usage errors exit 2."""
    cli(capsys, "user", "create", "app", *FAST)
    try:
        got, _, err = cli(capsys, *argv)
    except SystemExit as exc:  # argparse's own usage errors
        got, err = exc.code, capsys.readouterr().err
    assert got == code
    if line is not None:
        assert err.strip().splitlines()[-1] == line


def test_acl_create_update_delete_get_and_list(core, capsys):
    """mqadmin's ACL 2.0 shape: -u -r -a -d; each change prints the user's rules after it; get and
    list print the rows; list filters by user and resource text; --json gives the rows."""
    for name in ("app", "ops"):
        cli(capsys, "user", "create", name, *FAST)
    code, out, _ = cli(capsys, "acl", "create", "-u", "app", "-r", "Topic:orders-*,Group:billing", "-a", "Sub",
                       "-d", "allow")
    assert code == 0 and out == (
        "create acl to controller success.\n"
        "#User             #Resource               #Actions                #Decision\n"
        "app               Group:billing           Sub                     Allow\n"
        "app               Topic:orders-*          Sub                     Allow\n")
    code, out, _ = cli(capsys, "acl", "create", "-u", "app", "-r", "Topic:orders-*", "-a", "Sub", "-d", "allow")
    assert code == 0, "the same rule again is a success (a retry)"
    code, _, err = cli(capsys, "acl", "create", "-u", "app", "-r", "Topic:orders-*", "-a", "Pub", "-d", "allow")
    assert code == 1 and "POLICY_ALREADY_EXIST (3004)" in err and "use acl update" in err
    code, out, _ = cli(capsys, "acl", "update", "-u", "app", "-r", "Topic:orders-*", "-a", "pub,sub", "-d", "deny")
    assert code == 0 and "app               Topic:orders-*          Pub,Sub                 Deny" in out
    cli(capsys, "acl", "create", "-u", "ops", "-r", "Cluster:*,Topic:*", "-a", "All", "-d", "allow")
    code, out, _ = cli(capsys, "acl", "get", "-u", "ops", "--json")
    assert json.loads(out)["header"] == {"rules": [["ops", "Cluster:*", ["Admin"], "Allow"],
                                                   ["ops", "Topic:*", ["Admin", "Pub", "Sub"], "Allow"]]}
    code, out, _ = cli(capsys, "acl", "list", "-r", "Topic")
    assert code == 0 and [line.split()[:2] for line in out.splitlines()[1:]] == [
        ["app", "Topic:orders-*"], ["ops", "Topic:*"]]
    code, out, _ = cli(capsys, "acl", "list", "-u", "app")
    assert len(out.splitlines()) == 3
    code, out, _ = cli(capsys, "acl", "delete", "-u", "app", "-r", "Group:billing")
    assert code == 0 and out.startswith("delete acl from controller success.") and "Group:billing" not in out
    code, out, _ = cli(capsys, "acl", "delete", "-u", "app")
    assert code == 0 and out == "delete acl from controller success.\n(no rules)\n"
    code, out, _ = cli(capsys, "acl", "get", "-u", "app")
    assert (code, out) == (0, "(no rules)\n")
    cli(capsys, "user", "delete", "ops")
    code, out, _ = cli(capsys, "acl", "list")
    assert (code, out) == (0, "(no rules)\n")


def test_read_secret_unit():
    """read_secret drops one trailing newline only and keeps inner whitespace."""
    assert admin_auth.read_secret("-", io.StringIO(" a secret with spaces \n\n")) == " a secret with spaces \n"


# -- against real controllers (pysyncobj, no Ray) ---------------------------------------------------

class RaftCluster:
    """``Cluster.call_controller`` over in-process Raft nodes: the request goes to the leader."""

    def __init__(self, controllers) -> None:
        self.controllers = controllers

    def call_controller(self, request) -> Response:
        return self.controllers.wait_leader().handle(request)


def test_commands_on_real_controllers_and_a_login_against_a_followers_table(make_cluster, monkeypatch, capsys):
    """user create and acl create through the Raft leader; a follower's applied table (read without
    Raft, as a broker would) lets the printed secret log in and authorizes what the rule allows."""
    from rocketray.acl import Action, ResourceType

    controllers = make_cluster()
    monkeypatch.setattr(admin_common, "connect_cluster", lambda address, name: RaftCluster(controllers))
    code, out, _ = cli(capsys, "user", "create", "app", *FAST)
    secret = secret_of(out)
    assert code == 0
    code, _, _ = cli(capsys, "acl", "create", "-u", "app", "-r", "Topic:orders", "-a", "Pub", "-d", "allow")
    assert code == 0
    leader = controllers.wait_leader()
    follower = next(n for n in controllers.running() if n is not leader)

    def table():
        return auth_table_of(follower.auth_table(-1))

    from rr_testing import wait_until

    wait_until(lambda: table() is not None and table().rules("app"), timeout_s=10.0, what="the follower applied the rule")
    served = table()
    assert logs_in(served.credential, "app", secret) and not logs_in(served.credential, "app", "wrong-secret-xxxx")
    assert served.authorize("app", ResourceType.TOPIC, "orders", Action.PUB).allowed
    assert not served.authorize("app", ResourceType.TOPIC, "orders", Action.SUB).allowed
    code, out, _ = cli(capsys, "user", "list", "--json")
    assert json.loads(out)["header"]["users"] == [["app", False]]


def test_controller_events_show_user_events_without_keys():
    """get-controller-events: a user's record as its iteration count, rules as text, no group."""
    from rocketray.acl import parse_rules
    from rocketray.cli.admin_format import format_controller_events
    from rocketray.controller.event_log import EventLogRecord
    from rocketray.controller.events import DeleteUserEvent, PutUserEvent, SetAclEvent
    from rocketray.scram import ScramCredential

    record = ScramCredential(b"s" * 16, 4096, b"k" * 32, b"v" * 32)
    events = [EventLogRecord(5, 0, 1, 0, PutUserEvent("app", record, False)).to_json(),
              EventLogRecord(6, 0, 1, 0, SetAclEvent("app", parse_rules("Topic:o", "Sub", "allow"))).to_json(),
              EventLogRecord(7, 0, 1, 0, SetAclEvent("app", ())).to_json(),
              EventLogRecord(8, 0, 1, 0, DeleteUserEvent("app")).to_json()]
    assert [line.split("\t")[2:] for line in format_controller_events(events).splitlines()] == [
        ["PutUserEvent", "-", "name=app iterations=4096 superuser=false", "-> (users and ACLs)"],
        ["SetAclEvent", "-", "user=app rules=[Allow Sub on Topic:o]", "-> (users and ACLs)"],
        ["SetAclEvent", "-", "user=app rules=[]", "-> (users and ACLs)"],
        ["DeleteUserEvent", "-", "name=app", "-> (users and ACLs)"]]
    assert json.loads(json.dumps(events)) == events, "plain JSON"
