"""Users and ACL rules as controller state: their events' golden bytes and codec, apply (a new
immutable table, version bumped by every change), the snapshot section (and a snapshot without it),
the decide functions' validation and codes, GetAuthTable by version, and a property: random
request sequences decided and applied agree with a plain model and survive the codecs."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketray.acl import Action, ResourceType, parse_rules
from rocketray.wire.controller_api import (CreateAclRequest, CreateUserRequest, DeleteAclRequest, DeleteUserRequest,
                                           GetAclRequest, GetAuthTableRequest, ListAclsRequest, ListUsersRequest,
                                           UpdateAclRequest, UpdateUserRequest)
from rocketray.controller.auth_table import AuthTable, UserRecord
from rocketray.wire.controller_codes import ResponseCode as C
from rocketray.controller.decide import DecideContext, decide, is_write
from rocketray.controller.events import (CreateTopicEvent, DeleteUserEvent, EventCodecError, PutUserEvent, SetAclEvent, decode_event,
                                         decode_events, encode_event, encode_events)
from rocketray.controller.event_log import EventLogRecord
from rocketray.controller.limits import MAX_STRING_BYTES, check_request_limits
from rocketray.controller.pipeline import copy_state
from rocketray.controller.state import ControllerState
from rocketray.controller.users import auth_table_of
from rocketray.scram import ScramCredential
from rocketray.snapshot.format import SECTION_AUTH, SECTION_SNAPSHOT_META, decode_snapshot, encode_snapshot

CRED = ScramCredential(b"s" * 16, 4096, b"k" * 32, b"v" * 32)
CRED2 = ScramCredential(b"t" * 16, 4096, b"K" * 32, b"V" * 32)
CTX = DecideContext()


def rules(resources: str, actions: str, decision: str = "allow"):
    return parse_rules(resources, actions, decision)


# -- events ---------------------------------------------------------------------------------------

GOLDEN = [
    (PutUserEvent("app", CRED, False),
     "9201919409a361707094c41073737373737373737373737373737373cd1000c420" + "6b" * 32 + "c420" + "76" * 32 + "c2"),
    (DeleteUserEvent("app"), "920191920aa3617070"),
    (SetAclEvent("app", rules("Topic:o-*,Group:g", "Sub")),
     "920191930ba36170709293a9546f7069633a6f2d2a91a3537562a5416c6c6f7793a747726f75703a6791a3537562a5416c6c6f77"),
]


@pytest.mark.parametrize("event,golden", GOLDEN, ids=lambda v: type(v).__name__)
def test_auth_events_are_golden_and_round_trip(event, golden):
    """Type ids 9, 10, 11; a record as [salt, iterations, stored_key, server_key] (msgpack bin); rules
    as [resource text, [actions], decision]. Old journals must keep decoding to the same events."""
    assert encode_events([event]).hex() == golden
    assert decode_events(bytes.fromhex(golden)) == [event]
    assert decode_event(encode_event(event)) == event


@pytest.mark.parametrize("fields,message", [
    ([9, "app", [b"s" * 15, 4096, b"k" * 32, b"v" * 32], False], "salt must be 16..64 bytes"),
    ([9, "app", [b"s" * 16, 10, b"k" * 32, b"v" * 32], False], "iterations must be"),
    ([9, "app", [b"s" * 16, 4096, "k" * 32, b"v" * 32], False], "stored_key must be 32 bytes"),
    ([9, "app", [b"s" * 16, 4096, b"k" * 32], False], "expected [salt, iterations"),
    ([11, "app", [["Topic:o", ["Pub"], "Maybe"]]], "unknown decision"),
    ([11, "app", [["Group:g", ["Pub"], "Allow"]]], "Pub does not apply to Group"),
    ([11, "app", [["Topic:o", [], "Allow"]]], "no actions given"),
    ([11, "app", [["Topic:o", [7], "Allow"]]], "actions must be strings"),
    ([11, "app", [["Topic:o", "Pub", "Allow"]]], "expected [resource, [actions], decision]"),
    ([11, "app", "rules"], "expected a list of ACL rules"),
])
def test_malformed_auth_events_raise_codec_errors(fields, message):
    """A record outside its bounds or an invalid rule in a frame: EventCodecError naming it."""
    with pytest.raises(EventCodecError, match=message.replace("[", r"\[")):
        decode_event(msgpack.packb([1, *fields], use_bin_type=True))


def test_event_log_shows_no_key_and_rules_as_text():
    """The controller's event log (get-controller-events) gives a user's iteration count, never its
    keys or salt; rules as their text."""
    put = EventLogRecord(5, 0, 1, 0, PutUserEvent("app", CRED, True)).to_json()
    assert put["credential"] == {"iterations": 4096} and put["superuser"] is True
    assert not any(isinstance(v, bytes) for v in put.values())
    acl = EventLogRecord(6, 0, 1, 0, SetAclEvent("app", rules("Topic:o", "Pub,Sub"))).to_json()
    assert acl["rules"] == ["Allow Pub,Sub on Topic:o"]


# -- apply ----------------------------------------------------------------------------------------

def test_apply_builds_new_tables_and_bumps_the_version():
    """Put, set rules, replace, delete: each change bumps the version by one; a delete takes the
    rules too; rules of a missing user and deleting a missing user change nothing."""
    state = ControllerState()
    first = state.auth
    state.apply(PutUserEvent("app", CRED, False))
    assert first == AuthTable() and state.auth.version == 1 and state.auth.credential("app") is CRED
    state.apply(SetAclEvent("app", rules("Topic:o", "Pub")))
    state.apply(SetAclEvent("ghost", rules("Topic:o", "Pub")))
    state.apply(DeleteUserEvent("ghost"))
    assert state.auth.version == 2 and set(state.auth.acls) == {"app"}
    state.apply(PutUserEvent("app", CRED2, True))
    assert state.auth.version == 3 and state.auth.users["app"] == UserRecord("app", CRED2, True)
    assert state.auth.rules("app") == rules("Topic:o", "Pub")
    state.apply(SetAclEvent("app", ()))
    assert "app" not in state.auth.acls and state.auth.version == 4
    state.apply(SetAclEvent("app", rules("Topic:o", "Pub")))
    state.apply(DeleteUserEvent("app"))
    assert state.auth.users == {} and state.auth.acls == {} and state.auth.version == 6


def test_authorize_unknown_user_superuser_and_rules():
    """The broker's question: an unknown user may do nothing; a superuser everything; else the rules."""
    table = AuthTable(3, {"root": UserRecord("root", CRED, True), "app": UserRecord("app", CRED2)},
                      {"app": rules("Topic:o-*", "Pub")})
    assert not table.authorize("nobody", ResourceType.TOPIC, "o-1", Action.PUB).allowed
    assert table.authorize("nobody", ResourceType.TOPIC, "o-1", Action.PUB).reason == "unknown user"
    assert table.authorize("root", ResourceType.CLUSTER, "c", Action.ADMIN).allowed
    assert table.authorize("app", ResourceType.TOPIC, "o-1", Action.PUB).allowed
    assert not table.authorize("app", ResourceType.TOPIC, "o-1", Action.SUB).allowed
    assert table.credential("app") is CRED2 and table.credential("nobody") is None
    assert "kkkk" not in repr(table) and repr(table) == "AuthTable(version=3, users=2, rules=1)"


