"""Findings 6, 7 and 8: the client port bounds what one connection and one address can make it hold,
keeps serving when file descriptors run out, and speaks TLS end to end (a relay cannot inject).
The real ``ClientPort`` over real sockets, with a stand-in of the broker's endpoints."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from rocketray.actors.client_port import ClientPort
from rocketray.border import LimitsConfig
from rocketray.wire.client_frames import PUT_COUNT, FrameType, encode_frame, pack
from rocketray.wire.pull_result import PullResult, PullStatus
from rocketray.client.connections import Connection, Dialer
from rocketray.wire.put_result import PutResult, PutStatus, Written
from rocketray.tls import ClientTrust
from rr_users import authenticator, directory_of, login, table_of
from rr_members import CLUSTER, broker, ca_for, member
from rr_testing import wait_until

SECRET = "client-secret"
USER = "app"
ANSWER = b"x" * 12_000          # a 12 KB pull answer


class Endpoints:
    def __init__(self) -> None:
        self.puts = 0

    def put_start(self, batch, done):
        self.puts += 1
        return PutResult(PutStatus.PUT_OK, Written.YES, ((0, 0),), 1, 1)

    def pull_start(self, topic, queue_id, queue_offset, max_count, max_bytes, hold_ms, group, done,
                   tag_filter=None):
        return PullResult(PullStatus.FOUND, ANSWER, 1, queue_offset, queue_offset + 1, 9)


def dialer(secret: str = SECRET) -> Dialer:
    return Dialer(ClientTrust(CLUSTER, ca_for().cert_pem), login(USER, secret))


@pytest.fixture
def serve():
    """``serve(limits)``: a client port on its own loop thread; (address, port, endpoints)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    ports = []

    def start(limits: LimitsConfig = LimitsConfig()):
        endpoints = Endpoints()
        port = ClientPort(endpoints, authenticator(directory_of(table_of({USER: SECRET}))),
                          member(broker(0)).open_server_context(), limits)
        number = asyncio.run_coroutine_threadsafe(port.start("127.0.0.1", 0), loop).result(5)
        ports.append(port)
        return ("127.0.0.1", number), port, endpoints

    yield start
    for p in ports:
        asyncio.run_coroutine_threadsafe(p.close(), loop).result(5)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def test_a_client_that_stops_reading_is_paused_then_disconnected_as_a_slow_consumer(serve):
    # 400 PULLs of 12 KB never read made a broker hold 400 MB; now the port stops reading beyond a
    # quarter of max_unsent_bytes and closes the connection when the answers do not drain.
    limits = LimitsConfig(max_unsent_bytes=1 << 20, write_deadline_ms=500)
    address, port, _ = serve(limits)
    stream, _ = dialer().dial(address)                      # authenticated, then never read
    frames = [b"".join(encode_frame(FrameType.PULL, i + 1, pack(["t", 0, i, 1, 1 << 20, 0, None])))
              for i in range(3000)]                          # 36 MB of answers asked for

    def sender():
        try:
            for frame in frames:
                stream.sendall(frame)
        except OSError:
            pass                                             # the broker closed it: the point

    threading.Thread(target=sender, daemon=True).start()
    wait_until(lambda: port.slow_consumers == 1, 20, what="the slow consumer closed")
    stream.close()


def test_a_silent_flood_of_connections_is_refused_past_the_limits_and_dropped_at_the_deadline(serve):
    # ~250 half-open handshakes made real connections fail or wait seconds; now one address holds at
    # most max_connections_per_ip (refused at once beyond it) and a silent one is dropped after
    # preauth_timeout_ms, after which real clients get through.
    limits = LimitsConfig(max_connections=16, max_connections_per_ip=8, preauth_timeout_ms=600)
    address, port, endpoints = serve(limits)
    silent = [socket.create_connection(address, timeout=5) for _ in range(8)]
    try:
        with socket.create_connection(address, timeout=5) as extra:
            started = time.monotonic()
            assert extra.recv(100) == b"" and time.monotonic() - started < 2, "refused at once"
        wait_until(lambda: port.border.refused >= 1, 5, what="the refusal counted")
        for s in silent:
            s.settimeout(5)
            assert s.recv(100) == b"", "a silent connection is dropped at the pre-auth deadline"
        conn = wait_until(lambda: Connection(address, dialer()), 10, what="a real client connects")
        assert conn.request(FrameType.PUT, PUT_COUNT.pack(1), b"r").result(5).type is FrameType.PUT_ANSWER
        conn.close("done")
    finally:
        for s in silent:
            s.close()


