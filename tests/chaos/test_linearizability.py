"""The WGL linearizability checker: constructed histories with known answers, and a brute-force oracle."""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Hashable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rocketray.verify.linearizability import (
    ALTER_SYNC_STATE_SET_FAILED,
    ELECT_MASTER_FAILED,
    FENCED_MASTER_EPOCH,
    FENCED_SYNC_STATE_SET_EPOCH,
    INVALID_MASTER,
    MASTER_NOT_AVAILABLE,
    MASTER_STILL_EXIST,
    SUCCESS,
    UNKNOWN,
    AlterInput,
    AlterOutput,
    ControllerGroupModel,
    ElectInput,
    ElectOutput,
    GroupState,
    Operation,
    Outcome,
    ReadOutput,
    check_history,
    check_key,
    combine,
)


class RegisterModel:
    """A read/write/compare-and-set register, initially ``initial``. The checker's test model.

    ``write`` input v, output None; ``read`` output v; ``cas`` input (expected, new), output bool.
    """

    def __init__(self, initial: Hashable = None) -> None:
        self.initial = initial

    def init(self, key: str) -> Hashable:
        return self.initial

    def step(self, state: Hashable, op: Operation) -> tuple[bool, Hashable]:
        unknown = op.outcome == Outcome.UNKNOWN
        if op.f == "write":
            return True, op.input
        if op.f == "read":
            return unknown or op.output == state, state
        if op.f == "cas":
            assert isinstance(op.input, tuple)
            expected, new_value = op.input
            swapped = state == expected
            return unknown or op.output == swapped, new_value if swapped else state
        raise ValueError(f"register model has no op {op.f!r}")



OK, FAILED, UNK = Outcome.OK, Outcome.FAILED, Outcome.UNKNOWN


class H:
    """A tiny history builder: ``h.op(process, f, input, output, start, end, outcome, key)``."""

    def __init__(self) -> None:
        self.ops: list[Operation] = []

    def op(self, process, f, inp=None, out=None, start=0, end=None, outcome=OK, key="k"):
        self.ops.append(Operation(len(self.ops), process, key, f, inp, out, outcome, start,
                                  None if outcome == UNK else end))
        return self


def reg(ops, initial=0):
    return check_key(ops, RegisterModel(initial), "k").valid


# -- registers: the classic shapes ------------------------------------------------------------------

def test_empty_history_is_linearizable():
    assert reg([]) is True


def test_concurrent_write_and_read_of_new_value_is_linearizable():
    h = H().op(0, "write", 1, None, 0, 10).op(1, "read", None, 1, 5, 15)
    assert reg(h.ops) is True


def test_concurrent_write_and_read_of_old_value_is_linearizable():
    h = H().op(0, "write", 1, None, 0, 10).op(1, "read", None, 0, 5, 15)
    assert reg(h.ops) is True


def test_stale_read_after_acknowledged_write_is_not_linearizable():
    # Sequentially consistent (order the read first) but violates real time: must fail.
    h = H().op(0, "write", 1, None, 0, 10).op(1, "read", None, 0, 20, 30)
    assert reg(h.ops) is False


def test_reads_going_backwards_are_not_linearizable():
    h = (H().op(0, "write", 1, None, 0, 100)
         .op(1, "read", None, 1, 10, 20)
         .op(2, "read", None, 0, 30, 40))
    assert reg(h.ops) is False


def test_read_of_a_value_never_written_is_not_linearizable():
    assert reg(H().op(0, "read", None, 7, 0, 1).ops) is False


def test_failed_write_is_ignored_and_its_value_must_not_be_read():
    h = H().op(0, "write", 1, None, 0, 10, FAILED).op(1, "read", None, 1, 20, 30)
    assert reg(h.ops) is False
    h2 = H().op(0, "write", 1, None, 0, 10, FAILED).op(1, "read", None, 0, 20, 30)
    assert reg(h2.ops) is True


# -- unknown outcomes ------------------------------------------------------------------------------

def test_unknown_write_may_have_taken_effect():
    h = H().op(0, "write", 1, None, 0, None, UNK).op(1, "read", None, 1, 20, 30)
    assert reg(h.ops) is True


def test_unknown_write_may_not_have_taken_effect():
    h = H().op(0, "write", 1, None, 0, None, UNK).op(1, "read", None, 0, 20, 30)
    assert reg(h.ops) is True


