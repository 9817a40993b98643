"""mentor.lab.stats: Interval, Result and paired_overhead (the paired bootstrap over rounds), on hand-made step times
whose overheads and intervals can be worked out by hand."""

import math

import numpy as np
import pytest

from exact import whole
from mentor.lab.stats import RESAMPLES, Interval, Result, drift, paired_overhead


# ----------------------------------------------------------------------------------------------------------
# Interval


def test_interval_str():
    assert str(Interval(7.0, 6.1, 8.0)) == "+7.0 % [6.1, 8.0]"
    assert str(Interval(-2.345, -3.0, -1.25)) == "-2.3 % [-3.0, -1.2]"
    assert str(Interval(0.0, -0.04, 0.04)) == "+0.0 % [-0.04, 0.04]"  # not "[-0.0, 0.0]": each end shows its side
    assert Interval(7.0, 6.1, 8.0).fmt(2) == "+7.00 % [6.10, 8.00]"
    assert Interval(12.5, 6.1, 18.0).fmt(0) == "+12 % [6, 18]"
    assert str(Interval(7.0, math.nan, math.nan)) == "+7.0 % [one round: no interval]"
    assert Interval(7.0, 6.1, 8.0).level == 0.95


@pytest.mark.parametrize("args,error,message", [
    ((1.0, 2.0, 1.0), ValueError, r"Interval needs lo <= hi, got lo=2.0, hi=1.0"),
    ((1.0, math.nan, 1.0), ValueError, "lo and hi must both be numbers or both NaN"),
    ((math.nan, 0.0, 1.0), ValueError, "Interval.point must be finite"),
    ((1.0, 0.0, 2.0, 95), ValueError, r"level must be between 0 and 1 \(0.95 for 95 %\), got 95"),
    (("1", 0.0, 2.0), TypeError, "Interval.point must be a number, got '1'"),
])
def test_interval_rejects_bad_values(args, error, message):
    with pytest.raises(error, match=message):
        Interval(*args)
    with pytest.raises(ValueError, match="digits must be an int >= 0, got -1"):
        Interval(1.0, 0.0, 2.0).fmt(-1)


@pytest.mark.parametrize("level", [0, 1, 1.5])
def test_interval_level_must_lie_strictly_between_0_and_1(level):
    message = f"Interval.level must be between 0 and 1 (0.95 for 95 %), got {level!r}."
    with pytest.raises(ValueError, match=whole(message)):
        Interval(1.0, 0.0, 2.0, level)


def test_interval_fmt_defaults_to_one_decimal_and_refuses_fractional_digits():
    assert Interval(7.0, 6.1, 8.0).fmt() == "+7.0 % [6.1, 8.0]"
    for digits in (1.5, True):
        with pytest.raises(ValueError, match=whole(f"digits must be an int >= 0, got {digits!r}.")):
            Interval(7.0, 6.1, 8.0).fmt(digits)


# ----------------------------------------------------------------------------------------------------------
# Result


def result(name, rounds, report_steps=(), syncs=None, report_syncs=None, note=None):
    return Result(name, f"{name} config", [list(r) for r in rounds], list(report_steps), syncs, report_syncs, note)


def test_result_compat_properties():
    r = result("x", [[3.0, 1.0, 2.0], [10.0, 20.0]])
    assert r.step_ms == [3.0, 1.0, 2.0, 10.0, 20.0]
    assert r.round_medians_ms == [2.0, 15.0]
    assert r.spread_ms == (2.0, 15.0)
    assert r.median_ms == 3.0  # over every step, not over rounds
    assert r.total_ms == [6.0, 30.0]


@pytest.mark.parametrize("rounds,report_steps,message", [
    ([[1.0, math.nan]], [], r"Result 'x': step 1 of round 0 is nan; step times must be finite positive"),
    ([[1.0], [0.0]], [], "step 0 of round 1 is 0.0; step times must be finite positive milliseconds"),
    ([[1.0], [-2.0]], [], "step 0 of round 1 is -2.0"),
    ([[1.0, math.inf]], [], "step 1 of round 0 is inf"),
    ([], [], "round_step_ms must be a non-empty list of rounds"),
    ([[1.0], []], [], "round 1 of round_step_ms must be a non-empty list of step times"),
    ([1.0, 2.0], [], "round 0 of round_step_ms must be a non-empty list of step times in ms, got 1.0"),
    ([[1.0, 2.0]], [2], r"report_steps must be increasing step positions in 0..1, got \[2\]; report_positions"),
    ([[1.0, 2.0]], [1, 0], "report_steps must be increasing step positions"),
])
def test_result_rejects_bad_input(rounds, report_steps, message):
    with pytest.raises(ValueError, match=message):
        Result("x", "", rounds, report_steps)


