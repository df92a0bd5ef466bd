"""client-e2e: the client's data path as an application sees it, against Ray's own per-call floor.

Setup: an embedded Ray (``ray.init`` in this process), a cluster of 3 controllers and one group of
3 replicas (default profile, all-ack), and per round two new topics of ``--queues`` queues made with
``Admin``. Two worker processes (this file run with ``--worker``) join that Ray at ``RAY_ADDRESS``
(Ray 2.60's embedded head turns token auth on and sets ``RAY_AUTH_MODE`` in this process's
environment; the workers inherit it, and never start a Ray of their own) and use only
``rocketray.client``: one holds a ``Producer``, the other the ``Consumer``s. This process sends each
worker one JSON command per line on stdin and reads its answers (lines marked ``ANSWER``) on stdout.

Figures (1 KiB bodies, ``--message-bytes``):

- ``sync_p50_ms`` / ``sync_p99_ms``: ``Producer.send``, one message at a time (``--sync`` sends,
  after ``--warmup``).
- ``async_msgs_per_s``: ``send_async`` of ``--async`` messages keeping at most ``--window`` (256)
  futures outstanding (the oldest is waited for before the next send), then ``flush``.
- ``consume_msgs_per_s``: a consumer of a new group reads the round's backlog (every message the
  two phases above sent to the topic) from the start: from its first ``poll`` until it has all.
- ``filtered_consume_msgs_per_s``: the producer sends ``--filtered`` messages with ``send_async``
  to a third topic, tagged ``kept`` and ``skipped`` in turn; a consumer of a new group subscribed
  ``{topic: "kept"}`` (the brokers leave the ``skipped`` half out) reads them from the start: the
  ``kept`` messages received per second, from its first ``poll`` until it has all (informational,
  no target; ``filtered_vs_consume`` compares it with ``consume_msgs_per_s``).
- ``e2e_p50_ms`` / ``e2e_p99_ms``: the producer sends to a second topic one message at a time, back
  to back as ``sync_p50_ms`` does (``--e2e-interval-ms`` paces them instead), its ``time.time()``
  before ``send`` in the body; a consumer of another group, long-polling that topic, notes
  ``time.time()`` when ``poll`` returns the message (one machine, one clock). ``e2e_send_p50_ms``:
  those sends' own ``send`` time, so the e2e's excess over the send it contains is visible (paced
  sends cost about twice as much here: a send after an idle gap wakes every process on the path).

Same-run floors:

- ``ray_call_p50_ms`` / ``ray_calls_per_s``: from the producer's process, a call of a plain (not
  async) Ray actor method that takes ``--message-bytes`` bytes and does nothing: one at a time
  (``--ray-calls``), and ``--ray-window-calls`` calls with ``--window`` in flight, windowed as the
  async sends are.
- ``inprocess_put_p50_ms``: one put of a one-message batch on a master in this process with two
  slave processes, all-ack (bench_produce_allack's ``ha_side`` with one producer and batch 1, for
  ``--inprocess-seconds``): what the store and replication cost without any client or Ray hop.

Target ratios (issue "Client data path"): ``sync_vs_ray_call`` = sync p50 / Ray call p50 (at most 1),
``async_vs_ray_calls`` = async msgs/s / Ray calls/s with the same window (at least 15),
``consume_vs_async`` (at least 1), ``e2e_vs_sync`` = e2e p50 / sync p50 (at most 2), ``p99_vs_p50`` =
sync p99 / sync p50 (at most 4); with ``--tls both`` (the default) two clusters run side by side, one
with TLS and one with ``tls.enabled=false``, the client figures are the TLS one's, ``plain_*`` the
other's, and (issue "Security") ``tls_sync_vs_plain`` = TLS sync p50 / plain sync p50 (at most
1.25), ``tls_async_vs_plain`` = TLS async msgs/s / plain (at least 0.8); ``targets_met`` says
whether all hold. ``ratio`` is ``sync_vs_ray_call`` (lower is better).

The two sides (the floors; the client) alternate over ``--rounds`` rounds (default 3; the first
side changes every round) and each figure is the median of its rounds (``*_each`` list every
round); the ratios are taken of the medians. ``transport`` / ``consumer_transport`` name the client's
transport class: the benchmark uses only the public client API, so it measures whichever the client
picks. ``load_1m`` is the load average before and after.

    python benchmarks/run.py client-e2e [--json] [--rounds 3] [--sync 1000] [--async 20000] [--e2e 200]
                                        [--filtered 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import os
import struct
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import bench_produce_allack as allack  # noqa: E402  (its in-process master with slave processes)
from command_process import CommandProcess  # noqa: E402

ANSWER = "@@client-e2e "        # marks a worker's answer lines: Ray may write to stdout too
STAMP = struct.Struct(">dI")     # e2e body head: time.time() before the send, sequence number
COMMAND_TIMEOUT_S = 600
TARGET_MAX = {"sync_vs_ray_call": 1.0, "e2e_vs_sync": 2.0, "p99_vs_p50": 4.0, "tls_sync_vs_plain": 1.25}
TARGET_MIN = {"async_vs_ray_calls": 15.0, "consume_vs_async": 1.0, "tls_async_vs_plain": 0.8}
RECORD_OVERHEAD = 80             # ha_side's records are message_bytes long: body = message_bytes - 80

#: ``benchmarks/run.py client-e2e --smoke``: a size that finishes in seconds (CI runs it).
SMOKE_ARGS = ["--rounds", "1", "--sync", "30", "--async", "600", "--e2e", "10", "--warmup", "5", "--filtered", "600",
              "--ray-calls", "100", "--ray-window-calls", "600", "--inprocess-seconds", "0.3"]


# --- the worker processes (only rocketray.client, and a bare Ray actor for the floor) -----------------

class Noop:
    """The floor's actor: a plain Ray actor method that takes the bytes and does nothing."""

    def call(self, data: bytes) -> None:
        return None


