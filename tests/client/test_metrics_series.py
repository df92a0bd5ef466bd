"""The client's metric series (rocketray.client.metrics_series), pure: snapshot -> rows, rows ->
Prometheus text, successive samples -> the calls Ray's metric objects take. Table tests, no IO."""

from __future__ import annotations

import pytest

from rocketray.client import ConsumerMetrics, ProducerMetrics, TopicQueue
from rocketray.client.metrics_series import (DEFINITIONS, Series, consumer_series, merge, producer_series,
                                             prometheus_text, ray_updates)

P = ProducerMetrics(sent=10, failed=1, unknown=2, puts=7, retries=3, pending_messages=4, buffered_bytes=512)
C = ConsumerMetrics(received=9, polls=5, committed=3, commit_failures=1, rebalances=2, assigned=3, lag=11,
                    lag_by_queue={TopicQueue("b", 0): 4, TopicQueue("a", 1): 5, TopicQueue("a", 0): 2},
                    nacked=6, dead_lettered=1, held=2)


def values(rows: list[Series]) -> dict[tuple[str, tuple], float]:
    return {(r.name, r.labels): r.value for r in rows}


def test_producer_rows_name_every_counter_and_gauge_with_the_client_id():
    """Every field of ProducerMetrics is one row labelled client_id; counters end in _total."""
    got = values(producer_series(P, "p1"))
    lab = (("client_id", "p1"),)
    assert got == {
        ("rocketray_client_producer_sent_total", lab): 10, ("rocketray_client_producer_failed_total", lab): 1,
        ("rocketray_client_producer_unknown_total", lab): 2, ("rocketray_client_producer_puts_total", lab): 7,
        ("rocketray_client_producer_retries_total", lab): 3,
        ("rocketray_client_producer_pending_messages", lab): 4,
        ("rocketray_client_producer_buffered_bytes", lab): 512}
    for row in producer_series(P, "p1"):
        assert row.kind == ("counter" if row.name.endswith("_total") else "gauge")


def test_consumer_rows_carry_the_group_and_lag_is_summed_per_topic():
    """A consumer's rows are labelled client_id and group; lag is one row per topic (queues of a
    topic summed), in topic order; a consumer owning nothing has no lag row."""
    rows = consumer_series(C, "c1", "billing")
    got = values(rows)
    lab = (("client_id", "c1"), ("group", "billing"))
    expected_plain = {"received_total": 9, "polls_total": 5, "committed_total": 3, "commit_failures_total": 1,
                      "rebalances_total": 2, "nacked_total": 6, "dead_lettered_total": 1, "assigned_queues": 3,
                      "held_messages": 2}
    for part, value in expected_plain.items():
        assert got.pop((f"rocketray_client_consumer_{part}", lab)) == value, part
    assert got == {("rocketray_client_consumer_lag_messages", lab + (("topic", "a"),)): 7,
                   ("rocketray_client_consumer_lag_messages", lab + (("topic", "b"),)): 4}
    assert [r.labels[-1] for r in rows if r.name.endswith("lag_messages")] == [("topic", "a"), ("topic", "b")]
    idle = ConsumerMetrics(0, 0, 0, 0, 0, 0, 0)
    assert not [r for r in consumer_series(idle, "c1", "g") if "lag" in r.name]


def test_every_definition_is_a_counter_ending_in_total_or_a_gauge_not():
    for name, d in DEFINITIONS.items():
        assert name.startswith("rocketray_client_") and d.kind in ("counter", "gauge")
        assert name.endswith("_total") == (d.kind == "counter"), name


@pytest.mark.parametrize("rows, expected", [
    ([], []),
    ([Series("n", "counter", (("client_id", "a"),), 1), Series("n", "counter", (("client_id", "b"),), 2)],
     [Series("n", "counter", (("client_id", "a"),), 1), Series("n", "counter", (("client_id", "b"),), 2)]),
    ([Series("n", "gauge", (("client_id", "a"),), 1), Series("m", "gauge", (("client_id", "a"),), 5),
      Series("n", "gauge", (("client_id", "a"),), 2)],
     [Series("n", "gauge", (("client_id", "a"),), 3), Series("m", "gauge", (("client_id", "a"),), 5)]),
])
def test_merge_adds_rows_of_one_name_and_label_set(rows, expected):
    assert merge(rows) == expected


