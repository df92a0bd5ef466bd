"""replication: an empty slave catching up a master's backlog over the HA protocol.

Builds a master store holding ``--size-mb`` MiB (default 256) of 4 KiB messages, then starts a
slave in its own process (its own interpreter, like a real broker) and times how long the slave
takes, from its connection to its ack of the master's max offset, to copy everything: MB/s.

The HA run is made twice per round, over TLS (the default: ``ha_MBps``, ``ratio``) and over plain
TCP (development mode: ``ha_plain_MBps``, ``plain_ratio``); ``tls_ratio`` = TLS MB/s / plain MB/s
(the security issue's target: >= 0.8). ``raw_tls_MBps``: the raw baseline below over TLS between
the same member certificates (blocking ``ssl`` sockets, no protocol, no verification): the most a
TLS stream carries here, and ``tls_ceiling_ratio`` = that / HA over plain TCP, the highest
``tls_ratio`` any TLS replication could reach on this machine. Baseline, same run: read the same commit-log files and send
them over a loopback socket to a process that writes them into a file (no protocol, no
verification). ``ratio`` = HA MB/s / raw MB/s, higher is better (1.0 would mean the protocol costs
nothing). The two runs alternate
``--rounds`` times (default 5), each after an ``os.sync`` so neither pays for the other's
writeback, and the medians are compared: the file system's write speed drifts by a factor of
several between runs here, more than either side's cost.

``--cold``: before each side, the master's store is closed and its segments are dropped from the
page cache (``fsync`` + ``POSIX_FADV_DONTNEED``), so both sides read the backlog from disk, as a
master does for a slave that fell far behind (old segments are no longer cached). The master's
catch-up reads fault on its mapping of the log; ``max_loop_stall_ms`` shows what that costs its
event loop.

``max_loop_stall_ms``: the worst lateness of a 5 ms wake-up on the master's and on the slave's
event loop during the HA run (``rocketray.ha.loop_monitor``; the broker's target is <= 50 ms).

Options: ``--size-mb N``, ``--batch-kb K`` (transfer batch size; default: the HAConfig default),
``--sweep K1,K2,...`` (repeat the HA run for several batch sizes; reported under ``sweep``),
``--message-kb``, ``--rounds N``, ``--cold``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from rocketray.broker.config import StoreConfig  # noqa: E402
from rocketray.wire.message import Message  # noqa: E402
from rocketray.broker.store import MessageStore  # noqa: E402
from rocketray.ha.config import DEFAULT_TRANSFER_BATCH_SIZE, HAConfig  # noqa: E402
from rocketray.ha.loop_monitor import LoopStallMonitor  # noqa: E402
from rocketray.ha.service import HAService  # noqa: E402
from rocketray.identity import Identity  # noqa: E402
from rocketray.links import MemberLinks  # noqa: E402
from rocketray.tls import CertificateAuthority, MemberCredentials  # noqa: E402

MiB = 1 << 20
SEGMENT = 64 * MiB


def build_backlog(root: Path, size_mb: int, message_kb: int) -> MessageStore:
    store = open_master(root)
    store.epoch_file.append(1, 0)          # written as the master of epoch 1
    body = os.urandom(message_kb * 1024 - 80)
    batch = [Message("Bench", i % 8, body) for i in range(64)]
    while store.max_offset < size_mb * MiB:
        store.put_messages(batch, 0)
    store.confirm_offset = store.max_offset   # a master alone confirms what it wrote
    store.flush()
    return store


def bench_members() -> tuple[MemberCredentials, MemberCredentials]:
    """Master and slave credentials of one throwaway cluster CA."""
    ca = CertificateAuthority.create("bench")
    return tuple(ca.member(Identity.broker("bench", "broker-a", i), "bench-secret", ("127.0.0.1",))  # type: ignore[return-value]
                 for i in (0, 1))


async def ha_run(master_store: MessageStore, work: Path, batch_kb: int, tls: bool,
                 members: tuple[MemberCredentials, MemberCredentials]) -> tuple[float, float]:
    """Seconds for a fresh slave process to copy the whole backlog (over TLS or plain TCP), and the
    worst loop stall (ms) on the master or the slave during it."""
    monitor = LoopStallMonitor().start()
    cfg = HAConfig(ha_transfer_batch_size=batch_kb * 1024, ha_send_heartbeat_interval_ms=1000,
                   ha_housekeeping_interval_ms=20000)
    ha = HAService(master_store, 1, cfg, links=MemberLinks(members[0], tls=tls))
    port = await ha.start("127.0.0.1", 0)
    assert await ha.change_to_master(1)
    total = master_store.max_offset
    slave_dir = work / f"slave-{batch_kb}"
    # Spawned off the loop: forking this process can take 100 ms, which the loop monitor would
    # count as the master's stall (the broker itself never spawns anything on its loop).
    proc = await asyncio.to_thread(subprocess.Popen, [sys.executable, __file__, "--slave",
                                                      str(slave_dir), f"127.0.0.1:{port}",
                                                      str(batch_kb), "tls" if tls else "plain"],
                                   stdin=subprocess.PIPE)
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(members[1].to_json()).encode() + b"\n")   # credentials never in argv
    proc.stdin.close()
    try:
        start = None
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            conns = [c for c in ha.connections if c.slave_id == 2]
            if conns and start is None and conns[0].ack_offset >= 0:
                start = time.perf_counter()
            if conns and conns[0].ack_offset == total:
                elapsed = time.perf_counter() - start
                return elapsed, max(await monitor.stop(), _slave_stall_ms(slave_dir))
            await asyncio.sleep(0.005)
        raise RuntimeError("slave did not catch up")
    finally:
        proc.terminate()
        proc.wait()
        await ha.close()
        shutil.rmtree(slave_dir, ignore_errors=True)


def _slave_stall_ms(slave_dir: Path) -> float:
    """The slave's worst loop stall, as its process last wrote it (see ``slave_main``)."""
    deadline = time.monotonic() + 1.0
    path = Path(f"{slave_dir}.stall")
    time.sleep(0.15)                        # it publishes every 50 ms: let the last value land
    while time.monotonic() < deadline:
        time.sleep(0.05)
        try:
            return float(path.read_text())
        except (OSError, ValueError):
            continue
    return float("nan")


