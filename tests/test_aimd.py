"""The throttle's pure parts: judging signals, the AIMD controller, parsing, pacing."""

from __future__ import annotations

import io

import pytest

from schemaless.cleaner.aimd import Aimd, Breach, Limits, ServerSignals, Tuning, judge
from schemaless.cleaner.canary import Canary, Sample
from schemaless.cleaner.metrics import held_text
from schemaless.cleaner.progress import Progress
from schemaless.cleaner.throttle import TokenBucket
from schemaless.cleaner.throttler import parse_load
from schemaless.latency import LatencySample, p99, percentile, summarise

LIMITS = Limits(
    canary_ms={0: 3.0, 1: 3.0},
    clients_ms={1: 10.0},
    max_load={"Threads_running": 25},
    critical_load={"Threads_running": 50},
    max_lag=5.0,
    quantile=0.9,
)
SLOW = [Breach("server 1 p99 4.1 ms > 3.0 ms")]


def test_judge_names_each_signal_over_its_limit() -> None:
    quiet = ServerSignals(0, canary_ms=1.0, status={"threads_running": 3}, lag=0.5)
    assert judge([quiet], LIMITS) == []
    busy = ServerSignals(1, canary_ms=4.1, clients_ms=12.5, status={"threads_running": 52}, lag=7.0)
    assert [b.text for b in judge([quiet, busy], LIMITS)] == [
        "server 1 Threads_running 52 >= 50",  # critical first
        "server 1 p90 4.1 ms > 3.0 ms",
        "server 1 clients' p99 12.5 ms > 10.0 ms",
        "server 1 Threads_running 52 >= 25",
        "server 1 replica lag 7.0 s > 5 s",
    ]
    assert [b.critical for b in judge([busy], LIMITS)][:2] == [True, False]
    kinds = [b.kind for b in judge([busy], LIMITS)]
    assert kinds == ["paused", "canary", "clients", "load", "lag"]


def test_held_text_names_what_held_the_copy_back() -> None:
    assert held_text({}) == "" and held_text({"throttled_canary_s": 0.01}) == ""
    figures = {"throttled_canary_s": 25.04, "throttled_clients_s": 6.2, "throttled_lag_s": 0}
    assert held_text(figures) == "throttled 31.2s (canary 25.0s, clients' p99 6.2s)"
    assert held_text({"throttled_paused_s": 2.0}) == "throttled 2.0s (paused 2.0s)"


def test_judge_ignores_what_is_unknown() -> None:
    assert judge([ServerSignals(2, canary_ms=99.0, clients_ms=99.0)], LIMITS) == []
    assert judge([ServerSignals(0)], LIMITS) == []


#: no slow start, halving on a breach, +5 % of the peak a second: the mechanics
CLASSIC = Tuning(start=None, decrease=0.5, increase=0.05)


def test_aimd_starts_slow_and_ramps_until_the_first_breach() -> None:
    aimd = Aimd(tuning=Tuning(start=1_000.0, ramp=2.0, decrease=0.5, increase=0.05))
    assert aimd.rate == 1_000.0
    aimd.update(0.0, 1_000.0, [])
    aimd.update(1.0, 1_000.0, [])
    assert aimd.rate == 2_000.0  # doubles a second while the copy uses it
    aimd.update(2.0, 1_500.0, [])
    assert aimd.rate == 4_000.0
    aimd.update(3.0, 4_000.0, SLOW)
    assert aimd.rate == 2_000.0
    aimd.update(4.0, 2_000.0, [])  # after a breach: additive, 5 % of the peak a second
    assert aimd.rate == 2_200.0


def test_aimd_slow_start_counts_the_observed_rate_as_lagging_its_limit() -> None:
    # the observed rate is an average over a window: a copy that follows a limit
    # doubling a second shows about half of it, and must not stall the ramp; a copy
    # that cannot go faster stops it within ramp**lag / binding of its rate
    aimd = Aimd(tuning=Tuning(start=1_000.0, ramp=2.0, lag=1.0, binding=0.7))
    aimd.update(0.0, 0.0, [])
    now = 0.0
    for _ in range(8):
        now += 0.25
        aimd.update(now, 0.55 * (aimd.rate or 0.0), [])
    assert aimd.rate == pytest.approx(4_000.0)
    for _ in range(40):
        now += 0.25
        aimd.update(now, 4_000.0, [])
    rate = aimd.rate or 0.0
    assert 2 * 4_000.0 / 0.7 <= rate <= 2 * 4_000.0 / 0.7 * 2**0.25
    aimd.update(now + 0.25, 4_000.0, [])
    assert aimd.rate == rate  # no longer used: it holds


