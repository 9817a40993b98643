"""mentor.lab.across_runs on hand-made sweeps whose overheads are exact: spreads, orders, swaps, A/A misses."""

from __future__ import annotations

from pathlib import Path

import pytest

from mentor.lab.across_runs import aa_misses, load_runs, lowest_in, order_held, order_swaps, spread
from mentor.lab.comparison import Comparison, save_sweep
from mentor.lab.stats import Result


def _cmp(**ms: float) -> Comparison:
    """Baseline "base" at 10 ms in each of 4 rounds; each other configuration at its given ms in every round."""
    results = [Result("base", "", [[10.0]] * 4)] + [Result(name, "", [[value]] * 4) for name, value in ms.items()]
    return Comparison(results, "base", 32)


def _aa(steps: list[float]) -> Comparison:
    """The baseline at 10 ms and its repeat "again" at the given ms, one per round."""
    return Comparison([Result("base", "", [[10.0]] * 4), Result("again", "", [[s] for s in steps])], "base", 32)


# overheads in %: run one a=10, b=20, c=30 at p and a=5, b=1 at q; run two a=25, b=20, c=30 at p, a=5, b=2 at q
RUNS = {"one": {"p": _cmp(a=11.0, b=12.0, c=13.0), "q": _cmp(a=10.5, b=10.1, c=12.0)},
        "two": {"p": _cmp(a=12.5, b=12.0, c=13.0), "q": _cmp(a=10.5, b=10.2, c=12.0)}}


def test_spread_is_the_lowest_and_highest_point_estimate_over_runs() -> None:
    got = spread(RUNS, ["a", "b"])
    assert {p: {c: tuple(round(x, 9) for x in v) for c, v in by.items()} for p, by in got.items()} == {
        "p": {"a": (10.0, 25.0), "b": (20.0, 20.0)}, "q": {"a": (5.0, 5.0), "b": (1.0, 2.0)}}


def test_order_held_and_swaps_name_the_points_and_pairs() -> None:
    assert order_held(RUNS, ["a", "b", "c"]) == ["q"]
    assert order_swaps(RUNS, ["a", "b", "c"]) == {"p": [("a", "b")]}
    assert order_held(RUNS, ["b", "c"]) == ["p", "q"] and order_swaps(RUNS, ["b", "c"]) == {}


def test_lowest_in_counts_the_runs_where_the_config_is_cheapest() -> None:
    assert lowest_in(RUNS, "a", ["b", "c"]) == {"p": 1, "q": 0}
    assert lowest_in(RUNS, "b", ["a", "b", "c"]) == {"p": 1, "q": 2}


def test_aa_misses_lists_the_points_whose_interval_excludes_zero() -> None:
    runs = {"one": {"p": _aa([10.0, 10.0, 10.0, 10.0]), "q": _aa([11.0, 11.0, 11.0, 11.0])},
            "two": {"p": _aa([9.0, 11.0, 9.0, 11.0]), "q": _aa([10.0] * 4)}}
    assert aa_misses(runs, "again") == {"one": ["q"], "two": []}


def test_runs_must_be_at_least_two_and_of_the_same_points() -> None:
    with pytest.raises(ValueError, match=r"comparing runs needs at least two runs, got 1: \['one'\]"):
        spread({"one": RUNS["one"]}, ["a"])
    with pytest.raises(ValueError, match=r"run 'two' has the points \['p'\], run 'one' has \['p', 'q'\]: "
                                         "pass runs of the same sweep"):
        order_held({"one": RUNS["one"], "two": {"p": RUNS["two"]["p"]}}, ["a"])


def test_load_runs_reads_saved_sweeps_in_order(tmp_path: Path) -> None:
    for name, sweep in RUNS.items():
        save_sweep(sweep, tmp_path / name)
    runs = load_runs({"two": tmp_path / "two", "one": tmp_path / "one"})
    assert list(runs) == ["two", "one"] and list(runs["one"]) == ["p", "q"]
    assert order_swaps(runs, ["a", "b", "c"]) == {"p": [("a", "b")]}
