"""produce-allack: 1 KiB messages in batches to a master with two slaves, all-ack on.

The master runs in this process; each slave runs in its own process (its own interpreter, like
a broker actor). SyncStateSet {1, 2, 3} and ``all_ack_in_sync_state_set``: every put returns
only after both slaves acked its end offset. ``--producers`` puts are kept in flight.
Figures: messages/s and the p50/p99 latency of one put (one batch), and the worst stall of the
master's event loop during the measured phase (``max_loop_stall_ms``; target: at most 50).

Baseline, same run and same shape: for each batch, append the same encoded bytes to a file and
send them to two receiver processes that write them to their own file and answer an 8-byte ack;
the batch completes when both acks arrived. ``ratio`` = HA messages/s / baseline messages/s,
higher is better (targets: ``target_ratio`` 0.5, and ``p99_over_p50`` at most 4).
Both sides encode each batch as the producer does (``encode_batch``), once per put.

The two sides alternate ``--rounds`` times (default 3, ``--seconds`` each, default 4; the first
side changes every round), each in its own directory that is deleted and synced (``os.sync``)
before the other side starts, and the median round of each side is reported
(``msgs_per_s_each`` / ``raw_msgs_per_s_each`` list every round). Without the sync a side ran
while the kernel wrote back the previous side's gigabytes, which cost it up to half its rate.

Options: ``--seconds S`` (per side and round), ``--rounds R``, ``--batch N`` (messages per put,
default 32), ``--producers P`` (default 4), ``--message-bytes`` (default 1024).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from rocketray.broker.config import StoreConfig  # noqa: E402
from rocketray.wire.message import Message  # noqa: E402
from rocketray.wire.batch import RECORDS_IMPLEMENTATION, encode_batch  # noqa: E402
from rocketray.broker.store import MessageStore  # noqa: E402
from rocketray.ha.config import HAConfig  # noqa: E402
from rocketray.ha.loop_monitor import LoopStallMonitor  # noqa: E402
from rocketray.ha.service import HAService  # noqa: E402
from rocketray.wire.put_result import PutStatus  # noqa: E402
from rocketray.identity import Identity  # noqa: E402
from rocketray.links import MemberLinks  # noqa: E402
from rocketray.tls import CertificateAuthority, MemberCredentials  # noqa: E402

TARGET_RATIO = 0.5          # the targets the JSON line reports against
TARGET_P99_OVER_P50 = 4.0
SEGMENT = 256 << 20


def ha_config() -> HAConfig:
    return HAConfig(all_ack_in_sync_state_set=True, ha_send_heartbeat_interval_ms=1000)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(put_one, seconds: float, producers: int) -> tuple[int, list[float], float]:
    latencies: list[float] = []
    count = 0
    stop_at = time.perf_counter() + seconds
    start = time.perf_counter()

    async def producer() -> None:
        nonlocal count
        while time.perf_counter() < stop_at:
            t0 = time.perf_counter()
            done = await put_one()  # not `count += await ...`: that reads count before the await
            count += done           # and loses the other producers' updates meanwhile
            latencies.append(time.perf_counter() - t0)

    await asyncio.gather(*(producer() for _ in range(producers)))
    return count, latencies, time.perf_counter() - start


async def ha_side(work: Path, args) -> dict:
    store = MessageStore(work / "master", StoreConfig(segment_size_bytes=SEGMENT))
    ca = CertificateAuthority.create("bench")
    members = {i: ca.member(Identity.broker("bench", "broker-a", i), "bench-secret", ("127.0.0.1",)) for i in (1, 2, 3)}
    ha = HAService(store, 1, ha_config(), links=MemberLinks(members[1]))
    port = await ha.start("127.0.0.1", 0)
    assert await ha.change_to_master(1)
    ha.set_sync_state_set({1, 2, 3})
    procs = [subprocess.Popen([sys.executable, __file__, "--slave", str(work / f"slave{i}"),
                               f"127.0.0.1:{port}", str(i)], stdin=subprocess.PIPE) for i in (2, 3)]
    for i, p in zip((2, 3), procs):
        assert p.stdin is not None
        p.stdin.write(json.dumps(members[i].to_json()).encode() + b"\n")   # credentials never in argv
        p.stdin.close()
    body = os.urandom(args.message_bytes - 80)
    try:
        deadline = time.monotonic() + 60
        while {c.slave_id for c in ha.connections if c.ack_offset >= 0} != {2, 3}:
            assert time.monotonic() < deadline, "slaves did not connect"
            await asyncio.sleep(0.01)

        async def put_one() -> int:
            # the producer's work, as in the baseline: encode the batch once, one bytes object
            batch = encode_batch(Message("Bench", i % 4, body) for i in range(args.batch))
            result = await ha.put(batch, 0)
            assert result.status == PutStatus.PUT_OK, result
            return len(result.offsets)

        await measure(put_one, 0.5, args.producers)        # warm-up
        stall = LoopStallMonitor(interval_ms=10).start()     # the master's event loop, measured phase
        count, lat, elapsed = await measure(put_one, args.seconds, args.producers)
        max_stall_ms = await stall.stop()
    finally:
        for p in procs:
            p.terminate()
            p.wait()
        await ha.close()
        store.close()
    return {"msgs_per_s": count / elapsed, "p50_ms": percentile(lat, 0.5) * 1000,
            "p99_ms": percentile(lat, 0.99) * 1000, "puts": len(lat), "max_loop_stall_ms": max_stall_ms}


def slave_main(argv: list[str]) -> None:
    root, address, broker_id = argv
    credentials = MemberCredentials.from_json(json.loads(sys.stdin.readline()))

    async def main() -> None:
        store = MessageStore(Path(root), StoreConfig(segment_size_bytes=SEGMENT))
        ha = HAService(store, int(broker_id), ha_config(), links=MemberLinks(credentials))
        await ha.change_to_slave(address, 1)
        await asyncio.Event().wait()

    asyncio.run(main())


def receiver_main(argv: list[str]) -> None:
    """Baseline receiver: frames of length(4)+bytes; write them; ack the running total."""
    port, path = int(argv[0]), argv[1]

    async def main() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        total = 0
        with open(path, "wb") as f:
            while True:
                try:
                    (n,) = struct.unpack(">I", await reader.readexactly(4))
                    data = await reader.readexactly(n)
                except asyncio.IncompleteReadError:
                    return
                f.write(data)
                total += n
                writer.write(struct.pack(">q", total))

    asyncio.run(main())


async def raw_side(work: Path, args) -> dict:
    conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    ready = asyncio.Event()

    async def on_conn(reader, writer) -> None:
        conns.append((reader, writer))
        if len(conns) == 2:
            ready.set()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    procs = [subprocess.Popen([sys.executable, __file__, "--receiver", str(port),
                               str(work / f"recv{i}")]) for i in (2, 3)]
    await asyncio.wait_for(ready.wait(), 60)
    body = os.urandom(args.message_bytes - 80)
    log = open(work / "raw-master", "wb")
    sent = 0
    acked = [0, 0]
    waiters: list[tuple[int, asyncio.Future]] = []

    async def ack_reader(i: int, reader: asyncio.StreamReader) -> None:
        while True:
            (acked[i],) = struct.unpack(">q", await reader.readexactly(8))
            for end, fut in list(waiters):
                if min(acked) >= end and not fut.done():
                    fut.set_result(None)
                    waiters.remove((end, fut))

    readers = [asyncio.create_task(ack_reader(i, r)) for i, (r, _) in enumerate(conns)]

    async def put_one() -> int:
        nonlocal sent
        data = encode_batch(Message("Bench", i % 4, body) for i in range(args.batch)).data
        log.write(data)
        frame = struct.pack(">I", len(data)) + data
        sent += len(data)
        end = sent
        for _, w in conns:
            w.write(frame)
        fut = asyncio.get_running_loop().create_future()
        waiters.append((end, fut))
        if min(acked) >= end:
            fut.set_result(None)
            waiters.remove((end, fut))
        await fut
        return args.batch

    try:
        await measure(put_one, 0.5, args.producers)
        count, lat, elapsed = await measure(put_one, args.seconds, args.producers)
    finally:
        for t in readers:
            t.cancel()
        for p in procs:
            p.terminate()
            p.wait()
        for _, w in conns:
            w.close()
        server.close()
        log.close()
    return {"msgs_per_s": count / elapsed, "p50_ms": percentile(lat, 0.5) * 1000,
            "p99_ms": percentile(lat, 0.99) * 1000}


#: ``benchmarks/run.py produce-allack --smoke``: a size that finishes in seconds (CI runs it).
SMOKE_ARGS = ["--seconds", "1", "--producers", "1", "--rounds", "1"]


def run(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(prog="produce-allack")
    ap.add_argument("--seconds", type=float, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--message-bytes", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    raws: list[dict] = []
    has: list[dict] = []
    for i in range(args.rounds):  # alternated; each side's median round is reported
        sides = [(raw_side, raws), (ha_side, has)]
        for side, results in sides if i % 2 == 0 else sides[::-1]:
            with tempfile.TemporaryDirectory(prefix="bench-allack-") as d:
                results.append(asyncio.run(side(Path(d), args)))
            os.sync()  # the next side does not pay for this one's writeback (gigabytes of it)
    raw = sorted(raws, key=lambda r: r["msgs_per_s"])[len(raws) // 2]
    ha = sorted(has, key=lambda r: r["msgs_per_s"])[len(has) // 2]
    return {
        "rounds": args.rounds,
        "msgs_per_s_each": [round(r["msgs_per_s"]) for r in has],
        "raw_msgs_per_s_each": [round(r["msgs_per_s"]) for r in raws],
        "max_loop_stall_ms_all_rounds": round(max(r["max_loop_stall_ms"] for r in has), 1),
        "message_bytes": args.message_bytes, "batch": args.batch, "producers": args.producers,
        "msgs_per_s": round(ha["msgs_per_s"]), "p50_ms": round(ha["p50_ms"], 2),
        "p99_ms": round(ha["p99_ms"], 2), "puts": ha["puts"],
        "raw_msgs_per_s": round(raw["msgs_per_s"]), "raw_p50_ms": round(raw["p50_ms"], 2),
        "raw_p99_ms": round(raw["p99_ms"], 2),
        "ratio": round(ha["msgs_per_s"] / raw["msgs_per_s"], 3),
        "ratio_meaning": "HA msgs/s / raw baseline msgs/s (higher is better)",
        "target_ratio": TARGET_RATIO,
        "records": RECORDS_IMPLEMENTATION,
        "p99_over_p50": round(ha["p99_ms"] / ha["p50_ms"], 2),
        "target_p99_over_p50": TARGET_P99_OVER_P50,
        "max_loop_stall_ms": round(ha["max_loop_stall_ms"], 1),   # the master's event loop (target: 50)
    }


if __name__ == "__main__":
    if sys.argv[1:2] == ["--slave"]:
        slave_main(sys.argv[2:])
    elif sys.argv[1:2] == ["--receiver"]:
        receiver_main(sys.argv[2:])
    else:
        print(run(sys.argv[1:]))
