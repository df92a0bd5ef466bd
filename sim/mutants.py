"""Mutants: single data-survival rules broken on purpose, to measure what the simulator can find.

Theory of operation. A simulator that passes every seed proves only as much as it could have failed
(SIMULATION.md section 7). Each ``Mutant`` names one production rule (controller election,
SyncStateSet bookkeeping, ack policy, confirm offset, slave apply order, truncation, flush/fsync,
recovery, epoch file, committed offsets), the way it is broken, and the patches that break it:
``(target, make)`` where ``target`` is ``"module:Qualified.name"`` as the code that runs looks it
up, and ``make(original)`` returns the broken replacement (the makers live in
``sim/broken_rules.py``). ``applied(mutant)`` patches them for the
duration of a ``with`` block, in-process, and restores them after; a target that no longer exists
(a rename, a refactoring) raises ``MutantTargetError("mutant target X not found")`` instead of
silently testing nothing.

``hunt(mutant, budget)`` runs the CI seed schedule (``CI_BUDGET``: seeds of every fault profile,
interleaved, so the first dozen runs cover every profile) against the mutant until the first
violation and returns the *seeds-to-catch* (the 1-based index of the first failing run in that
schedule) or None when the mutant survives the budget. ``hunt_all`` runs every mutant in a process
pool. ``rocketray simulate --mutants`` and ``tests/sim/test_mutants.py`` use them; a mutant that
survives fails the check. Every bug fixed in a core adds its broken rule here, so the CI budget
keeps proving the fix.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from rocketray.sim.hunts import Hunt, hunt_blocks
from rocketray.sim.broken_rules import (
    rank_without, old_takes_report, shrink_from_confirmed, expand_on_any_ack, vetting_admits_all,
    confirmation_drops_all, stale_report_accepted, acked_by_connected, acked_by_confirmed_set,
    old_after_write, confirm_ignores_unknown, confirm_never_back, confirm_alone_is_max, reorder,
    consistent_point_max, flush_without_dir, header_only, keep_the_last, commit_acked_on_own_write,
    fold_whole_log, unclean_context, read_uncommitted, append_unflushed, timeout_not_written,
    ack_untruncated_end, write_in_place, const, gate_without, settle_ignoring_epoch, timeout_put_ok,
    release_reversed, release_writes_all)
from rocketray.sim.broken_shell import answered_on_write, wait_timer_kept, wait_timer_not_rearmed, release_ignoring_verdict

__all__ = ["Mutant", "MutantTargetError", "MUTANTS", "NOT_REACHED", "ALL_MUTANTS", "applied", "resolve",
           "schedule", "hunt", "hunt_all", "Hunt"]

Make = Callable[[Any], Any]


class MutantTargetError(LookupError):
    """A mutant's target does not exist (renamed or moved): fix the registry, not the simulator."""


@dataclass(frozen=True, slots=True)
class Mutant:
    name: str
    area: str                               # election, sync-state-set, ack, confirm, apply, truncation, ...
    rule: str                               # the rule it breaks, one sentence
    patches: tuple[tuple[str, Make], ...]   # (target "module:Qual.name", make(original) -> replacement)
    not_reached: str = ""                   # why the CI budget does not catch it yet (measured); "" = caught


def resolve(target: str) -> tuple[Any, str, Any]:
    """``(owner, attribute, value as stored)`` of ``"module:Qual.name"``; MutantTargetError if absent."""
    module_name, _, qual = target.partition(":")
    if not module_name or not qual:
        raise MutantTargetError(f"mutant target {target} not found (expected 'module:name')")
    try:
        owner: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise MutantTargetError(f"mutant target {target} not found ({exc})") from None
    *path, attr = qual.split(".")
    for part in path:
        if not hasattr(owner, part):
            raise MutantTargetError(f"mutant target {target} not found ({part!r} missing)")
        owner = getattr(owner, part)
    try:
        stored = inspect.getattr_static(owner, attr)
    except AttributeError:
        raise MutantTargetError(f"mutant target {target} not found ({attr!r} missing)") from None
    return owner, attr, stored


