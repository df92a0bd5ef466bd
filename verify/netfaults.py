"""Kernel network faults as data: which member stops hearing which, and the nftables rules that do it.

Pure: no IO, no clock; ``chaos/nft.py`` loads what this module renders and places the processes.

Theory of operation. A run's *members* are its processes (broker and controller actors, controller
node processes, the runner as the clients' process). Each gets a ``net_cls`` classid unique to the
run (``classid(major, minor)``) and owns the listening ports the spec gives it. A *fault* is a set of
blocked directed pairs ``(src, dst)`` of member names, meaning ``dst`` does not hear ``src``, and an
optional loss percentage (``None``: every packet dropped). ``render_fault`` turns each pair into two
rules of the run's ``faults`` chain: the connection's original direction (``src`` dialed ``dst``:
the sender's classid and a destination port of ``dst``) and its reply direction (``dst`` dialed
``src``: the dialer's classid, remembered as the connection's conntrack mark by ``render_base``,
and a source port of ``src``). Nothing else is matched: no rule names loopback traffic as a whole.

The broker run draws *shapes* (``BROKER_SHAPES``) whose actors only exist at run time (the current
master of a group, the controller leader); ``broker_grudge`` resolves a shape against the roles the
runner found. The controller run reuses the Jepsen grudges of ``verify/nemesis.py`` over node indexes.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["BROKER_SHAPES", "Member", "NET_KINDS", "NetFault", "NetShape", "broker_grudge", "classid",
           "draw_shape", "name_grudge", "parse_table_name", "render_base", "render_delete", "render_fault",
           "render_heal", "stale_tables", "table_name", "TABLE_PREFIX"]

#: The broker run's kernel network nemeses: full partitions (both directions), one-way partitions,
#: and random loss on every link of the chosen members.
NET_KINDS = ("net-partition", "net-oneway", "net-loss")
#: Loss percentages drawn for ``net-loss`` (inclusive).
LOSS_PERCENT = (1, 30)
TABLE_PREFIX = "rocketray_chaos_"
_TABLE = re.compile(r"^rocketray_chaos_(\d+)_([0-9a-f]{1,16})$")
#: Members per run: minor numbers 1..MAX_MEMBERS of the run's classid major.
MAX_MEMBERS = 4096

Pair = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Member:
    """One process of the run: its name, the classid its cgroup stamps on its sockets, the TCP ports
    it listens on (what the other members dial)."""

    name: str
    classid: int
    ports: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class NetFault:
    """``blocked``: directed pairs ``(src, dst)``, dst does not hear src. ``loss_percent``: drop that
    share of the pairs' packets at random instead of all of them."""

    blocked: frozenset[Pair]
    loss_percent: int | None = None

    def __post_init__(self) -> None:
        assert all(s != d for s, d in self.blocked), self.blocked
        assert self.loss_percent is None or 1 <= self.loss_percent <= 100, self.loss_percent


def classid(major: int, minor: int) -> int:
    """The ``net_cls.classid`` ``major:minor`` (both 16-bit, neither 0)."""
    assert 0 < major < 0xFFFF and 0 < minor <= 0xFFFF, (major, minor)
    return (major << 16) | minor


def table_name(pid: int, nonce: str) -> str:
    """The nftables table (and cgroup directory) of one run: the runner's pid and a random nonce."""
    name = f"{TABLE_PREFIX}{pid}_{nonce}"
    assert _TABLE.match(name), name
    return name


def parse_table_name(name: str) -> int | None:
    """The runner pid a run's table name carries; None for any other name."""
    match = _TABLE.match(name)
    return int(match.group(1)) if match else None


def stale_tables(names: Iterable[str], alive: Callable[[int], bool]) -> list[str]:
    """Run tables (or cgroups) left by runners that are no longer alive: the start-up sweep's victims.
    Names of other owners never match."""
    return sorted(n for n in names if (pid := parse_table_name(n)) is not None and not alive(pid))


def _ports(ports: Iterable[int]) -> str:
    ordered = sorted(set(ports))
    assert ordered and all(0 < p < 65536 for p in ordered), ordered
    return "{ " + ", ".join(str(p) for p in ordered) + " }"


def render_base(table: str, members: Sequence[Member]) -> str:
    """The run's table: an output chain on loopback that marks each connection with its dialer's
    classid and jumps to the (empty) ``faults`` chain. Loading it again replaces it whole."""
    assert members and len({m.classid for m in members}) == len(members), "classids must be distinct"
    lines = [f"table inet {table}", f"delete table inet {table}", f"table inet {table} {{",
             "  chain out {", "    type filter hook output priority 0; policy accept;"]
    for m in members:
        lines.append(f'    oifname "lo" ct direction original meta cgroup {m.classid:#010x} ct mark set meta cgroup')
    lines += ['    oifname "lo" jump faults', "  }", "  chain faults {", "  }", "}"]
    return "\n".join(lines) + "\n"


