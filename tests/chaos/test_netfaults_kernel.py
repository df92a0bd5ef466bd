"""The kernel network faults are really applied, to the run's members only, and always removed:
real processes in member cgroups talk over loopback TCP while nftables drops what a fault blocks
(the rules' counters move, the bytes do not arrive), a process outside the run is untouched, and
the table and cgroups are gone after close, after SIGTERM, and after a SIGKILLed runner (the next
start sweeps them). Needs root, nftables and the net_cls cgroup (.ci/run installs nftables)."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from rocketray.chaos.nft import NET_CLS, KernelNet, sweep
from rocketray.verify.netfaults import NetFault
from rocketray.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]

SERVER = textwrap.dedent("""
    import socket, sys, threading
    srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen()
    print(srv.getsockname()[1], flush=True)
    def echo(conn):
        while data := conn.recv(4096):
            for word in data.decode().split():
                print("got", word, flush=True)
            conn.sendall(data)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=echo, args=(conn,), daemon=True).start()
""")

CLIENT = textwrap.dedent("""
    import socket, sys
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    print("connected", flush=True)
    for line in sys.stdin:
        word, timeout = line.split()
        s.settimeout(float(timeout))
        s.sendall((word + "\\n").encode())
        try:
            while True:   # echoes of earlier words a partition held back come first
                got = b""
                while not got.endswith(b"\\n"):
                    got += s.recv(1)
                print("echo", got.decode().strip(), flush=True)
                if got.decode().strip() == word:
                    break
        except socket.timeout:
            print("timeout", word, flush=True)
""")


class Proc:
    def __init__(self, code: str, *args: str) -> None:
        self.p = subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, bufsize=1)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def line(self, timeout_s: float = 30.0) -> str:
        try:
            return self.lines.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"no output within {timeout_s}s") from None

    def _read(self) -> None:
        for line in self.p.stdout:
            self.lines.put(line.strip())

    def ask(self, word: str, timeout_s: float) -> str:
        self.p.stdin.write(f"{word} {timeout_s}\n")
        self.p.stdin.flush()
        return self.line()

    def stop(self) -> None:
        self.p.kill()
        self.p.wait()


def tables() -> str:
    return subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=True).stdout


def test_partitions_and_loss_drop_only_the_runs_blocked_directions() -> None:
    server = Proc(SERVER)
    port = int(server.line())
    net = KernelNet().start([("a", ()), ("b", (port,))])
    a = c = None
    try:
        assert net.place("b", server.p.pid)
        a = Proc(CLIENT, str(port))
        assert a.line() == "connected"
        assert net.place("a", a.p.pid)          # after its socket exists: the kernel restamps it
        c = Proc(CLIENT, str(port))             # not a member: never touched
        assert c.line() == "connected"
        assert a.ask("one", 5) == "echo one" and server.line() == "got one"

        net.fault(NetFault(frozenset({("a", "b"), ("b", "a")})))
        assert a.ask("two", 1) == "timeout two"
        assert c.ask("free", 5) == "echo free" and server.line() == "got free"
        assert net.dropped() > 0
        net.heal()
        assert a.ask("after", 30) == "echo two"   # TCP retransmits what the partition dropped
        assert a.line() == "echo after"
        assert server.line() == "got two" and server.line() == "got after"

        net.fault(NetFault(frozenset({("b", "a")})))          # a does not hear b: b still hears a
        assert a.ask("three", 1) == "timeout three"
        assert server.line() == "got three"
        net.heal()
        assert a.ask("later", 30) == "echo three" and a.line() == "echo later" and server.line() == "got later"

        before = net.dropped()
        net.fault(NetFault(frozenset({("a", "b"), ("b", "a")}), loss_percent=30))
        for i in range(15):
            assert a.ask(f"lossy{i}", 30) == f"echo lossy{i}"
            assert server.line() == f"got lossy{i}"
        assert net.dropped() > before, "30% loss over 30+ packets dropped some"
    finally:
        net.close()
        for p in (server, a, c):
            if p is not None:
                p.stop()
    assert net.table not in tables() and not net.cgroup.exists()


RUNNER = textwrap.dedent("""
    import sys, time
    from rocketray.chaos.nft import KernelNet
    net = KernelNet().start([("x", (1,))])
    print(net.table, flush=True)
    time.sleep(60)
""")


def test_a_killed_runner_is_swept_and_a_terminated_one_cleans_up() -> None:
    for sig, left_behind in ((signal.SIGTERM, False), (signal.SIGKILL, True)):
        runner = subprocess.Popen([sys.executable, "-c", RUNNER], stdout=subprocess.PIPE, text=True, cwd=REPO)
        table = runner.stdout.readline().strip()
        assert table in tables() and (NET_CLS / table).is_dir()
        runner.send_signal(sig)
        runner.wait(timeout=10)
        assert (table in tables()) is left_behind
        if left_behind:
            assert table in sweep()
        wait_for(lambda: table not in tables() and not (NET_CLS / table).exists(), 5, f"{table} removed")
