"""Consumer-group membership, driven by an injected ``now_ms`` (like ``controller/heartbeat.py``).

Theory of operation. Each member of a consumer group heartbeats the controller leader with its
group, its client id and the topics it subscribes to; the answer is the group's live members, from
which every member computes the same queue assignment (rebalance) on its side. A member is live
while ``last_update_ms + timeout_ms >= now_ms``; ``leaving=True`` removes it at once, so the others
take its queues over at their next heartbeat instead of one timeout later.

The table is local to the leader and is not replicated (as RocketMQ's ConsumerManager is local to
each broker): membership is soft state that every live member re-sends within one heartbeat
interval, so after a controller leader change the new leader's table fills up again by itself.
Until it has, a member may see fewer members than there are, which only means two members may
briefly both pull a queue: consumption is at-least-once and committed offsets decide (DESIGN.md).

Bounded: at most ``MAX_GROUPS`` groups and ``MAX_MEMBERS_PER_GROUP`` live members each; expired
rows are pruned on every heartbeat of their group and by ``expire(now_ms)``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rocketray.wire.controller_api import ConsumerHeartbeatRequest, Response
from rocketray.wire.controller_codes import ResponseCode
from rocketray.wire.controller_headers import ConsumerHeartbeatResponseHeader
from rocketray.controller.limits import check_request_limits
from rocketray.controller.topics import topic_name_problem

#: RocketMQ's group name rule (``Validators.checkGroup``): same characters as a topic, 255 at most.
GROUP_NAME_PATTERN = re.compile(r"^[%|a-zA-Z0-9_-]+$")
MAX_GROUP_NAME_CHARS = 255
MAX_GROUPS = 4096
MAX_MEMBERS_PER_GROUP = 1024
DEFAULT_TIMEOUT_MS = 10_000


@dataclass(frozen=True, slots=True)
class ConsumerMember:
    """One live member of a consumer group as its last heartbeat described it."""

    group: str
    client_id: str
    topics: tuple[str, ...]
    last_update_ms: int

    def is_alive(self, now_ms: int, timeout_ms: int) -> bool:
        return self.last_update_ms + timeout_ms >= now_ms


def request_problem(req: ConsumerHeartbeatRequest) -> str | None:
    """Why a consumer heartbeat is malformed, or None."""
    refused = check_request_limits(req)
    if refused is not None:
        return refused.remark
    if not isinstance(req.group, str) or not req.group:
        return "consumer group name is empty"
    if len(req.group) > MAX_GROUP_NAME_CHARS or not GROUP_NAME_PATTERN.match(req.group):
        return f"consumer group name {req.group!r:.80} is not [%|a-zA-Z0-9_-]{{1,{MAX_GROUP_NAME_CHARS}}}"
    if not isinstance(req.client_id, str) or not req.client_id:
        return "client id is empty"
    if not isinstance(req.topics, tuple):
        return f"topics must be a tuple of topic names, got {type(req.topics).__name__}"
    for topic in req.topics:
        problem = topic_name_problem(topic, allow_reserved=True)
        if problem is not None:
            return problem
    if not isinstance(req.leaving, bool):
        return "leaving must be a bool"
    return None


class ConsumerGroups:
    """Live members of every consumer group, keyed by ``(group, client_id)``; leader-local."""

    __slots__ = ("timeout_ms", "_groups")

    def __init__(self, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> None:
        assert timeout_ms > 0, "a consumer heartbeat timeout must be positive"
        self.timeout_ms = timeout_ms
        self._groups: dict[str, dict[str, ConsumerMember]] = {}

    def __len__(self) -> int:
        """Rows held (live or not yet pruned)."""
        return sum(len(members) for members in self._groups.values())

    def on_heartbeat(self, req: ConsumerHeartbeatRequest, now_ms: int) -> Response:
        """Refresh (or, with ``leaving``, remove) the caller; answer the group's live members."""
        problem = request_problem(req)
        if problem is not None:
            return Response.error(ResponseCode.CONTROLLER_INVALID_REQUEST, problem)
        self._prune(req.group, now_ms)
        members = self._groups.get(req.group, {})
        if req.leaving:
            members.pop(req.client_id, None)
        else:
            if req.client_id not in members and len(members) >= MAX_MEMBERS_PER_GROUP:
                return Response.error(ResponseCode.CONTROLLER_INVALID_REQUEST,
                                      f"consumer group {req.group} already has {MAX_MEMBERS_PER_GROUP} members")
            if req.group not in self._groups and len(self._groups) >= MAX_GROUPS:
                self.expire(now_ms)
                if len(self._groups) >= MAX_GROUPS:
                    return Response.error(ResponseCode.CONTROLLER_INVALID_REQUEST,
                                          f"the controller already tracks {MAX_GROUPS} consumer groups")
            members[req.client_id] = ConsumerMember(req.group, req.client_id, tuple(req.topics), now_ms)
            self._groups[req.group] = members
        if not members:
            self._groups.pop(req.group, None)
        return Response(ResponseCode.SUCCESS, ConsumerHeartbeatResponseHeader(req.group, tuple(sorted(members))))

    def members(self, group: str, now_ms: int) -> list[str]:
        """Sorted client ids of the live members of ``group`` at ``now_ms``."""
        rows = self._groups.get(group, {})
        return sorted(cid for cid, m in rows.items() if m.is_alive(now_ms, self.timeout_ms))

    def member(self, group: str, client_id: str) -> ConsumerMember | None:
        """The row of one member (live or not yet pruned)."""
        return self._groups.get(group, {}).get(client_id)

    def groups(self, now_ms: int) -> dict[str, list[str]]:
        """group -> sorted live client ids, for every group with a live member."""
        out = {group: self.members(group, now_ms) for group in sorted(self._groups)}
        return {group: ids for group, ids in out.items() if ids}

    def expire(self, now_ms: int) -> list[tuple[str, str]]:
        """Remove every member no longer live at ``now_ms``; return ``(group, client_id)`` sorted."""
        gone: list[tuple[str, str]] = []
        for group in list(self._groups):
            gone.extend((group, cid) for cid in self._prune(group, now_ms))
        return sorted(gone)

    def clear(self) -> None:
        """Forget every member (this node stopped being the leader)."""
        self._groups.clear()

    def _prune(self, group: str, now_ms: int) -> list[str]:
        rows = self._groups.get(group)
        if rows is None:
            return []
        dead = [cid for cid, m in rows.items() if not m.is_alive(now_ms, self.timeout_ms)]
        for cid in dead:
            del rows[cid]
        if not rows:
            del self._groups[group]
        return dead