def test_a_failed_batch_restores_the_auth_table():
    """apply_batch is all or nothing for the users and ACL table too."""
    state = ControllerState()
    state.apply(PutUserEvent("app", CRED, False))
    before = state.auth
    with pytest.raises(TypeError):  # an event whose apply raises (a malformed topic assignment)
        state.apply_batch([PutUserEvent("other", CRED2, False), CreateTopicEvent("t", 5)])  # type: ignore[arg-type]
    assert state.auth is before


def test_speculative_copy_shares_the_immutable_table():
    """copy_state shares the AuthTable; applying to the copy replaces the copy's table only."""
    state = ControllerState()
    state.apply(PutUserEvent("app", CRED, False))
    copy = copy_state(state)
    assert copy == state and copy.auth is state.auth
    copy.apply(DeleteUserEvent("app"))
    assert "app" in state.auth.users and copy != state


# -- snapshot -------------------------------------------------------------------------------------

AUTH_FILE = ("daa320a70001000000028ae0a6e1000000000000000000030000000e82a5696e6465780ca47465726d030005000000a384a7"
             "76657273696f6e01ac617574685f76657273696f6e02a575736572739196a3617070c3c410" + "73" * 16 + "cd1000c420"
             + "6b" * 32 + "c420" + "76" * 32 + "a461636c739192a36170709193a9546f7069633a6f2d2a92a3507562a3537562a4"
             "44656e79")


