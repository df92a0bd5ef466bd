"""What the per-step invariants of one group read from the world, as one comparable value.

Theory of operation. ``Invariants._check_group`` is a function of the world (the brokers, the
controller's view of the group, the clients' histories) and of the checker's own bookkeeping. Run
twice in a row on the same world, the second run is a no-op: every piece of bookkeeping it writes
is either set to what it reads (the last epoch, confirm offset and power-loss count seen; the
committed-offset reading's mark), advanced from a length (the commits taken), or only written on a
change it detects (a power loss, an election); an exemption it drops is one it would read as over
anyway. So a step after which ``group_inputs`` equals its value at the group's last check cannot
change what the check accepts or rejects, and ``check_step`` skips the group (three steps in four).

The value lists every input, as cheaply as it can be read:

- per broker: ``up``, ``power_losses``, ``restarts``, ``rewrites`` and ``flushed_end`` (the process,
  its crashes and truncations, its async flushes); its disk's IO step count (every change to a file's
  content, size or durable state, or to a name, is one IO step: what ``durable_end`` reads); its
  log's max and confirm offsets; its role machine's role, master epoch, broker id and master id
  (``is_master``, ``ha_role``, ``ha_epoch``); a master's union view (its replication core); its slave
  link (``slave.master``); and whether it gave committed-offset answers the checker has not read;
- per group: the controller's SyncStateSet and master (id, epoch); how many messages each producer
  had acknowledged, and each consumer had read and committed (their ends follow from those).

An election in the group (``controller.elections``) always runs the check (the oracle's election
rule), whatever the value. The checker's own state (the oracle's forgiveness, the commits taken,
the readings, the exemptions) changes only inside the checks, so it is no input.
``tests/sim/test_incremental.py`` runs seeds of every profile, and every mutant's catching run,
with and without the skip and requires identical traces and verdicts.
"""

from __future__ import annotations

from rocketray.broker.role import Role

__all__ = ["group_inputs", "verify_skip"]

_MASTER = Role.MASTER


def group_inputs(controller, brokers, producers, consumers, group: str) -> tuple:
    """The inputs of ``group``'s per-step checks (see the module docstring)."""
    out: list = [controller.sync_state_set(group), controller.master_of(group)]
    for p in producers:
        out.append(len(p.acked))
    for c in consumers:
        out.append(len(c.read))
        out.append(len(c.committed))
    for b in brokers:
        m, s = b.machine, b.store
        role = m.role
        out.append((b.up, b.power_losses, b.restarts, b.rewrites, b.flushed_end, b.disk.steps,
                    None if s is None else s.commitlog.max_offset, None if s is None else s.confirm_offset,
                    role, m.master_epoch, m.broker_id, m.master_broker_id, b.slave, not b.answers,
                    b.master.view() if role is _MASTER else None))
    return tuple(out)


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


def verify_skip(inv, group: str) -> None:
    """Debug mode (``Invariants.verify_skips``): run the per-step check of ``group`` that its
    unchanged inputs let ``check_step`` skip, and fail unless it raised nothing and changed nothing."""
    brokers = inv.groups[group]
    before = _checker_state(inv, brokers)
    inv._check_group(group, brokers, [])
    if _checker_state(inv, brokers) != before:
        raise AssertionError(f"step {inv.controller.world.steps}: the per-step check of {group}, skipped at "
                             f"unchanged inputs, would have changed the checker's state")
