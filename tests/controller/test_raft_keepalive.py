"""Raft peer connections stay usable while idle (controller/raft.py ``RaftHost._keep_connections_alive``):
when the leader dies, the first candidate's vote request reaches the other follower, so the new
leader is elected in one round (issue 29: a leader lost with a node used to cost two election
timeouts, because pysyncobj dropped the idle follower-to-follower connection on the vote's send)."""

from __future__ import annotations

import time

from rocketray.controller.config import ControllerConfig
from rocketray.controller.node import ControllerNode
from rocketray.controller.proc import member_credentials


def everyone_alive(name, broker_id):
    return True


def test_after_an_idle_spell_the_first_candidate_wins_in_one_round(tmp_path, port_factory, wait):
    # Scenario: leader C, followers A (stands for election after 200-400 ms) and B (never stands
    # within the test: 20-25 s). The group idles twice A's connection timeout, C dies; A's first
    # vote request must reach B over their idle connection, so A leads in term T+1 (a lost request
    # makes A stand again: term T+2).
    addresses = [f"127.0.0.1:{port_factory()}" for _ in range(3)]
    a, b, c = addresses
    fast = ControllerConfig.for_tests(raft_min_timeout_ms=200, raft_max_timeout_ms=400, connection_timeout_ms=1000)
    never = ControllerConfig.for_tests(raft_min_timeout_ms=20_000, raft_max_timeout_ms=25_000,
                                       connection_timeout_ms=25_000)
    leader_first = ControllerConfig.for_tests(raft_min_timeout_ms=50, raft_max_timeout_ms=100,
                                              append_entries_period_ms=10, connection_timeout_ms=1000)
    nodes: dict[str, ControllerNode] = {}
    controllers, credentials = dict(enumerate(addresses)), member_credentials(3)

    def start(i, config):
        return ControllerNode(controllers, tmp_path / str(i), config, credentials=credentials[i], alive=everyone_alive)

    try:
        nodes[c] = start(2, leader_first)
        nodes[b] = start(1, never)
        wait(lambda: nodes[c].is_leader(), 20, what="C to lead (with B's vote)")
        nodes[a] = start(0, fast)
        wait(lambda: nodes[a].metadata()["leader_address"] == c, 10, what="A to follow C")
        term = nodes[c].metadata()["term"]
        time.sleep(2 * fast.connection_timeout_ms / 1000)  # the idle spell is the scenario, not a wait for a state
        nodes.pop(c).close()
        wait(lambda: nodes[a].is_leader(), 10, what="A to lead after C died")
        assert nodes[a].metadata()["term"] == term + 1, "A's first vote request was lost: a second round was needed"
        assert nodes[b].metadata()["leader_address"] == a
        assert nodes[a]._raft.keepalives_sent > 0
    finally:
        for node in nodes.values():
            node.close()