def _auth_state() -> ControllerState:
    state = ControllerState()
    state.apply_all([PutUserEvent("app", CRED, True), SetAclEvent("app", rules("Topic:o-*", "Pub,Sub", "deny"))])
    return state


def test_auth_section_is_golden_and_loads_back():
    """SECTION_AUTH (5): {"version": 1, "auth_version", "users": [[name, superuser, salt, iterations,
    stored_key, server_key]], "acls": [[user, [[resource, [actions], decision]]]]}."""
    assert SECTION_AUTH == 5
    section = _auth_state().auth_to_snapshot()
    blob = encode_snapshot({SECTION_SNAPSHOT_META: {"index": 12, "term": 3}, SECTION_AUTH: section})
    assert blob.hex() == AUTH_FILE
    decoded = decode_snapshot(bytes.fromhex(AUTH_FILE))
    state = ControllerState.from_snapshot(ControllerState().to_snapshot(), None, decoded[SECTION_AUTH])
    assert state == _auth_state() and state.auth.version == 2


def test_a_snapshot_without_the_auth_section_loads_with_no_users():
    """A snapshot written before users existed (no SECTION_AUTH) loads: version 0, no users."""
    state = ControllerState.from_snapshot(ControllerState().to_snapshot(), {"version": 1, "topics": []}, None)
    assert state.auth == AuthTable() and state.auth.version == 0


@pytest.mark.parametrize("section,message", [
    ({"version": 2, "auth_version": 0}, "unsupported"),
    ({"version": 1, "auth_version": -1}, "bad auth_version"),
    ({"version": 1, "auth_version": 1, "users": [["app", 1, b"s" * 16, 4096, b"k" * 32, b"v" * 32]]}, "malformed user"),
    ({"version": 1, "auth_version": 1, "users": [["app", True, b"s" * 3, 4096, b"k" * 32, b"v" * 32]]}, "salt"),
    ({"version": 1, "auth_version": 1, "acls": [["ghost", []]]}, "unknown user"),
    ({"version": 1, "auth_version": 1, "users": [["app", True, b"s" * 16, 4096, b"k" * 32, b"v" * 32]],
      "acls": [["app", [["Topic:o", ["Jump"], "Allow"]]]]}, "unknown action"),
])
def test_a_malformed_auth_section_is_refused(section, message):
    with pytest.raises(ValueError, match=message):
        AuthTable.from_plain(section)


# -- decide ---------------------------------------------------------------------------------------

def _populated() -> ControllerState:
    state = ControllerState()
    state.apply_all([PutUserEvent("root", CRED, True), PutUserEvent("app", CRED2, False),
                     SetAclEvent("app", rules("Topic:o,Group:g", "Sub"))])
    return state