def windowed(count: int, window: int, submit: Callable[[], Any], wait: Callable[[Any], None]) -> collections.deque:
    """Issue ``count`` calls keeping at most ``window`` outstanding (the oldest is waited for before
    the next is issued); returns the ones still outstanding."""
    assert window > 0
    outstanding: collections.deque = collections.deque()
    for _ in range(count):
        if len(outstanding) >= window:
            wait(outstanding.popleft())
        outstanding.append(submit())
    return outstanding


def latency_figures(seconds: list[float]) -> dict:
    return {"p50_ms": allack.percentile(seconds, 0.5) * 1000, "p99_ms": allack.percentile(seconds, 0.99) * 1000,
            "samples": len(seconds)}


class Worker:
    """One worker process's commands; each returns the answer's dict (``e2e_receive`` also answers
    ``ready`` through ``answer`` before it returns)."""

    COMMANDS = frozenset({"ray_floor", "sync", "send_async", "e2e_send", "consume", "e2e_receive"})

    def __init__(self, cluster: str, answer: Callable[[dict], None]) -> None:
        self.cluster = cluster
        self.answer = answer
        self._producer: Any = None
        self._noop: Any = None

    def producer(self):
        from rocketray.client import Producer

        if self._producer is None:
            self._producer = Producer(self.cluster)
        return self._producer

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()

    def ray_floor(self, calls: int, window_calls: int, window: int, message_bytes: int) -> dict:
        import ray

        if self._noop is None:
            self._noop = ray.remote(Noop).options(num_cpus=0).remote()
        data = os.urandom(message_bytes)
        for _ in range(min(100, calls)):
            ray.get(self._noop.call.remote(data))
        samples = []
        for _ in range(calls):
            t0 = time.perf_counter()
            ray.get(self._noop.call.remote(data))
            samples.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        rest = windowed(window_calls, window, lambda: self._noop.call.remote(data), ray.get)
        ray.get(list(rest))
        return {**latency_figures(samples), "calls_per_s": window_calls / (time.perf_counter() - t0)}

    def sync(self, topic: str, count: int, warmup: int, message_bytes: int) -> dict:
        from rocketray.client import SendStatus

        p, body = self.producer(), os.urandom(message_bytes)
        for _ in range(warmup):
            p.send(topic, body)
        samples = []
        for _ in range(count):
            t0 = time.perf_counter()
            result = p.send(topic, body)
            samples.append(time.perf_counter() - t0)
            assert result.status is SendStatus.SEND_OK, result
        return {**latency_figures(samples), "sent": warmup + count, "transport": type(p._transport).__name__}

    def send_async(self, topic: str, count: int, window: int, message_bytes: int,
                   tags: list[str] | None = None) -> dict:
        """``count`` sends, ``window`` outstanding; tagged with ``tags`` in turn when given."""
        from rocketray.client import SendStatus

        p, body = self.producer(), os.urandom(message_bytes)
        turn = itertools.cycle(tags or [None])

        def acknowledged(future) -> None:
            assert future.result().status is SendStatus.SEND_OK

        t0 = time.perf_counter()
        rest = windowed(count, window, lambda: p.send_async(topic, body, tags=next(turn)), acknowledged)
        p.flush()
        elapsed = time.perf_counter() - t0
        for future in rest:
            acknowledged(future)
        return {"msgs_per_s": count / elapsed, "sent": count}

    def e2e_send(self, topic: str, count: int, warmup: int, interval_ms: float, message_bytes: int) -> dict:
        """One message every ``interval_ms`` (or as soon as the last send returned), stamped; the
        send times of sequence numbers ``warmup`` and up."""
        p, pad = self.producer(), os.urandom(message_bytes - STAMP.size)
        next_at = time.monotonic()
        samples = []
        for seq in range(count):
            time.sleep(max(0.0, next_at - time.monotonic()))
            next_at += interval_ms / 1000
            t0 = time.perf_counter()
            p.send(topic, STAMP.pack(time.time(), seq) + pad)
            if seq >= warmup:
                samples.append(time.perf_counter() - t0)
        return latency_figures(samples)

    def consume(self, topic: str, group: str, expect: int, timeout_s: float, tag_filter: str | None = None) -> dict:
        """Read ``expect`` messages of ``topic`` (only those tagged ``tag_filter`` when given)."""
        from rocketray.client import Consumer

        with Consumer(self.cluster, group=group, topics={topic: tag_filter or "*"}) as c:
            seen: set[tuple[int, int]] = set()
            t0 = time.perf_counter()
            while len(seen) < expect:
                messages = c.poll(timeout_s=1.0)
                assert tag_filter is None or all(m.tags == tag_filter for m in messages), "a message filtered out"
                seen.update((m.queue_id, m.queue_offset) for m in messages)
                if time.perf_counter() - t0 > timeout_s:
                    raise TimeoutError(f"group {group} read {len(seen)} of {expect} messages in {timeout_s} s")
            elapsed = time.perf_counter() - t0
            return {"msgs_per_s": expect / elapsed, "received": len(seen), "transport": type(c._transport).__name__}

    def e2e_receive(self, topic: str, group: str, expect: int, warmup: int, timeout_s: float) -> dict:
        """Long-poll ``topic``; answer ``ready`` once the first poll placed the pulls, then the
        send-to-receive latencies of sequence numbers ``warmup`` and up."""
        from rocketray.client import Consumer

        with Consumer(self.cluster, group=group, topics=[topic]) as c:
            c.poll(timeout_s=0.2)         # membership, start positions, held pulls on every queue
            self.answer({"ready": True, "queues": len(c.assignment())})
            seen: set[int] = set()
            samples: list[float] = []
            deadline = time.monotonic() + timeout_s
            while len(seen) < expect:
                messages = c.poll(timeout_s=1.0)
                now = time.time()
                for m in messages:
                    sent_at, seq = STAMP.unpack_from(m.body)
                    if seq not in seen and seq >= warmup:
                        samples.append(now - sent_at)
                    seen.add(seq)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"group {group} received {len(seen)} of {expect} in {timeout_s} s")
        return latency_figures(samples)