def test_aimd_starts_slowly_again_after_a_cut_below_its_first_rate() -> None:
    # a breach while the copy is barely running (something else is slow): the cut takes
    # the limit below the first rate, and once clear it ramps as at the start instead
    # of adding 10 % of a peak the copy never reached
    aimd = Aimd(tuning=Tuning(start=1_000.0, ramp=2.0, decrease=0.5, increase=0.1))
    aimd.update(0.0, 1_000.0, [])
    aimd.update(1.0, 1_000.0, SLOW)
    assert aimd.rate == 500.0
    aimd.update(2.0, 500.0, [])
    aimd.update(3.0, 1_000.0, [])
    assert aimd.rate == 2_000.0 and aimd.reason.startswith("recovering (last: ")
    aimd.update(4.0, 2_000.0, [])
    assert aimd.rate == 4_000.0
    aimd.update(5.0, 4_000.0, SLOW)  # a cut that stays above the first rate: additive
    assert aimd.rate == 2_000.0
    aimd.update(6.0, 2_000.0, [])
    assert aimd.rate == 2_400.0  # + 10 % of the peak (4,000)


def test_aimd_slow_start_holds_before_the_copy_begins() -> None:
    # the first steps come before the first batch (nothing reserved yet): the slow
    # start's limit must not be lifted as one the copy does not use
    aimd = Aimd(tuning=Tuning(start=5_000.0, ramp=1.5))
    for now in (0.0, 0.25, 0.5, 1.0):
        aimd.update(now, 0.0, [])
        assert aimd.rate == 5_000.0 and aimd.reason == "starting slowly"
    aimd.update(2.0, 4_000.0, [])
    assert aimd.rate == 5_000.0 * 1.5


def test_aimd_is_free_until_a_breach_then_halves_the_achieved_rate() -> None:
    aimd = Aimd(tuning=CLASSIC)
    aimd.update(0.0, 10_000.0, [])
    assert aimd.rate is None and aimd.reason == ""
    aimd.update(0.25, 8_000.0, SLOW)
    assert aimd.rate == 4_000.0
    assert aimd.reason == "throttled: server 1 p99 4.1 ms > 3.0 ms"
    aimd.update(0.5, 4_000.0, SLOW)  # within the cooldown: no second decrease
    assert aimd.rate == 4_000.0
    aimd.update(2.5, 4_000.0, SLOW)
    assert aimd.rate == 2_000.0


def test_aimd_counts_a_breach_once_its_evidence_is_newer_than_the_decrease() -> None:
    aimd = Aimd(tuning=Tuning(start=None, decrease=0.5, cooldown=0.0))
    aimd.update(0.0, 10_000.0, [])
    aimd.update(1.0, 10_000.0, [Breach("server 1 clients' p99 9 ms > 8 ms", since=0.5)])
    assert aimd.rate == 5_000.0
    # the same report (first seen at 0.5) read again: it shows the rate before the cut
    for now in (1.25, 1.5, 3.0):
        aimd.update(now, 5_000.0, [Breach("server 1 clients' p99 9 ms > 8 ms", since=0.5)])
        assert aimd.rate == 5_000.0  # held: neither cut again nor raised
        assert aimd.reason == "throttled: server 1 clients' p99 9 ms > 8 ms"
    # a canary window that began before the cut, beside a report seen after it
    stale = Breach("server 0 p90 9 ms > 8 ms", since=0.0)
    fresh = Breach("server 1 clients' p99 9 ms > 8 ms", since=3.5)
    aimd.update(3.6, 5_000.0, [stale, fresh])
    assert aimd.rate == 2_500.0
    assert aimd.reason == "throttled: server 1 clients' p99 9 ms > 8 ms"  # the fresh one
    aimd.update(3.7, 2_500.0, [Breach("server 0 Threads_running 30 >= 25")])  # a reading
    assert aimd.rate == 1_250.0  # of now: always fresh


def test_aimd_cuts_in_proportion_to_how_far_a_signal_is_over() -> None:
    tuning = Tuning(start=None, cooldown=0.0, deepest=0.5, gentlest=0.9)
    cuts = {}
    for over in (1.01, 1.25, 3.0, None):
        aimd = Aimd(tuning=tuning)
        aimd.update(0.0, 10_000.0, [])
        aimd.update(1.0, 10_000.0, [Breach("x", over=over)])
        cuts[over] = aimd.rate
    assert cuts == {1.01: 9_000.0, 1.25: 8_000.0, 3.0: 5_000.0, None: 7_000.0}
    aimd = Aimd(tuning=tuning)  # the worst breach decides
    aimd.update(0.0, 10_000.0, [])
    aimd.update(1.0, 10_000.0, [Breach("a", over=1.01), Breach("b", over=1.6)])
    assert aimd.rate == 6_250.0
    assert [b.over for b in judge([ServerSignals(1, canary_ms=6.0)], LIMITS)] == [2.0]


