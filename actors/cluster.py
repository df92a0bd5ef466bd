"""Start, connect to, inspect and stop a rocketray cluster on the current Ray.

``start_cluster`` decides a :class:`~rocketray.spec.ClusterSpec` (ports, node
placement, store directories) and the members' credentials
(``rocketray.credentials``: the cluster CA, each member's certificate, the members'
secret), starts a registry actor, the controllers and the brokers as named
detached actors in the namespace ``rocketray-<name>``, and waits until the
controllers have a leader and every group has a master.
``connect(name)`` rebuilds a :class:`Cluster` handle from the registry, so a
second driver (``ray job submit``, ``rocketray status``) can drive the same
cluster. Killing is done the way a user would: ``ray.kill(actor,
no_restart=False)``; Ray restarts the actor and it recovers from its store.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import signal
from pathlib import Path
from typing import Any, Callable

import ray

from rocketray import ports, waiting
from rocketray.actors import lookup, remote
from rocketray.actors.remote import DriverAccess
from rocketray.actors.views import BrokerStatus, ControllerMetadata, to_json
from rocketray.config import load_config
from rocketray.credentials import ClusterCredentials
from rocketray.spec import BrokerSpec, ClusterSpec, ControllerSpec
from rocketray.tls import MemberCredentials

log = logging.getLogger(__name__)

DEFAULT_NAME = "default"


class ClusterError(RuntimeError):
    """A cluster operation failed; the message says which and why."""


def _alive_nodes() -> list[dict]:
    return [n for n in ray.nodes() if n.get("Alive")]


#: A node offering the custom resource ``rocketray_node_<label>`` (e.g. ``ray start --resources
#: '{"rocketray_node_n1": 1000}'``, or ``actors/nodes.py`` for several nodes on one machine) is a
#: rocketray node called ``<label>``: actors are pinned to it by that resource, so when the node dies
#: they cannot restart anywhere else, and when a node with the same label comes back they restart
#: there, on their store directories.
NODE_RESOURCE_PREFIX = "rocketray_node_"


def node_resource(label: str) -> str:
    return NODE_RESOURCE_PREFIX + label


def labelled_nodes(nodes: list[dict]) -> list[tuple[str, dict]]:
    """``(label, node)`` for every alive node that offers a ``rocketray_node_<label>`` resource, by label."""
    out = []
    for n in nodes:
        for key in n.get("Resources", {}):
            if key.startswith(NODE_RESOURCE_PREFIX):
                out.append((key[len(NODE_RESOURCE_PREFIX):], n))
    return sorted(out, key=lambda pair: pair[0])


def plan_cluster(name: str, *, controllers: int, groups: int, replicas: int, data_dir: str,
                 profile: str = "fast", overrides: dict[str, str] | None = None,
                 cluster_name: str = "rocketray-cluster", ha_proxy: bool = False) -> ClusterSpec:
    """Choose ports, hosts, nodes and directories for a new cluster (no actor is started).

    Placement: on labelled rocketray nodes (see ``NODE_RESOURCE_PREFIX``) controller ``i`` goes to
    node ``i mod n`` and replica ``r`` of group ``g`` to node ``(g + r) mod n``, so the replicas of a
    group sit on different nodes (``replicas <= n`` is required) and so do the controllers (when
    ``controllers <= n``); each actor's store directory is ``DATA/NAME/<label>/<actor>``. Without
    labels, several Ray nodes are used round robin with node-id affinity; one node: anywhere.
    Ports are probed free when every node has the same address (one machine), fixed otherwise;
    probed ones lie outside the ephemeral range (``rocketray.ports``) and are all different.

    ``ha_proxy``: each broker's HA server binds a separate ``listen_port`` while it advertises
    ``ha_port``, where a fault-injecting proxy (``chaos/ha_proxy.py``) is expected to listen.
    """
    if controllers < 1 or groups < 1 or replicas < 1:
        raise ClusterError("controllers, groups and replicas must each be at least 1")
    nodes = _alive_nodes()
    labelled = labelled_nodes(nodes)
    if labelled and replicas > len(labelled):
        raise ClusterError(f"{replicas} replicas per group cannot sit on different nodes: only "
                           f"{len(labelled)} rocketray nodes ({', '.join(label for label, _ in labelled)})")
    multi = len(nodes) > 1 and not labelled
    one_machine = len({n["NodeManagerAddress"] for n in nodes}) <= 1
    root = Path(data_dir).absolute() / name

    def place(slot: int, actor: str) -> tuple[str, str | None, str | None, Path]:
        """(host, node_id, node_resource, store_dir) of the actor in placement slot ``slot``."""
        if labelled:
            label, node = labelled[slot % len(labelled)]
            return node["NodeManagerAddress"], None, node_resource(label), root / label / actor
        if not multi:
            return "127.0.0.1", None, None, root / actor
        node = nodes[slot % len(nodes)]
        return node["NodeManagerAddress"], node["NodeID"], None, root / actor

    taken: set[int] = set()

    def port(host: str, fixed: int) -> int:
        if not one_machine:
            return fixed
        chosen = ports.free_ports(1, host, avoid=taken)[0]
        taken.add(chosen)
        return chosen

    ctrl = []
    for i in range(controllers):
        host, node_id, resource, store = place(i, f"controller-{i}")
        ctrl.append(ControllerSpec(index=i, host=host, raft_port=port(host, 9878 + i), store_dir=str(store),
                                   node_id=node_id, node_resource=resource,
                                   session_port=port(host, 9978 + i)))
    brokers = []
    k = 0
    for g in range(groups):
        group = f"broker-{chr(ord('a') + g)}" if g < 26 else f"broker-{g}"
        for r in range(replicas):
            slot = g + r if labelled else controllers + k
            host, node_id, resource, store = place(slot, f"{group}-{r}")
            listen = port(host, 20912 + k) if ha_proxy else None
            brokers.append(BrokerSpec(group=group, replica=r, host=host, ha_port=port(host, 10912 + k),
                                      store_dir=str(store), node_id=node_id, listen_port=listen,
                                      node_resource=resource, client_port=port(host, 30912 + k)))
            k += 1
    return ClusterSpec(name=name, cluster_name=cluster_name, data_dir=str(root), profile=profile,
                       controllers=tuple(ctrl), brokers=tuple(brokers),
                       config_overrides=tuple(sorted((overrides or {}).items())))


wait_for = functools.partial(waiting.wait_for, error=ClusterError)  # rocketray.waiting, raising ClusterError


class Cluster:
    """A handle on a running cluster: actors by role, status, kills, teardown.

    ``access`` is what this driver uses on the client ports (``remote.DriverAccess``);
    ``credentials`` the members' credentials, held only by the handle of the process that started
    the cluster (``start_cluster``), which alone can start a member again by hand."""

    def __init__(self, spec: ClusterSpec, access: DriverAccess, credentials: ClusterCredentials | None = None):
        self.spec = spec
        self.access = access
        self._credentials = credentials
        self._controller_client = None   # created on first use (actors/controller_client.py)
        #: environment added to a broker's process, by (group, replica) (``start_cluster``'s ``broker_env``)
        self.broker_env: dict[tuple[str, int], dict[str, str]] = {}

    # --- members --------------------------------------------------------------------------
    def member_credentials(self, identity) -> MemberCredentials:
        """Credentials for member ``identity`` (a fresh certificate from the cluster CA), on the handle
        that started the cluster only: ClusterError elsewhere."""
        if self._credentials is None:
            raise ClusterError("only the process that started the cluster holds the members' credentials; "
                               "a member killed for good cannot be started from this driver")
        return self._credentials.member(identity, self.spec.member_hosts(identity))

    def start_controller(self, index: int):
        """Start controller ``index`` (after ``ray.kill(..., no_restart=True)``)."""
        from rocketray.identity import Identity

        return remote.start_controller(self.spec, index, self.member_credentials(
            Identity.controller(self.spec.name, index)))

    def start_broker(self, group: str, replica: int, spec: ClusterSpec | None = None):
        """Start replica ``replica`` of ``group`` (after ``ray.kill(..., no_restart=True)``), with
        ``spec`` if given (e.g. the replica moved to another port)."""
        return remote.start_broker(spec or self.spec, group, replica,
                                   self.member_credentials(self.spec.broker_identity(group, replica)),
                                   env=self.broker_env.get((group, replica)))

    # --- actors -------------------------------------------------------------------------
    def controller(self, index: int):
        return lookup.get_actor(self.spec, self.spec.controller_actor_name(index))

    def broker(self, group: str, replica: int):
        return lookup.get_actor(self.spec, self.spec.broker_actor_name(group, replica))

    def controllers(self) -> list:
        return [self.controller(c.index) for c in self.spec.controllers]

    # --- inspection ---------------------------------------------------------------------
    def controller_metadata(self, timeout_s: float = 3.0) -> list[ControllerMetadata | None]:
        """Each controller's ``metadata()`` by index, None where it does not answer within ``timeout_s``."""
        refs = []
        for c in self.spec.controllers:
            try:
                refs.append(self.controller(c.index).metadata.remote())
            except ValueError:  # killed for good (ray.kill without restart): no such actor any more
                refs.append(None)
        out: list[ControllerMetadata | None] = []
        for ref in refs:
            try:
                out.append(None if ref is None else ray.get(ref, timeout=timeout_s))
            except Exception:  # noqa: BLE001 - a dead or paused controller has no metadata
                out.append(None)
        return out

    def leader_index(self) -> int | None:
        for i, md in enumerate(self.controller_metadata()):
            if md is not None and md.is_leader:
                return i
        return None

    @property
    def controller_client(self):
        """The driver's controller client (``SyncControllerClient``): follows the ready leader,
        shared by every thread that calls through this handle."""
        if self._controller_client is None:
            from rocketray.actors.controller_client import SyncControllerClient

            self._controller_client = SyncControllerClient(self.spec, self.controller)
        return self._controller_client

    def call_controller(self, request, timeout_s: float = 10.0):
        """Send a request to the controller leader, following NOT_LEADER hints."""
        from rocketray.actors.controller_client import call_leader_sync

        return call_leader_sync(self, request, timeout_s=timeout_s)

    def controller_events(self, timeout_s: float = 10.0) -> tuple[list[dict], list[list[int]]]:
        """The controllers' event logs merged: (every applied event once, in log order, with its
        Raft index, seq, decision ``time_ms`` and the group's epochs after it; index ranges no
        reachable controller logged). An unreachable controller is skipped; the others cover it."""
        from rocketray.controller.event_log import merge_logs, read_whole_log

        logs = []
        for i, actor in enumerate(self.controllers()):
            try:
                logs.append(read_whole_log(lambda after, limit, a=actor: ray.get(
                    a.events.remote(after, limit), timeout=timeout_s)))
            except Exception as exc:  # noqa: BLE001 - a dead or paused controller contributes nothing
                log.info("controller %d event log not read: %s", i, exc)
        events, uncovered = merge_logs(logs)
        if uncovered:
            log.warning("controller event log has unlogged index ranges %s (no reachable controller holds them)",
                        uncovered)
        return events, uncovered

    def broker_status(self, group: str, replica: int, timeout_s: float = 3.0) -> BrokerStatus | None:
        """``BrokerService.status()`` of one replica, None if it does not answer within ``timeout_s``."""
        try:
            return ray.get(self.broker(group, replica).status.remote(), timeout=timeout_s)
        except Exception:  # noqa: BLE001
            return None

    def group_status(self, group: str) -> list[BrokerStatus | None]:
        return [self.broker_status(group, b.replica) for b in self.spec.brokers_of(group)]

    def master_of(self, group: str) -> int | None:
        """Replica index whose broker currently acts as a writable master, if any."""
        for b, st in zip(self.spec.brokers_of(group), self.group_status(group)):
            if st is not None and st.is_running_master:
                return b.replica
        return None

    def analytics_records(self, timeout_s: float = 10.0) -> dict[str, list[dict]]:
        """What ``rocketray analytics --live`` analyses, gathered through Ray: every reachable
        replica's epoch entries, offsets and consume-queue positions now, its role/epoch/offset
        samples over time, and the
        controllers' merged event log.
        (A live cluster has no client history or nemesis log; chaos runs record those.)"""
        replicas: list[dict] = []
        samples: list[dict] = []
        for b in self.spec.brokers:
            status = self.broker_status(b.group, b.replica, timeout_s)
            if status is None or status.broker_id is None:
                continue
            replicas.append({k: to_json(getattr(status, k)) for k in (
                "group", "broker_id", "role", "master_epoch", "epoch_entries", "min_offset", "max_offset",
                "confirm_offset", "queues")})
            try:
                samples.extend(ray.get(self.broker(b.group, b.replica).samples.remote(), timeout=timeout_s))
            except Exception:  # noqa: BLE001 - an unreachable replica contributes no samples
                pass
        events, _ = self.controller_events(timeout_s)
        return {"history": [], "nemesis": [], "replicas": replicas, "samples": samples, "controller_events": events}

    # --- faults -------------------------------------------------------------------------
    def _kill(self, actor, pid_before: int | None) -> None:
        ray.kill(actor, no_restart=False)
        if pid_before is None:
            return

        def restarted():
            try:
                return ray.get(actor.pid.remote(), timeout=2) != pid_before
            except Exception:  # noqa: BLE001 - still restarting
                return False

        wait_for(restarted, 60, "the killed actor to be restarted by Ray")

    def kill_controller(self, index: int, wait_restart: bool = True) -> None:
        actor = self.controller(index)
        pid = ray.get(actor.pid.remote(), timeout=5) if wait_restart else None
        self._kill(actor, pid)

    def kill_broker(self, group: str, replica: int, wait_restart: bool = True) -> None:
        actor = self.broker(group, replica)
        pid = ray.get(actor.pid.remote(), timeout=5) if wait_restart else None
        self._kill(actor, pid)

    def signal_actor(self, actor, sig: int) -> int:
        """SIGSTOP/SIGCONT an actor's process (the driver must be on the actor's node)."""
        pid = ray.get(actor.pid.remote(), timeout=5)
        os.kill(pid, sig)
        return pid

    def pause(self, actor) -> int:
        return self.signal_actor(actor, signal.SIGSTOP)

    def resume_pid(self, pid: int) -> None:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass

    # --- waiting ------------------------------------------------------------------------
    def wait_for_master(self, group: str, timeout_s: float = 60) -> int:
        """Replica index of the running master of ``group``, waiting for one to exist."""
        holder: dict[str, int] = {}

        def has_master():
            m = self.master_of(group)
            if m is not None:
                holder["m"] = m
            return m is not None

        wait_for(has_master, timeout_s, f"a running master in {group}")
        return holder["m"]

    def wait_for_leader(self, timeout_s: float = 60) -> int:
        holder: dict[str, int] = {}

        def has_leader():
            i = self.leader_index()
            if i is None:
                return False
            holder["i"] = i
            return True

        wait_for(has_leader, timeout_s, "a controller leader")
        return holder["i"]

    def wait_for_masters(self, timeout_s: float = 90) -> dict[str, int]:
        masters: dict[str, int] = {}

        for group in self.spec.groups:
            masters[group] = self.wait_for_master(group, timeout_s)
        return masters

    # --- teardown -----------------------------------------------------------------------
    def stop(self, delete_data: bool = False) -> None:
        names = ["registry"] + [self.spec.controller_actor_name(c.index) for c in self.spec.controllers]
        names += [self.spec.broker_actor_name(b.group, b.replica) for b in self.spec.brokers]
        for name in names:
            try:
                ray.kill(lookup.get_actor(self.spec, name), no_restart=True)
            except ValueError:
                pass  # already gone
        if delete_data:
            import shutil

            shutil.rmtree(self.spec.data_dir, ignore_errors=True)