def worker_main(cluster: str) -> None:
    """A worker process: join the benchmark's Ray (``RAY_ADDRESS``, never a Ray of its own) and
    run the commands read from stdin until ``exit`` or EOF."""
    import ray

    ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR", log_to_driver=False)

    def answer(value: dict) -> None:
        sys.stdout.write(ANSWER + json.dumps(value) + "\n")
        sys.stdout.flush()

    worker = Worker(cluster, answer)
    try:
        for line in sys.stdin:
            command = json.loads(line)
            if command["cmd"] == "exit":
                break
            assert command["cmd"] in Worker.COMMANDS, command
            try:
                answer(getattr(worker, command["cmd"])(**command["args"]))
            except Exception:  # noqa: BLE001 - the benchmark process reports it and stops
                answer({"error": traceback.format_exc()})
    finally:
        worker.close()


# --- the benchmark process --------------------------------------------------------------------------

def worker_process(cluster: str, env: dict, log_path: Path) -> CommandProcess:
    """A worker subprocess (this file with ``--worker``) and its answers."""
    return CommandProcess([sys.executable, __file__, "--worker", cluster], env, log_path, ANSWER, HERE.parent,
                          COMMAND_TIMEOUT_S)


def floor_side(producer: CommandProcess, args, tmp: Path) -> dict:
    ray_call = producer.call("ray_floor", calls=args.ray_calls, window_calls=args.ray_window_calls,
                             window=args.window, message_bytes=args.message_bytes)
    shape = argparse.Namespace(seconds=args.inprocess_seconds, batch=1, producers=1,
                               message_bytes=args.message_bytes + RECORD_OVERHEAD)
    with tempfile.TemporaryDirectory(prefix="inprocess-", dir=tmp) as d:
        put = asyncio.run(allack.ha_side(Path(d), shape))
    os.sync()   # the client side does not pay for this side's writeback
    return {"ray_call_p50_ms": ray_call["p50_ms"], "ray_call_p99_ms": ray_call["p99_ms"],
            "ray_calls_per_s": ray_call["calls_per_s"], "inprocess_put_p50_ms": put["p50_ms"],
            "inprocess_put_p99_ms": put["p99_ms"]}