def slave_main(argv: list[str]) -> None:
    root, address, batch_kb, mode = argv
    credentials = MemberCredentials.from_json(json.loads(sys.stdin.readline()))

    async def main() -> None:
        monitor = LoopStallMonitor().start()
        store = MessageStore(Path(root), StoreConfig(segment_size_bytes=SEGMENT))
        cfg = HAConfig(ha_transfer_batch_size=int(batch_kb) * 1024,
                       ha_send_heartbeat_interval_ms=1000, ha_housekeeping_interval_ms=20000)
        ha = HAService(store, 2, cfg, links=MemberLinks(credentials, tls=mode == "tls"))
        await ha.change_to_slave(address, 1)
        stall_path = Path(f"{root}.stall")
        written = None
        while True:      # publish the worst stall when it changes (checked every 50 ms)
            if monitor.max_stall_ms != written:
                written = monitor.max_stall_ms
                tmp = stall_path.with_suffix(".tmp")
                tmp.write_text(f"{written:.1f}")
                os.replace(tmp, stall_path)
            await asyncio.sleep(0.05)

    asyncio.run(main())


def raw_receiver_main(argv: list[str]) -> None:
    port, path, total = int(argv[0]), argv[1], int(argv[2])
    tls = argv[3:4] == ["tls"]      # the receiver's member credentials come on stdin (never argv)
    member = MemberCredentials.from_json(json.loads(sys.stdin.read())) if tls else None
    with socket.create_connection(("127.0.0.1", port)) as plain, open(path, "wb") as f:
        sock = member.client_context().wrap_socket(plain) if member is not None else plain
        buf = bytearray(MiB)
        view = memoryview(buf)
        got = 0
        while got < total and (n := sock.recv_into(buf)):
            f.write(view[:n])
            got += n
        f.flush()
        sock.sendall(b"k")


def open_master(root: Path) -> MessageStore:
    return MessageStore(root, StoreConfig(segment_size_bytes=SEGMENT, background_thread=False))


def evict(store: MessageStore) -> MessageStore:
    """Close ``store``, drop its segments from the page cache, and open it again (``--cold``)."""
    root = store.root
    store.close()
    for path in sorted((root / "commitlog").iterdir()):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return open_master(root)


