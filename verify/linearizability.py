"""A pure linearizability checker (Wing & Gong, with Lowe's memoization) and the models it checks.

Theory of operation. A history is a list of ``Operation`` records, each with an invoke time, a
completion time and an outcome. ``ok`` operations took effect exactly once, somewhere between their
invoke and their completion, and their recorded output must be what the sequential model gives at
that point. ``failed`` operations definitely took no effect and are dropped. ``unknown`` operations
(a timeout, a lost connection) may or may not have taken effect; if they did, it was at some point
after their invoke, so they are given an infinitely late completion and an unconstrained output
(linearizing one "at the very end" is the same as it never having happened). Unknown reads constrain
nothing and are dropped.

The search is WGL as refined by Lowe ("Testing for linearizability", 2017) and used by Knossos and
Porcupine: the call and return entries sit in one time-ordered doubly linked list; the checker walks
it, and at a call entry tries to linearize that operation now (the model accepts its output from the
current state), lifting its call and return out of the list and pushing a backtrack point; reaching a
return entry means the operation it closes can no longer be linearized later, so the search pops the
last choice and tries the next candidate. Lowe's cache of ``(set of linearized operations, model
state)`` pairs already explored prunes the search: a configuration seen once is never re-explored.

One pruning beyond Lowe: an unknown operation whose step from the current state would leave the
state unchanged is not linearized there (keeping it pending is never worse, since it can always go
last), so fenced or redundant unknown writes do not multiply the configurations.

Histories are checked per key (P-compositionality: linearizability is local, Herlihy & Wing §3.3),
one broker group at a time. The search is exponential in the worst case, so it runs under a budget
(a deadline and a cap on cached configurations); when the budget runs out the answer is
``"unknown"``, never a hang and never a guess.

Time is whatever integer or float the caller recorded (the runner uses ``time.monotonic_ns``). An
operation ``a`` precedes ``b`` only if ``a`` completed strictly before ``b`` was invoked; equal
timestamps count as concurrent, which errs towards "linearizable" when clocks are coarse.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable, NamedTuple, Protocol, Sequence

from rocketray.verify.outcome import Outcome


@dataclass(frozen=True, slots=True)
class Operation:
    """One client operation: ``f`` applied to ``key`` with ``input``, observed ``output``.

    ``end`` is None (and ``output`` ignored) when the outcome is unknown.
    """

    op_id: int
    process: int
    key: str
    f: str
    input: Hashable
    output: Hashable
    outcome: Outcome
    start: float
    end: float | None

    def __post_init__(self) -> None:
        assert self.outcome in Outcome, self.outcome
        assert self.outcome == Outcome.UNKNOWN or self.end is not None, "a completed op needs an end"
        assert self.end is None or self.end >= self.start, "an op ends after it starts"


class Model(Protocol):
    """A sequential specification. ``step`` returns ``(legal, next_state)``.

    ``legal`` is False when the op's recorded output is not what the spec produces from ``state``.
    For an unknown op (``op.outcome == UNKNOWN``) the output is unconstrained: ``legal`` is True
    and ``next_state`` is the state had it taken effect. States must be hashable.
    """

    def init(self, key: str) -> Hashable: ...

    def step(self, state: Hashable, op: Operation) -> tuple[bool, Hashable]: ...


UNKNOWN = "unknown"  # the third answer, next to True and False
Verdict = bool | str


@dataclass(slots=True)
class KeyResult:
    key: str
    valid: Verdict
    ops: int
    configurations: int
    elapsed_s: float
    #: on False: the deepest partial linearization reached and what it could not place next
    failure: dict[str, Any] | None = None
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "key": self.key, "valid": self.valid, "ops": self.ops,
            "configurations": self.configurations, "elapsed_s": round(self.elapsed_s, 3),
        }
        if self.failure is not None:
            out["failure"] = self.failure
        if self.reason:
            out["reason"] = self.reason
        return out


@dataclass(slots=True)
class HistoryResult:
    valid: Verdict
    keys: list[KeyResult] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"valid": self.valid, "keys": [k.to_json() for k in self.keys]}


def combine(verdicts: Iterable[Verdict]) -> Verdict:
    """False if any is False, else "unknown" if any is unknown, else True."""
    vs = list(verdicts)
    if any(v is False for v in vs):
        return False
    if any(v == UNKNOWN for v in vs):
        return UNKNOWN
    return True


class _Entry:
    """A call or return entry in the doubly linked list the search walks."""

    __slots__ = ("index", "is_call", "prev", "next", "match")

    def __init__(self, index: int, is_call: bool) -> None:
        self.index = index
        self.is_call = is_call
        self.prev: _Entry | None = None
        self.next: _Entry | None = None
        self.match: _Entry | None = None


def _build_list(ops: Sequence[Operation]) -> _Entry:
    """Time-ordered list of call/return entries behind a sentinel head; calls first at equal times."""
    events: list[tuple[float, int, int, _Entry]] = []
    for i, op in enumerate(ops):
        call, ret = _Entry(i, True), _Entry(i, False)
        call.match = ret
        end = math.inf if op.outcome == Outcome.UNKNOWN else op.end
        events.append((op.start, 0, i, call))
        events.append((end, 1, i, ret))  # type: ignore[arg-type]
    events.sort(key=lambda e: (e[0], e[1], e[2]))
    head = _Entry(-1, False)
    prev = head
    for _, _, _, entry in events:
        prev.next = entry
        entry.prev = prev
        prev = entry
    return head


def _lift(entry: _Entry) -> None:
    """Unlink a call entry and its return (dancing links: both keep their own pointers)."""
    ret = entry.match
    assert entry.prev is not None and entry.next is not None and ret is not None and ret.prev is not None
    entry.prev.next = entry.next
    entry.next.prev = entry.prev
    ret.prev.next = ret.next
    if ret.next is not None:
        ret.next.prev = ret.prev


def _unlift(entry: _Entry) -> None:
    """Relink what ``_lift`` unlinked, in reverse order."""
    ret = entry.match
    assert entry.prev is not None and entry.next is not None and ret is not None and ret.prev is not None
    ret.prev.next = ret
    if ret.next is not None:
        ret.next.prev = ret
    entry.prev.next = entry
    entry.next.prev = entry


def prepare(ops: Iterable[Operation]) -> list[Operation]:
    """Drop what constrains nothing: failed ops, and unknown ops that do not change state (reads)."""
    return [op for op in ops
            if op.outcome == Outcome.OK or (op.outcome == Outcome.UNKNOWN and op.f != "read")]


def check_key(ops: Sequence[Operation], model: Model, key: str, deadline_s: float | None = None,
              max_configurations: int = 2_000_000) -> KeyResult:
    """Is this one key's history linearizable with respect to ``model``?

    ``deadline_s`` is a ``time.monotonic()`` value; past it (or past ``max_configurations`` cached
    configurations) the answer is ``"unknown"``.
    """
    t0 = time.monotonic()
    ops = prepare(ops)
    n = len(ops)
    definite_left = sum(1 for op in ops if op.outcome == Outcome.OK)
    head = _build_list(ops)
    state = model.init(key)
    linearized = 0
    stack: list[tuple[_Entry, Hashable]] = []
    cache: set[tuple[int, Hashable]] = set()
    # Backtracking re-tries the same op from the same state often; models may be slow (the core
    # model rebuilds a ControllerState per step), so remember each (op, state) step.
    steps_memo: dict[tuple[int, Hashable], tuple[bool, Hashable]] = {}
    deepest: tuple[int, _Entry | None, Hashable] = (-1, None, state)  # depth, blocking return, state
    entry = head.next
    steps = 0

    def result(valid: Verdict, reason: str = "", failure: dict[str, Any] | None = None) -> KeyResult:
        return KeyResult(key, valid, n, len(cache), time.monotonic() - t0, failure, reason)

    while head.next is not None:
        if definite_left == 0:
            return result(True)  # only unknown ops remain: each may simply never have happened
        steps += 1
        if steps & 0x3FF == 0 and deadline_s is not None and time.monotonic() > deadline_s:
            return result(UNKNOWN, f"time budget exhausted after {steps} steps")
        if len(cache) > max_configurations:
            return result(UNKNOWN, f"state budget exhausted ({max_configurations} configurations)")
        assert entry is not None, "a call entry is always followed by its return"
        if entry.is_call:
            op = ops[entry.index]
            memo_key = (entry.index, state)
            stepped = steps_memo.get(memo_key)
            if stepped is None:
                stepped = steps_memo[memo_key] = model.step(state, op)
            legal, new_state = stepped
            # An unknown op that would not change the state here is better left pending: anything
            # that works after linearizing it now also works with it placed at the very end.
            if legal and not (op.outcome == Outcome.UNKNOWN and new_state == state):
                new_lin = linearized | (1 << entry.index)
                config = (new_lin, new_state)
                if config not in cache:
                    cache.add(config)
                    stack.append((entry, state))
                    state, linearized = new_state, new_lin
                    if op.outcome == Outcome.OK:
                        definite_left -= 1
                    _lift(entry)
                    entry = head.next
                    continue
            entry = entry.next
        else:
            if len(stack) > deepest[0]:
                deepest = (len(stack), entry, state)
            if not stack:
                return result(False, failure=_describe_failure(ops, head, deepest))
            entry, state = stack.pop()
            linearized &= ~(1 << entry.index)
            if ops[entry.index].outcome == Outcome.OK:
                definite_left += 1
            _unlift(entry)
            entry = entry.next
    return result(True)


def _describe_failure(ops: Sequence[Operation], head: _Entry,
                      deepest: tuple[int, _Entry | None, Hashable]) -> dict[str, Any]:
    """What the deepest partial linearization could not get past: the op whose completion blocked
    it, the ops that were candidates there, and the model state."""
    depth, blocking, state = deepest
    blocking_op = ops[blocking.index] if blocking is not None else None
    candidates = []
    if blocking_op is not None:
        for op in ops:
            overlaps = op.start <= blocking_op.end and (op.end is None or op.end >= blocking_op.start)  # type: ignore[operator]
            if overlaps and op is not blocking_op:
                candidates.append(op.op_id)
                if len(candidates) >= 20:
                    break
    return {
        "linearized_ops": depth,
        "blocking_op": _op_json(blocking_op) if blocking_op is not None else None,
        "concurrent_op_ids": candidates,
        "model_state": repr(state),
    }


def _op_json(op: Operation) -> dict[str, Any]:
    return {"op_id": op.op_id, "process": op.process, "f": op.f, "input": repr(op.input),
            "output": repr(op.output), "outcome": op.outcome.value, "start": op.start, "end": op.end}


def check_history(ops: Iterable[Operation], model: Model, budget_s: float = 60.0,
                  max_configurations: int = 2_000_000, clock: Callable[[], float] = time.monotonic
                  ) -> HistoryResult:
    """Check every key's sub-history; the time budget is shared, each key gets its fair remainder."""
    by_key: dict[str, list[Operation]] = defaultdict(list)
    for op in ops:
        by_key[op.key].append(op)
    start = clock()
    results: list[KeyResult] = []
    keys = sorted(by_key)
    for i, key in enumerate(keys):
        remaining = max(0.0, budget_s - (clock() - start))
        share = remaining / (len(keys) - i)
        results.append(check_key(by_key[key], model, key, deadline_s=time.monotonic() + share,
                                 max_configurations=max_configurations))
    return HistoryResult(combine(r.valid for r in results), results)


