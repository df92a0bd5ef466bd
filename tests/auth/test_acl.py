"""The ACL model (rocketray.acl): the admin tool's strings parsed with clear errors and formatted
back, evaluation by table (superuser, deny wins, default deny), and a property against a
brute-force evaluator that works on the rules' text."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketray.acl import (ACTIONS_BY_TYPE, AclParseError, AclRule, Action, Decision, PatternKind, Resource,
                           ResourceType, evaluate, format_actions, parse_actions, parse_decision, parse_resource,
                           parse_resources, parse_rules, user_name_problem)

T, G, C = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
PUB, SUB, ADMIN = Action.PUB, Action.SUB, Action.ADMIN


@pytest.mark.parametrize("text,expected", [
    ("Topic:orders", Resource(T, PatternKind.LITERAL, "orders")),
    ("topic:orders-*", Resource(T, PatternKind.PREFIXED, "orders-")),
    (" GROUP : billing ", Resource(G, PatternKind.LITERAL, "billing")),
    ("Group:*", Resource(G, PatternKind.ANY, "")),
    ("Cluster:rocketray-cluster", Resource(C, PatternKind.LITERAL, "rocketray-cluster")),
    ("Cluster:*", Resource(C, PatternKind.ANY, "")),
    ("Topic:%RETRY%billing", Resource(T, PatternKind.LITERAL, "%RETRY%billing")),
    ("Topic:a.b|c_d", Resource(T, PatternKind.LITERAL, "a.b|c_d")),
])
def test_resources_parse_and_format_back(text, expected):
    """Type case-insensitive, spaces trimmed, a trailing '*' is a prefix, '*' alone is any; str()
    is the canonical text, which parses to the same value."""
    resource = parse_resource(text)
    assert resource == expected
    assert parse_resource(str(resource)) == resource
    assert str(resource) == f"{expected.type.value}:{expected.name}{'' if expected.kind is PatternKind.LITERAL else '*'}"


@pytest.mark.parametrize("text,message", [
    ("orders", "needs a type: Topic:<name>, Group:<name> or Cluster:<name>"),
    ("*", "needs a type"),
    ("Queue:orders", "unknown resource type 'Queue': use one of Cluster, Topic, Group"),
    ("Topic:", "has no name (use Topic:* for every name)"),
    ("Topic:ord*ers", "has characters outside [%|a-zA-Z0-9_.-] (only a trailing '*' is a pattern)"),
    ("Topic:**", "has characters outside"),
    ("Topic:a b", "has characters outside"),
    ("Topic:" + "x" * 256, "is 256 characters, over 255"),
])
def test_bad_resources_say_what_is_wrong(text, message):
    with pytest.raises(AclParseError) as raised:
        parse_resource(text)
    assert message in str(raised.value)


def test_resource_lists_actions_and_decisions():
    """Comma lists (or lists), duplicates dropped, case-insensitive names; empty lists refused."""
    assert parse_resources("Topic:a, Group:g,Topic:a") == (parse_resource("Topic:a"), parse_resource("Group:g"))
    assert parse_resources(["Topic:a", " "]) == (parse_resource("Topic:a"),)
    assert parse_actions("pub, SUB,Pub") == frozenset({PUB, SUB})
    assert parse_decision(" ALLOW ") is Decision.ALLOW and parse_decision("deny") is Decision.DENY
    assert format_actions([ADMIN, PUB, SUB]) == "Pub,Sub,Admin"
    for call, arg, message in [(parse_resources, " , ", "no resources given"), (parse_actions, "", "no actions given"),
                               (parse_actions, "Pub,Write", "unknown action 'Write': use one of Pub, Sub, Admin"),
                               (parse_decision, "maybe", "unknown decision 'maybe': use one of Allow, Deny"),
                               (parse_decision, "Pub", "unknown decision 'Pub'")]:
        with pytest.raises(AclParseError, match=re.escape(message)):
            call(arg)


def test_parse_rules_one_rule_per_resource_and_all_expands_per_type():
    """-r Topic:o,Group:g -a Sub -d allow: two rules; 'All' gives each type its own actions."""
    rules = parse_rules("Topic:o,Group:g", "Sub", "allow")
    assert [str(r) for r in rules] == ["Allow Sub on Topic:o", "Allow Sub on Group:g"]
    rules = parse_rules(["Topic:o-*", "Group:g", "Cluster:*"], "all", "Deny")
    assert [(str(r.resource), r.actions) for r in rules] == [(str(r.resource), ACTIONS_BY_TYPE[r.resource.type])
                                                             for r in rules]
    assert str(rules[0]) == "Deny Pub,Sub,Admin on Topic:o-*" and str(rules[2]) == "Deny Admin on Cluster:*"


@pytest.mark.parametrize("resources,actions,message", [
    ("Group:g", "Pub", "Pub does not apply to Group resources (Group:g); use Sub,Admin"),
    ("Topic:o,Group:g", "Pub,Sub", "Pub does not apply to Group resources"),
    ("Cluster:c", "Sub", "Sub does not apply to Cluster resources (Cluster:c); use Admin"),
    ("Topic:o", "All,Pub", "'All' cannot be combined with other actions"),
])
def test_rules_with_actions_that_do_not_apply_are_refused(resources, actions, message):
    with pytest.raises(AclParseError, match=re.escape(message)):
        parse_rules(resources, actions, "allow")


@pytest.mark.parametrize("name,ok", [
    ("app", True), ("App-1.prod_x", True), ("9lives", True), ("a" * 64, True),
    ("", False), ("a" * 65, False), ("-lead", False), (".hidden", False), ("sp ace", False), ("ü", False),
    ("a:b", False), (7, False),
])
def test_user_names(name, ok):
    assert (user_name_problem(name) is None) is ok


def rule(text: str, actions: str, decision: str = "allow") -> AclRule:
    return parse_rules(text, actions, decision)[0]


@pytest.mark.parametrize("rules,superuser,request_,allowed,reason", [
    ([], False, (T, "orders", PUB), False, "no rule allows it (default deny)"),
    ([], True, (T, "orders", ADMIN), True, "superuser"),
    ([rule("Topic:*", "Pub", "deny")], True, (T, "orders", PUB), True, "superuser"),
    ([rule("Topic:orders", "Pub")], False, (T, "orders", PUB), True, "allowed by rule 'Allow Pub on Topic:orders'"),
    ([rule("Topic:orders", "Pub")], False, (T, "orders", SUB), False, "default deny"),
    ([rule("Topic:orders", "Pub")], False, (T, "orders2", PUB), False, "default deny"),
    ([rule("Topic:orders", "Pub")], False, (G, "orders", SUB), False, "default deny"),
    ([rule("Topic:orders-*", "Pub")], False, (T, "orders-eu", PUB), True, "allowed by rule"),
    ([rule("Topic:orders-*", "Pub")], False, (T, "orders", PUB), False, "default deny"),
    ([rule("Topic:orders-*", "Pub")], False, (T, "eu-orders-x", PUB), False, "default deny"),
    ([rule("Topic:*", "Pub,Sub")], False, (T, "anything", SUB), True, "allowed by rule 'Allow Pub,Sub on Topic:*'"),
    ([rule("Topic:*", "Pub"), rule("Topic:secret", "Pub", "deny")], False, (T, "secret", PUB), False,
     "denied by rule 'Deny Pub on Topic:secret'"),
    ([rule("Topic:*", "Pub"), rule("Topic:secret", "Pub", "deny")], False, (T, "public", PUB), True, "allowed"),
    # deny wins whatever the patterns (RocketMQ would let the literal Allow override):
    ([rule("Topic:orders", "Pub"), rule("Topic:*", "Pub", "deny")], False, (T, "orders", PUB), False,
     "denied by rule 'Deny Pub on Topic:*'"),
    ([rule("Topic:orders", "Pub"), rule("Topic:*", "Sub", "deny")], False, (T, "orders", PUB), True, "allowed"),
    ([rule("Group:billing", "Sub")], False, (G, "billing", SUB), True, "allowed"),
    ([rule("Cluster:*", "Admin")], False, (C, "rocketray-cluster", ADMIN), True, "allowed"),
])
def test_evaluation_table(rules, superuser, request_, allowed, reason):
    """Superuser allows; a matching Deny wins; else a matching Allow; else default deny. The
    decision names the requested resource and action and the deciding rule."""
    resource_type, name, action = request_
    decision = evaluate("app", superuser, rules, resource_type, name, action)
    assert (decision.allowed, decision.action, decision.resource, decision.user) == (
        allowed, action, f"{resource_type.value}:{name}", "app")
    assert reason in decision.reason
    assert str(decision).startswith(f"app {'allowed' if allowed else 'denied'} {action.value} on "
                                    f"{resource_type.value}:{name}")


# -- property: against a brute-force evaluator on the rules' text ---------------------------------

def brute_force(superuser: bool, rules: list[AclRule], resource_type: ResourceType, name: str, action: Action) -> bool:
    """Obviously right: each rule's *text* becomes a regular expression over 'Type:name' (a trailing
    '*' is '.*'), its actions a set of strings; then deny, allow, default deny."""
    if superuser:
        return True
    target = f"{resource_type.value}:{name}"
    verdicts = set()
    for r in rules:
        decision, actions, _, resource = str(r).split(" ")
        pattern = re.escape(resource[:-1]) + ".*" if resource.endswith("*") else re.escape(resource)
        if re.fullmatch(pattern, target) and action.value in actions.split(","):
            verdicts.add(decision)
    return "Deny" not in verdicts and "Allow" in verdicts


names = st.sampled_from(["o", "or", "orders", "orders-eu", "orders-", "eu-orders", "b", "billing", "xb", "x"])
resource_texts = st.builds(lambda t, n, k: f"{t}:{'*' if k == 'any' else n + ('*' if k == 'prefix' else '')}",
                           st.sampled_from(["Topic", "Group", "Cluster"]), names,
                           st.sampled_from(["literal", "prefix", "any"]))


@st.composite
def rules_strategy(draw):
    out = []
    for text in draw(st.lists(resource_texts, max_size=8)):
        resource = parse_resource(text)
        allowed = sorted(ACTIONS_BY_TYPE[resource.type], key=lambda a: a.value)
        actions = draw(st.sets(st.sampled_from(allowed), min_size=1))
        out.append(AclRule(resource, frozenset(actions), draw(st.sampled_from(list(Decision)))))
    return out


@settings(max_examples=500, deadline=None)
@given(st.booleans(), rules_strategy(), st.sampled_from(list(ResourceType)), names, st.sampled_from(list(Action)))
def test_evaluate_agrees_with_brute_force(superuser, rules, resource_type, name, action):
    """For random rule sets and requests, evaluate's verdict is the brute-force one, and a Deny
    verdict names a Deny rule that applies, an Allow verdict an Allow rule that applies."""
    decision = evaluate("u", superuser, rules, resource_type, name, action)
    assert decision.allowed is brute_force(superuser, rules, resource_type, name, action)
    if decision.rule is not None:
        assert decision.rule.applies_to(resource_type, name, action)
        assert (decision.rule.decision is Decision.ALLOW) is decision.allowed
