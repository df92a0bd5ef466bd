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
