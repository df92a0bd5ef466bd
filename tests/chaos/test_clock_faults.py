"""Clock faults without a cluster: a process under ``chaos/faketime.py``'s environment really runs on
the shifted wall clock (and its jump takes effect while it runs, its monotonic clock untouched, its
``time.sleep`` working: libfaketime 0.9.10 alone made every ``time.sleep`` raise ``EINVAL``); the
nemesis log's clock targets and windows; and the consumer-group checker's allowance for delayed
messages a master with a fast clock delivered early."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

from rocketray.chaos.faketime import faketime_env, read_offset, set_offset
from rocketray.verify.checker import check
from rocketray.verify.history import NemesisEvent
from rocketray.verify.nemesis import clock_offset_s, clock_target, clock_windows
from tests.chaos.test_group_checker_actions import delayed

# The child compares its wall clock with the kernel's (a raw syscall libfaketime does not see), sleeps
# with time.sleep, and reports its offset each time it reads a line on stdin.
CHILD = r"""
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
class TS(ctypes.Structure):
    _fields_ = [("s", ctypes.c_long), ("ns", ctypes.c_long)]
def kernel_now():
    ts = TS(); libc.syscall(228, 0, ctypes.byref(ts)); return ts.s + ts.ns / 1e9
for line in sys.stdin:
    want = float(line)
    mono = time.monotonic()
    for _ in range(60):                  # the jump shows within libfaketime's 1 s re-read
        offset = time.time() - kernel_now()
        if abs(offset - want) < 1:
            break
        time.sleep(0.05)
    print(round(offset, 1), round(time.monotonic() - mono, 1), flush=True)
"""


def test_a_running_process_jumps_back_and_forth_and_still_sleeps(tmp_path: Path):
    clock = tmp_path / "clock"
    env = faketime_env(clock)
    assert read_offset(clock) == 0
    child = subprocess.Popen([sys.executable, "-c", CHILD], env={**os.environ, **env}, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        seen = []
        for offset in (0, 3600, -600):
            set_offset(clock, offset)
            assert child.stdin is not None and child.stdout is not None
            child.stdin.write(f"{offset}\n")
            child.stdin.flush()
            wall, mono = map(float, child.stdout.readline().split())
            seen.append(wall)
            assert mono < 3.5, (offset, mono)    # the monotonic clock did not jump with the wall clock
        assert seen == [0.0, 3600.0, -600.0], (seen, child.stderr)
    finally:
        if child.stdin is not None:
            child.stdin.close()
        child.wait(timeout=10)
    assert child.returncode == 0, child.stderr.read() if child.stderr else None


def test_clock_targets_carry_the_offset_and_windows_pair_start_and_end():
    target = clock_target("broker:g0/r1", -600)
    assert target == "broker:g0/r1 clock -600s" and clock_offset_s(target) == -600
    assert clock_offset_s(f"{clock_target('broker:g0/r2', 3600)}; seen +3600.0 s") == 3600
    assert clock_offset_s("broker:g0/r1") is None and clock_offset_s(None) is None
    events = [NemesisEvent(100, "clock-broker", "start", clock_target("broker:g0/r1", 30), "g0"),
              NemesisEvent(150, "kill-master", "start", "broker:g0/r0", "g0"),
              NemesisEvent(200, "clock-broker", "end", clock_target("broker:g0/r1", 30) + "; back", "g0"),
              NemesisEvent(300, "clock-broker", "start", clock_target("broker:g1/r0", -600), "g1"),
              NemesisEvent(400, "heal", "start", None)]
    assert clock_windows(events) == [(100, 200, 30_000), (300, 400, -600_000)]


def _with_clock_fault(run, start: float, end: float, offset_s: int):
    return dataclasses.replace(run, nemesis=(
        NemesisEvent(start, "clock-broker", "start", clock_target("broker:broker-a/r0", offset_s), "broker-a"),
        NemesisEvent(end, "clock-broker", "end", clock_target("broker:broker-a/r0", offset_s), "broker-a")))


def test_a_delayed_message_may_come_early_by_a_fast_broker_clock_only():
    """p0 is due at 5000 and delivered at 3000: a failure, unless a broker clock ran at least 2 s
    ahead between its send (at 105) and its delivery."""
    early = delayed(3000).data()
    (plain,) = check(early).groups
    assert plain.delayed_early == 1 and not plain.valid
    (ahead,) = check(_with_clock_fault(early, 1000, 2000, 30)).groups
    assert ahead.delayed_early == 0 and ahead.valid, ahead
    (too_little,) = check(_with_clock_fault(early, 1000, 2000, 1)).groups
    assert too_little.delayed_early == 1
    (behind,) = check(_with_clock_fault(early, 1000, 2000, -600)).groups
    assert behind.delayed_early == 1
    (after,) = check(_with_clock_fault(early, 3500, 4000, 3600)).groups   # began after the delivery
    assert after.delayed_early == 1


def test_the_jump_is_written_whole(tmp_path: Path):
    clock = tmp_path / "clock"
    set_offset(clock, 3600)
    assert clock.read_text() == "+3600\n" and not list(tmp_path.glob("*.partial"))
    started = time.monotonic()
    set_offset(clock, -30)
    assert read_offset(clock) == -30 and time.monotonic() - started < 1
