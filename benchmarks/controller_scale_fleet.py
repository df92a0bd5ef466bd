"""The broker fleet of ``controller-scale``: light heartbeaters speaking the controller's real API.

Run as its own process by ``bench_controller_scale.py`` (``python benchmarks/controller_scale_fleet.py
CLUSTER``), joined to the benchmark's Ray at ``RAY_ADDRESS``, so the controllers' CPU is theirs alone.
Each of the G x R replicas does what a broker's ReplicasManager and ControllerSession do, with the
same requests and the same session protocol: GetNextBrokerId, ApplyBrokerId and RegisterBroker through
the real ``AsyncControllerClient`` (leader following), a session connection to the leader's session
port (authenticated with the cluster secret, then a hello with the first heartbeat:
``rocketray.controller.session``), a heartbeat frame on it every ``broker_heartbeat_interval_ms``
(acked by the leader), and, for replica 0 of each group, an ElectMaster and an AlterSyncStateSet that
puts every replica in the SyncStateSet. No store, no replication. ``--ray-heartbeats`` (the
``setup`` argument ``ray_heartbeats``) sends them through Ray instead: one Ray call per heartbeat to
every controller, the leader's answer timed (the transport of clusters without session ports).

Like a broker's session, the fleet follows the controller leader: when the client's leader view
(long polls on every controller) names another leader, every live replica says bye to the old one and
reopens its session, with a heartbeat, to the new one (``leader_changes``, ``reopen_ms`` in ``stats``).

Replica ``r`` of group ``g`` sits on node ``(g + r) % 3``, so node ``k`` holds a replica of every group
and the masters (replica 0) of the groups ``g % 3 == k``: ``lose k`` stops those replicas at once as
a dead machine would (their sessions close without a bye; their heartbeats stop).

Commands, one JSON line each on stdin, answers on stdout after ``ANSWER``: ``setup`` (replicas
heartbeat from their registration on), ``stats`` (heartbeats sent and answered by the leader since the last ``stats``, with latency
percentiles of the leader's acks: the time from sending until the row is in the leader's table and
the ack is back),
``lose`` (``node``; ``close``: close sessions, else keep them open and silent), ``exit``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

ANSWER = "@@fleet "
NODES = 3


@dataclass(slots=True)
class Replica:
    group: str
    index: int
    node: int
    address: str
    broker_id: int = 0
    alive: bool = True
    due_s: float = 0.0
    writer: asyncio.StreamWriter | None = None
    tasks: list = field(default_factory=list)
    links: object = None                          # its MemberLinks, made at its first session
    seq: int = 0
    sent_at: dict = field(default_factory=dict)   # seq -> perf_counter at send, until acked


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3) if ordered else 0.0


def fleet_address(g: int, r: int) -> str:
    """The HA address replica ``r`` of fleet group ``g`` registers with (never listened on)."""
    return f"10.9.{(g + r) % NODES}.{g % 250}:{10000 + g * 8 + r}"


def fleet_group(g: int) -> str:
    return f"scale-{g:04d}"


def fleet_brokers(groups: int, replicas: int) -> tuple:
    """The fleet's replicas as the cluster spec names them: the controllers admit a session only from
    a member whose certificate and spec address match its hello (``session.hello_problem``)."""
    from rocketray.spec import BrokerSpec

    out = []
    for g in range(groups):
        for r in range(replicas):
            host, port = fleet_address(g, r).rsplit(":", 1)
            out.append(BrokerSpec(group=fleet_group(g), replica=r, host=host, ha_port=int(port), store_dir=""))
    return tuple(out)


class Fleet:
    def __init__(self, cluster: str) -> None:
        import ray

        from rocketray.actors.controller_client import AsyncControllerClient
        from rocketray.config import load_config
        from rocketray.spec import ClusterSpec

        registry = ray.get_actor("registry", namespace=f"rocketray-{cluster}")
        self.spec = ClusterSpec.from_dict(ray.get(registry.spec.remote(), timeout=30))
        self.config = load_config(self.spec.profile, dict(self.spec.config_overrides))
        self.client = AsyncControllerClient(self.spec)
        self.handles = [ray.get_actor(self.spec.controller_actor_name(c.index), namespace=self.spec.namespace)
                        for c in self.spec.controllers]
        self.replicas: list[Replica] = []
        self.leader = 0
        self._lock = threading.Lock()
        self._latencies_ms: list[float] = []
        self._sent = 0
        self._answered = 0
        self._late = 0
        self._errors = 0
        self._running = False
        self._task: asyncio.Future | None = None
        self.busy_answers = 0
        self.ray_heartbeats = False
        self.leader_changes = 0
        self.reopen_ms: list[float] = []
        self._cpu0 = time.process_time()

    # -- setup -------------------------------------------------------------------------------------
    async def setup(self, groups: int, replicas: int, ca: dict, concurrency: int = 32,
                    ray_heartbeats: bool = False) -> dict:
        """``ca``: the cluster CA (``cert``, ``key`` PEM) and the members' ``secret``, from the process
        that started the controllers (the operator's): each replica gets its member certificate."""
        from rocketray.wire.controller_api import (AlterSyncStateSetRequest, ApplyBrokerIdRequest, ElectMasterRequest,
                                                   GetNextBrokerIdRequest, RegisterBrokerRequest)
        from rocketray.wire.controller_codes import ResponseCode
        from rocketray.identity import check_code

        from rocketray.tls import CertificateAuthority

        self.ca = CertificateAuthority(ca["cert"].encode(), ca["key"].encode())
        self.secret = ca["secret"]
        self.tls = self.config.tls.enabled
        cluster = self.spec.cluster_name
        started = time.perf_counter()
        self.ray_heartbeats = ray_heartbeats
        meta = await self.client.metadata()        # the leader every session goes to
        assert meta, "no controller leader"
        self.leader = meta[0]["index"]
        gate = asyncio.Semaphore(concurrency)
        period_s = self.config.broker.broker_heartbeat_interval_ms / 1000
        if self._task is None:   # replicas heartbeat from their registration on, as brokers do
            self._task = asyncio.ensure_future(self.run_heartbeats())

        async def one_group(g: int) -> None:
            name = fleet_group(g)
            members = [Replica(name, r, (g + r) % NODES, fleet_address(g, r)) for r in range(replicas)]
            async with gate:
                for rep in members:
                    resp = await self._call(GetNextBrokerIdRequest(cluster, name))
                    assert resp.ok, resp
                    next_id = resp.header.next_broker_id
                    code = check_code(rep.address, rep.index, self.spec.broker_identity(name, rep.index))
                    resp = await self._call(ApplyBrokerIdRequest(cluster, name, next_id, code))
                    assert resp.ok, resp
                    rep.broker_id = next_id
                    resp = await self._call(RegisterBrokerRequest(cluster, name, rep.broker_id, rep.address))
                    assert resp.ok, resp
                    if not ray_heartbeats:
                        await self._open_session(rep)     # its hello carries the first heartbeat
                    else:
                        self._heartbeat(rep, time.perf_counter(), timed=False)
                    rep.due_s = time.perf_counter() + period_s
                    self.replicas.append(rep)
                master = members[0]
                resp = await self._until_ok(ElectMasterRequest.of_broker_trigger(cluster, name, master.broker_id),
                                            done=(ResponseCode.CONTROLLER_MASTER_STILL_EXIST,))
                epoch = resp.header.master_epoch
                # an attempt whose answer was lost may have committed: the retry is then fenced (2001)
                resp = await self._until_ok(AlterSyncStateSetRequest(
                    name, master.broker_id, epoch, frozenset(r.broker_id for r in members),
                    resp.header.sync_state_set_epoch), done=(ResponseCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH,))

        await asyncio.gather(*(one_group(g) for g in range(groups)))
        assert self.spec.controller_by_address(self.client.leader_address).index == self.leader, "the leader moved"
        registered_s = time.perf_counter() - started
        if ray_heartbeats:
            await asyncio.gather(*(self._open_session(r) for r in self.replicas))
        else:
            asyncio.ensure_future(self._follow_leader())
        return {"replicas": len(self.replicas), "leader": self.leader, "registered_s": round(registered_s, 2),
                "setup_busy_answers": self.busy_answers,
                "setup_s": round(time.perf_counter() - started, 2)}

    async def _call(self, request, attempts: int = 10):
        """A request, retried while the controller answers SYSTEM_ERROR (busy: its request queue timed out)
        or none answers in time (the requests here are idempotent, as a broker's registrar's are)."""
        from rocketray.actors.controller_client import ControllerUnavailable
        from rocketray.wire.controller_codes import ResponseCode

        for attempt in range(attempts):
            try:
                resp = await self.client.call(request)
            except ControllerUnavailable:
                if attempt == attempts - 1:
                    raise
                self.busy_answers += 1
                continue
            if resp.code != ResponseCode.SYSTEM_ERROR:
                return resp
            self.busy_answers += 1
            await asyncio.sleep(0.1)
        return resp

    async def _until_ok(self, request, timeout_s: float = 60.0, done: tuple = ()):
        """The first election is answered 2004 until the requester's heartbeat is in the leader's table."""
        deadline = time.monotonic() + timeout_s
        while True:
            resp = await self._call(request)
            if resp.code in done:
                return resp
            if resp.ok or time.monotonic() > deadline:
                assert resp.ok, resp
                return resp
            await asyncio.sleep(0.05)

    async def _open_session(self, rep: Replica) -> None:
        from rocketray.auth import SESSION_LABEL
        from rocketray.controller.session import Hello, encode_hello
        from rocketray.links import MemberLinks

        c = self.spec.controllers[self.leader]
        if rep.links is None:
            identity = self.spec.broker_identity(rep.group, rep.index)
            rep.links = MemberLinks(self.ca.member(identity, self.secret), tls=self.tls, preauth_timeout_ms=10_000)
        reader, writer, _peer = await rep.links.connect(c.host, c.session_port, SESSION_LABEL)
        writer.write(encode_hello(Hello(self.spec.cluster_name, rep.group, rep.broker_id, rep.address)))
        rep.writer = writer
        if not self.ray_heartbeats:
            self._heartbeat(rep, time.perf_counter(), timed=False)
        await writer.drain()
        rep.tasks.append(asyncio.ensure_future(self._read_acks(rep, reader)))

    async def _follow_leader(self) -> None:
        """Move every live replica's session to a new leader as soon as the client's view names one
        (a bye to the old controller, then a hello with a heartbeat to the new one)."""
        from rocketray.controller.session import encode_bye

        while self._running or self._task is not None:
            await asyncio.sleep(0.05)
            address = self.client.leader_address
            moved = address is not None and self.spec.controller_by_address(address).index != self.leader
            if not moved:
                continue
            self.leader = self.spec.controller_by_address(address).index
            self.leader_changes += 1
            started = time.perf_counter()
            live = [r for r in self.replicas if r.alive]
            for rep in live:
                if rep.writer is not None and not rep.writer.is_closing():
                    rep.writer.write(encode_bye())
                    rep.writer.close()
                rep.writer = None
                for task in rep.tasks:
                    task.cancel()
                rep.tasks.clear()
            await asyncio.gather(*(self._open_session(r) for r in live), return_exceptions=True)
            self.reopen_ms.append(round((time.perf_counter() - started) * 1000, 1))
            print(f"fleet: leader moved to controller-{self.leader}; {len(live)} sessions reopened in "
                  f"{self.reopen_ms[-1]} ms", file=sys.stderr, flush=True)

    async def _read_acks(self, rep: Replica, reader: asyncio.StreamReader) -> None:
        """The leader's acks of this replica's heartbeats (none with Ray heartbeats: EOF only); its
        role notifications after an election are read and ignored (the fleet switches no roles)."""
        from rocketray.controller.session import Ack, ControllerFrameDecoder

        decoder = ControllerFrameDecoder()
        while data := await reader.read(4096):
            now = time.perf_counter()
            for ack in decoder.receive_data(data):
                if not isinstance(ack, Ack):
                    continue
                t0 = rep.sent_at.pop(ack.seq, None)
                if t0 is not None:
                    with self._lock:
                        self._answered += 1
                        self._latencies_ms.append((now - t0) * 1000)
        # The controller closed the session (a hello that reached a controller which was not the
        # leader, or one that stepped down): a broker opens it again at the leader it knows, and so
        # does the fleet, or the group's replicas are never alive and its elections fail.
        if not (self._running and rep.alive):
            return
        print(f"fleet: {rep.group}/{rep.index}: the controller closed its session; opening it again",
              file=sys.stderr, flush=True)
        await asyncio.sleep(0.2)
        address = self.client.leader_address
        if address is not None:
            self.leader = self.spec.controller_by_address(address).index
        if self._running and rep.alive:
            try:
                await self._open_session(rep)
            except OSError as exc:
                print(f"fleet: {rep.group}/{rep.index}: session not reopened: {exc!r}", file=sys.stderr, flush=True)

    # -- heartbeats --------------------------------------------------------------------------------
    def _request(self, rep: Replica):
        from rocketray.wire.controller_api import BrokerHeartbeatRequest

        b = self.config.broker
        return BrokerHeartbeatRequest(self.spec.cluster_name, rep.group, rep.address, rep.broker_id, 1, 4096, 4096,
                                      b.controller_heartbeat_timeout_ms, b.broker_election_priority)

    def _heartbeat(self, rep: Replica, now: float, timed: bool = True) -> None:
        """One heartbeat: a frame on the replica's session (timed: send -> the leader's ack), or with
        ``ray_heartbeats`` a Ray call to every controller (timed: the leader's answer)."""
        from rocketray.controller.session import encode_heartbeat, heartbeat_of

        request = self._request(rep)
        if not self.ray_heartbeats:
            if rep.writer is None or rep.writer.is_closing():
                return
            rep.seq += 1
            if timed:
                self._sent += 1
                rep.sent_at[rep.seq] = now
            rep.writer.write(encode_heartbeat(heartbeat_of(request, rep.seq)))
            return
        for i, handle in enumerate(self.handles):
            ref = handle.heartbeat.remote(request)
            if timed and i == self.leader:
                self._sent += 1
                ref.future().add_done_callback(lambda fut, t0=now: self._answer(fut, t0))

    def _answer(self, fut, t0: float) -> None:
        elapsed_ms = (time.perf_counter() - t0) * 1000
        with self._lock:
            if fut.exception() is None:
                self._answered += 1
                self._latencies_ms.append(elapsed_ms)
            else:
                self._errors += 1

    async def run_heartbeats(self) -> None:
        period_s = self.config.broker.broker_heartbeat_interval_ms / 1000
        self._running = True
        while self._running:
            now = time.perf_counter()
            for rep in self.replicas:
                if rep.alive and rep.due_s <= now:
                    if now - rep.due_s > period_s / 2:
                        self._late += 1
                    self._heartbeat(rep, time.perf_counter())
                    rep.due_s += period_s
            await asyncio.sleep(0.005)

    def stats(self) -> dict:
        with self._lock:
            samples, self._latencies_ms = self._latencies_ms, []
            out = {"sent": self._sent, "answered": self._answered, "errors": self._errors, "late": self._late}
            self._sent = self._answered = self._errors = self._late = 0
        cpu = time.process_time()
        out.update(p50_ms=_pct(samples, 0.5), p99_ms=_pct(samples, 0.99), max_ms=_pct(samples, 1.0),
                   fleet_cpu_s=round(cpu - self._cpu0, 3), leader=self.leader, leader_changes=self.leader_changes,
                   reopen_ms=self.reopen_ms)
        self._cpu0 = cpu
        return out

    def lose(self, node: int, close: bool) -> dict:
        """Node ``node`` dies: its replicas stop heartbeating and (``close``) their sessions close."""
        lost = [r for r in self.replicas if r.node == node and r.alive]
        at = time.time()
        for rep in lost:
            rep.alive = False
            if close and rep.writer is not None:
                rep.writer.transport.abort()
        masters = {r.group: r.broker_id for r in lost if r.index == 0}
        return {"at_wall_ms": at * 1000, "replicas": len(lost), "masters": masters}


def main(cluster: str) -> None:
    import ray

    ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR", log_to_driver=False)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    fleet = Fleet(cluster)
    lines: asyncio.Queue = asyncio.Queue()

    def read_stdin() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(lines.put_nowait, line)
        loop.call_soon_threadsafe(lines.put_nowait, "")

    def answer(value: dict) -> None:
        sys.stdout.write(ANSWER + json.dumps(value) + "\n")
        sys.stdout.flush()

    async def serve() -> None:
        threading.Thread(target=read_stdin, daemon=True).start()
        while True:
            line = await lines.get()
            if not line:
                break
            command = json.loads(line)
            cmd, args = command["cmd"], command.get("args", {})
            try:
                if cmd == "exit":
                    break
                if cmd == "setup":
                    answer(await fleet.setup(**args))
                elif cmd == "stats":
                    answer(fleet.stats())
                elif cmd == "lose":
                    answer(fleet.lose(**args))
                else:
                    answer({"error": f"unknown command {cmd!r}"})
            except Exception:  # noqa: BLE001 - reported to the benchmark process, which stops
                answer({"error": traceback.format_exc()})
        fleet._running = False
        if fleet._task is not None:
            await fleet._task

    loop.run_until_complete(serve())


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main(sys.argv[1])