def test_result_rejects_bad_syncs():
    with pytest.raises(ValueError, match=r"syncs_per_step must be a number >= 0 or None \(not counted\), got -1"):
        Result("x", "", [[1.0]], syncs_per_step=-1)
    with pytest.raises(ValueError, match="report_syncs must be a number >= 0 or None"):
        Result("x", "", [[1.0]], report_syncs=math.nan)


@pytest.mark.parametrize("kwargs,message", [
    (dict(syncs_per_step="3"), "Result 'x': syncs_per_step must be a number >= 0 or None (not counted), got '3'."),
    (dict(report_syncs=True), "Result 'x': report_syncs must be a number >= 0 or None (not counted), got True."),
    (dict(report_steps=[0.0]), "Result 'x': report_steps must be increasing step positions in 0..1, got [0.0]; "
                               "report_positions(warmup, steps, report_every) gives them."),
    (dict(report_steps=[True]), "Result 'x': report_steps must be increasing step positions in 0..1, got [True]; "
                                "report_positions(warmup, steps, report_every) gives them."),
])
def test_result_refuses_non_numbers_with_the_whole_message(kwargs, message):
    with pytest.raises(ValueError, match=whole(message)):
        Result("x", "", [[1.0, 2.0]], **kwargs)


@pytest.mark.parametrize("name,rounds,message", [
    (3, [[1.0]], "Result name must be a non-empty string, got 3."),
    ("x", 5, "Result 'x': round_step_ms must be a non-empty list of rounds, each a list of step times in ms, got 5."),
    ("x", "ab", "Result 'x': round_step_ms must be a non-empty list of rounds, each a list of step times in ms, "
                "got 'ab'."),
])
def test_result_refuses_bad_names_and_rounds_with_the_whole_message(name, rounds, message):
    with pytest.raises(ValueError, match=whole(message)):
        Result(name, "", rounds)


@pytest.mark.parametrize("rounds,message", [
    ([[1.0], [True]], "Result 'x': step 0 of round 1 is True; step times must be finite positive milliseconds."),
    ([[1.0, "2"]], "Result 'x': step 1 of round 0 is '2'; step times must be finite positive milliseconds."),
    ([[float("inf")]], "Result 'x': step 0 of round 0 is inf; step times must be finite positive milliseconds."),
    ([[0.0]], "Result 'x': step 0 of round 0 is 0.0; step times must be finite positive milliseconds."),
])
def test_result_refuses_bad_step_times_with_the_whole_message(rounds, message):
    # a bool is a number to Python (True == 1) but not a step time; a string is refused before math.isfinite sees it
    with pytest.raises(ValueError, match=whole(message)):
        Result("x", "", rounds)


# ----------------------------------------------------------------------------------------------------------
# paired_overhead: the bootstrap


def documented_bootstrap(a, b, kind, level, seed):
    """The interval as paired_overhead's docstring describes it, computed here step by step."""
    rng = np.random.default_rng(seed)
    n = len(a)
    idx = rng.integers(0, n, size=(RESAMPLES, n))
    ratios = []
    for row in idx:
        if kind == "median":
            pooled_a, pooled_b = np.concatenate([a[i] for i in row]), np.concatenate([b[i] for i in row])
            ratios.append(np.median(pooled_a) / np.median(pooled_b))
        else:
            ratios.append(sum(math.fsum(a[i]) for i in row) / sum(math.fsum(b[i]) for i in row))
    return tuple(np.quantile((np.array(ratios) - 1) * 100, [(1 - level) / 2, (1 + level) / 2]))


@pytest.mark.parametrize("kind", ["median", "throughput"])
@pytest.mark.parametrize("level", [0.95, 0.5])
def test_interval_is_the_documented_percentile_bootstrap(kind, level):
    # eight rounds, each with its own overhead: the quantiles fall between different resample values
    base = [[10.0, 10.0, 10.0]] * 8
    cfg = [[10.0 * f, 10.0 * f, 10.0 * f + 20.0 * k % 7] for k, f in enumerate([1.0, 1.02, 1.05, 1.1, 1.13, 1.2,
                                                                                    1.3, 1.41])]
    iv = paired_overhead(cfg, base, kind, level, seed=5)
    assert (iv.lo, iv.hi) == pytest.approx(documented_bootstrap(cfg, base, kind, level, 5), abs=1e-9)
    assert iv.level == level


