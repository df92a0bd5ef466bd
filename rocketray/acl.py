"""Users' access rules in RocketMQ 5.3 ACL 2.0's shape, and their evaluation (pure).

Theory of operation. A rule grants or refuses some actions on a resource pattern:

    resource  Topic:<pattern> | Group:<pattern> | Cluster:<pattern>
    pattern   a literal name (``orders``), a prefix (``orders-*``: every name starting ``orders-``)
              or any name (``*``)
    actions   Pub (send to a topic), Sub (read a topic, consume as a group), Admin (create and delete
              topics, manage the cluster); which apply to which type is ``ACTIONS_BY_TYPE``
    decision  Allow or Deny

A user holds at most one rule per resource pattern. Evaluating a request (user, resource type,
resource name, action): a superuser may do everything; otherwise, of the user's rules whose
pattern matches the name and whose actions include the action, any Deny wins, else any Allow
allows, else the request is denied (default deny). Deny always wins, whatever the patterns: unlike
RocketMQ, which lets a more specific pattern override a wider one, "Allow Topic:orders" and "Deny
Topic:*" deny ``orders`` here. Since nothing is allowed unless a rule allows it, "all but X" is
written "Allow Topic:*" plus "Deny Topic:X", and "only X" is just "Allow Topic:X".

``parse_*`` turn the admin tool's strings (``-r Topic:orders,Group:billing -a Pub,Sub -d allow``)
into rules, with an ``AclParseError`` that says what is wrong; ``str()`` of a resource is its
canonical text (``Topic:orders-*``), which ``parse_resource`` reads back to the same value, and of a
rule ``Allow Pub,Sub on Topic:orders-*``. ``evaluate`` returns an ``AccessDecision`` naming the resource and action (and the
rule that decided), which a client port turns into a typed AccessDenied.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Iterable

__all__ = [
    "ACTIONS_BY_TYPE", "AccessDecision", "AclParseError", "AclRule", "Action", "Decision", "MAX_RESOURCE_NAME_CHARS",
    "MAX_RULES_PER_USER", "MAX_USER_NAME_CHARS", "PatternKind", "Resource", "ResourceType", "evaluate",
    "format_actions", "parse_actions", "parse_decision", "parse_resource", "parse_resources", "parse_rules",
    "user_name_problem",
]

MAX_USER_NAME_CHARS = 64
MAX_RESOURCE_NAME_CHARS = 255
MAX_RULES_PER_USER = 256
USER_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
#: Topic and group names follow RocketMQ's rule ([%|a-zA-Z0-9_-]); '.' is allowed for cluster names.
RESOURCE_NAME_PATTERN = re.compile(r"^[%|a-zA-Z0-9_.-]+$")
ANY = "*"


class AclParseError(ValueError):
    """A resource, action, decision or rule string that is not valid; the message says why."""


class ResourceType(enum.Enum):
    CLUSTER = "Cluster"
    TOPIC = "Topic"
    GROUP = "Group"


class PatternKind(enum.Enum):
    LITERAL = "literal"
    PREFIXED = "prefixed"
    ANY = "any"


class Action(enum.Enum):
    PUB = "Pub"
    SUB = "Sub"
    ADMIN = "Admin"


class Decision(enum.Enum):
    ALLOW = "Allow"
    DENY = "Deny"


#: The actions that mean something on each resource type: a group is consumed with (Sub) or
#: managed (Admin), never published to; the cluster is only administered.
ACTIONS_BY_TYPE: dict[ResourceType, frozenset[Action]] = {
    ResourceType.TOPIC: frozenset({Action.PUB, Action.SUB, Action.ADMIN}),
    ResourceType.GROUP: frozenset({Action.SUB, Action.ADMIN}),
    ResourceType.CLUSTER: frozenset({Action.ADMIN}),
}
_ACTION_ORDER = (Action.PUB, Action.SUB, Action.ADMIN)
_BY_LOWER = {
    **{t.value.lower(): t for t in ResourceType},
    **{a.value.lower(): a for a in Action},
    **{d.value.lower(): d for d in Decision},
}
ALL_ACTIONS = "all"  # "-a All": every action that applies to each resource's type


def user_name_problem(name: object) -> str | None:
    """Why ``name`` is not a valid user name (1..64 of [A-Za-z0-9_.-], starting with a letter or
    digit), or None."""
    if not isinstance(name, str):
        return f"user name must be a string, got {type(name).__name__}"
    if not name:
        return "user name is empty"
    if len(name) > MAX_USER_NAME_CHARS:
        return f"user name is {len(name)} characters, over {MAX_USER_NAME_CHARS}"
    if not USER_NAME_PATTERN.match(name):
        return f"user name {name!r} must start with a letter or digit and use only [A-Za-z0-9_.-]"
    return None


def _name_problem(name: str) -> str | None:
    if len(name) > MAX_RESOURCE_NAME_CHARS:
        return f"name is {len(name)} characters, over {MAX_RESOURCE_NAME_CHARS}"
    if not RESOURCE_NAME_PATTERN.match(name):
        return f"name {name!r} has characters outside [%|a-zA-Z0-9_.-] (only a trailing '*' is a pattern)"
    return None


@dataclass(frozen=True, slots=True)
class Resource:
    """A resource pattern: ``type``, ``kind`` and ``name`` (the literal name or the prefix; empty
    for ANY). Build with ``parse_resource`` or the class methods; ``str()`` is its text."""

    type: ResourceType
    kind: PatternKind
    name: str

    def __post_init__(self) -> None:
        assert (self.kind is PatternKind.ANY) == (self.name == ""), "only ANY has an empty name"

    def __str__(self) -> str:
        if self.kind is PatternKind.ANY:
            return f"{self.type.value}:{ANY}"
        suffix = ANY if self.kind is PatternKind.PREFIXED else ""
        return f"{self.type.value}:{self.name}{suffix}"

    def sort_key(self) -> tuple[str, str, str]:
        return (self.type.value, self.name, self.kind.value)

    def matches(self, resource_type: ResourceType, name: str) -> bool:
        """Does this pattern cover the resource ``resource_type:name`` (a literal name)?"""
        if resource_type is not self.type:
            return False
        if self.kind is PatternKind.ANY:
            return True
        if self.kind is PatternKind.PREFIXED:
            return name.startswith(self.name)
        return name == self.name


def _lookup(text: str, kind: type, what: str) -> object:
    value = _BY_LOWER.get(text.strip().lower())
    if not isinstance(value, kind):
        choices = ", ".join(m.value for m in kind)  # type: ignore[attr-defined]
        raise AclParseError(f"unknown {what} {text.strip()!r}: use one of {choices}")
    return value


def parse_resource(text: str) -> Resource:
    """``Topic:orders``, ``Group:billing-*``, ``Cluster:*`` (the type is case-insensitive)."""
    if not isinstance(text, str):
        raise AclParseError(f"a resource must be a string, got {type(text).__name__}")
    type_text, sep, name = text.strip().partition(":")
    if not sep:
        raise AclParseError(f"resource {text!r} needs a type: Topic:<name>, Group:<name> or Cluster:<name>")
    resource_type = _lookup(type_text, ResourceType, "resource type")
    assert isinstance(resource_type, ResourceType)
    name = name.strip()
    if not name:
        raise AclParseError(f"resource {text!r} has no name (use {resource_type.value}:* for every name)")
    if name == ANY:
        return Resource(resource_type, PatternKind.ANY, "")
    kind = PatternKind.LITERAL
    if name.endswith(ANY):
        kind, name = PatternKind.PREFIXED, name[:-1]
    problem = _name_problem(name)
    if problem is not None:
        raise AclParseError(f"resource {text!r}: {problem}")
    return Resource(resource_type, kind, name)


def _split(value: str | Iterable[str], what: str) -> list[str]:
    items = value.split(",") if isinstance(value, str) else list(value)
    if not all(isinstance(item, str) for item in items):
        raise AclParseError(f"{what} must be strings")
    items = [item.strip() for item in items if item.strip()]
    if not items:
        raise AclParseError(f"no {what} given")
    return items


def parse_resources(value: str | Iterable[str]) -> tuple[Resource, ...]:
    """A comma-separated string (or a list) of resources, duplicates removed, in the given order."""
    return tuple(dict.fromkeys(parse_resource(item) for item in _split(value, "resources")))


def parse_actions(value: str | Iterable[str]) -> frozenset[Action]:
    """``Pub,Sub`` (case-insensitive). ``All`` is not an action: ``parse_rules`` expands it."""
    actions = set()
    for item in _split(value, "actions"):
        action = _lookup(item, Action, "action")
        assert isinstance(action, Action)
        actions.add(action)
    return frozenset(actions)


def parse_decision(value: str) -> Decision:
    """``allow`` or ``deny`` (case-insensitive)."""
    if not isinstance(value, str):
        raise AclParseError(f"a decision must be a string, got {type(value).__name__}")
    decision = _lookup(value, Decision, "decision")
    assert isinstance(decision, Decision)
    return decision


def format_actions(actions: Iterable[Action]) -> str:
    """Canonical text: ``Pub,Sub,Admin`` order."""
    chosen = set(actions)
    return ",".join(a.value for a in _ACTION_ORDER if a in chosen)


@dataclass(frozen=True, slots=True)
class AclRule:
    """Allow or deny ``actions`` on every resource ``resource`` matches."""

    resource: Resource
    actions: frozenset[Action]
    decision: Decision

    def __str__(self) -> str:
        return f"{self.decision.value} {format_actions(self.actions)} on {self.resource}"

    def applies_to(self, resource_type: ResourceType, name: str, action: Action) -> bool:
        return action in self.actions and self.resource.matches(resource_type, name)

    def problem(self) -> str | None:
        """Why this rule is not valid (no action, or one that does not apply to its type), or None."""
        if not self.actions:
            return f"rule on {self.resource} has no action"
        allowed = ACTIONS_BY_TYPE[self.resource.type]
        wrong = self.actions - allowed
        if wrong:
            return (f"{format_actions(wrong)} does not apply to {self.resource.type.value} resources "
                    f"({self.resource}); use {format_actions(allowed)}")
        return None


def parse_rules(resources: str | Iterable[str], actions: str | Iterable[str], decision: str) -> tuple[AclRule, ...]:
    """One rule per resource, each with ``actions`` and ``decision`` (the admin tool's ``-r -a -d``).
    ``All`` as the actions means every action that applies to each resource's type."""
    parsed = parse_resources(resources)
    chosen = _split(actions, "actions")
    every = [item.lower() == ALL_ACTIONS for item in chosen]
    if any(every) and not all(every):
        raise AclParseError("'All' cannot be combined with other actions")
    fixed = None if all(every) else parse_actions(chosen)
    verdict = parse_decision(decision)
    rules = []
    for resource in parsed:
        rule = AclRule(resource, ACTIONS_BY_TYPE[resource.type] if fixed is None else fixed, verdict)
        problem = rule.problem()
        if problem is not None:
            raise AclParseError(problem)
        rules.append(rule)
    return tuple(rules)


@dataclass(frozen=True, slots=True)
class AccessDecision:
    """The verdict on one request. ``resource`` is the requested resource's text (``Topic:orders``);
    ``rule`` the rule that decided (None: superuser, or no rule matched and the default denied)."""

    allowed: bool
    user: str
    resource: str
    action: Action
    rule: AclRule | None = None
    reason: str = ""

    def __str__(self) -> str:
        verdict = "allowed" if self.allowed else "denied"
        return f"{self.user} {verdict} {self.action.value} on {self.resource}: {self.reason}"


def evaluate(user: str, superuser: bool, rules: Iterable[AclRule], resource_type: ResourceType, name: str,
             action: Action) -> AccessDecision:
    """The verdict for ``user`` doing ``action`` on ``resource_type:name`` (module docstring)."""
    resource = f"{resource_type.value}:{name}"
    if superuser:
        return AccessDecision(True, user, resource, action, None, "superuser")
    allow: AclRule | None = None
    for rule in rules:
        if not rule.applies_to(resource_type, name, action):
            continue
        if rule.decision is Decision.DENY:
            return AccessDecision(False, user, resource, action, rule, f"denied by rule '{rule}'")
        allow = allow or rule
    if allow is not None:
        return AccessDecision(True, user, resource, action, allow, f"allowed by rule '{allow}'")
    return AccessDecision(False, user, resource, action, None, "no rule allows it (default deny)")