def test_unknown_write_may_take_effect_long_after_it_was_invoked():
    # old value read at 20-30 and 40-50, new value at 1000: the write landed between 50 and 1000.
    h = (H().op(0, "write", 1, None, 0, None, UNK)
         .op(1, "read", None, 0, 20, 30).op(1, "read", None, 0, 40, 50)
         .op(1, "read", None, 1, 1000, 1010))
    assert reg(h.ops) is True


def test_unknown_write_cannot_take_effect_before_it_was_invoked():
    h = H().op(1, "read", None, 1, 0, 10).op(0, "write", 1, None, 20, None, UNK)
    assert reg(h.ops) is False


def test_unknown_write_takes_effect_at_most_once():
    # value goes 0 -> 1 -> 2 -> 1: the second 1 needs a second application of the unknown write.
    h = (H().op(0, "write", 1, None, 0, None, UNK)
         .op(1, "read", None, 1, 10, 20)
         .op(2, "write", 2, None, 30, 40)
         .op(1, "read", None, 1, 50, 60))
    assert reg(h.ops) is False


def test_unknown_reads_constrain_nothing():
    h = H().op(0, "write", 1, None, 0, 10).op(1, "read", None, 99, 20, None, UNK)
    assert reg(h.ops) is True


def test_cas_chain_with_an_unknown_cas():
    h = (H().op(0, "cas", (0, 1), None, 0, None, UNK)
         .op(1, "cas", (1, 2), True, 10, 20)
         .op(2, "read", None, 2, 30, 40))
    assert reg(h.ops) is True
    h2 = (H().op(0, "cas", (0, 1), None, 0, None, UNK)
          .op(1, "cas", (1, 2), False, 10, 20)
          .op(2, "read", None, 2, 30, 40))
    assert reg(h2.ops) is False


# -- a brute-force oracle: every order consistent with real time, every subset of unknown ops ------

def brute_force(ops, model):
    definite = [op for op in ops if op.outcome == OK]
    unknown = [op for op in ops if op.outcome == UNK and op.f != "read"]
    for k in range(len(unknown) + 1):
        for chosen in itertools.combinations(unknown, k):
            for order in itertools.permutations(definite + list(chosen)):
                if not respects_real_time(order):
                    continue
                state, ok = model.init("k"), True
                for op in order:
                    ok, state = model.step(state, op)
                    if not ok:
                        break
                if ok:
                    return True
    return False


def respects_real_time(order):
    for i, a in enumerate(order):
        for b in order[i + 1:]:
            if b.end is not None and b.end < a.start:  # b finished before a began, yet comes after
                return False
    return True


def random_register_history(rng: random.Random, n: int) -> list[Operation]:
    ops = []
    for i in range(n):
        start = rng.randrange(0, 40)
        end = start + rng.randrange(0, 20)
        f = rng.choice(["write", "read", "cas"])
        outcome = rng.choices([OK, UNK, FAILED], [6, 2, 1])[0]
        inp = rng.randrange(3) if f == "write" else (rng.randrange(3), rng.randrange(3)) if f == "cas" else None
        out = rng.randrange(3) if f == "read" else rng.choice([True, False]) if f == "cas" else None
        ops.append(Operation(i, i % 3, "k", f, inp, out, outcome, start, None if outcome == UNK else end))
    return ops


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 6))
def test_wgl_agrees_with_brute_force_on_small_register_histories(seed, n):
    ops = random_register_history(random.Random(seed), n)
    model = RegisterModel(0)
    assert check_key(ops, model, "k").valid is brute_force(ops, model)


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_histories_generated_from_a_sequential_run_are_linearizable(seed):
    # Each op's effect happens at a random instant inside its interval; outputs come from that run.
    rng = random.Random(seed)
    points = []
    for i in range(60):
        start = rng.uniform(0, 100)
        end = start + rng.uniform(0, 10)
        points.append((rng.uniform(start, end), start, end, i))
    state, ops = 0, []
    for at, start, end, i in sorted(points):
        f = rng.choice(["write", "read", "cas"])
        outcome = rng.choices([OK, UNK], [9, 1])[0]
        if f == "write":
            inp, out, state = rng.randrange(4), None, None
            state = inp
        elif f == "read":
            inp, out = None, state
        else:
            inp = (rng.randrange(4), rng.randrange(4))
            out = state == inp[0]
            state = inp[1] if out else state
        ops.append(Operation(i, i % 5, "k", f, inp, out, outcome, start, None if outcome == UNK else end))
    assert check_key(ops, RegisterModel(0), "k").valid is True


