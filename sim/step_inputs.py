"""What the per-step invariants of one group read from the world, as comparable values.

Theory of operation. ``Invariants._check_group`` is a function of the world (the brokers, the
controller's view of the group, the clients' histories) and of the checker's own bookkeeping. Run
twice in a row on the same world, the second run is a no-op: every piece of bookkeeping it writes
is either set to what it reads (the last epoch, confirm offset and power-loss count seen; the
committed-offset reading's mark), advanced from a length (the commits taken), or only written on a
change it detects (a power loss, an election); an exemption it drops is one it would read as over
anyway. So after a step that left ``group_inputs`` as the group's last check left it, the check
cannot accept or reject anything new, and ``check_step`` skips it (three steps in four). The checks
split along the inputs: ``_check_brokers`` and ``_check_confirm`` read only the controller and the
brokers; ``_check_clients`` (invariants 1-2's cheap form, 8, 9) also reads the clients' histories
and the committed-offset answers, so a step that changed only those runs only it.

The inputs, as cheaply as they can be read:

- the controller's SyncStateSet and master (id, epoch) of the group; per broker: ``up``,
  ``power_losses``, ``restarts``, ``rewrites`` and ``flushed_end`` (the process, its crashes and
  truncations, its async flushes); its disk's IO step count (every change to a file's content, size
  or durable state, or to a name, is one IO step: what ``durable_end`` reads); its log's max and
  confirm offsets; its role machine's role, master epoch, broker id and master id (``is_master``,
  ``ha_role``, ``ha_epoch``); a master's union view (its replication core); its slave link
  (``slave.master``);
- how many messages each producer had acknowledged, and each consumer had read and committed
  (their ends follow from those);
- whether a broker gave committed-offset answers the checker has not read (reading them empties
  the list, so the inputs are read again after such a check).

An election in the group (``controller.elections``) always runs every check (the oracle's election
rule). The checker's own state (the oracle's forgiveness, the commits taken, the readings, the
exemptions) changes only inside the checks, so it is no input. A step whose event returned
``QUIET`` (``World.quiet``: it only read state or scheduled events) changed no input, and is
skipped without reading them.

Debug mode (``Invariants.verify_skips``): every skipped check runs anyway and must change nothing
(``verify_skip``), and a quiet step must leave the inputs as they were.
``tests/sim/test_incremental.py`` runs seeds of every profile incrementally, in full and in the
debug mode, and requires identical traces and verdicts; ``tests/sim/test_mutants.py`` judges every
mutant's catching run with the full checks too.
"""

from __future__ import annotations

from rocketray.broker.role import Role

__all__ = ["group_inputs", "broker_step_inputs", "verify_skip"]

_MASTER = Role.MASTER


def broker_inputs(b) -> tuple:
    """What the per-step checks read of one broker (see the module docstring)."""
    m, s = b.machine, b.store
    role = m.role
    return (b.up, b.power_losses, b.restarts, b.rewrites, b.flushed_end, b.disk.steps,
            None if s is None else s.commitlog.max_offset, None if s is None else s.confirm_offset,
            role, m.master_epoch, m.broker_id, m.master_broker_id, b.slave,
            b.master.view() if role is _MASTER else None)


def group_inputs(controller, brokers, producers, consumers, group: str) -> tuple[tuple, tuple, bool]:
    """The inputs of ``group``'s per-step checks (see the module docstring): (what the controller
    and the brokers hold, what the clients hold, whether a broker gave answers the checker has not
    read yet)."""
    clients: list = [len(p.acked) for p in producers]
    for c in consumers:
        clients.append(len(c.read))
        clients.append(len(c.committed))
    return ((controller.sync_state_set(group), controller.master_of(group), tuple(map(broker_inputs, brokers))),
            tuple(clients), any(b.answers for b in brokers))


def broker_step_inputs(controller, group: str, before: tuple, index: int, b) -> tuple[tuple, tuple, bool]:
    """``group_inputs`` after a step of broker ``b`` (``World.actor``; ``index``: its place in the
    group), given the inputs ``before`` it: only ``b`` and the controller can have changed."""
    brokers = list(before[0][2])
    brokers[index] = broker_inputs(b)
    return (controller.sync_state_set(group), controller.master_of(group), tuple(brokers)), before[1], bool(b.answers)


#: the checker's attributes that are the world's wiring or caches of ``check_logs``, not state the
#: per-step checks keep
_WIRING = {"controller", "groups", "producers", "consumers", "_producers_of", "_consumers_of", "_parts", "_inputs",
           "_found", "_record_bytes", "_log_folds", "_steps"}


def _checker_state(inv, brokers) -> str:
    """Everything a per-step check of ``brokers``' group may write, as text: the checker's state,
    the oracle's, what it drains from the brokers and what it notes in the trace."""
    own = {k: v for k, v in vars(inv).items() if k not in _WIRING}
    oracle = vars(inv.oracle) if inv.oracle is not None else None
    drained = [(b.answers, b._offsets[:2] if b._offsets is not None else None) for b in brokers]
    return repr((own, oracle, drained, list(inv.controller.world.trace)))


def verify_skip(inv, group: str, everything: bool) -> None:
    """Debug mode (``Invariants.verify_skips``): run the per-step checks of ``group`` that unchanged
    inputs let ``check_step`` skip (``everything``: all of them; else the ones that read only the
    controller and the brokers, after the clients' ran) and fail unless they raised nothing and
    changed nothing."""
    brokers = inv.groups[group]
    before = _checker_state(inv, brokers)
    if everything:
        inv._check_group(group, brokers, [])
    else:
        inv._check_brokers(group, brokers, [])
        inv._check_confirm(group, brokers)
    if _checker_state(inv, brokers) != before:
        raise AssertionError(f"step {inv.controller.world.steps}: the per-step checks of {group}, skipped at "
                             f"unchanged inputs, would have changed the checker's state")
