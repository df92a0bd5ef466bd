"""Controller core throughput: decide + apply of elections and SyncStateSet changes.

For each of ``--groups`` broker groups (default 10,000; 3 replicas, master 1, SSS {1,2,3}) the
timed loop runs one controller-triggered election with broker 1 dead (decide, then apply the
ElectMasterEvent) and one alterSyncStateSet from the new master (decide, then apply). The
baseline is a plain-dict loop of the same shape (pick the lowest alive SSS member, bump epochs,
check the epochs, replace the set) measured in the same run. ``ratio`` = core_time /
baseline_time: lower is better (it is the price of the checks, events and dataclasses).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from rocketray.wire.controller_api import AlterSyncStateSetRequest, ElectMasterRequest
from rocketray.controller.decide import DecideContext, decide_alter_sync_state_set, decide_elect_master
from rocketray.controller.events import ApplyBrokerIdEvent, AlterSyncStateSetEvent, ElectMasterEvent
from rocketray.controller.state import ControllerState


def _names(groups: int) -> list[str]:
    return [f"broker-{i}" for i in range(groups)]


def build_state(names: list[str]) -> ControllerState:
    state = ControllerState()
    for name in names:
        for bid in (1, 2, 3):
            addr = f"10.0.{bid}.1:10911"
            state.apply(ApplyBrokerIdEvent("bench", name, addr, f"{addr};0", bid))
        state.apply(ElectMasterEvent(True, name, 1))
        state.apply(AlterSyncStateSetEvent(name, frozenset({1, 2, 3})))
    return state


def run_core(state: ControllerState, names: list[str]) -> float:
    ctx = DecideContext(lambda name, bid: bid != 1)
    alive = ctx.alive
    start = time.perf_counter()
    for name in names:
        resp, events = decide_elect_master(state, ElectMasterRequest.of_controller_trigger(name), ctx)
        for event in events:
            state.apply(event)
        header = resp.header
        req = AlterSyncStateSetRequest(name, header.master_broker_id, header.master_epoch,
                                       frozenset({2, 3}), header.sync_state_set_epoch)
        resp, events = decide_alter_sync_state_set(state, req, alive)
        for event in events:
            state.apply(event)
    elapsed = time.perf_counter() - start
    assert all(state.sync_state[n].sync_state_set == {2, 3} for n in names)
    return elapsed


def build_dicts(names: list[str]) -> dict[str, dict[str, Any]]:
    return {n: {"master": 1, "master_epoch": 1, "sss": {1, 2, 3}, "sss_epoch": 2,
                "ids": {1: "a", 2: "b", 3: "c"}} for n in names}


def run_baseline(table: dict[str, dict[str, Any]], names: list[str]) -> float:
    def alive(name: str, bid: int) -> bool:
        return bid != 1

    start = time.perf_counter()
    for name in names:
        row = table[name]
        candidates = sorted(b for b in row["sss"] if alive(name, b))
        new = candidates[0]
        row["master"], row["master_epoch"] = new, row["master_epoch"] + 1
        row["sss"], row["sss_epoch"] = {new}, row["sss_epoch"] + 1
        master, epoch, sss_epoch = new, row["master_epoch"], row["sss_epoch"]
        new_set = {2, 3}
        if row["master"] == master and row["master_epoch"] == epoch and row["sss_epoch"] == sss_epoch \
                and all(b in row["ids"] and alive(name, b) for b in new_set):
            row["sss"], row["sss_epoch"] = new_set, row["sss_epoch"] + 1
    elapsed = time.perf_counter() - start
    assert all(table[n]["sss"] == {2, 3} for n in names)
    return elapsed


#: ``benchmarks/run.py controller-core --smoke``: a size that finishes in seconds (CI runs it).
SMOKE_ARGS = ["--groups", "200", "--repeat", "1"]


def run(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="controller-core")
    parser.add_argument("--groups", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    names = _names(args.groups)
    core_s = min(run_core(build_state(names), names) for _ in range(args.repeat))
    base_s = min(run_baseline(build_dicts(names), names) for _ in range(args.repeat))
    ops = 2 * args.groups
    return {"groups": args.groups, "ops": ops, "core_s": round(core_s, 6), "baseline_s": round(base_s, 6),
            "core_ops_per_s": round(ops / core_s), "baseline_ops_per_s": round(ops / base_s),
            "ratio": round(core_s / base_s, 3)}
