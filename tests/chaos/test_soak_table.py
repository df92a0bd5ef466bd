"""The soak's per-nemesis table (verify/soak.py) on hand-made histories with known answers."""

from __future__ import annotations

from rocketray.verify.history import NemesisEvent, OpRecord
from rocketray.verify.outcome import Outcome
from rocketray.verify.soak import format_table, soak_table, windows


def send(i: int, start: float, end: float, group: str = "g", ok: bool = True) -> OpRecord:
    return OpRecord(f"op{i}", "p", "send", group, 0, f"pay{i}", i if ok else None, None, start, end,
                    Outcome.OK if ok else Outcome.UNKNOWN)


EVENTS = [NemesisEvent(100, "net-partition", "start", "x", "g"), NemesisEvent(200, "net-partition", "end", "x", "g"),
          NemesisEvent(300, "corrupt-file", "start", "y", "h"), NemesisEvent(301, "corrupt-file", "end", "y", "h"),
          NemesisEvent(400, "kill-controller-leader", "start", "c", None),
          NemesisEvent(401, "kill-controller-leader", "end", "c", None),
          NemesisEvent(900, "heal", "start", None, None)]


def test_windows_pair_starts_and_ends():
    assert windows(EVENTS) == [("net-partition", "g", 100, 200), ("corrupt-file", "h", 300, 301),
                               ("kill-controller-leader", None, 400, 401)]


def test_rows_count_overlaps_losses_and_recovery():
    ops = [send(1, 90, 110), send(2, 150, 250), send(3, 210, 260, ok=False), send(4, 230, 270),   # g
           send(5, 290, 305, "h"), send(6, 320, 330, "h"),                                          # h
           send(7, 405, 420)]
    rows = {r.kind: r for r in soak_table(EVENTS, ops, lost_payloads=["pay2"])}
    part = rows["net-partition"]
    assert (part.faults, part.acked, part.lost) == (1, 2, 1)        # op1 and op2 overlap; op2 lost
    assert part.recovery_p50_ms == 70                               # op4: started 230 >= 200, ended 270
    f = rows["corrupt-file"]
    assert (f.acked, f.recovery_max_ms) == (1, 29)                  # op5 overlaps; op6 ends 330
    assert rows["kill-controller-leader"].recovery_p50_ms == 19     # any group: op7
    assert list(rows) == ["kill-controller-leader", "net-partition", "corrupt-file"]   # FAULT_KINDS order


def test_a_fault_without_a_later_write_is_unrecovered_and_printed():
    rows = soak_table(EVENTS[:2], [send(1, 10, 20)], lost_payloads=[])
    assert rows[0].unrecovered == 1 and rows[0].recovery_p50_ms is None
    text = format_table(rows)
    assert "| net-partition | 1 | 0 | 0 | - | - (1 none) |" in text
