"""The one place that turns rocketray's plain classes into Ray actors.

Actor classes (``ControllerService``, ``BrokerService``, ``Registry``) are plain
Python classes that run without Ray in unit tests; this module applies the Ray
options: name and namespace per cluster, detached lifetime, restart forever,
zero CPU reservation (they are IO-bound and must fit on a 2-core machine), and
hard node affinity when a cluster spans several nodes, so a restarted actor
finds its store directory where it left it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rocketray.spec import ClusterSpec
from rocketray.tls import ClientTrust, MemberCredentials


@dataclass(frozen=True)
class DriverAccess:
    """What a Ray driver (an operator: Ray trusts every driver with the whole cluster) gets to reach
    the client ports: the CA to verify brokers by (None when TLS is off) and the operator user's
    credential (a user, never a member: it opens no member port)."""

    trust: ClientTrust | None
    user: str | None = None
    secret: str | None = field(default=None, repr=False)


class Registry:
    """A tiny named actor holding what every Ray driver of a cluster may know, so any driver can
    ``connect`` by name: the public spec and the operator's client access (the CA to trust and
    the operator user's credential). Never the members' credentials."""

    def __init__(self, spec: dict, access: DriverAccess):
        self._spec = spec
        self._access = access

    def spec(self) -> dict:
        return self._spec

    def access(self) -> DriverAccess:
        return self._access

    def pid(self) -> int:
        return os.getpid()


def _placement(node_id: str | None, node_resource: str | None = None) -> dict[str, Any]:
    """Pin to a rocketray node by its custom resource (survives the node's restart under a new node
    id; the actor waits, unschedulable, while the node is gone), or to one Ray node by id."""
    if node_resource is not None:
        return {"resources": {node_resource: 1}}
    if node_id is None:
        return {}
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)}


def _common(spec: ClusterSpec, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": spec.namespace,
        "lifetime": "detached",
        "max_restarts": -1,
        "max_task_retries": 0,
        "num_cpus": 0,
    }


def start_registry(spec: ClusterSpec, access: DriverAccess):
    return ray.remote(Registry).options(**_common(spec, "registry")).remote(spec.to_dict(), access)


def controller_options(spec: ClusterSpec, index: int) -> dict[str, Any]:
    """Ray options of controller ``index``: blocking requests (``handle``) share the default
    group's threads; heartbeats and status calls have their own concurrency group, and so do the
    clients' master watches."""
    from rocketray.actors.controller_service import NONBLOCKING_GROUP, NONBLOCKING_THREADS, WATCH_GROUP, WATCH_THREADS

    c = spec.controllers[index]
    return {**_common(spec, spec.controller_actor_name(index)), **_placement(c.node_id, c.node_resource),
            "max_concurrency": 32,
            "concurrency_groups": {NONBLOCKING_GROUP: NONBLOCKING_THREADS, WATCH_GROUP: WATCH_THREADS}}


def start_controller(spec: ClusterSpec, index: int, credentials: MemberCredentials):
    """Start controller ``index`` with its member credentials (an actor argument: Ray hands the same
    to every restart; never in the spec the registry gives drivers)."""
    from rocketray.actors.controller_service import ControllerService

    options = controller_options(spec, index)
    # Ray accepts concurrency_groups only in ray.remote(...), not in .options().
    groups = options.pop("concurrency_groups")
    return ray.remote(concurrency_groups=groups)(ControllerService).options(**options).remote(
        spec.to_dict(), index, credentials)


#: Calls a broker actor runs at once: consumers' held pulls wait on its event loop, one per queue a
#: consumer owns, so this bounds held pulls plus puts in flight (an async actor's waits cost no thread).
BROKER_MAX_CONCURRENCY = 1024


def start_broker(spec: ClusterSpec, group: str, replica: int, credentials: MemberCredentials,
                 env: dict[str, str] | None = None):
    """Start replica ``replica`` of ``group`` with its member credentials (see ``start_controller``);
    ``env`` is added to its process's environment (Ray's ``runtime_env``; every restart keeps it)."""
    from rocketray.actors.broker_service import BrokerService

    b = next(x for x in spec.brokers_of(group) if x.replica == replica)
    options = {**_common(spec, spec.broker_actor_name(group, replica)), **_placement(b.node_id, b.node_resource),
               "max_concurrency": BROKER_MAX_CONCURRENCY}
    if env:
        options["runtime_env"] = {"env_vars": dict(env)}
    return ray.remote(BrokerService).options(**options).remote(spec.to_dict(), group, replica, credentials)
