"""Fixtures of real controller groups (pysyncobj nodes in this process) and their credentials."""

from __future__ import annotations

import pytest

from rocketray.controller.config import ControllerConfig
from rocketray.controller.proc import CLUSTER, InProcessControllers, member_credentials
from rocketray.tls import CertificateAuthority


def everyone_alive(name, broker_id):
    return True


@pytest.fixture(scope="session")
def raft_ca():
    """One cluster CA for the session's controller groups (a group's nodes admit only the Raft
    addresses of their own group, so groups sharing a CA stay apart)."""
    return CertificateAuthority.create(CLUSTER)


@pytest.fixture
def raft_credentials(raft_ca):
    """``make(count, secret=None)`` -> ``MemberCredentials`` of controllers ``0..count-1`` of
    ``proc.CLUSTER``: certificates of ``raft_ca`` and one members' secret."""
    return lambda count, **kw: member_credentials(count, ca=raft_ca, **kw)


@pytest.fixture
def make_cluster(tmp_path, port_factory):
    """``make(**config)`` -> a InProcessControllers of 3 nodes on fresh ports, TLS on, a CA of its
    own (closed after the test)."""
    made = []

    def make(**config):
        cluster = InProcessControllers(tmp_path / f"c{len(made)}", [port_factory() for _ in range(3)],
                               ControllerConfig.for_tests(**config), alive=everyone_alive)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.close()