def test_aimd_climbs_while_clear_and_lifts_the_limit() -> None:
    aimd = Aimd(tuning=Tuning(start=None, decrease=0.5, increase=0.1))
    aimd.update(0.0, 10_000.0, [])
    aimd.update(1.0, 10_000.0, SLOW)
    assert aimd.rate == 5_000.0
    aimd.update(2.0, 5_000.0, [])  # +10 % of the peak per second
    assert aimd.rate == 6_000.0
    assert aimd.reason == "recovering (last: server 1 p99 4.1 ms > 3.0 ms)"
    aimd.update(3.0, 1_000.0, [])  # the copy does not use its limit: no growth
    assert aimd.rate == 6_000.0
    now = 3.0
    while aimd.rate is not None:  # the copy's own speed is 10,000 rows/s
        now += 1.0
        aimd.update(now, min(aimd.rate, 10_000.0), [])
    assert now == 3.0 + 9  # 15,000 rows/s: well above what the copy uses, lifted
    assert aimd.reason == "" and aimd.peak == 10_000.0


def test_aimd_never_goes_below_its_floor() -> None:
    aimd = Aimd(tuning=Tuning(start=None, decrease=0.5, cooldown=0.0))
    aimd.update(0.0, 10_000.0, [])
    for step in range(1, 20):
        aimd.update(float(step), aimd.rate or 10_000.0, SLOW)
    assert aimd.rate == 200.0  # 2 % of the peak


def test_aimd_pauses_on_critical_load_and_resumes_slower() -> None:
    aimd = Aimd(tuning=CLASSIC)
    aimd.update(0.0, 10_000.0, [])
    critical = [Breach("server 0 Threads_running 52 >= 50", critical=True), *SLOW]
    aimd.update(1.0, 10_000.0, critical)
    assert aimd.paused and aimd.rate == 0.0
    assert aimd.reason == "paused: server 0 Threads_running 52 >= 50"
    aimd.update(5.0, 0.0, critical)
    assert aimd.rate == 0.0
    aimd.update(6.0, 0.0, [])
    assert not aimd.paused and aimd.rate == 5_000.0
    assert aimd.peak == 10_000.0  # a pause is not a slower copy


def test_aimd_rate_is_capped() -> None:
    aimd = Aimd(cap=3_000.0, tuning=CLASSIC)
    aimd.update(0.0, 3_000.0, [])
    assert aimd.rate == 3_000.0 and aimd.reason == "capped by --rate"
    aimd.update(1.0, 3_000.0, SLOW)
    assert aimd.rate == 1_500.0


def test_aimd_has_nothing_to_slow_before_rows_flow() -> None:
    aimd = Aimd(tuning=CLASSIC)
    aimd.update(0.0, 0.0, SLOW)
    assert aimd.rate is None and aimd.reason.startswith("throttled: ")


def test_parse_load() -> None:
    assert parse_load("Threads_running=25") == {"Threads_running": 25}
    assert parse_load("Threads_running=5, Threads_connected=300") == {
        "Threads_running": 5,
        "Threads_connected": 300,
    }
    assert parse_load("") == {}
    for bad in ["Threads_running", "Threads_running=0", "x=-1", "a`b=3", "T=1e3", "T=5;DROP"]:
        with pytest.raises(ValueError, match="STATUS_VARIABLE=N"):
            parse_load(bad)


def test_token_bucket_rate_changes_from_now_on() -> None:
    now = [0.0]
    bucket = TokenBucket(100.0, burst=100.0, clock=lambda: now[0])
    assert bucket.reserve(100) == 0.0
    bucket.set_rate(10.0)
    assert bucket.reserve(10) == pytest.approx(1.0)
    now[0] = 2.0
    bucket.set_rate(1000.0)  # the 2 s at 10/s paid the debt and earned 10
    assert bucket.reserve(10) == 0.0
    with pytest.raises(ValueError):
        bucket.set_rate(0)


def _paced_rate(burst: float, rate: float = 50_000.0) -> float:
    """Rows/s of a copy paced by a bucket: rounds of 500 rows (250 per server, two
    servers), each paid before it is sent, whose work takes 8 ms."""
    now = [0.0]
    bucket = TokenBucket(rate, burst=burst, clock=lambda: now[0])
    for _ in range(1000):
        now[0] += bucket.reserve(500) + 0.008
    return 500 * 1000 / now[0]