# --------------------------------------------------------------------------------------------------
# Models


# Response codes of reference §6.2 that the group model produces.
SUCCESS = 0
FENCED_MASTER_EPOCH = 2000
FENCED_SYNC_STATE_SET_EPOCH = 2001
INVALID_MASTER = 2002
INVALID_REPLICAS = 2003
MASTER_NOT_AVAILABLE = 2004
MASTER_STILL_EXIST = 2011
ELECT_MASTER_FAILED = 2012
ALTER_SYNC_STATE_SET_FAILED = 2013


class GroupState(NamedTuple):
    """One broker group's SyncStateInfo (reference §3.1); registration is fixed during a run."""

    master: int | None
    master_epoch: int
    sss: frozenset[int]
    sss_epoch: int


class ReadOutput(NamedTuple):
    code: int
    master: int | None
    master_epoch: int | None
    sss: tuple[int, ...]
    sss_epoch: int | None


class ElectInput(NamedTuple):
    broker_id: int
    designate: bool


class ElectOutput(NamedTuple):
    code: int
    master: int | None  # only for SUCCESS and MASTER_STILL_EXIST
    master_epoch: int | None


class AlterInput(NamedTuple):
    master_id: int
    master_epoch: int
    new_sss: tuple[int, ...]
    sss_epoch: int