def start_cluster(name: str = DEFAULT_NAME, *, controllers: int = 3, groups: int = 1, replicas: int = 3,
                  data_dir: str = "rocketray-data", profile: str = "fast",
                  overrides: dict[str, str] | None = None, wait: bool = True,
                  timeout_s: float = 120, ha_proxy: bool = False,
                  before_brokers: Callable[[ClusterSpec], None] | None = None,
                  broker_env: Callable[[BrokerSpec], dict[str, str]] | None = None) -> Cluster:
    """Start a cluster on the current Ray and (by default) wait until it serves writes.

    ``ha_proxy`` plans separate HA listen ports (see ``plan_cluster``); ``before_brokers(spec)`` runs
    after the controllers and before the brokers start (e.g. to start those proxies);
    ``broker_env(broker)`` is added to that broker's process environment (e.g. the chaos run's
    libfaketime)."""
    try:
        ray.get_actor("registry", namespace=f"rocketray-{name}")
        raise ClusterError(f"a cluster named {name!r} is already running; stop it first or pick another name")
    except ValueError:
        pass
    spec = plan_cluster(name, controllers=controllers, groups=groups, replicas=replicas,
                        data_dir=data_dir, profile=profile, overrides=overrides, ha_proxy=ha_proxy)
    tls = load_config(profile, dict(spec.config_overrides)).tls
    if not tls.enabled:
        log.warning("cluster %s starts WITHOUT TLS (tls.enabled=false, development only): every port, "
                    "the client ports included, carries data and credentials' proofs in plain text", name)
    for c in spec.controllers:
        Path(c.store_dir).mkdir(parents=True, exist_ok=True)
    for b in spec.brokers:
        Path(b.store_dir).mkdir(parents=True, exist_ok=True)
    credentials = ClusterCredentials.create(spec.name, tls, Path(spec.data_dir) / "tls")
    access = DriverAccess(credentials.client_trust if tls.enabled else None, user=OPERATOR_USER,
                          secret=secrets.token_hex(32))
    remote.start_registry(spec, access)
    cluster = Cluster(spec, access, credentials)
    for c in spec.controllers:
        cluster.start_controller(c.index)
    cluster.wait_for_leader(timeout_s)
    _create_operator_user(cluster, access, timeout_s)
    if before_brokers is not None:
        before_brokers(spec)
    for b in spec.brokers:
        if broker_env is not None:
            cluster.broker_env[(b.group, b.replica)] = broker_env(b)
        cluster.start_broker(b.group, b.replica)
    if wait:
        cluster.wait_for_masters(timeout_s)
    return cluster


