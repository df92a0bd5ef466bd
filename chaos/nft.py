"""Kernel network faults of one chaos run: its nftables table and its net_cls cgroups.

Theory of operation (the rules are ``verify/netfaults.py``; docs/chaos.md has the design). A
:class:`KernelNet` owns one table ``inet rocketray_chaos_<pid>_<nonce>`` and one cgroup directory of
the same name in the cgroup-v1 ``net_cls`` hierarchy (mounted at ``NET_CLS`` if nothing is), with a
child cgroup per member whose ``net_cls.classid`` is ``<major>:<minor>``, ``major`` unused by any
other cgroup there. ``place(member, pid)`` moves a process into its member's cgroup (the kernel
rewrites the classid of the process's open sockets too). ``fault``/``heal`` load rules with one
``nft -f`` each. ``close`` deletes the table, moves the processes back to the root cgroup and
removes the directories; it runs from ``finally``, at exit, and on SIGTERM/SIGINT (then the
previous handler runs). A start-up ``sweep`` removes tables and cgroups of runners that died
without it (their pid is in the name). Every command is bounded by ``NFT_TIMEOUT_S``.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import random
import secrets
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any, Iterable, Sequence

from rocketray.verify.netfaults import (Member, NetFault, classid, render_base, render_delete, render_fault,
                                        render_heal, stale_tables, table_name)

log = logging.getLogger("rocketray.chaos.nft")

NET_CLS = Path("/sys/fs/cgroup/net_cls")
NFT_TIMEOUT_S = 10.0

__all__ = ["KernelNet", "KernelNetError", "NET_CLS", "sweep"]


class KernelNetError(RuntimeError):
    """nftables or the net_cls cgroups are not usable here (the message says what failed)."""


def _nft(script: str) -> str:
    try:
        done = subprocess.run(["nft", "-f", "-"], input=script, text=True, capture_output=True,
                              timeout=NFT_TIMEOUT_S)
    except FileNotFoundError:
        raise KernelNetError("nft is not installed (apt-get install nftables)") from None
    if done.returncode != 0:
        raise KernelNetError(f"nft -f failed: {done.stderr.strip()}\n{script}")
    return done.stdout


def _nft_json(*args: str) -> Any:
    done = subprocess.run(["nft", "-j", *args], text=True, capture_output=True, timeout=NFT_TIMEOUT_S)
    if done.returncode != 0:
        raise KernelNetError(f"nft -j {' '.join(args)} failed: {done.stderr.strip()}")
    return json.loads(done.stdout)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def ensure_net_cls() -> Path:
    """The net_cls hierarchy, mounted here if no one has."""
    if (NET_CLS / "cgroup.procs").exists():
        return NET_CLS
    NET_CLS.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "cgroup", "-o", "net_cls", "net_cls", str(NET_CLS)], text=True,
                          capture_output=True, timeout=NFT_TIMEOUT_S)
    if done.returncode != 0 or not (NET_CLS / "cgroup.procs").exists():
        raise KernelNetError(f"cannot mount the net_cls cgroup at {NET_CLS}: {done.stderr.strip()}")
    return NET_CLS


def _remove_cgroup(directory: Path) -> None:
    """Move every process of ``directory``'s member cgroups back to the root, then remove them."""
    for child in sorted(p for p in directory.iterdir() if p.is_dir()) if directory.is_dir() else ():
        _empty(child)
        child.rmdir()
    if directory.is_dir():
        _empty(directory)
        directory.rmdir()


def _empty(cgroup: Path) -> None:
    for line in (cgroup / "cgroup.procs").read_text().split():
        try:
            (NET_CLS / "cgroup.procs").write_text(line)
        except (ProcessLookupError, OSError):
            pass   # gone meanwhile


def sweep() -> list[str]:
    """Remove the tables and cgroups of chaos runners that are no longer alive; returns their names."""
    tables = [t["table"]["name"] for t in _nft_json("list", "tables").get("nftables", [])
              if "table" in t and t["table"].get("family") == "inet"]
    dead = stale_tables(tables, _alive)
    for name in dead:
        _nft(render_delete(name))
    groups = [p.name for p in NET_CLS.iterdir() if p.is_dir()] if NET_CLS.is_dir() else []
    for name in stale_tables(groups, _alive):
        _remove_cgroup(NET_CLS / name)
        dead.append(name)
    if dead:
        log.warning("removed what dead chaos runs left: %s", sorted(set(dead)))
    return sorted(set(dead))


