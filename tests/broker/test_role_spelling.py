"""A broker role has one spelling (its upper-case name) wherever it is written, and no aliases."""

from __future__ import annotations

import json

from rocketray.broker.role import Role, RoleMachine


def test_each_role_has_one_spelling_and_no_alias():
    """Value, name, str() and format() agree, so no writer can pick a second spelling; every name
    is a member of its own (an alias would be a name mapping to another member)."""
    assert [r.value for r in Role] == ["NONE", "SLAVE", "MASTER"]
    for role in Role:
        assert role.value == role.name == str(role) == f"{role}" == "%s" % role
        assert json.dumps(role) == f'"{role.name}"'
    assert list(Role.__members__) == [r.name for r in Role]


def test_a_role_read_back_from_its_spelling_is_the_same_member():
    """Readers (``HAStatus.from_dict``, the run-directory reader) parse what writers wrote."""
    assert all(Role(r.value) is r and Role[r.name] is r for r in Role)


def test_the_machines_snapshot_writes_a_plain_string():
    """What crosses Ray or a JSON encoder is the plain string, not the enum."""
    snap = RoleMachine("127.0.0.1:1").snapshot()
    assert snap["role"] == "NONE" and type(snap["role"]) is str
