"""The kernel network faults' pure rules: classids, table names and the sweep, the rendered nftables
rules, and the broker run's shapes resolved against run-time roles (table tests)."""

from __future__ import annotations

import random

import pytest

from rocketray.verify import nemesis as sched
from rocketray.verify.netfaults import (BROKER_SHAPES, NET_KINDS, Member, NetFault, NetShape, broker_grudge, classid,
                                        draw_shape, name_grudge, parse_table_name, render_base, render_fault,
                                        render_heal, stale_tables, table_name)

A = Member("a", classid(0x1234, 1), (7001,))
B = Member("b", classid(0x1234, 2), (7002, 7012))
C = Member("client", classid(0x1234, 3), ())


def test_classid_packs_major_and_minor():
    assert classid(0x1234, 1) == 0x12340001
    with pytest.raises(AssertionError):
        classid(0, 1)
    with pytest.raises(AssertionError):
        classid(1, 0)


@pytest.mark.parametrize("name, pid", [
    ("rocketray_chaos_4242_abc123", 4242),
    ("rocketray_chaos_1_0", 1),
    ("rocketray_chaos_4242", None),            # no nonce
    ("rocketray_chaos_x_ab", None),            # not a pid
    ("filter", None),                          # another owner's table
    ("rocketray_chaos_12_ab; drop", None),     # never parsed out of something longer
])
def test_parse_table_name(name, pid):
    assert parse_table_name(name) == pid


def test_sweep_takes_only_dead_runners_tables():
    names = [table_name(10, "aa"), table_name(11, "bb"), "filter", "nat", table_name(12, "cc")]
    assert stale_tables(names, alive=lambda pid: pid == 11) == [table_name(10, "aa"), table_name(12, "cc")]
    assert stale_tables(names, alive=lambda pid: True) == []


def test_base_marks_each_dialer_and_matches_only_loopback_and_the_runs_classids():
    text = render_base("rocketray_chaos_1_ab", [A, B, C])
    assert text.startswith("table inet rocketray_chaos_1_ab\ndelete table inet rocketray_chaos_1_ab\n")
    marks = [line for line in text.splitlines() if "ct mark set" in line]
    assert len(marks) == 3
    assert all('oifname "lo"' in line and "ct direction original" in line for line in marks)
    assert "meta cgroup 0x12340002 ct mark set meta cgroup" in text
    with pytest.raises(AssertionError):
        render_base("t", [A, Member("dup", A.classid, ())])


@pytest.mark.parametrize("blocked, loss, expected", [
    # b stops hearing a: a's packets to b's ports, and a's answers to connections b dialed
    ({("a", "b")}, None, [
        "ct direction original meta cgroup 0x12340001 tcp dport { 7002, 7012 } counter drop",
        "ct direction reply ct mark 0x12340002 tcp sport { 7001 } counter drop"]),
    # the client listens on nothing: only its dialed connections' answers to it can be blocked
    ({("b", "client")}, None, [
        "ct direction reply ct mark 0x12340003 tcp sport { 7002, 7012 } counter drop"]),
    ({("client", "a")}, 7, [
        "ct direction original meta cgroup 0x12340003 tcp dport { 7001 } counter numgen random mod 100 < 7 drop"]),
])
def test_fault_rules(blocked, loss, expected):
    text = render_fault("t", [A, B, C], NetFault(frozenset(blocked), loss))
    rules = [line.split(" faults ", 1)[1] for line in text.splitlines() if line.startswith("add rule")]
    assert text.splitlines()[0] == "flush chain inet t faults"
    assert rules == expected


def test_fault_naming_an_unknown_member_is_refused():
    with pytest.raises(KeyError):
        render_fault("t", [A, B], NetFault(frozenset({("a", "zz")})))


def test_heal_flushes_only_the_fault_chain():
    assert render_heal("t") == "flush chain inet t faults\n"


ROLES = dict(group="g", replicas={"g": ["g/r0", "g/r1", "g/r2"], "h": ["h/r0"]},
             controllers=["controller-0", "controller-1"], leader="controller-1", client="client")


@pytest.mark.parametrize("shape, kind, inbound, master, expected", [
    # pick 1 of the slaves [g/r1, g/r2]: g/r2
    ("master-slave", "net-partition", True, "g/r0", {("g/r0", "g/r2"), ("g/r2", "g/r0")}),
    ("master-slave", "net-oneway", True, "g/r0", {("g/r0", "g/r2")}),          # the slave stops hearing the master
    ("master-slave", "net-oneway", False, "g/r0", {("g/r2", "g/r0")}),         # the master stops hearing the slave
    ("client-master", "net-oneway", True, "g/r2", {("g/r2", "client")}),
    ("broker-controllers", "net-partition", False, "g/r0",
     {("g/r1", "controller-0"), ("controller-0", "g/r1"), ("g/r1", "controller-1"), ("controller-1", "g/r1")}),
    ("master-slave", "net-partition", True, None, set()),                       # no master now: skipped
])
def test_broker_shapes(shape, kind, inbound, master, expected):
    got = broker_grudge(NetShape(kind, shape, pick=1, inbound=inbound), master=master, **ROLES)
    assert got == frozenset(expected)


def test_isolate_master_cuts_it_from_every_member_and_nothing_else():
    got = broker_grudge(NetShape("net-partition", "isolate-master", 0, True), master="g/r1", **ROLES)
    others = {"g/r0", "g/r2", "h/r0", "controller-0", "controller-1", "client"}
    assert got == frozenset({("g/r1", o) for o in others} | {(o, "g/r1") for o in others})


def test_halves_split_everyone_in_two():
    got = broker_grudge(NetShape("net-partition", "halves", 5, True), master="g/r0", **ROLES)
    dsts = {d for _s, d in got}
    assert len(dsts) == 7 and all((d, s) in got for s, d in got)


def test_draw_shape_is_seeded_and_loss_in_range():
    rng1, rng2 = random.Random(3), random.Random(3)
    draws = [draw_shape(rng1, k) for k in NET_KINDS * 50]
    assert draws == [draw_shape(rng2, k) for k in NET_KINDS * 50]
    assert {d.shape for d in draws} == set(BROKER_SHAPES)
    assert all(1 <= d.loss_percent <= 30 for d in draws if d.kind == "net-loss")
    assert all(d.loss_percent is None for d in draws if d.kind != "net-loss")


def test_controller_topologies_become_member_pairs():
    grudge, _ = sched.majorities_ring(3, random.Random(1))
    names = ["node-0", "node-1", "node-2"]
    pairs = name_grudge(grudge, names)
    assert len(pairs) == len(grudge) and all(s in names and d in names for s, d in pairs)