def _majors_in_use(root: Path) -> set[int]:
    used = set()
    for path in root.glob("*/*/net_cls.classid"):
        try:
            used.add(int(path.read_text()) >> 16)
        except (OSError, ValueError):
            continue
    return used


class KernelNet:
    """The kernel network faults of one run (see the module docstring)."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self.table = table_name(os.getpid(), secrets.token_hex(4))
        self._ports: dict[str, tuple[int, ...]] = {}
        self._rng = rng or random.Random()
        self.members: list[Member] = []
        self.cgroup = NET_CLS / self.table
        self._lock = threading.Lock()
        self._open = False
        self._previous: dict[int, Any] = {}
        self.fault_in_force: NetFault | None = None
        self._dropped_before = 0   # drops counted by fault rules already flushed

    # -- lifecycle -------------------------------------------------------------------------------
    def prepare(self) -> "KernelNet":
        """Sweep, create the run's table with a conntrack rule and its cgroup directory. Run it before
        the members open their connections: conntrack must see each connection from its first packet
        to know which end dialed (one it meets mid-stream may take the acceptor for the dialer)."""
        if self._open:
            return self
        ensure_net_cls()
        sweep()
        self.cgroup.mkdir()
        self._open = True
        self._handlers()
        _nft(f"table inet {self.table} {{\n  chain out {{\n    type filter hook output priority 0; policy accept;\n"
             f'    oifname "lo" ct state new counter\n  }}\n}}\n')
        return self

    def start(self, members: Sequence[tuple[str, Iterable[int]]]) -> "KernelNet":
        """The members (name, listening ports) and their cgroups; the rules that mark dialers."""
        self.prepare()
        self._ports = {name: tuple(sorted(set(ports))) for name, ports in members}
        used = _majors_in_use(NET_CLS)
        major = next(m for m in (self._rng.randrange(0x1000, 0xFFFE) for _ in range(1000)) if m not in used)
        self.members = [Member(n, classid(major, i + 1), self._ports[n]) for i, (n, _) in enumerate(members)]
        for m in self.members:
            (self.cgroup / m.name.replace("/", "_")).mkdir()
            (self.cgroup / m.name.replace("/", "_") / "net_cls.classid").write_text(str(m.classid))
        _nft(render_base(self.table, self.members))
        log.info("kernel network faults: table %s, %d members, classid major %#x", self.table, len(self.members), major)
        return self

    def _handlers(self) -> None:
        atexit.register(self.close)
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        previous = self._previous.get(signum)
        self.close()
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def close(self) -> None:
        """Delete the table and the cgroups (idempotent; safe from a signal handler)."""
        with self._lock:
            if not self._open:
                return
            self._open = False
        try:
            _nft(render_delete(self.table))
        except (KernelNetError, subprocess.TimeoutExpired) as exc:
            log.warning("could not delete table %s: %s", self.table, exc)
        try:
            _remove_cgroup(self.cgroup)
        except OSError as exc:
            log.warning("could not remove cgroup %s: %s", self.cgroup, exc)
        for sig, previous in self._previous.items():
            if threading.current_thread() is threading.main_thread():
                signal.signal(sig, previous)
        self._previous.clear()

    # -- members and faults ----------------------------------------------------------------------
    def place(self, name: str, pid: int) -> bool:
        """Move process ``pid`` into member ``name``'s cgroup; False if it is gone."""
        assert name in self._ports, name
        try:
            (self.cgroup / name.replace("/", "_") / "cgroup.procs").write_text(str(pid))
        except (ProcessLookupError, OSError):
            return False
        return True

    def fault(self, fault: NetFault) -> None:
        self._dropped_before = self.dropped()
        _nft(render_fault(self.table, self.members, fault))
        self.fault_in_force = fault

    def heal(self) -> None:
        if self._open:
            self._dropped_before = self.dropped()
            _nft(render_heal(self.table))
        self.fault_in_force = None

    def dropped(self) -> int:
        """Packets the fault rules of this run dropped so far (their counters)."""
        total = self._dropped_before
        for item in _nft_json("list", "chain", "inet", self.table, "faults").get("nftables", []):
            for expr in item.get("rule", {}).get("expr", []):
                if "counter" in expr:
                    total += int(expr["counter"].get("packets", 0))
        return total
