"""Controller clients follow leadership (issue 29) through two node calls, on real 3-node clusters:
``handle(term=...)`` decides only as the ready leader of that term, and ``wait_ready_leader`` answers
the moment a node becomes the ready leader of a later term."""

from __future__ import annotations

import threading
import time

from rocketray.wire.controller_api import ApplyBrokerIdRequest, GetReplicaInfoRequest
from rocketray.wire.controller_codes import ResponseCode
from tests.support.controller_cluster import make_cluster  # noqa: F401 - fixture


def test_a_request_fenced_by_another_term_has_no_effect(make_cluster):
    cluster = make_cluster()
    leader = cluster.wait_leader()
    term = leader.metadata()["term"]
    stale = leader.handle(ApplyBrokerIdRequest("c", "g", 1, "h:1;1"), term=term - 1)
    assert stale.code == ResponseCode.CONTROLLER_NOT_LEADER
    assert leader.handle(GetReplicaInfoRequest(broker_name="g")).code != ResponseCode.SUCCESS  # nothing written
    assert leader.handle(ApplyBrokerIdRequest("c", "g", 1, "h:1;1"), term=term).ok
    assert leader.handle(GetReplicaInfoRequest(broker_name="g")).ok
    follower = next(n for n in cluster.running() if n is not leader)
    assert follower.handle(GetReplicaInfoRequest(broker_name="g"), term=term).code == ResponseCode.CONTROLLER_NOT_LEADER


def test_the_leader_watch_answers_when_a_survivor_becomes_ready_not_before(make_cluster):
    cluster = make_cluster()
    leader = cluster.wait_leader()
    term = leader.metadata()["term"]
    assert leader.wait_ready_leader(term - 1, 5.0) == {"term": term, "is_leader": True}   # at once
    started = time.monotonic()
    assert leader.wait_ready_leader(term, 0.2)["is_leader"] and time.monotonic() - started >= 0.19  # no news
    survivors = [n for n in cluster.running() if n is not leader]
    answers: list[tuple[int, dict, float]] = []
    threads = [threading.Thread(target=lambda i=i, n=n: answers.append((i, n.wait_ready_leader(term, 20.0),
                                                                         time.monotonic())))
               for i, n in enumerate(survivors)]
    for t in threads:
        t.start()
    time.sleep(0.1)
    assert answers == []                       # followers of a live leader stay silent
    cluster.stop(cluster.index_of(leader))
    new = cluster.wait_leader(20)
    ready_at = time.monotonic()
    deadline = time.monotonic() + 20
    while not answers and time.monotonic() < deadline:
        time.sleep(0.005)
    assert answers, "the new leader's watch did not answer"
    index, status, at = answers[0]
    assert survivors[index] is new and status["is_leader"] and status["term"] > term
    assert at - ready_at < 0.5
    cluster.close()                            # closing releases the other watch
    for t in threads:
        t.join(25)
    assert len(answers) == 2
