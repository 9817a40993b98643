"""mentor.lab.wording: where intervals lie against 0, tallies of them, overlaps and moves between runs.

Exact strings on hand-made intervals, a property test of ``tally``'s counts against a direct count, and the
errors for input that would otherwise give a wrong sentence.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mentor.lab.comparison import Comparison
from mentor.lab.stats import Interval, Result
from mentor.lab.wording import SIDES, moved, overlap, side, tally

NAN = math.nan


def test_side_of_each_kind_of_interval() -> None:
    assert side(Interval(0.4, 0.1, 0.8)) == "above 0"
    assert side(Interval(-0.4, -0.8, -0.1)) == "below 0"
    assert side(Interval(0.2, -0.1, 0.5)) == "containing 0"
    assert side(Interval(3.0, NAN, NAN)) == "without an interval"


def test_an_end_at_zero_contains_it_as_in_the_comparisons_verdict() -> None:
    # the same rule as Comparison.verdict: "slower" needs lo > 0, "faster" hi < 0
    assert side(Interval(0.5, 0.0, 1.0)) == "containing 0"
    assert side(Interval(-0.5, -1.0, 0.0)) == "containing 0"
    rounds = [[10.0], [20.0], [30.0]]
    cmp = Comparison([Result("a", "", rounds), Result("b", "", [[11.0], [22.0], [33.0]]),
                      Result("c", "", [[9.0], [18.0], [27.0]]), Result("d", "", rounds)], "a", 1)
    words = {"slower": "above 0", "faster": "below 0", "no difference resolved": "containing 0"}
    for name in ("b", "c", "d"):
        assert side(cmp.overhead(name)) == words[cmp.verdict(name)]


def test_tally_counts_each_side_in_a_fixed_order_and_names_the_resolved_ones() -> None:
    costs = {"in": Interval(1.0, -1.0, 3.0), "up": Interval(3.0, 2.0, 4.0), "down": Interval(-2.0, -3.0, -1.0),
             "up too": Interval(2.0, 1.0, 3.0), "one round": Interval(5.0, NAN, NAN)}
    assert tally(costs) == ("2 above 0 (up: +3.0 % [2.0, 4.0]; up too: +2.0 % [1.0, 3.0]); "
                            "1 below 0 (down: -2.0 % [-3.0, -1.0]); 1 containing 0; 1 without an interval")
    assert tally(costs, name=("containing 0",)) == (
        "2 above 0; 1 below 0; 1 containing 0 (in: +1.0 % [-1.0, 3.0]); 1 without an interval")
    assert tally(costs, name="below 0") == (
        "2 above 0; 1 below 0 (down: -2.0 % [-3.0, -1.0]); 1 containing 0; 1 without an interval")
    assert tally(costs, name=()) == "2 above 0; 1 below 0; 1 containing 0; 1 without an interval"


def test_tally_of_intervals_all_on_one_side_has_one_group() -> None:
    assert tally({"a": Interval(1.0, 0.5, 1.5), "b": Interval(2.0, 1.5, 2.5)}, name=()) == "2 above 0"


@st.composite
def _intervals(draw: st.DrawFn) -> dict[str, Interval]:
    n = draw(st.integers(1, 8))
    out = {}
    for i in range(n):
        lo = draw(st.floats(-50, 50, allow_nan=False))
        hi = lo + draw(st.floats(0, 20, allow_nan=False))
        out[f"c{i}"] = Interval(min(max((lo + hi) / 2, lo), hi), lo, hi)
    return out


@given(_intervals())
def test_tally_counts_equal_a_direct_count(costs: dict[str, Interval]) -> None:
    counts = {"above 0": sum(c.lo > 0 for c in costs.values()), "below 0": sum(c.hi < 0 for c in costs.values())}
    counts["containing 0"] = len(costs) - counts["above 0"] - counts["below 0"]
    expected = "; ".join(f"{k} {s}" for s, k in counts.items() if k)
    assert tally(costs, name=()) == expected
    named = tally(costs, name=SIDES)
    assert all(f"{label}: {interval}" in named for label, interval in costs.items())


def test_tally_refuses_nothing_to_count_an_unknown_side_and_a_non_interval() -> None:
    with pytest.raises(ValueError, match=r"^tally needs at least one interval: pass \{label: Interval, \.\.\.\}$"):
        tally({})
    with pytest.raises(ValueError, match=r"not \['above zero'\]"):
        tally({"a": Interval(1.0, 0.5, 1.5)}, name=("above zero",))
    with pytest.raises(TypeError, match=r"intervals\['a'\] must be a mentor.lab.stats.Interval.*got str"):
        tally({"a": "+1.0 % [0.5, 1.5]"})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="interval must be a mentor.lab.stats.Interval"):
        side(1.0)  # type: ignore[arg-type]


def test_overlap_counts_touching_ends_and_is_symmetric() -> None:
    a, touching, apart = Interval(1.0, 0.0, 2.0), Interval(3.0, 2.0, 4.0), Interval(3.0, 2.1, 4.0)
    assert overlap(a, touching) and overlap(touching, a)
    assert not overlap(a, apart) and not overlap(apart, a)
    assert overlap(a, Interval(1.0, 0.5, 1.5))  # one inside the other


def test_overlap_refuses_a_one_round_estimate_and_names_it() -> None:
    both, one_round = Interval(1.0, 0.0, 2.0), Interval(7.0, NAN, NAN)
    for a, b in ((both, one_round), (one_round, both)):
        with pytest.raises(ValueError, match=r"; \+7\.0 % \[one round: no interval\] is a one-round estimate.*"
                                             "at least two rounds"):
            overlap(a, b)


def test_overlap_names_the_argument_that_is_not_an_interval() -> None:
    with pytest.raises(TypeError, match=r"^a must be a mentor.lab.stats.Interval .*got float$"):
        overlap(1.0, Interval(1.0, 0.0, 2.0))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^b must be a mentor.lab.stats.Interval .*got str$"):
        overlap(Interval(1.0, 0.0, 2.0), "+1.0 %")  # type: ignore[arg-type]


def test_moved_lists_the_labels_whose_runs_do_not_overlap_in_the_later_runs_order() -> None:
    before = {"a": Interval(1.0, 0.0, 2.0), "b": Interval(9.0, 8.0, 10.0), "c": Interval(5.0, 4.0, 6.0)}
    after = {"c": Interval(1.0, 0.5, 1.5), "b": Interval(4.0, 3.0, 5.0), "a": Interval(1.5, 0.5, 2.5)}
    assert moved(before, after) == ["c", "b"]
    assert moved(before, before) == []


def test_moved_refuses_runs_of_different_configurations() -> None:
    with pytest.raises(ValueError, match=r"\['b'\] appear in one run only"):
        moved({"a": Interval(1.0, 0.0, 2.0)}, {"a": Interval(1.0, 0.0, 2.0), "b": Interval(1.0, 0.0, 2.0)})


# --- the book's one rule for "resolved" (issue 51) ---

from mentor.lab.wording import RESOLUTION, RULE, resolved  # noqa: E402


def test_the_resolution_rule_on_the_cases_the_book_met() -> None:
    """Chapter 9's bf16 batch 32: +3.0 % [0.3, 5.8] against an A/A of +1.6 % [-1.6, 5.1] (6.7 points wide, half of
    it 3.35) is not resolved; its fp32 batch 32 rankings overlap an A/A that missed 0, so they are not ranked."""
    assert RESOLUTION == 0.5 and "half the width of the same run's A/A interval" in RULE
    bf16_aa = Interval(1.6, -1.6, 5.1)
    assert resolved(Interval(3.0, 0.3, 5.8), bf16_aa) == "not resolved"
    assert resolved(Interval(3.35, 0.3, 5.8), bf16_aa) == "above 0"  # exactly half the width: resolved
    assert resolved(Interval(-3.4, -6.0, -0.5), bf16_aa) == "below 0"
    missed = Interval(-4.1, -6.4, -1.6)
    assert resolved(Interval(-6.2, -8.6, -3.7), missed) == "not resolved"  # sync-free macro vs macro
    assert resolved(Interval(-5.2, -8.2, -2.2), missed) == "not resolved"  # suite vs grouped set
    assert resolved(Interval(-9.0, -11.0, -7.0), missed) == "below 0"  # clear of the biased A/A too
    assert resolved(Interval(0.5, -0.5, 1.5), bf16_aa) == resolved(Interval(0.5, -0.5, 1.5)) == "not resolved"
    assert resolved(Interval(3.0, 0.3, 5.8)) == "above 0"  # a run with no A/A: the side of 0 decides
    assert resolved(Interval(3.0, math.nan, math.nan), bf16_aa) == "without an interval"


def test_the_resolution_rule_refuses_an_aa_without_an_interval_and_names_it() -> None:
    with pytest.raises(ValueError, match=r"aa must be the A/A's interval over at least two rounds, got \+1.0 % "
                                         r"\[one round: no interval\]: pass aa=None"):
        resolved(Interval(3.0, 1.0, 5.0), Interval(1.0, math.nan, math.nan))
    with pytest.raises(TypeError, match="aa must be a mentor.lab.stats.Interval"):
        resolved(Interval(3.0, 1.0, 5.0), (0.0, -1.0, 1.0))  # type: ignore[arg-type]


@given(st.floats(-20, 20), st.floats(0, 10), st.floats(0, 10), st.floats(-5, 5), st.floats(0.01, 8))
def test_a_resolved_difference_is_clear_of_zero_and_of_half_the_aa(point: float, below: float, above: float,
                                                                    aa_point: float, aa_half: float) -> None:
    interval, aa = Interval(point, point - below, point + above), Interval(aa_point, aa_point - aa_half,
                                                                              aa_point + aa_half)
    verdict = resolved(interval, aa)
    clear = side(interval) in ("above 0", "below 0")
    big = abs(point) >= RESOLUTION * (aa.hi - aa.lo)
    biased = side(aa) != "containing 0" and overlap(interval, aa)
    assert verdict == (side(interval) if clear and big and not biased else "not resolved")


def test_a_comparison_with_an_aa_judges_its_verdicts_by_the_rule() -> None:
    """The same configuration is "slower" without an A/A and "no difference resolved" beside a wide one."""
    base = [[10.0, 10.0], [10.0, 10.0], [10.0, 10.0]]
    cfg = [[10.3, 10.3], [10.3, 10.3], [10.3, 10.3]]  # +3 % in every round
    wide_aa = [[9.5, 9.5], [10.0, 10.0], [10.5, 10.5]]  # -5 % to +5 %: 10 points wide
    alone = Comparison([Result("no metrics", "", base), Result("cfg", "", cfg)], "no metrics", 8)
    beside = Comparison([Result("no metrics", "", base), Result("no metrics, again", "", wide_aa),
                         Result("cfg", "", cfg)], "no metrics", 8)
    assert alone.aa is None and beside.aa == "no metrics, again"
    assert alone.verdict("cfg") == "slower" and beside.verdict("cfg") == "no difference resolved"
    assert beside.facts("cfg")["verdict"] == beside.facts("cfg")["tput_verdict"] == "no difference resolved"
    assert beside.verdict("no metrics, again") == "no difference resolved"  # the A/A against 0 itself


# --- withdrawals: a missed A/A takes back the rankings whose intervals overlap it -----------------------------

def test_a_missed_aa_withdraws_the_rankings_that_overlap_it() -> None:
    """Chapter 9's case of issue 51: the A/A missed 0 at -4.1 % [-6.4, -1.6]; -6.2 % [-8.6, -3.7] overlaps it."""
    from mentor.lab.wording import withdrawn
    aa = Interval(-4.1, -6.4, -1.6)
    assert withdrawn(Interval(-6.2, -8.6, -3.7), aa) is True
    assert withdrawn(Interval(-5.2, -8.2, -2.2), aa) is True
    assert withdrawn(Interval(-9.0, -11.0, -6.5), aa) is False  # clear of the miss: still ranked
    assert withdrawn(Interval(-9.0, -11.0, -6.4), aa) is True  # touching ends overlap
    assert withdrawn(Interval(-1.0, -2.0, 0.5), aa) is False  # contains 0: never ranked, nothing to withdraw
    assert withdrawn(Interval(-6.2, -8.6, -3.7), Interval(-1.0, -2.0, 0.1)) is False  # the A/A contains 0


