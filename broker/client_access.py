"""What each client-port request needs from the user's ACL (pure).

RocketMQ 5.3's ACL 2.0 actions on topics and groups: a producer needs **Pub** on every topic it
writes; a consumer needs **Sub** on the topic it reads and on its consumer group (pulls, commits,
committed offsets, group membership); creating and deleting a topic need **Admin** on it. A topic's
route, which producers and consumers both need, is readable with any of the three, and a topic
listing shows only the topics the user holds one of them on. :func:`needs` names the pairs a
request needs, all of which must be allowed; :func:`route_visible` is the "any of" rule.

Delayed messages (``rocketray.broker.schedule``) are stored in ``%SCHEDULE%<topic>`` first:
:func:`guarded` decides Pub on such a topic as Pub on ``<topic>`` (a user who may send to a topic
may send to it later), and refuses every other action on the scheduler's topics and consumer group,
to every user: reading them, or committing the scheduler's offsets, is the brokers' alone.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from rocketray.acl import AccessDecision, Action, ResourceType
from rocketray.wire.delayed import is_schedule_name, real_topic
from rocketray.wire.controller_api import (ConsumerHeartbeatRequest, CreateTopicRequest, DeleteTopicRequest,
                                           GetTopicRouteRequest, ListTopicsRequest)

__all__ = ["Need", "needs", "first_denied", "route_visible", "guarded"]

Need = tuple[ResourceType, str, Action]
Authorize = Callable[[ResourceType, str, Action], AccessDecision]

TOPIC, GROUP = ResourceType.TOPIC, ResourceType.GROUP


def needs(request: Any) -> list[Need]:
    """The (resource type, name, action) pairs a controller request through the client port needs
    (a topic route and a listing are not here: ``route_visible``)."""
    if isinstance(request, (CreateTopicRequest, DeleteTopicRequest)):
        return [(TOPIC, request.topic, Action.ADMIN)]
    if isinstance(request, ConsumerHeartbeatRequest):
        return [(GROUP, request.group, Action.SUB), *((TOPIC, t, Action.SUB) for t in request.topics)]
    if isinstance(request, (GetTopicRouteRequest, ListTopicsRequest)):
        return []
    raise TypeError(f"not a client request: {type(request).__name__}")


def pull_needs(topic: str, group: str | None) -> list[Need]:
    return [(TOPIC, topic, Action.SUB), *(() if group is None else ((GROUP, group, Action.SUB),))]


def group_needs(group: str, topics: Iterable[str]) -> list[Need]:
    return [(GROUP, group, Action.SUB), *((TOPIC, t, Action.SUB) for t in sorted(set(topics)))]


def first_denied(authorize: Authorize, pairs: Iterable[Need]) -> AccessDecision | None:
    """The first refusal among ``pairs``, or None when all are allowed."""
    for resource_type, name, action in pairs:
        decision = authorize(resource_type, name, action)
        if not decision.allowed:
            return decision
    return None


def route_visible(authorize: Authorize, topic: str) -> AccessDecision:
    """A topic's route is visible with Pub, Sub or Admin on it: the first allowing decision, else
    the Sub refusal (the one a consumer meets first)."""
    refusal = None
    for action in (Action.PUB, Action.SUB, Action.ADMIN):
        decision = authorize(TOPIC, topic, action)
        if decision.allowed:
            return decision
        if action is Action.SUB:
            refusal = decision
    assert refusal is not None
    return refusal


def guarded(authorize: Authorize, user: str) -> Authorize:
    """``authorize`` with the scheduler's names reserved (module docstring): Pub on
    ``%SCHEDULE%<topic>`` is Pub on ``<topic>``; anything else on a ``%SCHEDULE%`` topic or group is
    refused, whatever the user's rules (a superuser's too)."""
    def decide(resource_type: ResourceType, name: str, action: Action) -> AccessDecision:
        if not is_schedule_name(name):
            return authorize(resource_type, name, action)
        target = real_topic(name) if resource_type is TOPIC and action is Action.PUB else None
        if target is not None and not is_schedule_name(target):
            return authorize(TOPIC, target, Action.PUB)
        return AccessDecision(False, user, f"{resource_type.value}:{name}", action, None,
                              "reserved for the brokers' delayed-delivery scheduler")
    return decide
