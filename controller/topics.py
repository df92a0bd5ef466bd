"""Pure decisions about topics: create/extend, delete, route, list (rocketray's own; no nameserver).

Theory of operation. A topic is a row of the replicated ``ControllerState.topics`` table: its name
and, for each queue id ``0..N-1``, the broker group (broker name) that holds the queue. Like every
other table it changes only through events decided here and applied on every controller, and it is
kept in the snapshot, so a topic is as durable as the controller itself: no broker's local file
holds it (upstream RocketMQ keeps a topic created with mqadmin in the master broker's topics.json,
so it vanished after a master switch; a route here names groups, never replicas).

Assignment: queue ``i`` of a new topic goes to ``names[i % len(names)]`` over the registered broker
groups in name order. Extending a topic keeps every existing queue where it is and continues the
round robin from the old queue count; shrinking is refused because the dropped queues would orphan
their messages. Each ``decide_*`` returns ``(Response, events)`` and mutates nothing.
"""

from __future__ import annotations

import re

from rocketray.wire.controller_api import (CreateTopicRequest, DeleteTopicRequest, GetTopicRouteRequest,
                                           ListTopicsRequest, Response)
from rocketray.wire.controller_codes import ResponseCode as C
from rocketray.wire.controller_headers import (CreateTopicResponseHeader, DeleteTopicResponseHeader,
                                               ListTopicsResponseHeader, TopicRouteResponseHeader)
from rocketray.controller.events import CreateTopicEvent, DeleteTopicEvent, Event
from rocketray.controller.state import ControllerState

Decision = tuple[Response, list[Event]]

#: RocketMQ's topic name rule (``TopicValidator``): characters and length.
TOPIC_NAME_PATTERN = re.compile(r"^[%|a-zA-Z0-9_-]+$")
MAX_TOPIC_NAME_CHARS = 127
#: Names starting with these are RocketMQ's system topics (``%RETRY%``, ``%DLQ%``, ``__...``).
RESERVED_TOPIC_PREFIXES = ("%", "__")
#: The reserved names that may be created and deleted like a topic: a consumer group's retry and
#: dead-letter topics (``%RETRY%<group>``, ``%DLQ%<group>``: the client creates them on the first
#: nack, an operator may create, read and delete them), as RocketMQ lets ``updateTopic`` make them.
GROUP_TOPIC_PREFIXES = ("%RETRY%", "%DLQ%")
MIN_QUEUES, MAX_QUEUES = 1, 1024


def topic_name_problem(topic: object, *, allow_reserved: bool = False) -> str | None:
    """Why ``topic`` is not a valid user topic name, or None."""
    if not isinstance(topic, str):
        return f"topic name must be a string, got {type(topic).__name__}"
    if not topic:
        return "topic name is empty"
    if len(topic) > MAX_TOPIC_NAME_CHARS:
        return f"topic name is {len(topic)} characters, over {MAX_TOPIC_NAME_CHARS}"
    if not TOPIC_NAME_PATTERN.match(topic):
        return f"topic name {topic!r} has characters outside [%|a-zA-Z0-9_-]"
    if not allow_reserved and topic.startswith(RESERVED_TOPIC_PREFIXES) and not is_group_topic(topic):
        return (f"topic name {topic!r} is reserved for system topics (names starting with '%' or '__', "
                f"except a group's %RETRY%<group> and %DLQ%<group>)")
    return None


def is_group_topic(topic: str) -> bool:
    """Whether ``topic`` is a consumer group's retry or dead-letter topic: a prefix of
    ``GROUP_TOPIC_PREFIXES`` and then a group name (which does not start with '%')."""
    for prefix in GROUP_TOPIC_PREFIXES:
        if topic.startswith(prefix):
            rest = topic[len(prefix):]
            return bool(rest) and not rest.startswith("%")
    return False


def queue_count_problem(queues: object) -> str | None:
    """Why ``queues`` is not a valid queue count, or None."""
    if isinstance(queues, bool) or not isinstance(queues, int):
        return f"queue count must be an int, got {type(queues).__name__}"
    if not MIN_QUEUES <= queues <= MAX_QUEUES:
        return f"queue count {queues} is outside {MIN_QUEUES}..{MAX_QUEUES}"
    return None


def assign_queues(current: tuple[str, ...], queues: int, broker_names: list[str]) -> tuple[str, ...]:
    """``current`` extended to ``queues`` queues, round robin over ``broker_names`` from index
    ``len(current)`` (queue i -> broker_names[i % len]). ``current`` is kept as it is."""
    assert broker_names, "assigning queues needs at least one broker group"
    assert queues >= len(current), "never shrinks"
    added = tuple(broker_names[i % len(broker_names)] for i in range(len(current), queues))
    return current + added


def route_header(topic: str, assignment: tuple[str, ...]) -> TopicRouteResponseHeader:
    """The topic's queues as ``(queue_id, broker_name)`` in queue order."""
    return TopicRouteResponseHeader(topic, tuple(enumerate(assignment)))


def _created(topic: str, assignment: tuple[str, ...], created: bool) -> CreateTopicResponseHeader:
    return CreateTopicResponseHeader(topic, tuple(enumerate(assignment)), created)


def _invalid(remark: str) -> Decision:
    return Response.error(C.CONTROLLER_INVALID_REQUEST, remark), []


def _not_exist(topic: str) -> Decision:
    return Response.error(C.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist"), []


def decide_create_topic(state: ControllerState, req: CreateTopicRequest) -> Decision:
    """Create or extend a topic; the same queue count again is SUCCESS with no event."""
    problem = topic_name_problem(req.topic) or queue_count_problem(req.queues)
    if problem is not None:
        return _invalid(problem)
    current = state.topics.get(req.topic, ())
    if current and req.queues == len(current):
        return Response(C.SUCCESS, _created(req.topic, current, False)), []
    if req.queues < len(current):
        return _invalid(f"cannot shrink topic {req.topic} from {len(current)} to {req.queues} queues")
    names = state.broker_names()
    if not names:
        return _invalid("no broker group registered yet: start a broker group before creating topics")
    assignment = assign_queues(current, req.queues, names)
    return Response(C.SUCCESS, _created(req.topic, assignment, True)), [CreateTopicEvent(req.topic, assignment)]


def decide_delete_topic(state: ControllerState, req: DeleteTopicRequest) -> Decision:
    """Forget a topic (TOPIC_NOT_EXIST if unknown; reserved names are refused)."""
    problem = topic_name_problem(req.topic)
    if problem is not None:
        return _invalid(problem)
    if req.topic not in state.topics:
        return _not_exist(req.topic)
    return Response(C.SUCCESS, DeleteTopicResponseHeader(req.topic)), [DeleteTopicEvent(req.topic)]


def decide_get_topic_route(state: ControllerState, req: GetTopicRouteRequest) -> Decision:
    """The queue -> broker group assignment of a topic."""
    problem = topic_name_problem(req.topic, allow_reserved=True)
    if problem is not None:
        return _invalid(problem)
    assignment = state.topics.get(req.topic)
    if assignment is None:
        return _not_exist(req.topic)
    return Response(C.SUCCESS, route_header(req.topic, assignment)), []


def decide_list_topics(state: ControllerState, req: ListTopicsRequest) -> Decision:
    """Every topic with its queue count."""
    topics = tuple((name, len(assignment)) for name, assignment in sorted(state.topics.items()))
    return Response(C.SUCCESS, ListTopicsResponseHeader(topics)), []