@pytest.mark.parametrize("request_,code,events", [
    (CreateUserRequest("new", CRED), C.SUCCESS, 1),
    (CreateUserRequest("app", CRED2, False), C.SUCCESS, 0),        # a retry: same record and flag
    (CreateUserRequest("app", CRED, False), C.USER_ALREADY_EXIST, 0),
    (CreateUserRequest("-bad", CRED), C.INVALID_USER_NAME, 0),
    (CreateUserRequest("new", ScramCredential(b"s", 4096, b"k" * 32, b"v" * 32)), C.INVALID_CREDENTIAL, 0),
    (CreateUserRequest("new", "secret"), C.INVALID_CREDENTIAL, 0),  # type: ignore[arg-type]
    (UpdateUserRequest("app", superuser=True), C.SUCCESS, 1),
    (UpdateUserRequest("app", CRED), C.SUCCESS, 1),
    (UpdateUserRequest("app", CRED2, False), C.SUCCESS, 0),
    (UpdateUserRequest("app"), C.CONTROLLER_INVALID_REQUEST, 0),
    (UpdateUserRequest("ghost", CRED), C.USER_NOT_EXIST, 0),
    (DeleteUserRequest("app"), C.SUCCESS, 1),
    (DeleteUserRequest("ghost"), C.USER_NOT_EXIST, 0),
    (DeleteUserRequest(""), C.INVALID_USER_NAME, 0),
    (CreateAclRequest("app", ("Topic:p",), ("Pub",), "allow"), C.SUCCESS, 1),
    (CreateAclRequest("app", ("Topic:o",), ("Sub",), "Allow"), C.SUCCESS, 0),   # the same rule again
    (CreateAclRequest("app", ("Topic:o",), ("Pub",), "allow"), C.POLICY_ALREADY_EXIST, 0),
    (CreateAclRequest("ghost", ("Topic:o",), ("Pub",), "allow"), C.USER_NOT_EXIST, 0),
    (CreateAclRequest("app", ("Queue:o",), ("Pub",), "allow"), C.INVALID_POLICY, 0),
    (CreateAclRequest("app", ("Group:g2",), ("Pub",), "allow"), C.INVALID_POLICY, 0),
    (CreateAclRequest("app", ("Topic:o",), ("Pub",), "perhaps"), C.INVALID_POLICY, 0),
    (UpdateAclRequest("app", ("Topic:o",), ("Pub", "Sub"), "deny"), C.SUCCESS, 1),
    (UpdateAclRequest("app", ("Topic:p",), ("Pub",), "allow"), C.POLICY_NOT_EXIST, 0),
    (DeleteAclRequest("app", ("Topic:o",)), C.SUCCESS, 1),
    (DeleteAclRequest("app"), C.SUCCESS, 1),
    (DeleteAclRequest("app", ("Topic:zzz",)), C.POLICY_NOT_EXIST, 0),
    (DeleteAclRequest("root"), C.POLICY_NOT_EXIST, 0),
    (DeleteAclRequest("app", ("nope",)), C.INVALID_POLICY, 0),
    (GetAclRequest("ghost"), C.USER_NOT_EXIST, 0),
])
def test_decisions_and_their_codes(request_, code, events):
    """Validation, existence, change: each refusal has its code and no event; a request that changes
    nothing succeeds without an event (an admin tool may retry after an unknown outcome)."""
    response, emitted = decide(_populated(), request_, CTX)
    assert (response.code, len(emitted)) == (code, events), response.remark
    assert is_write(request_) is isinstance(request_, (CreateUserRequest, UpdateUserRequest, DeleteUserRequest,
                                                       CreateAclRequest, UpdateAclRequest, DeleteAclRequest))


def test_refusals_explain_themselves():
    state = _populated()
    remark = decide(state, CreateAclRequest("app", ("Topic:o",), ("Pub",), "allow"), CTX)[0].remark
    assert remark == "user 'app' already has a rule on Topic:o ('Allow Sub on Topic:o'): use acl update to replace it"
    remark = decide(state, CreateAclRequest("app", ("Group:g2",), ("Pub",), "allow"), CTX)[0].remark
    assert remark == "Pub does not apply to Group resources (Group:g2); use Sub,Admin"
    assert decide(state, CreateUserRequest("app", CRED), CTX)[0].remark.startswith("user 'app' already exists")


def test_reads_list_users_and_rules_without_keys():
    """ListUsers names users and flags only; GetAcl/ListAcls give (user, resource, actions, decision)
    rows; ListAcls filters by user and by resource text."""
    state = _populated()
    assert decide(state, ListUsersRequest(), CTX)[0].header.users == (("app", False), ("root", True))
    rows = decide(state, GetAclRequest("app"), CTX)[0].header.rules
    assert rows == (("app", "Group:g", ("Sub",), "Allow"), ("app", "Topic:o", ("Sub",), "Allow"))
    assert decide(state, ListAclsRequest(), CTX)[0].header.rules == rows
    assert decide(state, ListAclsRequest(resource="Topic"), CTX)[0].header.rules == rows[1:]
    assert decide(state, ListAclsRequest(user="root"), CTX)[0].header.rules == ()


def test_get_auth_table_by_version():
    """Unchanged at or above the current version; the whole table (keys included) below it; the
    table read back equals the state's."""
    state = _populated()
    unchanged = decide(state, GetAuthTableRequest(3), CTX)[0]
    assert (unchanged.header.version, unchanged.header.changed, unchanged.body) == (3, False, None)
    assert auth_table_of(unchanged) is None and auth_table_of(decide(state, GetAuthTableRequest(9), CTX)[0]) is None
    for since in (-1, 0, 2):
        answer = decide(state, GetAuthTableRequest(since), CTX)[0]
        assert answer.header.changed and auth_table_of(answer) == state.auth