@contextlib.contextmanager
def applied(mutant: Mutant) -> Iterator[Mutant]:
    """Break ``mutant``'s rule inside the block (resolving every target first), restore after."""
    resolved = [(resolve(target), make) for target, make in mutant.patches]
    done: list[tuple[Any, str, Any]] = []
    try:
        for (owner, attr, stored), make in resolved:
            original = getattr(owner, attr)
            replacement = make(original)
            if isinstance(stored, staticmethod):
                replacement = staticmethod(replacement)
            elif isinstance(stored, classmethod):
                replacement = classmethod(replacement)
            setattr(owner, attr, replacement)
            done.append((owner, attr, stored))
        yield mutant
    finally:
        for owner, attr, stored in reversed(done):
            setattr(owner, attr, stored)


_OLD_SIM = "survived the first 120 runs of the CI schedule with the simulator before in-flight delivery and swarm"
_WIN = "60 seeds of the windows profile (sync flush, faults waiting for rare windows)"
_AWIN = "60 seeds of async-windows (async flush, overlapping faults, windows)"
_GATE = ("survived the first 150 runs of the CI schedule (crashes without switch time), 250 crashes seeds with "
         "switch time (5-60 ms a step, the CI profile), 80 default and 60 load seeds with switch time")
_GATE2 = ("; also crashes seeds 1-40 with min_in_sync_replicas 2 (the world where invariant 11 checks every "
          "PUT_OK)")