def test_median_interval_resamples_pooled_step_medians_not_totals():
    # one long report step per round: the median step is 10 % slower in every round, the total time 110 %
    base = [[10.0, 10.0, 10.0, 10.0]] * 3
    cfg = [[11.0, 11.0, 11.0, 51.0]] * 3
    iv = paired_overhead(cfg, base, "median")
    assert (iv.point, iv.lo, iv.hi) == pytest.approx((10.0, 10.0, 10.0))


@pytest.mark.parametrize("cfg_rounds", [
    [[11.0], [11.0, 11.0]],               # two lengths (1 and 2 steps)
    [[11.0], [11.0, 11.0], [11.0] * 3],   # three lengths
])
def test_overhead_of_rounds_of_different_lengths(cfg_rounds):
    base = [[10.0] * len(r) for r in cfg_rounds]
    iv = paired_overhead(cfg_rounds, base)  # every pooled median is 11 over 10, whatever rounds a resample draws
    assert (iv.point, iv.lo, iv.hi) == pytest.approx((10.0, 10.0, 10.0))


# Two rounds: a resample draws rounds (0, 0), one of each or (1, 1), with probabilities 1/4, 1/2 and 1/4. Against
# 10 ms steps the pooled median step is 12 ms, 12.5 ms or 26 ms (+20, +25, +160 %), the total time 48, 76 or 104 ms
# over 40 ms (+20, +90, +160 %).
SLOW = [[11.0, 13.0], [12.0, 40.0]]
FLAT = [[10.0, 10.0], [10.0, 10.0]]


@pytest.mark.parametrize("kind, level, expected", [
    ("median", 0.95, (25.0, 20.0, 160.0)),
    ("throughput", 0.95, (90.0, 20.0, 160.0)),
    # the 30 % and 70 % quantiles both fall among the draws of one round each
    ("median", 0.4, (25.0, 25.0, 25.0)),
    ("throughput", 0.4, (90.0, 90.0, 90.0)),
])
def test_paired_overhead_pins_the_point_and_the_percentile_interval(kind, level, expected):
    iv = paired_overhead(SLOW, FLAT, kind, level)
    assert (iv.point, iv.lo, iv.hi) == pytest.approx(expected, abs=1e-9)
    assert iv.level == level


def test_paired_overhead_defaults_to_the_median_a_95_percent_interval_and_seed_0():
    assert paired_overhead(SLOW, FLAT) == paired_overhead(SLOW, FLAT, "median", 0.95, 0)
    assert paired_overhead(SLOW, FLAT).level == 0.95


def test_paired_overhead_takes_the_same_rounds_of_both_sides():
    # round k of base ran next to round k of rounds: a drift of +-20 % that hits both cancels in every resample
    drift = [1.0, 1.2, 0.8, 1.15, 0.85]
    base = [[10.0 * d, 10.5 * d] for d in drift]
    slower = [[1.05 * t for t in steps] for steps in base]
    for kind in ("median", "throughput"):
        iv = paired_overhead(slower, base, kind)
        assert (iv.point, iv.lo, iv.hi) == pytest.approx((5.0, 5.0, 5.0), abs=1e-9)


def test_paired_overhead_draws_its_resamples_from_the_seed():
    noisy = [[10.0 * f] for f in (1.02, 1.07, 0.99, 1.05, 1.03, 1.11)]
    base = [[10.0]] * 6
    a, again, other = (paired_overhead(noisy, base, "throughput", seed=s) for s in (0, 0, 7))
    assert a == again  # reproducible
    assert a.point == other.point and (a.lo, a.hi) != (other.lo, other.hi)  # the seed drives the draws only


def test_paired_overhead_of_one_round_is_a_point_without_an_interval():
    iv = paired_overhead([[11.0, 13.0]], [[10.0, 10.0]], level=0.9)
    assert iv.point == pytest.approx(20.0) and iv.level == 0.9  # pooled medians 12 over 10
    assert math.isnan(iv.lo) and math.isnan(iv.hi) and not iv.has_interval
    tput = paired_overhead(((11, 22),), ((10, 20),), "throughput")  # any sequences of numbers
    assert tput.point == pytest.approx(10.0) and not tput.has_interval