# -- budget --------------------------------------------------------------------------------------

def test_budget_exhaustion_answers_unknown_instead_of_hanging():
    # Many concurrent unknown writes and a final impossible read: an exponential search space.
    h = H()
    for i in range(40):
        h.op(i, "write", i + 1, None, 0, None, UNK)
    h.op(99, "read", None, 1000, 10, 20)
    started = time.monotonic()
    res = check_key(h.ops, RegisterModel(0), "k", max_configurations=5_000)
    assert res.valid == UNKNOWN and "state budget" in res.reason
    res = check_key(h.ops, RegisterModel(0), "k", deadline_s=time.monotonic() + 0.2)
    assert res.valid == UNKNOWN and "time budget" in res.reason
    assert time.monotonic() - started < 10


def test_combine_false_beats_unknown_beats_true():
    assert combine([True, UNKNOWN, False]) is False
    assert combine([True, UNKNOWN]) == UNKNOWN
    assert combine([True, True]) is True
    assert combine([]) is True


# -- the controller group model ------------------------------------------------------------------

INIT = GroupState(master=1, master_epoch=1, sss=frozenset({1}), sss_epoch=1)
MODEL = ControllerGroupModel(INIT, frozenset({1, 2, 3}))


def read_out(master, master_epoch, sss, sss_epoch):
    return ReadOutput(SUCCESS, master, master_epoch, tuple(sorted(sss)), sss_epoch)


@pytest.mark.parametrize("state, req, code, after", [
    # §4.4: designate the current master -> 2011, nothing changes
    (INIT, ElectInput(1, True), MASTER_STILL_EXIST, INIT),
    # designate an id outside the SSS -> 2012 (unclean election off)
    (INIT, ElectInput(2, True), ELECT_MASTER_FAILED, INIT),
    # designate an SSS member -> elected, SSS = {it}, both epochs +1
    (INIT._replace(sss=frozenset({1, 2}), sss_epoch=2), ElectInput(2, True), SUCCESS,
     GroupState(2, 2, frozenset({2}), 3)),
    # very first election takes the requester if registered and alive (Q3 fixed)
    (GroupState(None, 0, frozenset(), 0), ElectInput(3, False), SUCCESS, GroupState(3, 1, frozenset({3}), 1)),
    (GroupState(None, 0, frozenset(), 0), ElectInput(9, False), ELECT_MASTER_FAILED, GroupState(None, 0, frozenset(), 0)),
    # controller trigger with no master and nobody electable: 2004 without an epoch bump (Q2 fixed)
    (GroupState(None, 0, frozenset(), 0), ElectInput(-1, False), MASTER_NOT_AVAILABLE, GroupState(None, 0, frozenset(), 0)),
    # controller trigger with an old master in the SSS -> 2011
    (INIT, ElectInput(-1, False), MASTER_STILL_EXIST, INIT),
])
def test_group_model_elect_rules(state, req, code, after):
    out, new = MODEL.elect(state, req)
    assert out.code == code and new == after


@pytest.mark.parametrize("req, code", [
    (AlterInput(1, 1, (1,), 1), ALTER_SYNC_STATE_SET_FAILED),     # no change
    (AlterInput(1, 0, (1,), 0), FENCED_MASTER_EPOCH),             # Q6 fixed: fencing before "no change"
    (AlterInput(2, 1, (1, 2), 1), INVALID_MASTER),
    (AlterInput(1, 0, (1, 2), 1), FENCED_MASTER_EPOCH),
    (AlterInput(1, 1, (1, 2), 0), FENCED_SYNC_STATE_SET_EPOCH),
    (AlterInput(1, 1, (2, 3), 1), ALTER_SYNC_STATE_SET_FAILED),   # drops the master
    (AlterInput(1, 1, (1, 2, 3), 1), SUCCESS),
])
def test_group_model_alter_checks_in_reference_order(req, code):
    out, new = MODEL.alter(INIT, req)
    assert out.code == code
    assert (new.sss_epoch == 2 and out.new_sss_epoch == 2) if code == SUCCESS else (new == INIT)


def alter_ok(h, p, start, end, req, new_epoch, key="g"):
    return h.op(p, "alter", req, AlterOutput(SUCCESS, new_epoch), start, end, key=key)


