"""The controller chaos run's kernel network and OS-level faults (``--network kernel``, ``--nemesis os``).

Theory of operation (docs/chaos.md has the design). In kernel mode the Raft nodes talk directly,
each on its own port of ``127.0.0.2`` (:func:`direct_topology`: every node's peer list is the
others' real addresses, pysyncobj's higher address dials), and :class:`KernelRaftNet` turns a grudge
of node indexes into the run's nftables rules (``chaos/nft.py``), placing each running node process
in its member cgroup first (a restarted node is a new process). Clients reach the nodes on their
client ports, which no rule names: the faults cut Raft traffic only, as the proxies did.

:class:`NodeFaults` does what the proxies cannot: ``loss`` (every Raft link of one node loses a
share of its packets), ``clock`` (one node's wall clock jumps: every node runs under libfaketime with
a timestamp file of its own, ``+0`` until a fault rewrites it; the monotonic clock is left alone:
``chaos/faketime.py``),
and the file faults (the node is SIGKILLed, its newest snapshot or its journal damaged as
``verify/filefaults.py`` plans from the step's seed, and restarted). A node that refuses to start on
what it found (``JournalDamaged``, ``RecoveryRefused``) is repaired as an operator would: its store
is wiped and it rejoins empty, catching up from the leader. Every step is bounded in time.
"""

from __future__ import annotations

import logging
import random
import shutil
from pathlib import Path
from typing import Any, Callable, Sequence

from rocketray.chaos.faketime import set_offset
from rocketray.chaos.nft import KernelNet
from rocketray.chaos.proxy import Topology
from rocketray.controller.proc import NodeProcess
from rocketray.verify.filefaults import StoredFile, apply_fault, classify, plan_file_fault
from rocketray.verify.nemesis import NODE_FILE_FAULTS
from rocketray.verify.netfaults import NetFault, name_grudge

log = logging.getLogger("rocketray.chaos.controller")

__all__ = ["KernelRaftNet", "NodeFaults", "direct_topology"]


def direct_topology(node_addresses: Sequence[str]) -> Topology:
    """Nodes that dial each other directly (no proxies)."""
    n = len(node_addresses)
    peers = tuple(tuple(a for j, a in enumerate(node_addresses) if j != i) for i in range(n))
    return Topology(tuple(node_addresses), peers, ())


def node_name(i: int) -> str:
    return f"node-{i}"


class KernelRaftNet:
    """The controller run's network in kernel mode: ``block``/``heal`` like the proxy network."""

    def __init__(self, topology: Topology, nodes: Callable[[], Sequence[NodeProcess]]) -> None:
        self.topology = topology
        self._nodes = nodes
        self.kernel = KernelNet()
        self.names = [node_name(i) for i in range(topology.size)]
        self.blocked: frozenset[tuple[int, int]] = frozenset()
        self.connections_reset = 0

    def start(self, _sockets: Any = None) -> None:
        ports = [int(a.rsplit(":", 1)[1]) for a in self.topology.self_addresses]
        self.kernel.start([(name, (port,)) for name, port in zip(self.names, ports)])

    def place_all(self) -> None:
        for node in self._nodes():
            if node.running and node.proc is not None:
                self.kernel.place(node_name(node.index), node.proc.pid)

    def block(self, pairs, loss_percent: int | None = None) -> None:
        pairs = frozenset(pairs)
        self.blocked = pairs
        if not pairs:
            self.kernel.heal()
            return
        self.place_all()
        self.kernel.fault(NetFault(name_grudge(pairs, self.names), loss_percent))

    def heal(self) -> None:
        self.block(())

    def dropped(self) -> int:
        return self.kernel.dropped()

    def close(self) -> None:
        self.kernel.close()


class NodeFaults:
    """Loss, clock and file faults on one node of the controller run (see the module docstring)."""

    def __init__(self, nodes: Sequence[NodeProcess], net: Any, clock_files: Sequence[Path] | None) -> None:
        self.nodes, self.net, self.clock_files = nodes, net, clock_files

    def start(self, kind: str, node: int, param: int) -> dict[str, Any]:
        """Apply; returns what the nemesis log records about it."""
        if kind == "loss":
            n = len(self.nodes)
            pairs = {(node, j) for j in range(n) if j != node} | {(j, node) for j in range(n) if j != node}
            if not isinstance(self.net, KernelRaftNet):
                raise RuntimeError("the loss nemesis needs --network kernel")
            self.net.block(pairs, loss_percent=param)
            return {"loss_percent": param}
        if kind == "clock":
            if self.clock_files is None:
                raise RuntimeError("the clock nemesis needs the nodes under libfaketime")
            set_offset(self.clock_files[node], param)
            return {"clock_offset_s": param}
        assert kind in NODE_FILE_FAULTS, kind
        return self._damage(kind, self.nodes[node], param)

    def end(self, kind: str, node: int) -> dict[str, Any]:
        if kind == "loss":
            dropped = self.net.dropped()
            self.net.heal()
            return {"dropped_packets": dropped}
        if kind == "clock":
            assert self.clock_files is not None
            set_offset(self.clock_files[node], 0)
            return {}
        return {}

    def _damage(self, kind: str, node: NodeProcess, seed: int) -> dict[str, Any]:
        node.kill()
        root = node.store_dir
        files = [StoredFile(p.relative_to(root).as_posix(), p.stat().st_size, p.stat().st_size)
                 for p in sorted(root.rglob("*")) if p.is_file() and classify(p.relative_to(root).as_posix())]
        file_class = "snapshot" if "snapshot" in kind else "journal"
        if file_class == "snapshot":   # the newest snapshot: the one the node would load
            snaps = sorted((f for f in files if classify(f.path) == "snapshot"), key=lambda f: f.path)
            files = snaps[-1:]
        action = "flip-bit" if kind.startswith("corrupt") else "truncate"
        fault = plan_file_fault(random.Random(seed), action, file_class, files)
        info: dict[str, Any] = {"damage": None}
        if fault is not None:
            path = root / fault.path
            before = path.read_bytes()
            after = apply_fault(fault, before)
            assert after is not None
            path.write_bytes(after)
            info["damage"] = fault.describe()
            info["on_disk"] = (f"byte {fault.offset} {before[fault.offset]:#04x} -> {path.read_bytes()[fault.offset]:#04x}"
                               if fault.action == "flip-bit" else f"{path.stat().st_size} bytes (was {len(before)})")
        try:
            node.start()
            info["restart"] = "started"
        except RuntimeError:
            refusal = _refusal(node.log_path)
            log.warning("node %d refused to start (%s); wiping its store so it rejoins empty", node.index, refusal)
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir(parents=True)
            node.start()
            info["restart"] = f"refused ({refusal}); store wiped, rejoined empty"
        return info


def _refusal(log_path: Path) -> str:
    """The reason a node gave for not starting (the last matching line of its log)."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return "unknown"
    for line in reversed(lines):
        for name in ("JournalDamaged", "RecoveryRefused", "JournalCorrupt"):
            if name in line:
                return line.strip()[:200]
    return "unknown"
