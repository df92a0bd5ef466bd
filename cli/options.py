"""Flags every ``rocketray`` command spells the same way.

``--name NAME`` names a cluster (its actors live in the Ray namespace ``rocketray-NAME``) and
``--address ADDR`` the Ray to join, in ``start``, ``status``, ``stop``, ``admin`` and
``analytics --live``. ``--cluster`` (admin, analytics) and ``--ray-address`` (analytics) were the old
spellings: still accepted, hidden from ``--help``.

The default name is ``actors.cluster.DEFAULT_NAME``, the one ``start_cluster``, ``connect`` and
``driver.py`` use. It is spelled here again because that module imports Ray, which would make every
``rocketray --help`` wait for it; ``tests/test_cli_config.py`` holds the two equal.
"""

from __future__ import annotations

import argparse

#: ``rocketray.actors.cluster.DEFAULT_NAME`` (a test holds them equal).
DEFAULT_NAME = "default"


def add_cluster_flags(p: argparse.ArgumentParser, *, name_default: str | None = DEFAULT_NAME,
                      address_default: str = "auto") -> None:
    p.add_argument("--address", default=address_default,
                   help="Ray address (default: auto, the running Ray)")
    p.add_argument("--name", default=name_default,
                   help=f"cluster name (Ray namespace rocketray-NAME; default: {name_default or 'the only one'})")
    p.add_argument("--cluster", dest="name", help=argparse.SUPPRESS)  # deprecated spelling of --name
    p.add_argument("--ray-address", dest="address", help=argparse.SUPPRESS)  # deprecated spelling of --address
