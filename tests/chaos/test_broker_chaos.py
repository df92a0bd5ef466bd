"""Broker chaos: the HA proxy's faults on real sockets, the schedule planning, a live run driven into
data loss on purpose (the checker must say so), the CI chaos run through the CLI, and a short run of
master kills and consumer crashes whose consumer groups must keep at-least-once."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading

import pytest

from rocketray.verify import nemesis as sched
from rocketray.chaos.broker_chaos import NemesisListError, parse_kinds, plan_steps
from rocketray.chaos.ha_proxy import HaProxies
from rocketray.spec import BrokerSpec, ClusterSpec
from rocketray import ports
from rocketray.actors.views import Role
from rr_testing import wait_until

GROUP = "broker-a"


# --- the proxy on real sockets, no Ray -----------------------------------------------------------

class EchoServer:
    """A TCP echo server on a background loop: the stand-in for a broker's HA listener."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        async def handle(r, w):
            try:
                while data := await r.read(4096):
                    w.write(data)
                    await w.drain()
            except ConnectionError:
                pass
            finally:
                w.close()

        async def start():
            return await asyncio.start_server(handle, "127.0.0.1", port)

        self.server = asyncio.run_coroutine_threadsafe(start(), self.loop).result(5)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def proxied():
    listen, advertised = ports.free_ports(2)
    spec = ClusterSpec("p", "c", "/tmp", "fast", (), (BrokerSpec(GROUP, 0, "127.0.0.1", advertised, "/tmp",
                                                                 listen_port=listen),))
    echo = EchoServer(listen)
    proxies = HaProxies(spec).start()
    yield proxies, advertised
    proxies.close()
    echo.close()


def roundtrip(sock: socket.socket, data: bytes, timeout_s: float = 2.0) -> bytes:
    sock.settimeout(timeout_s)
    sock.sendall(data)
    out = b""
    while len(out) < len(data):
        chunk = sock.recv(4096)
        if not chunk:
            break
        out += chunk
    return out


def test_proxy_forwards_cuts_and_heals(proxied):
    """A cut aborts live connections and refuses new ones; heal lets new connections through."""
    proxies, port = proxied
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        assert roundtrip(s, b"hello") == b"hello"
        assert proxies.fault((GROUP, 0), "cut") == 1
        with pytest.raises(OSError):
            s.settimeout(2)
            s.sendall(b"x")
            if not s.recv(10):
                raise ConnectionResetError("closed")
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s2:
        s2.settimeout(2)
        with pytest.raises(OSError):
            s2.sendall(b"y")
            if not s2.recv(10):
                raise ConnectionResetError("closed")
    proxies.heal()
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s3:
        assert roundtrip(s3, b"again") == b"again"


def test_proxy_stall_holds_bytes_until_heal(proxied):
    """A stall keeps the connection open but forwards nothing; heal delivers what was held."""
    proxies, port = proxied
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        assert roundtrip(s, b"one") == b"one"
        proxies.fault((GROUP, 0), "stall")
        s.sendall(b"held")
        s.settimeout(0.5)
        with pytest.raises(socket.timeout):
            s.recv(10)
        proxies.heal()
        assert roundtrip(s, b"", 2.0) == b"" and s.recv(10) == b"held"


def test_proxy_link_fault_hits_only_the_named_peer_process(proxied):
    """A fault with peer pids (found in /proc from the source port) spares other processes' links."""
    proxies, port = proxied
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        assert roundtrip(s, b"a") == b"a"
        assert proxies.fault((GROUP, 0), "cut", peer_pids=[os.getpid() + 10_000_000]) == 0
        assert roundtrip(s, b"still") == b"still"
        assert proxies.fault((GROUP, 0), "cut", peer_pids=[os.getpid()]) == 1


# --- planning --------------------------------------------------------------------------------------

def test_nemesis_list_parsing_and_seeded_plans():
    """--nemesis accepts kinds, all and none; a plan is a pure function of the seed and draws only
    the listed kinds, never overlapping and ending within the run."""
    assert parse_kinds("none") == () and parse_kinds("kill-master,all") == ("all",)
    with pytest.raises(NemesisListError):
        parse_kinds("kill-master,explode")
    kw = dict(groups={GROUP: [1, 2, 3]}, controllers=3, run_ms=60_000, interval_ms=4000, fault_ms=4000)
    a = plan_steps(("kill-master", "partition-ha"), 7, **kw)
    assert a == plan_steps(("kill-master", "partition-ha"), 7, **kw)
    assert {s.kind for s in a} <= {"kill-master", "partition-ha"} and len(a) >= 3
    assert all(x.end_ms < y.at_ms for x, y in zip(a, a[1:])) and a[-1].end_ms <= 60_000
    every = {s.kind for s in plan_steps(("process",), 10, **kw)}
    assert every == set(sched.PROCESS_DRAWS), "seed 10 (the CI run's) exercises every process nemesis"


