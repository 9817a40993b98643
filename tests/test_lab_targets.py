"""mentor.lab.targets: the suite's targets of issue "Free in the loops readers run", on made-up intervals."""

from __future__ import annotations

import math

import pytest

from mentor.lab.stats import Interval
from mentor.lab.targets import AA_NARROW, HIGH, POINT, Target, targets_table

NARROW = Interval(0.0, -0.5, 0.5)  # exactly at the narrow limit on both sides
WIDE = Interval(0.3, -3.0, 3.6)


def test_the_limits_are_the_issues() -> None:
    assert (AA_NARROW, POINT, HIGH) == (0.5, 0.3, 0.5)


@pytest.mark.parametrize(("aa", "test"), [
    (NARROW, "narrow A/A"),
    (Interval(0.0, -0.51, 0.2), "wide A/A"),
    (Interval(0.0, -0.2, 0.51), "wide A/A"),
    (Interval(-0.1, -0.1, -0.01), "narrow A/A"),  # a narrow A/A that misses 0 is still narrow
])
def test_which_test_follows_the_aa_interval(aa: Interval, test: str) -> None:
    assert Target("loop", aa, Interval(0.1, 0.0, 0.2)).test == test


@pytest.mark.parametrize(("suite", "verdict"), [
    (Interval(0.3, 0.1, 0.5), "met"),  # both limits reached, not passed
    (Interval(0.31, 0.1, 0.5), "missed"),
    (Interval(0.3, 0.1, 0.51), "missed"),
    (Interval(-0.2, -0.4, 0.0), "met"),
])
def test_the_narrow_test_takes_the_estimate_and_the_upper_end(suite: Interval, verdict: str) -> None:
    assert Target("loop", NARROW, suite, host_share=5.0).verdict == verdict  # the host share plays no part


@pytest.mark.parametrize(("suite", "share", "reports", "verdict"), [
    (Interval(2.4, 0.3, 4.9), 0.3, True, "met"),
    (Interval(2.4, 0.31, 4.9), 0.1, True, "missed"),
    (Interval(2.4, 0.2, 4.9), 0.31, True, "missed"),
    (Interval(2.4, 0.2, 4.9), 0.8, False, "missed"),  # over the limit without reports: over it with them too
    (Interval(2.4, 0.2, 4.9), 0.2, False, "not shown"),  # under it without reports: the reports may add the rest
    (Interval(2.4, 0.2, 4.9), None, False, "not shown"),
    (Interval(9.6, 1.5, 19.0), None, False, "missed"),  # the lower end alone decides a miss
])
def test_the_wide_test_takes_the_lower_end_and_the_host_share(suite: Interval, share: float | None, reports: bool,
                                                             verdict: str) -> None:
    assert Target("loop", WIDE, suite, host_share=share, host_share_reports=reports).verdict == verdict


def test_said_gives_the_numbers_of_each_test() -> None:
    assert Target("a", NARROW, Interval(0.8, 0.3, 1.3)).said() == (
        "missed: +0.8 % [0.3, 1.3]: estimate 0.8 > 0.3 and upper end 1.3 > 0.5")
    assert Target("b", WIDE, Interval(2.4, 0.2, 4.9), host_share=0.8).said() == (
        "missed: +2.4 % [0.2, 4.9]: lower end 0.2 <= 0.3; host time 0.80 % of the step without reports > 0.3")
    assert Target("c", WIDE, Interval(-1.8, -10.9, 7.8)).said() == (
        "not shown: -1.8 % [-10.9, 7.8]: lower end -10.9 <= 0.3; no host time per step measured")
    assert Target("d", WIDE, Interval(1.0, 0.1, 2.0), host_share=0.25, host_share_reports=True).said() == (
        "met: +1.0 % [0.1, 2.0]: lower end 0.1 <= 0.3; host time 0.25 % of the step <= 0.3")


def test_bad_input_is_refused_by_name() -> None:
    one_round = Interval(1.0, math.nan, math.nan)
    with pytest.raises(ValueError, match=r"Target\.aa must be an Interval with its two ends"):
        Target("a", one_round, Interval(0.1, 0.0, 0.2))
    with pytest.raises(ValueError, match=r"Target\.suite must be an Interval"):
        Target("a", NARROW, (0.1, 0.0, 0.2))  # type: ignore[arg-type]
    for share in (-0.1, math.nan):
        with pytest.raises(ValueError, match=r"Target\.host_share must be a share in %"):
            Target("a", NARROW, Interval(0.1, 0.0, 0.2), host_share=share)
    with pytest.raises(ValueError, match="at least one Target"):
        targets_table([])


def test_the_table_aligns_its_columns_and_ends_with_the_verdict() -> None:
    table = targets_table([Target("eager fp32 b128", Interval(0.0, -0.01, 0.01), Interval(0.1, 0.04, 0.1), 0.29),
                           Target("Lightning bf16 b32", Interval(4.7, -4.0, 16.2), Interval(9.6, 1.5, 19.0))])
    assert table.splitlines() == [
        "loop                A/A                   A/A is  suite               host / step  target",
        "eager fp32 b128     +0.0 % [-0.01, 0.01]  narrow  +0.1 % [0.04, 0.1]  0.29 %       met",
        "Lightning bf16 b32  +4.7 % [-4.0, 16.2]   wide    +9.6 % [1.5, 19.0]  not timed    missed",
    ]