def client_side(round_no: int, admin, producer: CommandProcess, consumer: CommandProcess, args) -> dict:
    topic, e2e_topic = f"bench-client-{round_no}", f"bench-client-e2e-{round_no}"
    filtered_topic = f"bench-client-filtered-{round_no}"
    for name in (topic, e2e_topic, filtered_topic):
        admin.create_topic(name, queues=args.queues)
    sync = producer.call("sync", topic=topic, count=args.sync, warmup=args.warmup, message_bytes=args.message_bytes)
    sent_async = producer.call("send_async", topic=topic, count=args.async_count, window=args.window,
                               message_bytes=args.message_bytes)
    backlog = sync["sent"] + sent_async["sent"]
    consume = consumer.call("consume", topic=topic, group=f"bench-backlog-{round_no}", expect=backlog,
                            timeout_s=COMMAND_TIMEOUT_S / 2)
    producer.call("send_async", topic=filtered_topic, count=args.filtered, window=args.window,
                  message_bytes=args.message_bytes, tags=["kept", "skipped"])
    filtered = consumer.call("consume", topic=filtered_topic, group=f"bench-filtered-{round_no}",
                             expect=(args.filtered + 1) // 2, timeout_s=COMMAND_TIMEOUT_S / 2, tag_filter="kept")
    consumer.send("e2e_receive", topic=e2e_topic, group=f"bench-e2e-{round_no}", expect=args.warmup + args.e2e,
                  warmup=args.warmup, timeout_s=COMMAND_TIMEOUT_S / 2)
    ready = consumer.receive()
    assert ready["queues"] == args.queues, ready
    paced = producer.call("e2e_send", topic=e2e_topic, count=args.warmup + args.e2e, warmup=args.warmup,
                          interval_ms=args.e2e_interval_ms, message_bytes=args.message_bytes)
    e2e = consumer.receive()
    return {"sync_p50_ms": sync["p50_ms"], "sync_p99_ms": sync["p99_ms"], "async_msgs_per_s": sent_async["msgs_per_s"],
            "consume_msgs_per_s": consume["msgs_per_s"], "backlog": backlog,
            "filtered_consume_msgs_per_s": filtered["msgs_per_s"], "e2e_p50_ms": e2e["p50_ms"],
            "e2e_p99_ms": e2e["p99_ms"], "e2e_send_p50_ms": paced["p50_ms"], "transport": sync["transport"],
            "consumer_transport": consume["transport"]}


def measure(args, tmp: Path) -> tuple[list[dict], dict[str, list[dict]]]:
    """Start the cluster(s) and two workers per cluster; alternate the sides over the rounds. With
    ``--tls both`` two clusters run side by side, one with TLS (the default) and one with
    ``tls.enabled=false``, and each round measures both, in alternating order."""
    import ray

    from rocketray.actors.cluster import start_cluster
    from rocketray.client import Admin

    modes = {"both": ("tls", "plain"), "on": ("tls",), "off": ("plain",)}[args.tls]
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address, "PYTHONUNBUFFERED": "1"}
    clusters, workers, sides = [], [], {}
    floors: list[dict] = []
    clients: dict[str, list[dict]] = {mode: [] for mode in modes}
    try:
        for mode in modes:
            name = f"bench-client-e2e-{mode}-{int(time.time())}"
            clusters.append(start_cluster(name, controllers=3, groups=1, replicas=3, profile="default",
                                          data_dir=str(tmp / "data"),
                                          overrides={"tls.enabled": "true" if mode == "tls" else "false"}))
            producer = worker_process(name, env, tmp / f"producer-{mode}.log")
            consumer = worker_process(name, env, tmp / f"consumer-{mode}.log")
            workers += [producer, consumer]
            sides[mode] = (Admin(name), producer, consumer)
        first = sides[modes[0]][1]
        for i in range(args.rounds):
            steps = [(lambda: floor_side(first, args, tmp), floors)]
            steps += [(lambda mode=mode: client_side(i, *sides[mode], args), clients[mode]) for mode in modes]
            for step, results in steps if i % 2 == 0 else steps[::-1]:
                results.append(step())
    finally:
        for w in workers:
            w.close()
        for cluster in clusters:
            cluster.stop(delete_data=True)
    return floors, clients


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