# --- live --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ray_here():
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(include_dashboard=False, logging_level="ERROR", log_to_driver=False,
                 object_store_memory=300 * 1024 * 1024, namespace="rocketray-tests")
    yield ray
    if started:
        ray.shutdown()


@pytest.mark.slow
def test_live_loss_with_all_ack_off_and_unclean_election_is_reported(ray_here, tmp_path):
    """All-ack off, unclean election on: with the master's replication cut at its HA proxy the
    master acknowledges writes alone, then dies; a slave without those writes is elected. The
    checker, run on the recorded history, must report the acknowledged writes as lost (lost > 0,
    valid false). (Freezing the slaves instead is not enough: the kernel keeps what the master
    already sent in their socket buffers and they read it when resumed.)"""
    from rocketray.actors import pipeline
    from rocketray.chaos.broker_workload import ProducerLoop, RunLog, create_topic, final_reads, replica_snapshots
    from rocketray.chaos.broker_chaos import write_run
    from rocketray.verify.checker import check_run_dir
    from rocketray.actors.cluster import start_cluster

    proxies: list[HaProxies] = []
    cluster = start_cluster("loss", controllers=1, groups=1, replicas=3, data_dir=str(tmp_path / "data"),
                            profile="fast", overrides={"ha.all_ack_in_sync_state_set": "false",
                                                       "controller.enable_elect_unclean_master": "true"},
                            ha_proxy=True, before_brokers=lambda spec: proxies.append(HaProxies(spec).start()))
    producer = None
    try:
        runlog = RunLog()
        layout = create_topic(cluster.spec.name, 1)
        producer = ProducerLoop(cluster.spec.name, layout, 0, runlog, threading.Event(), send_timeout_ms=30_000)

        def send(n: int) -> int:
            """Send one batch of ``n`` payloads (one queue); how many were acknowledged."""
            before = producer.outcomes["ok"]
            producer.batch = n
            producer.send_batch()
            return producer.outcomes["ok"] - before

        assert send(50) == 50
        pipeline.settle(cluster)
        old = cluster.wait_for_master(GROUP)
        runlog.event("partition-ha", "start", f"broker:{GROUP}/r{old} cut all links", GROUP)
        proxies[0].fault((GROUP, old), "cut")
        try:
            assert send(100) == 100, "all-ack off: the cut-off master acknowledges alone"
            assert cluster.master_of(GROUP) == old
            runlog.event("kill-master", "start", f"broker:{GROUP}/r{old}", GROUP)
            import ray

            ray.kill(cluster.broker(GROUP, old), no_restart=True)
        finally:
            proxies[0].heal()
            runlog.event("partition-ha", "end", f"broker:{GROUP}/r{old} cut all links", GROUP)
        new = cluster.wait_for_master(GROUP, 60)
        assert new != old
        assert send(50) == 50
        from rocketray.actors import remote

        cluster.start_broker(GROUP, old)  # rejoins as a slave, truncating the lost batch
        pipeline.settle(cluster)
        runlog.event("heal", "end", None, None)
        wait_until(lambda: getattr(cluster.broker_status(GROUP, old), "role", None) == Role.SLAVE, 30,
                   what="the old master to rejoin as a slave")
        final_reads(cluster, layout, runlog)
        write_run(tmp_path / "run", runlog, replica_snapshots(cluster), cluster)
        verdict = check_run_dir(tmp_path / "run")
        assert verdict.lost >= 100 and not verdict.valid, verdict.to_json()
    finally:
        if producer is not None:
            producer.producer.close(timeout_s=5)
        cluster.stop(delete_data=True)
        for p in proxies:
            p.close()