def raw_run(master_store: MessageStore, work: Path,
            members: tuple[MemberCredentials, MemberCredentials] | None = None) -> float:
    """Seconds to read the segment files and push them through a loopback socket into a file;
    with ``members``, over TLS between the two (blocking ``ssl`` sockets: Python's fastest TLS
    stream, the ceiling any TLS replication here can reach)."""
    files = sorted((master_store.root / "commitlog").iterdir())
    total = master_store.max_offset
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        proc = subprocess.Popen([sys.executable, __file__, "--raw-receiver", str(port), str(work / "raw.out"),
                                 str(total), *(["tls"] if members else [])], stdin=subprocess.PIPE)
        assert proc.stdin is not None
        if members:
            proc.stdin.write(json.dumps(members[1].to_json()).encode())
        proc.stdin.close()
        conn, _ = server.accept()
        if members:
            conn = members[0].server_context().wrap_socket(conn, server_side=True)
        start = time.perf_counter()
        sent = 0
        with conn:
            for path in files:
                with open(path, "rb") as f:
                    while sent < total and (chunk := f.read(min(MiB, total - sent))):
                        conn.sendall(chunk)
                        sent += len(chunk)
            assert conn.recv(1) == b"k"
        elapsed = time.perf_counter() - start
        proc.wait()
    os.unlink(work / "raw.out")
    return elapsed


#: ``benchmarks/run.py replication --smoke``: a size that finishes in seconds (CI runs it).
SMOKE_ARGS = ["--size-mb", "4", "--rounds", "1", "--cold"]


def run(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(prog="replication")
    ap.add_argument("--size-mb", type=int, default=256)
    ap.add_argument("--batch-kb", type=int, default=DEFAULT_TRANSFER_BATCH_SIZE // 1024)
    ap.add_argument("--message-kb", type=int, default=4)
    ap.add_argument("--sweep", default="")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cold", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-repl-") as d:
        work = Path(d)
        store = build_backlog(work / "master", args.size_mb, args.message_kb)
        mb = store.max_offset / MiB
        members = bench_members()
        raws, raw_tlss, has, plains, stalls = [], [], [], [], []
        for _ in range(args.rounds):  # alternated, each after a sync (no writeback debt carried over)
            os.sync()
            if args.cold:
                store = evict(store)
            raws.append(raw_run(store, work))
            os.sync()
            raw_tlss.append(raw_run(store, work, members))
            for tls, times in ((True, has), (False, plains)):
                os.sync()
                if args.cold:
                    store = evict(store)
                ha_s, stall_ms = asyncio.run(ha_run(store, work, args.batch_kb, tls, members))
                times.append(ha_s)
                stalls.append(stall_ms)
        raw_s, ha_s, plain_s = statistics.median(raws), statistics.median(has), statistics.median(plains)
        raw_tls_s = statistics.median(raw_tlss)
        stall_ms = max(stalls)
        sweep = {}
        for kb in [int(x) for x in args.sweep.split(",") if x]:
            sweep[f"{kb}KiB_MBps"] = round(mb / asyncio.run(ha_run(store, work, kb, True, members))[0], 1)
        store.close()
    result = {
        "size_mb": round(mb, 1),
        "message_bytes": args.message_kb * 1024,
        "batch_kb": args.batch_kb,
        "ha_seconds": round(ha_s, 3),
        "ha_MBps": round(mb / ha_s, 1),
        "ha_plain_MBps": round(mb / plain_s, 1),
        "tls_ratio": round(plain_s / ha_s, 3),
        "raw_seconds": round(raw_s, 3),
        "raw_MBps": round(mb / raw_s, 1),
        "ratio": round((mb / ha_s) / (mb / raw_s), 3),
        "plain_ratio": round((mb / plain_s) / (mb / raw_s), 3),
        "raw_tls_MBps": round(mb / raw_tls_s, 1),
        "tls_ceiling_ratio": round(plain_s / raw_tls_s, 3),
        "max_loop_stall_ms": round(stall_ms, 1),
        "rounds": args.rounds,
        "cold": args.cold,
        "ha_MBps_each": [round(mb / t, 1) for t in has],
        "ha_plain_MBps_each": [round(mb / t, 1) for t in plains],
        "raw_MBps_each": [round(mb / t, 1) for t in raws],
        "raw_tls_MBps_each": [round(mb / t, 1) for t in raw_tlss],
    }
    if sweep:
        result["sweep"] = sweep
    return result


if __name__ == "__main__":
    if sys.argv[1:2] == ["--slave"]:
        slave_main(sys.argv[2:])
    elif sys.argv[1:2] == ["--raw-receiver"]:
        raw_receiver_main(sys.argv[2:])
    else:
        print(run(sys.argv[1:]))
