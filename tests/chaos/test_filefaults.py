"""The file faults' pure rules: classifying a store's files, choosing the damage, applying it."""

from __future__ import annotations

import random

import pytest

from rocketray.verify.filefaults import FileFault, StoredFile, apply_fault, classify, plan_file_fault

SEG = "commitlog/00000000000000000000"
CQ = "consumequeue/chaos/3/00000000000000000000"


@pytest.mark.parametrize("path, cls", [
    (SEG, "segment"),
    ("commitlog/0000000000000000000", None),             # 19 digits: not a segment name
    ("commitlog/00000000000000000000.tmp", None),
    (CQ, "consume-queue"),
    ("consumequeue/chaos/3", None),
    ("epochFileCheckpoint", "epoch-file"),
    ("epochFileCheckpoint.bak", "epoch-file"),
    ("storeCheckpoint", "checkpoint"),
    ("raft.wal", "journal"),
    ("raft.wal.meta", None),
    ("snapshots/snapshot_00000000000000000010.snap", "snapshot"),
    ("brokerIdentity", None),
])
def test_classify(path, cls):
    assert classify(path) == cls


FILES = [StoredFile(SEG, 4096, 1000), StoredFile("commitlog/00000000000000001000", 4096, 0), StoredFile(CQ, 40, 40),
         StoredFile("epochFileCheckpoint", 20, 20), StoredFile("epochFileCheckpoint.bak", 20, 20)]


def test_flip_lands_in_data_only():
    for seed in range(200):
        f = plan_file_fault(random.Random(seed), "flip-bit", "segment", FILES)
        assert f.path == SEG and 0 <= f.offset < 1000 and 0 <= f.bit < 8   # the empty segment never


def test_truncate_cuts_inside_the_data_tail():
    for seed in range(200):
        f = plan_file_fault(random.Random(seed), "truncate", "consume-queue", FILES)
        assert f.path == CQ and 1 <= f.new_size < 40


def test_epoch_fault_spares_the_backup_and_missing_class_is_none():
    assert {plan_file_fault(random.Random(s), "flip-bit", "epoch-file", FILES).path for s in range(50)} == \
        {"epochFileCheckpoint"}
    assert plan_file_fault(random.Random(1), "flip-bit", "checkpoint", FILES) is None
    with pytest.raises(AssertionError):
        plan_file_fault(random.Random(1), "delete", "segment", FILES)


@pytest.mark.parametrize("fault, before, after", [
    (FileFault("x", "segment", "flip-bit", offset=1, bit=0), b"\x00\x00\x00", b"\x00\x01\x00"),
    (FileFault("x", "segment", "flip-bit", offset=0, bit=7), b"\x80", b"\x00"),
    (FileFault("x", "segment", "truncate", new_size=2), b"abcd", b"ab"),
    (FileFault("x", "consume-queue", "delete"), b"abcd", None),
])
def test_apply(fault, before, after):
    assert apply_fault(fault, before) == after


def test_plans_are_seeded():
    assert plan_file_fault(random.Random(9), "flip-bit", "segment", FILES) == \
        plan_file_fault(random.Random(9), "flip-bit", "segment", FILES)