FLOOR_FIGURES = ("ray_call_p50_ms", "ray_call_p99_ms", "ray_calls_per_s", "inprocess_put_p50_ms",
                 "inprocess_put_p99_ms")
CLIENT_FIGURES = ("sync_p50_ms", "sync_p99_ms", "async_msgs_per_s", "consume_msgs_per_s",
                  "filtered_consume_msgs_per_s", "e2e_p50_ms", "e2e_p99_ms", "e2e_send_p50_ms")


def summarize(args, floors: list[dict], by_mode: dict[str, list[dict]], load_1m: list[float]) -> dict:
    """Each figure's median over its rounds, the target ratios of those medians, every round. The
    client figures are the TLS cluster's (the default) when it ran, the plain one's as ``plain_*``,
    and ``tls_*_vs_plain`` compare the two (targets: sync p50 at most 1.25x, async at least 0.8x)."""
    clients = by_mode.get("tls") or by_mode["plain"]
    per_round = {k: [r[k] for r in floors] for k in FLOOR_FIGURES}
    per_round |= {k: [r[k] for r in clients] for k in CLIENT_FIGURES}
    if "tls" in by_mode and "plain" in by_mode:
        per_round |= {f"plain_{k}": [r[k] for r in by_mode["plain"]] for k in CLIENT_FIGURES}
    fig = {k: median(v) for k, v in per_round.items()}
    ratios = {
        "sync_vs_ray_call": fig["sync_p50_ms"] / fig["ray_call_p50_ms"],
        "async_vs_ray_calls": fig["async_msgs_per_s"] / fig["ray_calls_per_s"],
        "consume_vs_async": fig["consume_msgs_per_s"] / fig["async_msgs_per_s"],
        "filtered_vs_consume": fig["filtered_consume_msgs_per_s"] / fig["consume_msgs_per_s"],
        "e2e_vs_sync": fig["e2e_p50_ms"] / fig["sync_p50_ms"],
        "p99_vs_p50": fig["sync_p99_ms"] / fig["sync_p50_ms"],
    }
    if "plain_sync_p50_ms" in fig:
        ratios["tls_sync_vs_plain"] = fig["sync_p50_ms"] / fig["plain_sync_p50_ms"]
        ratios["tls_async_vs_plain"] = fig["async_msgs_per_s"] / fig["plain_async_msgs_per_s"]
    met = all(ratios[k] <= t for k, t in TARGET_MAX.items() if k in ratios) and \
        all(ratios[k] >= t for k, t in TARGET_MIN.items() if k in ratios)
    return {
        **{k: round(v, 3) if k.endswith("_ms") else round(v) for k, v in fig.items()},
        **{k: round(v, 3) for k, v in ratios.items()},
        "sync_vs_inprocess_put": round(fig["sync_p50_ms"] / fig["inprocess_put_p50_ms"], 2),
        "targets_met": met, "target_max": TARGET_MAX, "target_min": TARGET_MIN,
        "ratio": round(ratios["sync_vs_ray_call"], 3),
        "ratio_meaning": "sync send p50 / bare Ray actor call p50 (lower is better, target <= 1)",
        **{f"{k}_each": [round(v, 3) if k.endswith("_ms") else round(v) for v in vs] for k, vs in per_round.items()},
        "rounds": args.rounds, "backlog": clients[0]["backlog"], "tls": args.tls,
        "transport": clients[0]["transport"], "consumer_transport": clients[0]["consumer_transport"],
        "message_bytes": args.message_bytes, "window": args.window, "queues": args.queues,
        "sync_sends": args.sync, "async_sends": args.async_count, "e2e_sends": args.e2e,
        "filtered_sends": args.filtered,
        "e2e_interval_ms": args.e2e_interval_ms, "profile": "default", "load_1m": load_1m,
    }