def test_a_bucket_must_hold_a_round_or_the_copy_runs_below_its_limit() -> None:
    # why the throttler's bucket holds a whole batch, not one server's burst: a
    # bucket smaller than a round forfeits the tokens earned while a round works
    assert _paced_rate(burst=2000) == pytest.approx(50_000.0, rel=0.01)
    assert _paced_rate(burst=250) < 40_000.0


def test_latency_sample_and_summary() -> None:
    assert p99([]) == 0.0
    assert p99(float(i) for i in range(1, 101)) == 99.0
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    sample = LatencySample()
    for i in range(600):
        sample.record(i / 1000)
    taken = sample.take()
    assert len(taken) == 512 and taken[-1] == 0.599  # bounded: the latest
    assert sample.take() == []
    report = summarise({"a:1": taken, "b:2": [0.001] * 3})
    assert report == {"a:1": {"p99_ms": 594.0, "n": 512}}  # too few samples on b


def test_the_progress_line_ends_with_the_throttle_note() -> None:
    out = io.StringIO()
    progress = Progress(out, tty=True, clock=lambda: 2.0)
    progress.update("by_link", 100, force=True)
    assert out.getvalue().endswith("by_link: 100 rows, 0 rows/s")
    progress.note = lambda: "limit 5,000 rows/s, throttled: server 1 p99 4.1 ms > 3.0 ms"
    progress.update("by_link", 200, force=True)
    assert (
        out.getvalue()
        .rstrip()
        .endswith("rows/s | limit 5,000 rows/s, throttled: server 1 p99 4.1 ms > 3.0 ms")
    )


def test_a_canary_window_of_a_few_probes_shows_only_a_stall() -> None:
    canary = Canary(None, "db", "c")  # type: ignore[arg-type]  # no probe is sent here
    assert canary.latency_ms(10.0, 4.0, 0.9, least=3, stall=0.02) is None
    canary.record(Sample(9.0, 9.05))  # one slow probe (a connect, a hiccup)
    canary.record(Sample(9.5, 9.501))
    assert canary.latency_ms(10.0, 4.0, 0.9, least=3, stall=0.02) is None  # not a p90 yet
    canary.began(9.99)
    assert canary.latency_ms(10.0, 4.0, 0.9, least=4, stall=0.02) is None  # 10 ms: no stall
    assert canary.latency_ms(10.0, 4.0, 0.9, least=4) is None  # no stall given: none
    assert canary.latency_ms(10.05, 4.0, 0.9, least=4, stall=0.02) == pytest.approx(60.0)
    for i in range(10):
        canary.record(Sample(9.9 + i / 100, 9.902 + i / 100))
    p90 = canary.latency_ms(10.0, 4.0, 0.9, least=3)
    assert p90 is not None and p90 < 10.0  # twelve probes: their p90, not the slow one


def test_one_slow_probe_alone_is_no_breach_however_few_the_probes() -> None:
    """A p90 (nearest rank) of nine probes or fewer is their slowest: the signal is at
    most the second slowest, as it is in a full window of sixteen."""
    canary = Canary(None, "db", "c")  # type: ignore[arg-type]
    for i in range(5):
        canary.record(Sample(9.0 + i / 10, 9.001 + i / 10))
    canary.record(Sample(9.6, 9.65))  # 50 ms
    assert canary.latency_ms(10.0, 4.0, 0.9) == pytest.approx(1.0)
    canary.record(Sample(9.7, 9.73))  # a second one: 30 ms
    assert canary.latency_ms(10.0, 4.0, 0.9) == pytest.approx(30.0)
    canary.began(9.95)  # in flight for 50 ms: a sample like the others
    assert canary.latency_ms(10.0, 4.0, 0.9) == pytest.approx(50.0)
    # a probe in flight past the stall threshold counts alone, at its age
    assert canary.latency_ms(10.2, 4.0, 0.9, stall=0.2) == pytest.approx(250.0)


def test_limits_read_as_one_line() -> None:
    limits = Limits({1: 15, 0: 12.34}, {}, {"Threads_running": 25}, {}, 5.0, 0.99)
    assert str(limits) == (
        "canary p99 at most 12.3 ms on server 0, 15.0 ms on server 1; clients' p99 at most "
        "n/a (no reports); load at most Threads_running 25; critical load n/a; "
        "replica lag at most 5 s"
    )