ALL_MUTANTS: dict[str, Mutant] = {m.name: m for m in [
    # -- controller election
    Mutant("election-ignores-max-offset", "election",
           "candidates ranked by epoch and priority only, not by the max offset they reported",
           (("rocketray.controller.election:rank_key", rank_without("max_offset")),),
           not_reached=(_OLD_SIM + "; 400 runs of the CI schedule and " + _AWIN + " (current simulator) did not "
                        "catch it either: SyncStateSet members hold every acknowledged record, so ranking by progress "
                        "matters only when a counted member lost its unflushed tail and the master fails before it "
                        "catches up (async-windows seed 53 failed only on the consume-queue name loss, another bug)")),
    Mutant("election-ignores-epoch", "election",
           "candidates ranked by max offset only, not by the epoch of their last entry",
           (("rocketray.controller.election:rank_key", rank_without("epoch")),),
           not_reached=(_OLD_SIM + "; nor 400 runs of the CI schedule nor " + _AWIN + ": a member "
                        "with more bytes of an older epoch rejoins the SyncStateSet only after truncating to the master's log")),
    Mutant("heartbeat-keeps-best-progress", "election",
           "the heartbeat row keeps the best progress of the epoch instead of the last report",
           (("rocketray.controller.heartbeat:_takes_report", old_takes_report),),
           not_reached=(_OLD_SIM + "; nor " + _WIN + " nor " + _AWIN + ": a second guard, the new-term "
                        "request carries its progress (new-term-ignores-requester-progress); scenario violation-6 reaches both")),
    Mutant("new-term-ignores-requester-progress", "election",
           "a restarted master's new-term request is ranked by its row, not by the progress it carries",
           (("rocketray.controller.decide:_with_requester_progress", lambda _o: (lambda ctx, req: ctx)),),
           not_reached=(_OLD_SIM + "; nor " + _AWIN + ": a second guard behind the heartbeat row "
                        "taking the last report; scenario violation-6 reaches both")),
    Mutant("new-term-only-sync-state-set", "election",
           "the new-term election ignores live replicas whose log contains the restarted master's",
           (("rocketray.controller.decide:contains_log", const(False)),),
           not_reached=(_OLD_SIM + "; nor " + _AWIN + ": it matters only when the replica joining "
                        "under an unanswered expand is the only other holder of what the restarted master lost (2 "
                        "replicas, or the others down); scenario new-term-outside-sss reaches it")),
    Mutant("registration-term-taken", "election",
           "a term named by the answer to this process's registration is taken with what survived",
           (("rocketray.broker.role:is_term_won_before_boot", const(False)),),
           not_reached=(_OLD_SIM + "; nor " + _AWIN + ": the slave elected must lose power in the "
                        "milliseconds between its election and its registration answer; scenario elected-then-lost-power "
                        "reaches it")),
    Mutant("restart-resumes-old-term", "election",
           "a master restarted before the controller noticed resumes its term (#9689)",
           (("rocketray.broker.role:is_term_from_before_restart", const(False)),),
           not_reached=("caught at run 101 of the CI schedule by the old simulator (controller seed 13), too late "
                        "for the CI check's time; not in " + _WIN + "; scenario restarted-master-resumes-its-old-term "
                        "reaches it")),
    Mutant("unclean-election", "election",
           "with no SyncStateSet member alive the controller elects another registered replica",
           (("rocketray.controller.decide:DecideContext.from_heartbeats", unclean_context),)),
    # -- SyncStateSet bookkeeping
    Mutant("shrink-overwrites-pending-expand", "sync-state-set",
           "the shrink check builds its candidate from the confirmed set and replaces a pending expand",
           (("rocketray.ha.sync_state:SyncStateTracker.maybe_shrink", shrink_from_confirmed),),
           not_reached=(_OLD_SIM + "; nor " + _WIN + ": it needs a confirmed member behind "
                        "for the whole not-caught-up limit while an expand waits for an answer the controller lost; "
                        "scenario violation-2 reaches it")),
    Mutant("union-view-ignores-pending", "sync-state-set",
           "the master counts only the confirmed SyncStateSet, not the proposals in flight",
           (("rocketray.ha.sync_state:union_view", lambda _o: (lambda confirmed, pending=(): frozenset(confirmed))),)),
    Mutant("expand-before-caught-up", "sync-state-set",
           "a slave is proposed for the SyncStateSet on any ack, caught up to the confirm offset or not (the "
           "expand rule and the report vetting that re-checks it)",
           (("rocketray.ha.master:MasterReplication.acked", expand_on_any_ack),
            ("rocketray.ha.master:MasterReplication.in_flight", vetting_admits_all))),
    Mutant("confirmation-drops-every-proposal", "sync-state-set",
           "a confirmed SyncStateSet drops every pending proposal from the union view, not only those it answered",
           (("rocketray.ha.sync_state:SyncStateTracker.set_sync_state_set", confirmation_drops_all),),
           not_reached="not caught in the first 80 runs of the CI schedule (current simulator): it needs two proposals "
                       "pending at once (one report at the controller, a newer expand waiting behind it) and a put "
                       "acknowledged, between the first answer and the second report, beyond the joining member's log"),
    Mutant("alter-accepts-stale-report", "sync-state-set",
           "the controller applies a SyncStateSet report made against an older SyncStateSet epoch",
           (("rocketray.controller.decide:decide_alter_sync_state_set", stale_report_accepted),),
           not_reached=(_OLD_SIM + "; nor " + _WIN + ": a second guard, every report that "
                        "could be stale comes from an older master epoch (an election bumps it), fenced first")),
    # -- ack policy
    Mutant("all-ack-counts-connected-only", "ack",
           "all-ack waits only for members that are connected (a disconnected member does not block)",
           (("rocketray.ha.master:batch_acked", acked_by_connected),)),
    Mutant("ack-by-confirmed-set-only", "ack",
           "a put waits for the confirmed SyncStateSet's acks, not a joining member's (#5663)",
           (("rocketray.ha.master:MasterReplication.batch_acked", acked_by_confirmed_set),)),
    Mutant("not-master-after-write", "ack",
           "a role change during the ack wait answers NOT_MASTER (not written) for a written batch",
           (("rocketray.ha.ack:after_write", old_after_write),)),
    Mutant("timeout-answered-not-written", "ack",
           "a put whose acks timed out is answered FLUSH_SLAVE_TIMEOUT as not written (it was written)",
           (("rocketray.ha.ack:after_write", timeout_not_written),)),
    # -- the put gate and the ack wait (ha/put_gate.py: what the broker actor and the simulator run)
    Mutant("ack-timeout-put-ok", "ack",
           "a waiting put whose deadline passed is answered PUT_OK, not FLUSH_SLAVE_TIMEOUT",
           (("rocketray.ha.put_gate:PutGate.settle", timeout_put_ok),)),
    Mutant("gate-admits-without-isr", "gate",
           "a put is admitted however few replicas are in sync (min_in_sync_replicas ignored)",
           (("rocketray.ha.put_gate:PutGate.admit", gate_without("isr")),)),
    Mutant("gate-writes-while-fenced", "gate",
           "a master by role writes while fenced or while a switch runs (the role alone decides, not writable)",
           (("rocketray.ha.put_gate:PutGate.admit", gate_without("fence")),),
           not_reached=(_GATE + _GATE2 + ": a simulated replica is fenced only before its first switch (role NONE), and a "
                        "master by role that is not writable is switching away or to a new epoch: it closed its "
                        "slaves' connections first, so the batch it writes is never acknowledged by another member "
                        "(the new master is in the SyncStateSet): answered MASTER_CHANGED, truncated when it follows")),
    Mutant("ack-wait-ignores-epoch", "ack",
           "a waiting put asks only whether this replica is master, not whether of the epoch it was written in",
           (("rocketray.ha.put_gate:PutGate.settle", settle_ignoring_epoch),),
           not_reached=(_GATE + ": a second guard behind the role check: every switch away from master settles the "
                        "waits as it follows (MASTER_CHANGED), and the same master at a new epoch keeps its log, so "
                        "the older epoch's batch is below the new epoch's start and acknowledged by its members")),
    Mutant("held-puts-released-newest-first", "gate",
           "the puts held during a promotion are written newest first when the switch ends",
           (("rocketray.ha.put_gate:PutGate.release", release_reversed),),
           not_reached=(_GATE + _GATE2 + ": each simulated producer keeps one batch in flight, so puts held together "
                        "are different producers'; the order of held puts is no data-survival promise (each put is "
                        "answered with the offsets it got; RocketMQ promises no order among a producer's batches in "
                        "flight either), so no invariant orders them; tests/ha/test_put_gate.py and "
                        "tests/actors/test_promotion_hold.py pin the order")),
    Mutant("held-puts-written-after-failed-switch", "gate",
           "the puts held during a promotion are written when the switch ends, whether it succeeded or not",
           (("rocketray.ha.put_gate:PutGate.release", release_writes_all),),
           not_reached=(_GATE + ": a simulated switch fails only by a crash, which ends the process and its held "
                        "puts with it, and a promotion while fenced (the first registration) holds nothing; "
                        "tests/ha/test_put_gate.py and tests/actors/test_promotion_hold.py pin it. Its other half, a "
                        "held put written after a successful switch without the gate's in-sync check, is caught at "
                        "crashes seed 3 with min_in_sync_replicas 2 (invariant 11: a new master alone answers a held "
                        "put PUT_OK), but no CI profile has both switch time and min_in_sync_replicas 2 yet")),
    # -- confirm offset
    Mutant("confirm-ignores-unknown-acks", "confirm",
           "the confirm offset is the min of the known acks; a member with no ack yet does not freeze it",
           (("rocketray.ha.sync_state:confirm_offset", confirm_ignores_unknown),)),
    Mutant("confirm-never-goes-back", "confirm",
           "the confirm offset keeps a floor at its current value above what the members hold",
           (("rocketray.ha.sync_state:confirm_offset", confirm_never_back),),
           not_reached=(_OLD_SIM + "; nor " + _WIN + ": the report vetting keeps a member short "
                        "of the confirm offset out of the view, so the floor never matters")),
    Mutant("confirm-alone-is-max", "confirm",
           "a master alone in its confirmed set confirms its max offset while an expand is pending",
           (("rocketray.ha.sync_state:SyncStateTracker.compute_confirm_offset", confirm_alone_is_max),)),
    Mutant("reads-beyond-confirm", "confirm",
           "a replica indexes and serves consumers records beyond its confirm offset",
           (("rocketray.broker.store:MessageStore.__init__", read_uncommitted),)),
    # -- slave apply order
    Mutant("slave-acks-before-append", "apply",
           "the slave sends its ack before it appends (and fsyncs) the batch",
           (("rocketray.ha.session:SlaveSession._on_transfer", reorder("Send", "Append")),)),
    Mutant("slave-acks-unflushed", "apply",
           "with sync flush a slave acks a received batch before it is fsynced (the slave path skips the flush)",
           (("rocketray.broker.store:MessageStore.append_raw", append_unflushed),)),
    Mutant("slave-epoch-after-data", "epoch-file",
           "the slave records a new epoch's entry after appending the epoch's first bytes",
           (("rocketray.ha.session:SlaveSession._on_transfer", reorder("Append", "RecordEpoch")),),
           not_reached=(_OLD_SIM + "; with the current simulator caught at run 88 only while its maker also "
                        "moved every Append behind the ack (a list without a RecordEpoch), fixed: it needs a crash "
                        "between a new epoch's first bytes and its entry, then that slave elected")),
    # -- truncation
    Mutant("consistent-point-max", "truncation",
           "the consistent point is the larger end of the common epoch, not the smaller",
           (("rocketray.ha.truncation:find_consistent_point", consistent_point_max),)),
    Mutant("unlink-oldest-first", "truncation",
           "a cut unlinks the segments after the cut point oldest first",
           (("rocketray.broker.commitlog:unlink_order", lambda _o: (lambda segments: list(segments))),),
           not_reached="not caught in the first 120 runs (old simulator) nor 24 (with in-flight delivery): a second guard "
                       "behind recovery's contiguity check (recovery-ignores-holes); scenario violation-3 reverts both"),
    Mutant("slave-acks-untruncated-end", "truncation",
           "a slave that truncates on the handshake acks the end its log had before the cut",
           (("rocketray.ha.session:SlaveSession._on_handshake", ack_untruncated_end),)),
    Mutant("epoch-file-not-durable", "epoch-file",
           "the epoch file is rewritten in place without fsync (no temp file, no rename)",
           (("rocketray.broker.epoch_file:write_durably", write_in_place),)),
    # -- flush / fsync
    Mutant("flush-skips-fsync", "flush",
           "a sync-flush append does not fsync before the ack",
           (("rocketray.broker.commitlog:CommitLog.flush", lambda _o: (lambda self: None)),)),
    Mutant("flush-skips-directory", "flush",
           "a flush fsyncs the segments but not the directory after a new segment was created",
           (("rocketray.broker.commitlog:CommitLog.flush", flush_without_dir),)),
    # -- recovery
    Mutant("recovery-trusts-unsynced-tail", "recovery",
           "recovery marks the scanned tail verified without fsyncing it",
           (("rocketray.broker.commitlog:CommitLog._sync_scanned", lambda _o: (lambda self, segments: None)),)),
    Mutant("recovery-ignores-holes", "recovery",
           "recovery keeps segments after a hole (no contiguity check)",
           (("rocketray.broker.commitlog:first_gap", const(None)),),
           not_reached="not caught in the first 24 runs of the CI schedule: a second guard behind the newest-first unlink "
                       "order (unlink-oldest-first); scenario violation-3 reverts both"),
    Mutant("recovery-keeps-torn-body", "recovery",
           "recovery's torn-tail cut checks record headers but not body CRCs",
           (("rocketray.broker.commitlog:verify_record", header_only),
            ("rocketray.broker.commitlog:records_valid", const(False)))),
    Mutant("recovery-trusts-sealed-predecessor", "recovery",
           "recovery does not rescan the segment before a verified offset on a segment boundary",
           (("rocketray.broker.commitlog:first_scanned",
             lambda _o: (lambda bases, verified: max(0, __import__("bisect").bisect_right(bases, verified) - 1))),),
           not_reached="not caught in the first 24 runs of the CI schedule (with in-flight delivery): it needs a power loss "
                       "between a seal's ftruncate and the next checkpoint with the verified offset on that boundary"),
    # -- committed offsets
    Mutant("offsets-fold-keeps-last", "offsets",
           "the offset fold keeps the last committed value instead of the maximum",
           (("rocketray.broker.offsets:OffsetTable.apply", keep_the_last),)),
    Mutant("commit-acked-on-own-write", "offsets",
           "a commit is answered PUT_OK after the master's own write, without the SyncStateSet's acks",
           (("rocketray.sim.broker:SimBroker.put", commit_acked_on_own_write),)),
    Mutant("offsets-reader-ignores-confirm", "offsets",
           "the master answers committed offsets at once from every record of its log, confirmed or not",
           (("rocketray.sim.broker:SimBroker.offset_table", fold_whole_log),
            ("rocketray.sim.offsets:answerable", const(True)))),
    # -- found by the async-overlap profile
    Mutant("first-term-after-restart-taken", "election",
           "a restarted broker takes the first term a MASTER_STILL_EXIST answer, poll or notification names it "
           "master of, with what survived its power loss",
           (("rocketray.broker.role:is_first_term_after_restart", const(False)),),
           not_reached="not caught in the first 120 runs of the CI schedule; async-overlap seed 36 (run 1,207 of the "
                       "schedule, by the profile's own search) and scenario elected-while-down-named-later reach it"),
    Mutant("queue-name-trusted-after-kill", "recovery",
           "a consume-queue file found at start is trusted to have a durable name (only its creator fsyncs the "
           "directory), so checkpoints vouch for entries a power loss drops",
           (("rocketray.broker.consume_queue:name_needs_sync", lambda _o: (lambda created: created)),),
           not_reached="not caught in the first 120 runs of the CI schedule; async-overlap first reaches it at seed 70, "
                       "past the 60 in the budget; tests/broker/test_queue_name_durable.py pins it"),
    Mutant("queue-dir-name-trusted-after-kill", "recovery",
           "a checkpoint fsyncs only the queue-id directory of a queue file, trusting the topic directory a killed "
           "process made (its name unsynced) to be durable, so checkpoints vouch for entries a power loss drops",
           (("rocketray.broker.consume_queue:names_to_sync", lambda _o: (lambda queue_dir, root: [queue_dir])),),
           not_reached="not caught in the first 200 runs of the CI schedule; async-overlap first reaches it at seed 456 "
                       "(an exception in the offsets fold), past the 60 in the budget; "
                       "tests/broker/test_queue_name_durable.py pins it"),
    # -- the put shell (ha/put_shell.py: the IO around the gate, what the broker actor and the simulator run)
    Mutant("shell-answers-on-write", "shell",
           "a written put is answered PUT_OK from its own write, not from its ack wait",
           (("rocketray.ha.put_shell:PutShell._write", answered_on_write),)),
    Mutant("shell-wait-timer-kept", "shell",
           "the ack-wait timer, once fired, keeps its handle and is never armed again (no wait times out)",
           (("rocketray.ha.put_shell:PutShell._wait_timer_fired", wait_timer_kept),)),
    Mutant("shell-wait-timer-not-rearmed", "shell",
           "the ack-wait timer is not armed again when it fires (the waits left time out only once a later write arms it)",
           (("rocketray.ha.put_shell:PutShell._wait_timer_fired", wait_timer_not_rearmed),)),
    Mutant("shell-writes-held-puts-whatever-the-verdict", "shell",
           "the shell writes every held put when the switch ends, ignoring the gate's verdict at the release",
           (("rocketray.ha.put_shell:PutShell.release_held", release_ignoring_verdict),),
           not_reached=("survived the first 150 runs of the CI schedule: a simulated switch fails only by a crash, "
                        "which ends the process and its held puts, so every release's verdict is WRITE (15 held puts "
                        "released in 40 crashes seeds, all WRITE); tests/ha/test_put_shell.py pins it")),
]}