def test_withdrawn_refuses_one_round_estimates_and_non_intervals_by_name() -> None:
    from mentor.lab.wording import withdrawn
    with pytest.raises(ValueError, match="one-round run ranks nothing"):
        withdrawn(Interval(-6.2, NAN, NAN), Interval(-4.1, -6.4, -1.6))
    with pytest.raises(TypeError, match="aa must be a mentor.lab.stats.Interval"):
        withdrawn(Interval(-6.2, -8.6, -3.7), (-4.1, -6.4, -1.6))  # type: ignore[arg-type]


def test_by_verdict_groups_points_in_order_and_lists_withdrawn_ones_last() -> None:
    from mentor.lab.wording import by_verdict
    verdicts = {"fp32 b128": "no difference resolved", "fp32 b32": "faster", "bf16 b32": "faster",
                "bf16 b128": "slower"}
    assert by_verdict(verdicts) == ("not resolved from it at fp32 b128; cheaper at fp32 b32, bf16 b32; "
                                    "dearer at bf16 b128")
    assert by_verdict(verdicts, unranked=["fp32 b32"]) == (
        "not resolved from it at fp32 b128; cheaper at bf16 b32; dearer at bf16 b128; "
        "not ranked in that run (its repeated loop missed 0 there) at fp32 b32")
    assert by_verdict({"a": "slower"}, said={"slower": "slower than the grouped set"}) == (
        "slower than the grouped set at a")