class AlterOutput(NamedTuple):
    code: int
    new_sss_epoch: int | None  # only for SUCCESS


class ControllerGroupModel:
    """The sequential spec of one group's metadata under the controller API (reference §3.5, §4,
    with the project's deliberate fixes of §18 documented in ``controller/decide.py``: Q2, Q3, Q6).

    Ops: ``read`` (getReplicaInfo), ``elect`` (electMaster, ``ElectInput``), ``alter``
    (alterSyncStateSet with epoch fencing, ``AlterInput``). Every registered broker is alive (the
    runner's controller nodes hold a never-expiring heartbeat for each), unclean election is off.
    An election whose result would depend on heartbeat live-info tie-breaks (a broker-triggered
    election with several candidates and no old master among them) is not modelled: the runner only
    issues designated (admin) elections, whose outcome the rules fix.
    """

    def __init__(self, initial: GroupState, registered: frozenset[int]) -> None:
        self.initial = initial
        self.registered = registered

    def init(self, key: str) -> Hashable:
        return self.initial

    def step(self, state: Hashable, op: Operation) -> tuple[bool, Hashable]:
        assert isinstance(state, GroupState)
        if op.f == "read":
            return self._read(state, op)
        expected: Hashable
        if op.f == "elect":
            assert isinstance(op.input, ElectInput)
            expected, new = self.elect(state, op.input)
        elif op.f == "alter":
            assert isinstance(op.input, AlterInput)
            expected, new = self.alter(state, op.input)
        else:
            raise ValueError(f"group model has no op {op.f!r}")
        return op.outcome == Outcome.UNKNOWN or op.output == expected, new

    @staticmethod
    def _read(state: GroupState, op: Operation) -> tuple[bool, Hashable]:
        out = ReadOutput(SUCCESS, state.master, state.master_epoch, tuple(sorted(state.sss)), state.sss_epoch)
        return op.outcome == Outcome.UNKNOWN or op.output == out, state

    def elect(self, s: GroupState, req: ElectInput) -> tuple[ElectOutput, GroupState]:
        """electMaster (§4.2) with DefaultElectPolicy (§4.3); alive = registered, unclean off."""
        new: int | None = None
        if s.master_epoch == 0 and req.broker_id in self.registered:
            new = req.broker_id  # Q3: the first election takes a registered, alive requester
        if new is None:
            prefer = req.broker_id if req.designate and req.broker_id >= 0 else None  # -1: controller trigger
            new = self._try_elect(s.sss & self.registered, s.master, prefer)
        if new is not None and new == s.master:
            return ElectOutput(MASTER_STILL_EXIST, s.master, s.master_epoch), s
        if new is not None:
            return (ElectOutput(SUCCESS, new, s.master_epoch + 1),
                    GroupState(new, s.master_epoch + 1, frozenset((new,)), s.sss_epoch + 1))
        if req.broker_id == -1:
            if s.master is None:  # Q2: nothing to demote, no event
                return ElectOutput(MASTER_NOT_AVAILABLE, None, None), s
            return ElectOutput(MASTER_NOT_AVAILABLE, None, None), s._replace(master=None, master_epoch=s.master_epoch + 1)
        return ElectOutput(ELECT_MASTER_FAILED, None, None), s

    @staticmethod
    def _try_elect(candidates: frozenset[int], old: int | None, prefer: int | None) -> int | None:
        if not candidates:
            return None
        if old in candidates and (prefer is None or prefer == old):
            return old
        if prefer is not None:
            return prefer if prefer in candidates else None
        if len(candidates) == 1:
            return next(iter(candidates))
        raise ValueError("election outcome depends on live-info tie-breaks; not modelled")

    def alter(self, s: GroupState, req: AlterInput) -> tuple[AlterOutput, GroupState]:
        """alterSyncStateSet (§3.5): fencing first, then "no change" (Q6), then the replicas."""
        new = frozenset(req.new_sss)
        if s.master is None or s.master != req.master_id:
            return AlterOutput(INVALID_MASTER, None), s
        if req.master_epoch != s.master_epoch:
            return AlterOutput(FENCED_MASTER_EPOCH, None), s
        if req.sss_epoch != s.sss_epoch:
            return AlterOutput(FENCED_SYNC_STATE_SET_EPOCH, None), s
        if new == s.sss:
            return AlterOutput(ALTER_SYNC_STATE_SET_FAILED, None), s
        for broker_id in sorted(new):
            if broker_id not in self.registered:
                return AlterOutput(INVALID_REPLICAS, None), s
        if s.master not in new:
            return AlterOutput(ALTER_SYNC_STATE_SET_FAILED, None), s
        return AlterOutput(SUCCESS, s.sss_epoch + 1), s._replace(sss=new, sss_epoch=s.sss_epoch + 1)