def render_fault(table: str, members: Sequence[Member], fault: NetFault) -> str:
    """Replace the ``faults`` chain with the rules of ``fault`` (one ``nft -f``: atomic)."""
    by_name = {m.name: m for m in members}
    unknown = sorted({n for pair in fault.blocked for n in pair} - set(by_name))
    if unknown:
        raise KeyError(f"unknown members {unknown}")
    verdict = "drop" if fault.loss_percent is None else f"numgen random mod 100 < {fault.loss_percent} drop"
    lines = [f"flush chain inet {table} faults"]
    for src, dst in sorted(fault.blocked):
        s, d = by_name[src], by_name[dst]
        if d.ports:   # src dialed dst
            lines.append(f"add rule inet {table} faults ct direction original meta cgroup {s.classid:#010x} "
                         f"tcp dport {_ports(d.ports)} counter {verdict}")
        if s.ports:   # dst dialed src; src answers from its port
            lines.append(f"add rule inet {table} faults ct direction reply ct mark {d.classid:#010x} "
                         f"tcp sport {_ports(s.ports)} counter {verdict}")
    return "\n".join(lines) + "\n"


def render_heal(table: str) -> str:
    return f"flush chain inet {table} faults\n"


def render_delete(table: str) -> str:
    return f"delete table inet {table}\n"


# -- the broker run: shapes resolved against run-time roles ------------------------------------------

#: ``isolate-master``: the master of a group hears no one and no one hears it; ``master-slave``: one
#: slave and its master; ``broker-controllers``: one replica and every controller;
#: ``isolate-controller-leader``: the Raft leader and everyone; ``client-master``: the clients and a
#: master; ``halves``: every member split in two random halves.
BROKER_SHAPES = ("isolate-master", "master-slave", "broker-controllers", "isolate-controller-leader",
                 "client-master", "halves")


@dataclass(frozen=True, slots=True)
class NetShape:
    """A planned network fault of the broker run; ``pick`` chooses among run-time candidates (a
    slave, a replica) and ``inbound`` says which way a one-way fault blocks (True: the shape's first
    side stops hearing the rest)."""

    kind: str
    shape: str
    pick: int
    inbound: bool
    loss_percent: int | None = None

    def to_json(self) -> dict:
        return {"kind": self.kind, "shape": self.shape, "pick": self.pick, "inbound": self.inbound,
                "loss_percent": self.loss_percent}


def draw_shape(rng: random.Random, kind: str) -> NetShape:
    """One planned network fault of ``kind`` (one of ``NET_KINDS``)."""
    assert kind in NET_KINDS, kind
    shape = rng.choice(BROKER_SHAPES)
    pick = rng.randrange(1 << 16)
    inbound = rng.random() < 0.5
    loss = rng.randint(*LOSS_PERCENT) if kind == "net-loss" else None
    return NetShape(kind, shape, pick, inbound, loss)


def _between(a: Iterable[str], b: Iterable[str], *, both: bool, a_hears_b: bool) -> frozenset[Pair]:
    """Blocked pairs between sides ``a`` and ``b``: both ways, or only so that one side stops hearing
    the other (``a_hears_b`` False: a does not hear b)."""
    a, b = sorted(set(a)), sorted(set(b))
    to_a = {(y, x) for x in a for y in b if x != y}
    to_b = {(x, y) for x in a for y in b if x != y}
    if both:
        return frozenset(to_a | to_b)
    return frozenset(to_b if a_hears_b else to_a)


def broker_grudge(shape: NetShape, *, group: str, master: str | None, replicas: Mapping[str, Sequence[str]],
                  controllers: Sequence[str], leader: str | None, client: str) -> frozenset[Pair]:
    """The blocked pairs of ``shape`` given the run-time roles: ``replicas`` maps each group to its
    members, ``master`` names the group's current master (None: no master right now), ``leader`` the
    controller leader. Empty when the shape cannot be formed now (the runner skips the step)."""
    everyone = sorted({client, *controllers, *(r for rs in replicas.values() for r in rs)})
    both = shape.kind != "net-oneway"
    first_deaf = shape.inbound  # one-way: the shape's first side stops hearing the rest

    def cut(side: Sequence[str], rest: Sequence[str]) -> frozenset[Pair]:
        return _between(side, rest, both=both, a_hears_b=not first_deaf)

    members = list(replicas.get(group, ()))
    if shape.shape == "isolate-master":
        return cut([master], [m for m in everyone if m != master]) if master else frozenset()
    if shape.shape == "master-slave":
        slaves = [m for m in members if m != master]
        return cut([slaves[shape.pick % len(slaves)]], [master]) if master and slaves else frozenset()
    if shape.shape == "broker-controllers":
        return cut([members[shape.pick % len(members)]], controllers) if members and controllers else frozenset()
    if shape.shape == "isolate-controller-leader":
        return cut([leader], [m for m in everyone if m != leader]) if leader else frozenset()
    if shape.shape == "client-master":
        return cut([client], [master]) if master else frozenset()
    assert shape.shape == "halves", shape
    order = list(everyone)
    random.Random(shape.pick).shuffle(order)
    half = len(order) // 2
    return cut(order[:half], order[half:]) if half else frozenset()


def name_grudge(grudge: Iterable[tuple[int, int]], names: Sequence[str]) -> frozenset[Pair]:
    """A grudge over node indexes (``verify/nemesis.py``'s topologies) as member-name pairs."""
    return frozenset((names[s], names[d]) for s, d in grudge)
