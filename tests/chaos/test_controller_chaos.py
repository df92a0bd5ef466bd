"""The controller chaos runner: its outcome rules, model, CLI, and a short real run (its wire to the
node processes: tests/security/test_runner_port.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rocketray.chaos.controller_workload import classify, load_run
from rocketray.verify.controller_model import CoreGroupModel
from rocketray.verify.linearizability import (AlterInput, ControllerGroupModel, ElectInput, GroupState, Operation,
                                          Outcome, ReadOutput, check_history)

ROOT = Path(__file__).resolve().parents[2]


# -- outcome classification -------------------------------------------------------------------------

@pytest.mark.parametrize("f, reply, outcome", [
    ("alter", {"code": 2007, "precheck": True}, Outcome.FAILED),    # refused before handle: no effect
    ("alter", {"code": 2007, "precheck": False}, Outcome.UNKNOWN),  # leadership lost mid-commit
    ("read", {"code": 2007, "precheck": False}, Outcome.FAILED),    # a read has no effect anyway
    ("elect", {"code": 1}, Outcome.UNKNOWN),                        # commit wait timed out
    ("alter", {"code": 2000}, Outcome.OK),                          # fenced: a definite answer
    ("elect", {"code": 0}, Outcome.OK),
])
def test_classify(f, reply, outcome):
    assert classify(f, reply) == outcome


# -- the core-backed model agrees with the hand-written spec ---------------------------------------

def base_snapshot(group="g"):
    from rocketray.controller.state import SNAPSHOT_VERSION

    return {"version": SNAPSHOT_VERSION,
            "replica_info": [[group, "chaos", 4, [[b, f"127.0.0.1:{30910 + b}", f"c{b}"] for b in (1, 2, 3)]]],
            "sync_state": [[group, "chaos", 1, 1, [1], 1]]}


group_states = st.builds(
    lambda master, epoch, extra, sss_epoch: GroupState(master, epoch, frozenset({master} | extra if master else extra),
                                                       sss_epoch),
    st.sampled_from([None, 1, 2, 3]), st.integers(0, 4), st.frozensets(st.sampled_from([1, 2, 3])), st.integers(0, 4))
ops = st.one_of(
    st.tuples(st.just("read"), st.none()),
    st.tuples(st.just("elect"), st.builds(ElectInput, st.sampled_from([-1, 1, 2, 3, 4]), st.booleans())),
    st.tuples(st.just("alter"), st.builds(AlterInput, st.sampled_from([1, 2, 3]), st.integers(0, 4),
                                          st.lists(st.sampled_from([1, 2, 3, 4]), min_size=1, max_size=3, unique=True)
                                          .map(lambda x: tuple(sorted(x))), st.integers(0, 4))),
)


@settings(max_examples=400, deadline=None)
@given(state=group_states, op=ops)
def test_core_model_agrees_with_the_hand_written_spec(state, op):
    # The runner checks against the real core; the spec in linearizability.py is written from the
    # reference independently. Same output and next state for every reachable-ish state and op.
    f, inp = op
    core = CoreGroupModel(base_snapshot())
    spec = ControllerGroupModel(GroupState(1, 1, frozenset({1}), 1), frozenset({1, 2, 3}))
    core_out, core_next = core.run("g", state, f, inp)
    if f == "read":
        assert core_out == ReadOutput(0, state.master, state.master_epoch, tuple(sorted(state.sss)), state.sss_epoch)
        assert core_next == state
        return
    try:
        spec_out, spec_next = (spec.elect if f == "elect" else spec.alter)(state, inp)
    except ValueError:
        assume(False)  # live-info tie-breaks: not modelled by the spec (the workload never asks)
    assert (core_out, core_next) == (spec_out, spec_next)


# -- CLI -------------------------------------------------------------------------------------------

def test_cli_rejects_unknown_nemesis(capsys):
    from rocketray.cli import main as cli

    assert cli.main(["chaos", "--target", "controller", "--nemesis", "meteor"]) == 2
    assert "unknown nemesis 'meteor'" in capsys.readouterr().err


# -- a short real run ------------------------------------------------------------------------------

def stale_read_mutation(ops: list[Operation]) -> list[Operation] | None:
    """Make one late read return the initial state of its group: a lost-write anomaly."""
    for i in range(len(ops) - 1, -1, -1):
        op = ops[i]
        if op.f == "read" and op.outcome == Outcome.OK and op.output.sss_epoch and op.output.sss_epoch > 1:
            stale = op.output._replace(master=1, master_epoch=1, sss=(1,), sss_epoch=1)
            return ops[:i] + [Operation(op.op_id, op.process, op.key, op.f, op.input, stale, op.outcome,
                                        op.start, op.end)] + ops[i + 1:]
    return None


def run_controller_cli(out: Path, *args: str) -> tuple[dict, subprocess.CompletedProcess]:
    """``rocketray chaos --target controller ... --json --out OUT`` in a subprocess; (the last
    stdout line, the process)."""
    cmd = [sys.executable, "-m", "rocketray.cli", "chaos", "--target", "controller", *args, "--json", "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=str(ROOT), env=env)
    lines = done.stdout.strip().splitlines()
    assert lines, f"no stdout; stderr tail:\n{done.stderr[-3000:]}"
    return json.loads(lines[-1]), done


@pytest.mark.slow
def test_short_controller_chaos_run_is_linearizable_and_converges(tmp_path):
    # 40 s of every nemesis against 5 real controller processes with snapshots every 10 entries:
    # the history is linearizable, one leader per term, everything converges and survives a restart.
    out = tmp_path / "run"
    summary, done = run_controller_cli(out, "--duration", "40", "--seed", "7", "--nemesis", "all")
    print(json.dumps(summary, indent=1))
    assert summary["linearizable"] is True, summary.get("groups")
    assert summary["converged"] is True, summary.get("convergence")
    assert summary["leaders_per_term_max"] == 1
    assert summary["restart_ok"] is True
    assert summary["nemesis_events"] >= 6
    assert summary["ops"] > 200 and summary["ok"] > 100
    assert summary["snapshots_saved"] > 0 and summary["snapshots_loaded"] > 0
    assert done.returncode == 0
    nemesis = [json.loads(line) for line in (out / "controller_nemesis.jsonl").read_text().splitlines()]
    assert {e["phase"] for e in nemesis} == {"start", "end"}
    # the partitions were the kernel's (--network kernel, the default): its rules dropped packets
    assert max(e.get("dropped_packets_so_far", 0) for e in nemesis) > 0

    # The saved run re-checks the same, and the checker is not blind on it: one stale read fails it.
    ops, base = load_run(out)
    assert check_history(ops, CoreGroupModel(base), budget_s=60.0).valid is True
    mutated = stale_read_mutation(ops)
    assert mutated is not None
    assert check_history(mutated, CoreGroupModel(base)).valid is False