EMFILE_SCRIPT = textwrap.dedent("""
    import asyncio, json, logging, resource, socket, sys
    sys.path.insert(0, sys.argv[1])
    from rocketray.actors.client_port import ClientPort
    from rocketray.border import LimitsConfig
    from rr_members import broker, member
    from rr_users import authenticator, directory_of, table_of

    records = []
    class Count(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage() + (" TRACEBACK" if record.exc_info else ""))
    logging.getLogger().addHandler(Count())
    logging.getLogger().setLevel(logging.INFO)

    async def main():
        limits = LimitsConfig(preauth_timeout_ms=60_000, log_interval_ms=10_000)
        port = ClientPort(None, authenticator(directory_of(table_of({}))), member(broker(0)).open_server_context(), limits)
        number = await port.start("127.0.0.1", 0)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard))
        flood = []
        for _ in range(300):        # until this process's descriptors run out: the accepts fail
            try:
                s = socket.socket()
            except OSError:
                break
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", number))
            flood.append(s)
            await asyncio.sleep(0)
        await asyncio.sleep(3)
        print(json.dumps({"records": records}))

    asyncio.run(main())
""")


def test_running_out_of_file_descriptors_is_logged_once_per_interval_without_tracebacks(tmp_path):
    # fd limit 256 made asyncio log a traceback per failed accept (26,615 in 40 s); now a warning at
    # most once per log interval, and the listener keeps serving.
    support = os.path.join(os.path.dirname(__file__), "..", "support")
    out = subprocess.run([sys.executable, "-c", EMFILE_SCRIPT, support], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    records = __import__("json").loads(out.stdout.strip().splitlines()[-1])["records"]
    accept = [r for r in records if "accept" in r]
    assert 1 <= len(accept) <= 2, records[:5]
    assert not any("TRACEBACK" in r for r in accept)


def test_a_relay_cannot_inject_a_frame_into_an_authenticated_connection(serve):
    # Plain text after the handshake let a relay without the secret pass a real client's handshake
    # through and then inject a PUT that the broker wrote. Under TLS the relay sees ciphertext;
    # bytes it injects break the record MAC and the broker drops the connection, writing nothing.
    address, port, endpoints = serve()
    relay = socket.create_server(("127.0.0.1", 0))
    inject = threading.Event()

    def pump(src, dst, inject_here: bool):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
                if inject_here and inject.is_set():
                    dst.sendall(b"".join(encode_frame(FrameType.PUT, 99, PUT_COUNT.pack(1), b"evil")))
                    inject.clear()
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def run_relay():
        client_side, _ = relay.accept()
        broker_side = socket.create_connection(address)
        threading.Thread(target=pump, args=(broker_side, client_side, False), daemon=True).start()
        pump(client_side, broker_side, True)

    threading.Thread(target=run_relay, daemon=True).start()
    conn = Connection(relay.getsockname(), dialer())
    assert conn.request(FrameType.PUT, PUT_COUNT.pack(1), b"real").result(5).type is FrameType.PUT_ANSWER
    inject.set()
    fut = conn.request(FrameType.PUT, PUT_COUNT.pack(1), b"real-2")   # the relay appends its frame after it
    try:
        fut.result(5)
    except Exception:  # noqa: BLE001 - the connection may die before this answer
        pass
    wait_until(lambda: conn.closed is not None, 10, what="the broker to drop the tampered connection")
    assert endpoints.puts <= 2, "the injected put was never written"
    relay.close()