def test_by_verdict_refuses_unknown_points_and_an_empty_run() -> None:
    from mentor.lab.wording import by_verdict
    with pytest.raises(ValueError, match=r"unranked names points that verdicts does not hold: \['fp32 b16'\]"):
        by_verdict({"fp32 b32": "faster"}, unranked=["fp32 b16"])
    with pytest.raises(ValueError, match="at least one point"):
        by_verdict({})


@given(st.dictionaries(st.sampled_from(["p1", "p2", "p3", "p4", "p5"]),
                       st.sampled_from(["faster", "slower", "no difference resolved"]), min_size=1),
       st.data())
def test_by_verdict_names_every_point_once(verdicts: dict[str, str], data: st.DataObject) -> None:
    from mentor.lab.wording import by_verdict
    unranked = data.draw(st.lists(st.sampled_from(sorted(verdicts)), unique=True))
    text = by_verdict(verdicts, unranked=unranked)
    named = [p.strip() for group in text.split("; ") for p in group.split(" at ", 1)[1].split(",")]
    assert sorted(named) == sorted(verdicts)
    for p in unranked:
        assert f"missed 0 there) at {', '.join(unranked)}" in text and p in text


def test_a_made_up_run_whose_aa_missed_is_cited_as_not_ranked(tmp_path) -> None:
    """A made-up source: its repeated loop ran 4 % faster than the baseline in every round (a miss), and the pair it
    would rank (b against a) lies in that miss. The verdict withdraws it, the source's computed list says "not
    ranked", and a page that reads the source's stored glue keeps that word instead of deciding again."""
    import json

    from mentor.lab.stored import glued
    from mentor.lab.wording import by_verdict, withdrawn
    base = [[10.0, 10.0], [10.0, 10.2], [10.2, 10.0], [10.1, 10.1]]
    aa = [[9.6, 9.6], [9.6, 9.8], [9.8, 9.6], [9.7, 9.7]]  # -4 %: the loop compared with itself missed 0
    a = [[10.0, 10.0], [10.0, 10.2], [10.2, 10.0], [10.1, 10.1]]
    b = [[9.7, 9.7], [9.3, 9.5], [9.8, 9.5], [9.4, 9.4]]  # about -5 % against a, its interval over the miss
    cmp = Comparison([Result("no metrics", "", base), Result("no metrics, again", "", aa), Result("a", "", a),
                      Result("b", "", b)], "no metrics", 8)
    pair, miss = cmp.overhead("b", kind="throughput", against="a"), cmp.overhead("no metrics, again", kind="throughput")
    assert side(miss) == "below 0" and side(pair) == "below 0"  # each interval alone would rank b as cheaper
    assert withdrawn(pair, miss)
    assert cmp.verdict("b", kind="throughput", against="a") == "no difference resolved"
    listed = by_verdict({"p": cmp.verdict("b", kind="throughput", against="a")}, unranked=["p"])
    assert listed == "not ranked in that run (its repeated loop missed 0 there) at p"
    # the source stores the list and the withdrawal as glued values; the citing page reads them back
    outputs = [{"output_type": "display_data", "metadata": {"scrapbook": {"name": name}},
                "data": {"application/papermill.record/text/plain": repr(value)}}
               for name, value in (("b_vs_a", listed), ("unranked", {"p": ["b against a"]}))]
    source = tmp_path / "source.ipynb"
    source.write_text(json.dumps({"cells": [{"cell_type": "code", "source": "", "metadata": {}, "outputs": outputs}],
                                  "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    stored = glued(source)
    assert stored["unranked"] == {"p": ["b against a"]}
    assert "not ranked in that run" in stored["b_vs_a"] and "cheaper" not in stored["b_vs_a"]