def test_request_limits_cover_the_credential_and_rule_lists():
    """A SCRAM record inside a request is checked field by field; oversized bytes are refused."""
    assert check_request_limits(CreateUserRequest("app", CRED)) is None
    big = ScramCredential(b"s" * (MAX_STRING_BYTES + 1), 4096, b"k" * 32, b"v" * 32)
    refused = check_request_limits(CreateUserRequest("app", big))
    assert refused is not None and "credential.salt is 4097 bytes" in refused.remark
    assert check_request_limits(CreateAclRequest("app", ("Topic:o",) * 1025, ("Pub",), "allow")) is not None


# -- property: random requests against a plain model -----------------------------------------------

NAMES = ["app", "root", "svc", "x"]
RESOURCES = ["Topic:o", "Topic:o-*", "Topic:*", "Group:g", "Cluster:*"]
requests = st.one_of(
    st.builds(CreateUserRequest, st.sampled_from(NAMES), st.sampled_from([CRED, CRED2]), st.booleans()),
    st.builds(UpdateUserRequest, st.sampled_from(NAMES), st.sampled_from([None, CRED, CRED2]),
              st.sampled_from([None, True, False])),
    st.builds(DeleteUserRequest, st.sampled_from(NAMES)),
    st.builds(CreateAclRequest, st.sampled_from(NAMES), st.lists(st.sampled_from(RESOURCES), min_size=1, max_size=2)
              .map(tuple), st.sampled_from([("Admin",), ("All",), ("Sub", "Admin")]), st.sampled_from(["allow", "deny"])),
    st.builds(UpdateAclRequest, st.sampled_from(NAMES), st.lists(st.sampled_from(RESOURCES), min_size=1, max_size=2)
              .map(tuple), st.sampled_from([("Admin",), ("All",)]), st.sampled_from(["allow", "deny"])),
    st.builds(DeleteAclRequest, st.sampled_from(NAMES), st.lists(st.sampled_from(RESOURCES), max_size=2).map(tuple)),
)


def _model_step(model: dict, request) -> None:
    """The obviously-right effect of a request that succeeded, on {user: [record, superuser, {resource: rule}]}."""
    if isinstance(request, CreateUserRequest):
        model.setdefault(request.name, [request.credential, request.superuser, {}])
    elif isinstance(request, UpdateUserRequest):
        row = model[request.name]
        row[0] = row[0] if request.credential is None else request.credential
        row[1] = row[1] if request.superuser is None else request.superuser
    elif isinstance(request, DeleteUserRequest):
        del model[request.name]
    elif isinstance(request, (CreateAclRequest, UpdateAclRequest)):
        for rule in parse_rules(request.resources, request.actions, request.decision):
            model[request.user][2][str(rule.resource)] = rule
    elif isinstance(request, DeleteAclRequest):
        rules_of = model[request.user][2]
        for resource in list(dict.fromkeys(request.resources)) or list(rules_of):  # a resource named twice counts once
            rules_of.pop(str(parse_rules(resource, "Admin", "allow")[0].resource))


@settings(max_examples=300, deadline=None)
@given(st.lists(requests, max_size=25))
def test_random_requests_agree_with_the_model_and_survive_the_codecs(sequence):
    """Decide + apply of random user and ACL requests: the table equals the model's, the version
    counts the events, every event and the snapshot section round-trip, and a follower rebuilt
    from the section plus the remaining events equals the leader."""
    state, model, applied = ControllerState(), {}, 0
    for request in sequence:
        response, events = decide(state, request, CTX)
        assert decode_events(encode_events(events)) == events
        state.apply_all(events)
        applied += len(events)
        if response.ok:
            _model_step(model, request)
    assert state.auth.version == applied
    assert {n: (r.credential, r.superuser) for n, r in state.auth.users.items()} == \
        {n: (row[0], row[1]) for n, row in model.items()}
    assert {n: set(rs) for n, rs in state.auth.acls.items()} == \
        {n: set(row[2].values()) for n, row in model.items() if row[2]}
    section = msgpack.unpackb(msgpack.packb(state.auth_to_snapshot(), use_bin_type=True), raw=False)
    assert AuthTable.from_plain(section) == state.auth