@pytest.mark.parametrize("rounds, base, kwargs, message", [
    (SLOW, FLAT, dict(kind="mean"), "unknown kind 'mean': pass one of ['median', 'throughput']."),
    (SLOW, FLAT, dict(level=1), "level must be a number between 0 and 1 (0.95 for 95 %), got 1."),
    (SLOW, FLAT, dict(level=True), "level must be a number between 0 and 1 (0.95 for 95 %), got True."),
    (SLOW, FLAT, dict(seed=1.5), "seed must be an int (it seeds the bootstrap), got 1.5."),
    (SLOW, FLAT, dict(seed=True), "seed must be an int (it seeds the bootstrap), got True."),
    (SLOW, FLAT[:1], {}, "rounds has 2 rounds and base 1: the bootstrap pairs round k of one with round k of the "
                         "other, so pass rounds of the same run."),
    ([[1.0], [-2.0]], FLAT, {}, "paired_overhead: step 0 of round 1 of rounds is -2.0; step times must be finite "
                                "positive milliseconds."),
    (SLOW, [], {}, "paired_overhead: base must be a non-empty list of rounds, each a list of step times in ms, "
                   "got []."),
    (SLOW, [[1.0], []], {}, "paired_overhead: round 1 of base must be a non-empty list of step times in ms, got []."),
])
def test_paired_overhead_refuses_bad_input_with_the_whole_message(rounds, base, kwargs, message):
    with pytest.raises(ValueError, match=whole(message)):
        paired_overhead(rounds, base, **kwargs)


# ----------------------------------------------------------------------------------------------------------
# drift


def test_drift_means_whole_windows_only():
    assert drift([1.0, 3.0, 2.0, 6.0, 9.0], window=2) == [2.0, 4.0]
    assert drift([5.0, 7.0], window=2) == [6.0]
    with pytest.raises(ValueError) as err:
        drift([1.0, 2.0], window=3)
    assert str(err.value) == "step_ms has 2 steps, fewer than one window of 3: pass more steps or a smaller window."
    with pytest.raises(ValueError) as err:
        drift([1.0], window=0)
    assert str(err.value) == "window must be an int >= 1, got 0."


def test_drift_default_window_is_50():
    # 50 ones, 50 threes, then 49 sevens (a partial window, dropped)
    assert drift([1.0] * 50 + [3.0] * 50 + [7.0] * 49) == [1.0, 3.0]


def test_drift_averages_in_float64():
    # float32 input: 2**24 + 1 rounds to 2**24 in float32 (ties to even), so a float32 mean would be 2**23
    assert drift(np.array([2.0 ** 24, 1.0], dtype=np.float32), window=2) == [(2 ** 24 + 1) / 2]


# --- printed numbers show their side of 0 (issue 51) ---

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mentor.lab.stats import number  # noqa: E402


def test_numbers_that_would_print_as_zero_get_the_decimals_that_show_their_sign() -> None:
    assert [number(v) for v in (0.009, -0.04, 0.045, -0.0004, 0.0, -0.0, 12.34)] == [
        "0.01", "-0.04", "0.04", "-0.0004", "0.0", "0.0", "12.3"]
    assert number(0.026, sign=True) == "+0.03" and number(0.0, sign=True) == "+0.0"
    assert str(Interval(0.027, 0.009, 0.045)) == "+0.03 % [0.01, 0.04]"  # chapter 8's "+0.0 [0.0, 0.0]" row
    assert Interval(5.1, 0.0226, 11.3).fmt(1) == "+5.1 % [0.02, 11.3]"  # chapter 16's "[0.0, 11.3]"
    assert Interval(-0.02, -0.04, 0.01).cell(1) == "-0.02 [-0.04, 0.01]"
    with pytest.raises(ValueError, match="digits must be an int >= 0, got -1"):
        number(1.0, -1)


@given(st.floats(-1e3, 1e3, allow_nan=False).filter(lambda v: v == 0 or abs(v) > 1e-12), st.integers(0, 3))
def test_a_printed_number_has_the_sign_of_the_number(value: float, digits: int) -> None:
    printed = float(number(value, digits))
    assert (printed > 0) == (value > 0) and (printed < 0) == (value < 0)
