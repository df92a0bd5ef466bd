"""rocketray.ports: probed ports lie outside the ephemeral range, are distinct, and skip bound ones."""

from __future__ import annotations

import random
import socket

import pytest

from rocketray import ports


def test_free_ports_are_distinct_and_outside_the_ephemeral_range():
    low, high = ports.ephemeral_range()
    chosen = ports.free_ports(50, rng=random.Random(3))
    assert len(set(chosen)) == 50
    assert all(not (low <= p <= high) for p in chosen)


def test_a_port_an_outgoing_connection_holds_is_never_chosen():
    """The CI failure: a port probed free inside the ephemeral range was taken by an outgoing
    connection before the HA proxy bound it. Outside that range, connect() never picks a port."""
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    try:
        local = client.getsockname()[1]
        low, high = ports.ephemeral_range()
        assert low <= local <= high
        assert local not in ports.outside_ephemeral()
    finally:
        client.close()
        server.close()


def test_a_bound_port_is_skipped():
    rng = random.Random(7)
    first = ports.free_ports(1, rng=random.Random(7))[0]
    with socket.socket() as held:
        held.bind(("127.0.0.1", first))
        assert not ports.is_free("127.0.0.1", first)
        assert first not in ports.free_ports(1, rng=rng)


def test_avoid_is_honoured_and_exhaustion_is_an_error():
    candidates = ports.outside_ephemeral()
    with pytest.raises(OSError, match="could not find"):
        ports.free_ports(1, avoid=frozenset(candidates))
