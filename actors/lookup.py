"""Finding a cluster's named actors: a member looks up its peers, a driver the cluster's members.

Apart from ``rocketray.actors.remote`` (which creates the actors and imports their classes), so an
actor class can find other actors without importing the module that creates it.
"""

from __future__ import annotations

import ray

from rocketray.spec import ClusterSpec

__all__ = ["get_actor"]


def get_actor(spec: ClusterSpec, name: str):
    """The live actor named ``name`` in ``spec``'s namespace (ValueError if there is none)."""
    return ray.get_actor(name, namespace=spec.namespace)
