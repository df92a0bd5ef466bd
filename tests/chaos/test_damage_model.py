"""The fault model's precondition for file faults (verify/damage_model.py): a majority of each
group's SyncStateSet stays undamaged. Found by the 30-minute soak of 2026-11-28 (seed 1): a bit
flipped in the commit log of the only member of broker-b's SyncStateSet; it restarted, cut its log
at the damage, was elected again as the set's only member and the other replicas truncated to it."""

import pytest

from rocketray.verify.damage_model import DamageLedger


@pytest.mark.parametrize("sss, damaged, victim, allowed", [
    ([1], [], 1, False),          # the only in-sync copy
    ([1], [], 2, True),           # a replica outside the set
    ([1, 2], [], 1, False),       # one of two: no majority left undamaged
    ([1, 2], [], 3, True),
    ([1, 2, 3], [], 2, True),     # one of three
    ([1, 2, 3], [3], 2, False),   # a second of three before the first is back
    ([1, 2, 3], [3], 3, True),    # the same replica again: still one of three damaged
    ([1, 2], [3], 3, True),       # damaged outside the set stays outside the count
    ([], [], 1, False),           # no set known: nothing is covered
])
def test_allows_only_while_a_majority_of_the_set_stays_undamaged(sss, damaged, victim, allowed):
    ledger = DamageLedger()
    for d in damaged:
        ledger.record("g", d, sss_epoch=5)
    assert ledger.allows("g", sss, 5, victim) is allowed


def test_a_damaged_replica_counts_until_readmitted_under_a_newer_set_epoch():
    ledger = DamageLedger()
    ledger.record("g", 3, sss_epoch=7)
    assert not ledger.allows("g", [1, 2, 3], 7, 2)     # same epoch: 3 was not re-admitted yet
    assert not ledger.allows("g", [1, 2], 8, 1)        # 3 dropped out: still damaged, 1 of 2 left
    assert ledger.damaged("g") == {3}
    assert ledger.allows("g", [1, 2, 3], 9, 2)         # 3 back under epoch 9 > 7
    assert ledger.damaged("g") == frozenset()


def test_groups_are_counted_apart():
    ledger = DamageLedger()
    ledger.record("a", 1, sss_epoch=1)
    assert ledger.allows("b", [1, 2, 3], 1, 2)
    assert not ledger.allows("a", [1, 2, 3], 1, 2)


class _Status:
    def __init__(self, broker_id):
        self.broker_id = broker_id


class _Answer:
    ok = True

    def __init__(self, sss, epoch):
        self.body = {"sync_state_set": sss, "sync_state_set_epoch": epoch}


class _Cluster:
    """The two calls the precondition makes: a replica's status and the controller's answer."""

    def __init__(self, ids, sss, epoch):
        self.ids, self.sss, self.epoch = ids, sss, epoch

    def broker_status(self, group, replica):
        return None if self.ids[replica] is None else _Status(self.ids[replica])

    def call_controller(self, request, timeout_s):
        return _Answer(self.sss, self.epoch)


def _nemesis(cluster):
    from rocketray.chaos.os_nemesis import OsNemesis
    return OsNemesis(cluster, runlog=None, seed=1, kernel=None, master_of=lambda g: None,
                     replica_of=lambda g, b: None)


def test_the_precondition_counts_the_replica_damaged_not_the_broker_the_schedule_named():
    """Soak seed 1 (guarded, 2026-11-28): the schedule named broker 2, which was restarting, so the
    fault fell back to replica r1 by index; r1 was broker 1, the set's only member, and lost its
    unsynced writes because the check was made for broker 2."""
    from rocketray.verify.nemesis import NemesisStep
    step = NemesisStep(at_ms=0, kind="lose-unsynced", group="broker-b", broker_id=2)
    cluster = _Cluster(ids=[2, 1, 3], sss=[1], epoch=41)
    assert _nemesis(cluster)._within_model(step, replica=1) is None          # r1 is broker 1: the only copy
    assert _nemesis(cluster)._within_model(step, replica=2) == (3, 41)       # r2 is broker 3: outside the set
    cluster.ids[1] = None                                                    # r1 not answering: id unknown
    assert _nemesis(cluster)._within_model(step, replica=1) is None