def run_chaos_cli(out, *args: str, timeout_s: float = 420) -> tuple[dict, subprocess.CompletedProcess]:
    """``rocketray chaos --target brokers ... --json`` in a subprocess; (the last stdout line, the process)."""
    proc = subprocess.run(
        [sys.executable, "-m", "rocketray.cli", "chaos", "--target", "brokers", *args, "--profile", "fast",
         "--out", str(out), "--json"], capture_output=True, text=True, timeout=timeout_s)
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr[-3000:]
    return json.loads(lines[-1]), proc


def assert_groups_clean(summary: dict, groups: int = 2) -> dict:
    """Every consumer group's report is clean and the group workload really ran; the reports."""
    reports = summary["consumer_groups"]
    assert sorted(reports) == [f"cg-{i}" for i in range(groups)], reports
    for name, g in reports.items():
        assert g["valid"] and g["undelivered"] == 0 and g["rereads_below_commit"] == 0, (name, g)
        assert g["commit_regressions"] == 0 and g["corrupt"] == 0, (name, g)
        if g["expression"] == "*":
            assert g["acked"] == summary["acked"], (name, g)
        else:                                  # a filtered group must receive only what its tags match
            assert 0 < g["acked"] < summary["acked"], (name, g)
        assert g["deliveries"] >= g["acked"] > 0, (name, g)
        assert g["commits_ok"] > 0 and g["progress_samples"] > 0, (name, g)
    assert summary["groups_drained"] is True, summary
    return reports


@pytest.mark.slow
def test_ci_chaos_run_all_nemeses_is_valid(tmp_path):
    """CI: one minute of every process nemesis (seed 10 draws each kind: kills, pauses, HA-proxy
    partitions) and consumer churn on the fast profile, through the CLI in a subprocess; the last
    stdout line is the JSON verdict and it must be valid, every consumer group's report included.
    (The OS-level kinds have their own run: tests/chaos/test_os_nemeses.py.)"""
    out = tmp_path / "run"
    summary, proc = run_chaos_cli(out, "--duration", "60", "--seed", "10", "--nemesis", "process", "--groups", "2")
    for key in ("ops", "acked", "lost", "unseen", "duplicates", "inconsistent_offsets", "masters_per_epoch_max",
                "replicas_converged", "failover_ms", "valid", "consumer_groups"):
        assert key in summary, key
    assert summary["valid"] and proc.returncode == 0, (summary, proc.stderr[-3000:])
    assert summary["acked"] > 0 and summary["lost"] == 0 and summary["nemesis_acted"] >= 6, summary
    assert {"p50", "max"} <= set(summary["failover_ms"])
    assert_groups_clean(summary)
    assert summary["churn_acted"] >= 5, summary
    for name in ("history.jsonl", "nemesis.jsonl", "replicas.json", "samples.jsonl", "verdict.json"):
        assert (out / name).is_file(), name


@pytest.mark.slow
def test_consumer_groups_survive_master_kills_and_consumer_crashes(tmp_path):
    """At-least-once per group, end to end: 20 s of master kills (one every ~4 s) while two consumer
    groups of two members poll, commit, nack and seek back (the second filtering by tag), a share of
    the sends is delayed, the topic gains queues at 10 s, and the churn schedule crashes members
    (abandoned, expired by the controller) and closes others; after the drain every acknowledged
    message was delivered to each group whose filter matches it (delayed ones not before their time,
    new queues' too), every nacked one again or to the dead-letter topic, no group read below an
    acknowledged commit that no seek explains and no committed offset went back."""
    summary, proc = run_chaos_cli(tmp_path / "run", "--duration", "20", "--seed", "10", "--nemesis", "kill-master",
                                  "--groups", "2", timeout_s=300)
    assert summary["valid"] and proc.returncode == 0, (summary, proc.stderr[-3000:])
    assert summary["nemesis_acted"] >= 3 and summary["failover_ms"]["count"] >= 3, summary
    reports = assert_groups_clean(summary)
    assert sum(g["consumers_crashed"] for g in reports.values()) >= 2, reports
    assert sum(g["consumers_started"] for g in reports.values()) >= 6, reports
    # the members nacked (copies came back, poison payloads reached the dead-letter topic) and sought
    # back, the second group filtered by tag, delayed sends came, and the topic gained queues midway
    for key in ("nacks_ok", "copies_delivered", "dead_lettered", "seeks", "delayed_delivered"):
        assert sum(g[key] for g in reports.values()) > 0, (key, reports)
    assert reports["cg-1"]["expression"] != "*" and all(g["queues_added"] > 0 for g in reports.values()), reports