#: The user Ray drivers (operators) authenticate as on the client ports: a superuser whose secret only
#: the cluster's registry holds (``remote.DriverAccess``), made when the cluster starts.
OPERATOR_USER = "operator"


def _create_operator_user(cluster: Cluster, access: DriverAccess, timeout_s: float) -> None:
    from rocketray.wire.controller_api import CreateUserRequest
    from rocketray.scram import DEFAULT_SALT_BYTES, ScramCredential

    assert access.user is not None and access.secret is not None
    credential = ScramCredential.from_secret(access.secret, os.urandom(DEFAULT_SALT_BYTES))
    request = CreateUserRequest(access.user, credential, superuser=True)

    def created() -> bool:
        response = cluster.call_controller(request, timeout_s=5.0)
        return response.ok    # a retry of the same record succeeds without a second event

    wait_for(created, timeout_s, f"the {access.user} user created")


def connect(name: str = DEFAULT_NAME) -> Cluster:
    """A handle on a running cluster by name (needs ``ray.init`` to the same Ray first)."""
    try:
        registry = ray.get_actor("registry", namespace=f"rocketray-{name}")
    except ValueError as exc:
        raise ClusterError(f"no rocketray cluster named {name!r} is running on this Ray") from exc
    spec, access = ray.get([registry.spec.remote(), registry.access.remote()], timeout=30)
    return Cluster(ClusterSpec.from_dict(spec), access)

