"""Which controller leads, as a client sees it, and where each attempt of a request goes (pure).

Theory of operation. A client keeps a :class:`LeaderView`: the newest *ready* leader (Raft leader
whose barrier committed in its term, ``ControllerNode.is_leader``) it heard of, fed by each
controller's own word about itself (``leader_status``, ``watch_leader``), never by hints about
others, so a dead leader that followers still name is not waited on. Every attempt names the term
of the leader it goes to and a controller decides it only as the ready leader of exactly that term
(``ControllerNode.handle(term=...)``): an attempt can take effect only there, then.

:class:`Attempts` says where a request's next attempt goes and when one in flight is given up:

- an answer other than NOT_LEADER is the request's answer;
- NOT_LEADER, a dead controller, or a call timeout (longer than the controller's own request
  deadline) forget that leader; the next attempt goes to whichever ready leader the view names next;
- an attempt still in flight is given up only for a ready leader of a *later term on another
  controller*. That leader's barrier committed in its term, so by Raft's log matching the earlier
  attempt's entry (term t below it) is either in the log the new leader applied before it served, or
  can never commit; and the fence keeps the old controller from deciding it in any later term.

So a retried write is decided on a state that already holds its earlier attempt if that took effect,
never concurrently with it: the property the old client had (it re-sent only after the controller
died or answered), now without waiting out a dead controller's restart or a lost node's timeout.
"""

from __future__ import annotations

from dataclasses import dataclass

from rocketray.wire.controller_api import Response
from rocketray.wire.controller_codes import ResponseCode

__all__ = ["Attempts", "Leader", "LeaderStatus", "LeaderView"]


@dataclass(frozen=True, slots=True)
class LeaderStatus:
    """A controller's word about itself (its ``leader_status`` and ``watch_leader`` answers):
    controller ``index`` is at Raft ``term`` and is, or is not, the ready leader of that term."""

    index: int
    term: int
    is_leader: bool


@dataclass(frozen=True, slots=True)
class Leader:
    """Controller ``index`` is the ready leader of ``term``."""

    index: int
    term: int


class LeaderView:
    """The newest ready leader a client heard of (shared by its concurrent calls)."""

    __slots__ = ("leader", "term")

    def __init__(self) -> None:
        self.leader: Leader | None = None
        self.term = -1          # the highest term a ready leader was seen in

    def observe(self, status: LeaderStatus) -> bool:
        """A controller's word about itself. True when it names a ready leader the view did not hold."""
        index, term = status.index, status.term
        if status.is_leader:
            if term < self.term:
                return False    # an answer from before a newer leader was seen
            new = Leader(index, term)
            moved = new != self.leader
            self.leader, self.term = new, term
            return moved
        if self.leader is not None and self.leader.index == index and term >= self.leader.term:
            self.leader = None  # our leader says it no longer serves
        return False

    def forget(self, leader: Leader) -> None:
        """An attempt at ``leader`` ended without a decision: look again before the next one."""
        if self.leader == leader:
            self.leader = None


class Attempts:
    """One request's attempts (see the module docstring). ``target()`` where to send now (None: wait
    for the view to move), ``sent(leader)``, then ``answered(response)`` / ``failed()``, and while
    waiting ``give_up()``."""

    __slots__ = ("view", "in_flight")

    def __init__(self, view: LeaderView) -> None:
        self.view = view
        self.in_flight: Leader | None = None

    def target(self) -> Leader | None:
        assert self.in_flight is None, "one attempt at a time"
        return self.view.leader

    def sent(self, leader: Leader) -> None:
        self.in_flight = leader

    def answered(self, response: Response) -> Response | None:
        """The request's answer, or None to try again."""
        leader, self.in_flight = self.in_flight, None
        assert leader is not None
        if response.code == ResponseCode.CONTROLLER_NOT_LEADER:
            self.view.forget(leader)
            return None
        return response

    def failed(self) -> None:
        """The controller died, could not be reached, or did not answer within the call timeout."""
        leader, self.in_flight = self.in_flight, None
        assert leader is not None
        self.view.forget(leader)

    def give_up(self) -> bool:
        """Should the attempt in flight be abandoned for the view's leader? Only for a ready leader
        of a later term on another controller (its outcome is then decided and visible there)."""
        sent, now = self.in_flight, self.view.leader
        if sent is None or now is None or now.term <= sent.term or now.index == sent.index:
            return False
        self.in_flight = None
        return True