#: The mutants the CI budget catches (the mutation check requires each to be caught).
MUTANTS: dict[str, Mutant] = {n: m for n, m in ALL_MUTANTS.items() if not m.not_reached}
#: Broken rules the CI budget does not catch yet, each with the reason (kept to be hunted again).
NOT_REACHED: dict[str, Mutant] = {n: m for n, m in ALL_MUTANTS.items() if m.not_reached}


# -- hunting ------------------------------------------------------------------------------------------

def schedule(budget: dict[str, int]) -> list[tuple[str, int]]:
    """The runs of a seed budget ``{profile: seeds}`` as ``(profile, seed)``, interleaved so that
    every profile comes early: run k takes the profile furthest behind its share."""
    total = sum(budget.values())
    done = {p: 0 for p in budget}
    out: list[tuple[str, int]] = []
    for k in range(total):
        profile = min(budget, key=lambda p: (done[p] / budget[p] if done[p] < budget[p] else 2.0, list(budget).index(p)))
        done[profile] += 1
        out.append((profile, done[profile]))
    return out


def hunt(mutant: Mutant | str, budget: dict[str, int] | None = None, limit: int | None = None,
         start: int = 0) -> Hunt:
    """Run the schedule of ``budget`` (default: ``run.CI_BUDGET``; its first ``limit`` runs when
    given; from run ``start + 1``) against ``mutant`` until the first violation (an exception raised
    inside the run counts: a core's assertion fired)."""
    from rocketray.sim.run import CI_BUDGET, PROFILES, run_seed

    m = ALL_MUTANTS[mutant] if isinstance(mutant, str) else mutant
    started = time.perf_counter()
    runs = schedule(budget or CI_BUDGET)[:limit]
    with applied(m):
        for k, (profile, seed) in enumerate(runs[start:], start=start + 1):
            try:
                r = run_seed(seed, PROFILES[profile])
                violation = r.violation
            except MutantTargetError:
                raise
            except Exception as exc:          # noqa: BLE001 - a core's assertion is a detection too
                violation = f"exception {type(exc).__name__}: {exc}"
            if violation is not None:
                return Hunt(m.name, k, profile, seed, violation, k, round(time.perf_counter() - started, 2))
    return Hunt(m.name, None, None, None, None, len(runs), round(time.perf_counter() - started, 2))


def hunt_all(names: list[str] | None = None, budget: dict[str, int] | None = None, workers: int = 2,
             progress: Callable[[Hunt], None] | None = None, limit: int | None = None) -> list[Hunt]:
    """Hunt every mutant (or ``names``) on ``workers`` forked processes (``hunts.hunt_blocks``); results
    in registry order. Every target is resolved first, so a rename fails before any seed runs."""
    chosen = [ALL_MUTANTS[n] for n in (names or list(MUTANTS))]
    for m in chosen:
        for target, _make in m.patches:
            resolve(target)
    if workers > 1:      # blocks of each schedule, so no worker waits for the longest hunt (sim/hunts.py)
        from rocketray.sim.run import CI_BUDGET

        total = len(schedule(budget or CI_BUDGET)[:limit])
        results = hunt_blocks([m.name for m in chosen], budget, total, workers, hunt, progress)
        return [results[m.name] for m in chosen]
    out = []
    for m in chosen:
        out.append(hunt(m.name, budget, limit))
        if progress is not None:
            progress(out[-1])
    return out
