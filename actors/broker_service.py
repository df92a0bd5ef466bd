"""The broker actor: one replica's store, HA endpoint and controller loop on one event loop.

A plain class run by Ray as an async actor (options in ``actors/remote.py``).
``__init__`` runs on the actor's event loop, so it opens the store (recovering a
torn tail), and schedules the :class:`rocketray.broker.replicas_manager.ReplicasManager`
there; the HA service is created by the manager once the controller has given
this replica its persistent broker id, and listens on the HA port fixed in the
cluster spec. A broker restarted by Ray therefore comes back by itself: same
store directory, same identity file, same port, and it rejoins as a slave of
whoever the controller elected (truncating divergent bytes in the handshake).

Writes are accepted only while the manager says the broker is a running,
unfenced master; every other case answers a status without writing anything.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import logging
import os
import time
from typing import Callable

from rocketray.config import load_config
from rocketray.actors.controller_client import AsyncControllerClient
from rocketray.actors.controller_session import ControllerSession
from rocketray.actors.client_control import ClientControl
from rocketray.actors.client_port import ClientPort
from rocketray.actors.lookup import get_actor
from rocketray.actors.user_directory import UserDirectory, fake_key_of, user_authenticator
from rocketray.actors.priority import set_process_niceness
from rocketray.actors.consumer_path import ConsumerPath
from rocketray.actors.delay_scheduler import DelayScheduler
from rocketray.actors.metrics import BrokerMetrics, configure_actor_logging
from rocketray.actors.views import BrokerStatus, EpochEntry, HAStatus, QueuePosition, StoredMessage
from rocketray.spec import ClusterSpec
from rocketray.wire.message import Message
from rocketray.wire.batch import EncodedBatch
from rocketray.broker.register import FileIdentityStore
from rocketray.broker.replicas_manager import ReplicasManager, Role, State
from rocketray.broker.role import MasterInfo, RoleMachine
from rocketray.wire.pull_result import OffsetsResult, PullResult
from rocketray.broker.store import MessageStore
from rocketray.wire.controller_api import GetSyncStateDataRequest
from rocketray.controller.session import Hello
from rocketray.credentials import member_credentials
from rocketray.wire.put_result import PutResult, PutStatus
from rocketray.ha.ack import refused
from rocketray.ha.loop_monitor import LoopStallMonitor, OrderedIO
from rocketray.ha.peers import RegisteredPeers
from rocketray.ha.promotion_hold import PromotionHold
from rocketray.ha.service import HAService
from rocketray.links import MemberLinks
from rocketray.tls import MemberCredentials

log = logging.getLogger("rocketray.broker")

DIGEST_CHUNK = 1 << 20
SAMPLE_INTERVAL_S = 1.0
SAMPLES_KEPT = 3600  # one hour at one sample a second
METRICS_PERIOD_S = 1.0


def now_ms() -> int:
    return int(time.time() * 1000)


def _stored(m: Message, broker_id: int | None) -> StoredMessage:
    return StoredMessage(m.topic, m.queue_id, m.queue_offset, m.physical_offset, bytes(m.body), dict(m.properties),
                         m.store_timestamp_ms, broker_id)


class BrokerService:
    def __init__(self, spec: dict, group: str, replica: int, credentials: MemberCredentials):
        configure_actor_logging()
        self._spec = ClusterSpec.from_dict(spec)
        self._group = group
        self._replica = replica
        self._me = next(b for b in self._spec.brokers_of(group) if b.replica == replica)
        self._config = load_config(self._spec.profile, dict(self._spec.config_overrides))
        # Ray started this process at nice 15: a server's every hand-off would wait, and so would the
        # store's recovery below, which a restart after a kill waits for (actors/priority.py); the
        # threads started from here on inherit the niceness
        set_process_niceness(self._config.broker.process_niceness, f"broker {group}/{replica}")
        credentials = member_credentials(credentials, self._config.tls, self._spec.broker_actor_name(group, replica))
        self._links = MemberLinks(credentials, tls=self._config.tls.enabled,
                                  preauth_timeout_ms=self._config.limits.preauth_timeout_ms)
        self._credentials = credentials
        self.store = MessageStore(self._me.store_dir, self._config.store_config())
        # One ordered IO thread for this broker's blocking store work (HA appends, truncation,
        # epoch-file syncs, digest), and the worst event-loop stall since start (status()).
        self._io = OrderedIO(f"broker-{group}-{replica}")
        self._stall = LoopStallMonitor(interval_ms=10).start()
        self.ha: HAService | None = None
        # the session carries the heartbeats to the leader (Ray calls to every controller only
        # when the controllers have no session port)
        self.session = ControllerSession(
            self._spec, self._links, self._session_hello,
            lambda: controller_client.leader_address or self.manager.controller_leader_address,
            lambda: self.manager.sync_controller_metadata_once(),
            on_role=lambda info: self.manager.on_role_change(info))   # pushed on the session after an election
        controller_client = AsyncControllerClient(
            self._spec, heartbeat_sink=self.session.heartbeat if ControllerSession.carries_heartbeats(self._spec)
            else None)
        self.manager = ReplicasManager(
            cluster_name=self._spec.cluster_name, broker_name=group, broker_address=self._me.ha_address,
            controller_client=controller_client, store=self.store,
            identity=FileIdentityStore(self._me.store_dir), now_ms=now_ms, ha_factory=self._make_ha,
            controller_addresses=[c.raft_address for c in self._spec.controllers],
            config=self._config.replicas_manager_config(), member=credentials.identity)
        # the HA service's put gate answers the puts it held while this replica became master
        # once the switch ends (ha/put_gate.py), after every role input
        self.manager.settled = self._answer_held
        self.manager.start()
        self.consumers = ConsumerPath(self.store, lambda: self.manager.role == Role.MASTER and self.ha is not None,
                                      lambda: self.manager.writable, lambda: self.ha)
        self.scheduler = DelayScheduler(self.store, self.consumers, lambda: self.ha, lambda: self.manager.writable,
                                        now_ms, group)     # delayed messages, while this replica is master
        self._scheduler_task = asyncio.get_running_loop().create_task(self.scheduler.run_forever())
        # the session follows the leader the client follows (long polls), else the manager's belief
        self.session.start()
        self._samples: collections.deque[dict] = collections.deque(maxlen=SAMPLES_KEPT)
        self._sampler = asyncio.get_running_loop().create_task(self._sample_forever())
        self._metrics = BrokerMetrics(self._spec.name, group, on_error=lambda name, exc: log.warning(
            "metrics disabled after error metric=%s error=%r", name, exc))
        self._metrics_task = asyncio.get_running_loop().create_task(self._metrics_loop())
        self._refresh_task = asyncio.get_running_loop().create_task(self._refresh_offsets_loop())
        self.client_port: ClientPort | None = None
        if self._me.client_port is not None:
            self._client_port_task = asyncio.get_running_loop().create_task(self._serve_clients())
        log.info("broker started group=%s replica=%d ha=%s pid=%d max_offset=%d", group, replica,
                 self._me.ha_address, os.getpid(), self.store.max_offset)

    async def _serve_clients(self) -> None:
        """Serve producers and consumers on the client port (``actors/client_port.py``). A port that
        cannot be bound is logged and retried: clients fall back to Ray calls meanwhile."""
        context = self._credentials.open_server_context() if self._config.tls.enabled else None
        control = ClientControl(self._spec, self._controller_handles, self.manager.call_controller,
                                self._config.to_dict()["client"])
        self.users = UserDirectory(self._auth_tables).start()
        port = ClientPort(self, user_authenticator(self.users, fake_key_of(self._credentials.secret)), context,
                          self._config.limits, control, authorize=self.users.authorize)
        while True:
            try:
                await port.start(self._me.host, self._me.client_port)
                self.client_port = port
                log.info("client port listening group=%s replica=%d port=%d", self._group, self._replica, port.port)
                return
            except OSError as exc:
                log.error("client port not bound group=%s replica=%d port=%s: %r (retrying)", self._group,
                          self._replica, self._me.client_port, exc)
                await asyncio.sleep(1.0)

    async def _auth_tables(self, since_version: int) -> list:
        """Every controller's applied users and ACL table newer than ``since_version`` (None where
        a controller did not answer)."""
        async def ask(handle) -> object:
            try:
                return await handle.applied_auth_table.remote(since_version)
            except Exception:  # noqa: BLE001 - a dead or restarting controller answers nothing
                return None
        return list(await asyncio.gather(*(ask(h) for h in self._controller_handles())))

    def _controller_handles(self) -> list:
        """The controller actors that exist now (one killed for good is skipped)."""
        handles = []
        for c in self._spec.controllers:
            try:
                handles.append(get_actor(self._spec, self._spec.controller_actor_name(c.index)))
            except ValueError:
                continue
        return handles

    def _session_hello(self) -> Hello | None:
        broker_id = self.manager.broker_id
        if broker_id is None:
            return None
        return Hello(self._spec.cluster_name, self._group, broker_id, self._me.ha_address)

    async def _make_ha(self, broker_id: int, roles: RoleMachine) -> HAService:
        peers = RegisteredPeers(self._group, self._registered_members)
        ha = HAService(self.store, broker_id, self._config.ha_config(), links=self._links, peers=peers,
                       group=self._group, limits=self._config.limits, io=self._io, roles=roles,
                       hold=PromotionHold())   # puts wait while this replica becomes master
        await ha.start(self._me.host, self._me.bind_port)
        self.ha = ha
        return ha

    async def _registered_members(self, group: str) -> dict[int, str | None]:
        """Broker id -> the member identity that registered it, for every replica of ``group``, from
        the controller leader (the HA port admits a slave only under its own broker id)."""
        resp = await self.manager.call_controller(GetSyncStateDataRequest((group,)))
        table = (resp.body or {}).get("replicas_info_table", {}).get(group, {}) if resp.ok else {}
        rows = table.get("in_sync_replicas", []) + table.get("not_in_sync_replicas", [])
        return {int(r["broker_id"]): r.get("member") for r in rows}

    # --- data path ------------------------------------------------------------------------
    async def put(self, batch: EncodedBatch) -> PutResult:
        """Append a producer's encoded batch as master and wait for the ack policy; see
        ``rocketray.wire.put_result.PutResult`` (``written`` NO/YES/UNKNOWN, ``retriable``; ``broker_id`` is
        this replica's).  The batch is one ``bytes`` object through Ray (no per-message objects);
        anything else, or a malformed batch, is refused with MESSAGE_ILLEGAL and nothing written."""
        fut: asyncio.Future[PutResult] = asyncio.get_running_loop().create_future()
        refusal = self.put_start(batch, lambda result: fut.done() or fut.set_result(result))
        return refusal if refusal is not None else await fut

    def put_start(self, batch: EncodedBatch, done: Callable[[PutResult], object]) -> PutResult | None:
        """``put`` without a task (the client port's path): a refusal at once, or None and
        ``done(result)`` later, on the loop. The gate, the hold during a promotion and the ack wait
        are the HA service's ``PutGate`` (``ha/put_gate.py``); here: the batch's type, metrics and
        this replica's broker id on the answer."""
        ha = self.ha
        if not isinstance(batch, EncodedBatch):
            result = refused(PutStatus.MESSAGE_ILLEGAL)
        elif ha is None:
            result = refused(PutStatus.FENCED)      # no HA endpoint yet: the gate's endpoint-down rule
        else:
            started = time.monotonic()

            def finish(result: PutResult) -> None:
                latency_ms = (time.monotonic() - started) * 1000
                broker_id = self.manager.broker_id
                done(dataclasses.replace(result, broker_id=broker_id))    # the answer first, then the metrics
                self._metrics.put(broker_id, result.status.name, batch.count, latency_ms)

            refusal = ha.put_start(batch, now_ms(), finish, may_hold=True)
            if refusal is None:
                return None
            result = refusal
        broker_id = self.manager.broker_id
        count = batch.count if isinstance(batch, EncodedBatch) else 0
        self._metrics.put(broker_id, result.status.name, count, 0.0)
        return dataclasses.replace(result, broker_id=broker_id)

    def _answer_held(self) -> None:
        """After every role input: once no switch to master runs, the held puts are answered in
        arrival order (``HAService.release_held``)."""
        if self.ha is not None and self.ha.gate.held:
            self.ha.release_held()

    async def get_messages(self, topic: str, queue_id: int, queue_offset: int, max_count: int) -> list[StoredMessage]:
        """Messages of one queue from ``queue_offset``, never beyond this replica's confirm offset."""
        broker_id = self.manager.broker_id
        return [_stored(m, broker_id) for m in self.store.get_messages(topic, queue_id, queue_offset, max_count)]

    def pull_start(self, topic: str, queue_id: int, queue_offset: int, max_count: int, max_bytes: int,
                   hold_ms: int, group: str | None, done: Callable[[PullResult], object],
                   tag_filter: str | None = None) -> PullResult | None:
        """``pull`` without a task (the client port's path): the answer now, or None and
        ``done(answer)`` later, on the loop (``ConsumerPath.pull_start``)."""
        return self.consumers.pull_start(topic, queue_id, queue_offset, max_count, max_bytes, hold_ms, group, done,
                                         tag_filter)

    async def pull(self, topic: str, queue_id: int, queue_offset: int, max_count: int, max_bytes: int,
                   hold_ms: int, group: str | None = None, tag_filter: str | None = None) -> PullResult:
        """A consumer's pull, held up to ``hold_ms`` for a confirmed message, never below ``group``'s
        committed offset, only of the tags ``tag_filter`` names (``actors/consumer_path.py``)."""
        return await self.consumers.pull(topic, queue_id, queue_offset, max_count, max_bytes, hold_ms, group,
                                         tag_filter)

    async def commit_offsets(self, group: str, entries: list[tuple[str, int, int]], reset: bool = False) -> PutResult:
        """Commit ``group``'s ``(topic, queue_id, offset)`` entries as one replicated record (with
        ``reset``: an admin's reset record, which sets the offsets instead of raising them)."""
        result = await self.consumers.commit(group, entries, reset)
        return dataclasses.replace(result, broker_id=self.manager.broker_id)

    async def committed_offsets(self, group: str, topics: list[str] | None = None) -> OffsetsResult:
        """``group``'s committed offsets on this broker group (the master answers)."""
        return await self.consumers.committed(group, topics)

    async def queue_max_offsets(self, queues: list[tuple[str, int]]) -> tuple[tuple[str, int, int], ...]:
        return await self.consumers.queue_max_offsets(queues)

    async def search_offsets(self, queues: list[tuple[str, int]],
                             timestamp_ms: int) -> tuple[tuple[str, int, int], ...]:
        """Per queue, the first offset stored at or after ``timestamp_ms`` (``ConsumerPath.search_offsets``)."""
        return await self.consumers.search_offsets(queues, timestamp_ms)

    async def digest(self, start: int, end: int, plain: bool = False) -> str:
        """SHA-256 of the commit-log bytes [start, end): replicas agree iff their digests do.

        ``plain``: the hash of the bytes alone (the chaos contract's ``digest_to_confirm``); otherwise
        the range actually read is mixed in too.  Runs on the IO thread (after the store work queued
        before it), not on the event loop."""
        return await self._io.run(self._digest, start, end, plain)

    def _digest(self, start: int, end: int, plain: bool) -> str:
        h = hashlib.sha256()
        offset = start
        while offset < end:
            chunk = self.store.read_raw(offset, min(DIGEST_CHUNK, end - offset))
            if len(chunk) == 0:
                break
            chunk = chunk[: end - offset]
            h.update(chunk)
            offset += len(chunk)
        if not plain:
            h.update(f"|{start}-{offset}".encode())
        return h.hexdigest()

    # --- control path ---------------------------------------------------------------------
    async def on_role_change(self, notification: MasterInfo) -> bool:
        """NOTIFY_BROKER_ROLE_CHANGED from the controller actor (``RoleChangeNotice.notification``) as a
        Ray call: to a broker whose session is not with that controller (else it comes on the session)."""
        return await self.manager.on_role_change(notification)

    async def status(self) -> BrokerStatus:
        """This replica as it stands (``actors/views.py``); ``role`` NONE until the first switch."""
        m = self.manager
        return BrokerStatus(
            group=self._group, replica=self._replica, ha_address=self._me.ha_address,
            broker_id=m.broker_id, state=m.state.name, running=m.state == State.RUNNING, role=m.role,
            fenced=m.fenced, master_broker_id=m.master_broker_id, master_address=m.master_address,
            master_epoch=m.master_epoch, sync_state_set=tuple(sorted(m.sync_state_set)),
            sync_state_set_epoch=m.sync_state_set_epoch,
            min_offset=self.store.min_offset, max_offset=self.store.max_offset,
            confirm_offset=self.store.confirm_offset,
            epoch_entries=tuple(EpochEntry(e.epoch, e.start_offset, e.end_offset)
                                for e in self.store.epoch_file.entries()),
            queues=tuple(QueuePosition(**q) for q in self.store.queue_positions()),
            ha=HAStatus.from_dict(self.ha.status()) if self.ha is not None else None,
            pid=os.getpid(), controller_session=self.session.connected_to,
            max_loop_stall_ms=round(self._stall.max_stall_ms, 1),
            lost_confirmed_bytes=self.store.lost_confirmed_bytes)

    # --- samples for the analytics -----------------------------------------------------------
    def _sample(self) -> dict:
        m = self.manager
        return {"time_ms": now_ms(), "group": self._group, "broker_id": m.broker_id,
                "role": m.role.value, "master_epoch": m.master_epoch,
                "max_offset": self.store.max_offset, "confirm_offset": self.store.confirm_offset}

    async def _sample_forever(self) -> None:
        while True:
            try:
                if self.manager.broker_id is not None:
                    self._samples.append(self._sample())
            except Exception:  # noqa: BLE001 - sampling must never stop the broker
                log.exception("sampling failed group=%s replica=%d", self._group, self._replica)
            await asyncio.sleep(SAMPLE_INTERVAL_S)

    async def samples(self) -> list[dict]:
        """Role, epoch and offsets sampled every second (the last hour), oldest first."""
        return list(self._samples)

    def pid(self) -> int:
        return os.getpid()

    def wall_clock_ms(self) -> int:
        """This replica's wall clock as it reads it (what stamps stored records, the delayed-delivery
        scheduler's and the SyncStateSet's clock): the chaos clock nemesis shows its jump by it."""
        return now_ms()

    async def _refresh_offsets_loop(self) -> None:
        """Keep committed offsets older than retention: as master, re-append the offsets of groups
        whose newest commit record is past half the retention (``ConsumerPath.refresh_idle_groups``)."""
        retention_ms = self._config.store.retention_ms
        if retention_ms is None:
            return
        period_s = min(retention_ms / 8, 60_000) / 1000
        while True:
            await asyncio.sleep(period_s)
            try:
                refreshed = await self.consumers.refresh_idle_groups(retention_ms // 2)
                if refreshed:
                    log.info("committed offsets re-appended before retention group=%s consumer_groups=%s",
                             self._group, ",".join(refreshed))
            except Exception:  # noqa: BLE001 - the next period tries again
                log.exception("offset refresh failed group=%s replica=%d", self._group, self._replica)

    async def _metrics_loop(self) -> None:
        """Sample this replica into the metrics and log role/epoch/SyncStateSet/truncation changes."""
        while True:
            await asyncio.sleep(METRICS_PERIOD_S)
            try:
                for line in self._metrics.observe(await self.status()):
                    log.info(line)
            except Exception:  # noqa: BLE001 - observability must not stop the broker
                log.exception("broker metrics sample failed group=%s replica=%d", self._group, self._replica)