def run(argv: list[str]) -> dict:
    import ray

    ap = argparse.ArgumentParser(prog="client-e2e")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sync", type=int, default=1000)
    ap.add_argument("--async", dest="async_count", type=int, default=20000)
    ap.add_argument("--e2e", type=int, default=200)
    ap.add_argument("--filtered", type=int, default=10000,
                    help="messages sent for the filtered consume (half of them filtered out on the brokers)")
    ap.add_argument("--e2e-interval-ms", type=float, default=0)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--message-bytes", type=int, default=1024)
    ap.add_argument("--ray-calls", type=int, default=1000)
    ap.add_argument("--ray-window-calls", type=int, default=10000)
    ap.add_argument("--inprocess-seconds", type=float, default=2)
    ap.add_argument("--tls", choices=("both", "on", "off"), default="both",
                    help="measure a TLS cluster, a plain one, or both side by side (default)")
    args = ap.parse_args(argv)
    load_before = os.getloadavg()[0]
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", include_dashboard=False, logging_level="ERROR", log_to_driver=False,
                 object_store_memory=300 * 1024 * 1024, namespace="rocketray-bench")
    try:
        with tempfile.TemporaryDirectory(prefix="bench-client-e2e-") as tmp:
            floors, clients = measure(args, Path(tmp))
    finally:
        if started:
            ray.shutdown()
    return summarize(args, floors, clients, [round(load_before, 2), round(os.getloadavg()[0], 2)])


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker_main(sys.argv[2])
    else:
        print(run(sys.argv[1:]))