def test_rip59_shape_linearizable_passes():
    # A widens the SSS while B reads concurrently (old) and C reads afterwards (new).
    h = H()
    alter_ok(h, 0, 0, 10, AlterInput(1, 1, (1, 2), 1), 2)
    h.op(1, "read", None, read_out(1, 1, {1}, 1), 2, 8, key="g")
    h.op(2, "read", None, read_out(1, 1, {1, 2}, 2), 12, 20, key="g")
    assert check_history(h.ops, MODEL).valid is True


def test_rip59_shape_sequentially_consistent_but_not_linearizable_fails():
    # The alter was acknowledged at 10; a read starting at 20 still sees the old SSS. Ordering
    # the read first would satisfy every process's program order, but not real time.
    h = H()
    alter_ok(h, 0, 0, 10, AlterInput(1, 1, (1, 2), 1), 2)
    h.op(1, "read", None, read_out(1, 1, {1}, 1), 20, 30, key="g")
    res = check_history(h.ops, MODEL)
    assert res.valid is False
    assert res.keys[0].failure["blocking_op"]["f"] in ("alter", "read")


def test_rip59_shape_not_sequentially_consistent_fails():
    # Process 0: alter to {1,2} then to {1,2,3}; process 1 reads {1,2,3} then {1,2}: no total order
    # explains it, whatever the timing (all four ops overlap).
    h = H()
    alter_ok(h, 0, 0, 50, AlterInput(1, 1, (1, 2), 1), 2)
    alter_ok(h, 0, 51, 100, AlterInput(1, 1, (1, 2, 3), 2), 3)
    h.op(1, "read", None, read_out(1, 1, {1, 2, 3}, 3), 0, 60, key="g")
    h.op(1, "read", None, read_out(1, 1, {1, 2}, 2), 61, 100, key="g")
    assert check_history(h.ops, MODEL).valid is False


def test_two_successful_alters_from_the_same_epoch_are_not_linearizable():
    # Epoch fencing: only one of two alters carrying sss_epoch 1 can succeed.
    h = H()
    alter_ok(h, 0, 0, 10, AlterInput(1, 1, (1, 2), 1), 2)
    alter_ok(h, 1, 0, 10, AlterInput(1, 1, (1, 3), 1), 2)
    assert check_history(h.ops, MODEL).valid is False


def test_unknown_election_explains_a_later_epoch():
    h = H()
    alter_ok(h, 0, 0, 10, AlterInput(1, 1, (1, 2), 1), 2)
    h.op(1, "elect", ElectInput(2, True), None, 20, None, UNK, key="g")
    h.op(2, "read", None, read_out(2, 2, {2}, 3), 40, 50, key="g")
    h.op(2, "alter", AlterInput(1, 1, (1, 3), 2), AlterOutput(INVALID_MASTER, None), 60, 70, key="g")
    assert check_history(h.ops, MODEL).valid is True


def test_elect_response_must_match_the_model():
    h = H()
    h.op(0, "elect", ElectInput(1, True), ElectOutput(MASTER_STILL_EXIST, 1, 2), 0, 10, key="g")
    assert check_history(h.ops, MODEL).valid is False  # the epoch was 1, not 2


def test_keys_are_checked_independently_and_combined():
    h = H()
    alter_ok(h, 0, 0, 10, AlterInput(1, 1, (1, 2), 1), 2, key="a")
    h.op(1, "read", None, read_out(1, 1, {1, 2}, 2), 20, 30, key="a")
    alter_ok(h, 0, 0, 10, AlterInput(1, 1, (1, 2), 1), 2, key="b")
    h.op(1, "read", None, read_out(1, 1, {1}, 1), 20, 30, key="b")
    res = check_history(h.ops, MODEL)
    assert res.valid is False
    assert {k.key: k.valid for k in res.keys} == {"a": True, "b": False}


def test_unknown_ops_that_change_nothing_do_not_blow_up_the_search():
    # 40 concurrent unknown writes of the value already there, then an impossible read: refuted
    # at once because an unknown no-op is never worth linearizing early (it can always go last).
    h = H()
    for i in range(40):
        h.op(i, "write", 0, None, 0, None, UNK)
    h.op(99, "read", None, 5, 10, 20)
    res = check_key(h.ops, RegisterModel(0), "k", max_configurations=5_000)
    assert res.valid is False and res.configurations < 100