def test_prometheus_text_has_help_type_and_one_line_per_label_set():
    text = prometheus_text(producer_series(P, "p1")[:2] + producer_series(P, "p2")[:1])
    assert text == (
        "# HELP rocketray_client_producer_sent_total messages acknowledged (SEND_OK)\n"
        "# TYPE rocketray_client_producer_sent_total counter\n"
        'rocketray_client_producer_sent_total{client_id="p1"} 10\n'
        'rocketray_client_producer_sent_total{client_id="p2"} 10\n'
        "# HELP rocketray_client_producer_failed_total messages known not written (SendFailed)\n"
        "# TYPE rocketray_client_producer_failed_total counter\n"
        'rocketray_client_producer_failed_total{client_id="p1"} 1\n')
    assert prometheus_text([]) == ""


@pytest.mark.parametrize("client_id, rendered", [
    ('a"b', 'client_id="a\\"b"'),
    ("a\\b", 'client_id="a\\\\b"'),
    ("a\nb", 'client_id="a\\nb"'),
    ("host@1@ff", 'client_id="host@1@ff"'),
])
def test_prometheus_text_escapes_label_values(client_id, rendered):
    """A label value with a quote, backslash or newline cannot break the line or forge a label."""
    line = prometheus_text(producer_series(P, client_id)[:1]).splitlines()[2]
    assert line == "rocketray_client_producer_sent_total{" + rendered + "} 10"


def test_prometheus_text_sums_duplicate_label_sets_and_keeps_fractions():
    rows = [Series("rocketray_client_producer_pending_messages", "gauge", (("client_id", "x"),), v)
            for v in (1.5, 2)]
    assert prometheus_text(rows).splitlines()[2] == 'rocketray_client_producer_pending_messages{client_id="x"} 3.5'


SENT = "rocketray_client_producer_sent_total"
PENDING = "rocketray_client_producer_pending_messages"
LAG = "rocketray_client_consumer_lag_messages"
A = (("client_id", "a"),)
LAG_T = (("client_id", "c"), ("group", "g"), ("topic", "t"))


def counter(v: float) -> Series:
    return Series(SENT, "counter", A, v)


@pytest.mark.parametrize("samples, calls", [
    # a counter is increased by what it gained since the last sample; nothing when it did not move
    ([[counter(3)], [counter(3)], [counter(8)]], [[("inc", SENT, 3)], [], [("inc", SENT, 5)]]),
    # a counter at 0 sends nothing (Ray refuses inc(0))
    ([[counter(0)]], [[]]),
    # a counter that went down restarted: its new value is what it gained
    ([[counter(10)], [counter(4)]], [[("inc", SENT, 10)], [("inc", SENT, 4)]]),
    # a counter absent from one sample keeps its total: no double count when it comes back
    ([[counter(5)], [], [counter(7)]], [[("inc", SENT, 5)], [], [("inc", SENT, 2)]]),
    # a gauge is set every sample
    ([[Series(PENDING, "gauge", A, 4)], [Series(PENDING, "gauge", A, 4)]],
     [[("set", PENDING, 4)], [("set", PENDING, 4)]]),
    # a gauge whose label set is gone (a topic no longer owned) is set to 0 once, then forgotten
    ([[Series(LAG, "gauge", LAG_T, 9)], [], []], [[("set", LAG, 9)], [("set", LAG, 0)], []]),
    ([[Series(LAG, "gauge", LAG_T, 0)], []], [[("set", LAG, 0)], []]),
])
def test_ray_updates_turn_samples_into_inc_and_set_calls(samples, calls):
    last: dict = {}
    for rows, expected in zip(samples, calls):
        updates, last = ray_updates(last, rows)
        assert [(u.method, u.name, u.value) for u in updates] == expected
        for u in updates:
            assert set(u.tags) == set(DEFINITIONS[u.name].label_keys)
