"""Where a controller client's attempts go (issue 29, controller/leadership.py), pure: a view fed
only by controllers' word about themselves, and an in-flight attempt given up only for a ready
leader of a later term on another controller."""

from __future__ import annotations

import pytest

from rocketray.wire.controller_headers import NotLeaderResponseHeader
from rocketray.wire.controller_api import Response
from rocketray.wire.controller_codes import ResponseCode
from rocketray.controller.leadership import Attempts, Leader, LeaderStatus, LeaderView

OK = Response(ResponseCode.SUCCESS)
NOT_LEADER = Response.error(ResponseCode.CONTROLLER_NOT_LEADER, "not leader", NotLeaderResponseHeader("x"))


def ready(index: int, term: int) -> LeaderStatus:
    return LeaderStatus(index, term, True)


def follower(index: int, term: int) -> LeaderStatus:
    return LeaderStatus(index, term, False)


@pytest.mark.parametrize("answers,leader", [
    ([], None),
    ([follower(0, 3), follower(1, 3)], None),
    ([ready(1, 3)], Leader(1, 3)),
    ([ready(1, 3), ready(2, 4)], Leader(2, 4)),
    ([ready(2, 4), ready(1, 3)], Leader(2, 4)),        # a stale answer never moves it back
    ([ready(1, 3), follower(1, 3)], None),              # the leader says it stopped serving
    ([ready(1, 3), follower(2, 3)], Leader(1, 3)),      # a follower's word is about itself only
    ([ready(1, 5), follower(1, 4)], Leader(1, 5)),      # an older "not leader" of it changes nothing
    ([ready(1, 3), follower(1, 3), ready(1, 3)], Leader(1, 3)),  # it serves again in its term
])
def test_the_view_follows_controllers_word_about_themselves(answers, leader):
    view = LeaderView()
    for status in answers:
        view.observe(status)
    assert view.leader == leader


def test_observe_says_when_the_view_moved():
    view = LeaderView()
    assert view.observe(ready(0, 1)) and not view.observe(ready(0, 1)) and view.observe(ready(2, 2))
    assert not view.observe(follower(1, 9))


def test_an_answer_ends_the_request_and_not_leader_forgets_the_leader():
    view = LeaderView()
    view.observe(ready(1, 3))
    a = Attempts(view)
    a.sent(a.target())
    assert a.answered(NOT_LEADER) is None and view.leader is None and a.target() is None
    view.observe(ready(2, 4))
    a.sent(a.target())
    assert a.answered(OK) is OK and view.leader == Leader(2, 4)


def test_a_failure_forgets_only_the_leader_it_was_sent_to():
    view = LeaderView()
    view.observe(ready(1, 3))
    a = Attempts(view)
    a.sent(a.target())
    view.observe(ready(2, 4))     # someone else learnt of a newer leader meanwhile
    a.failed()
    assert view.leader == Leader(2, 4)


@pytest.mark.parametrize("sent,seen,give_up", [
    (Leader(0, 3), None, False),
    (Leader(0, 3), Leader(0, 3), False),
    (Leader(0, 3), Leader(1, 4), True),     # a ready leader of a later term elsewhere: decided there
    (Leader(0, 3), Leader(0, 4), False),    # the same controller in a later term: it answers (fenced)
])
def test_an_attempt_in_flight_is_given_up_only_for_a_later_leader_elsewhere(sent, seen, give_up):
    view = LeaderView()
    view.observe(ready(sent.index, sent.term))
    a = Attempts(view)
    a.sent(a.target())
    if seen is not None:
        view.observe(ready(seen.index, seen.term))
    assert a.give_up() is give_up
    if give_up:
        assert a.target() == seen       # and the next attempt goes to it, with its term
