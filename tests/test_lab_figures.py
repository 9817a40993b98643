"""mentor.lab.figures: the phone-width rule, on real figures rendered to SVG (every font size read back from the file)."""

from __future__ import annotations

import re

import matplotlib
import pytest

from mentor.lab.comparison import Comparison
from mentor.lab.figures import (MIN_TEXT_PT, PHONE_WIDTH_IN, as_svg, full_labels, largest_text_pt, phone_figure,
                                phone_text, smallest_text_pt)
from mentor.lab.plots import plot_comparison
from mentor.lab.stats import Result

PHONE_FIGURE_PX = 342.0
"""The width at which the built book shows a figure on a 390 px phone (measured in Chromium; the browser test checks
the rendered text itself)."""


def svg_font_sizes(svg: str) -> list[float]:
    return [float(x) for x in re.findall(r"font-size: ([0-9.]+)px", svg)]


def comparison() -> Comparison:
    names = ["no metrics", "naive", "fused suite, compiled (reduce-overhead)", "optimized"]
    return Comparison([Result(n, "", [[10.0 + k, 20.0 + k], [11.0 + k, 19.0 + 2 * k]], syncs_per_step=k)
                       for k, n in enumerate(names)], "no metrics", 4)


def test_the_rule_gives_9_px_on_a_phone() -> None:
    assert MIN_TEXT_PT * PHONE_FIGURE_PX / (72 * PHONE_WIDTH_IN) >= 9.0


def test_a_comparison_drawn_at_phone_width_has_no_text_under_the_minimum_in_its_svg() -> None:
    """plot_comparison picks 11 and 12 point text for a wide figure; phone_text sets all of it, ticks drawn later
    included, and the SVG keeps each as text with that size."""
    cmp = comparison()
    fig, axes = phone_figure(2, sharex=True)
    for ax in axes:
        plot_comparison(cmp, ax=ax, kind="throughput")
        ax.set_title("a point", fontsize=20)
    phone_text(fig, 8.5, title=9.0)
    sizes = svg_font_sizes(as_svg(fig).data)
    assert sizes and min(sizes) == 8.5 and max(sizes) == 9.0
    assert smallest_text_pt(fig) == 8.5 and largest_text_pt(fig) == 9.0
    assert re.search(r'width="288pt"', as_svg(fig).data)


def test_without_phone_text_the_comparison_keeps_its_wide_figure_sizes() -> None:
    """The check above can fail: the same drawing left alone has 12 point labels and matplotlib's 10 point default."""
    cmp = comparison()
    fig, (ax,) = phone_figure()
    plot_comparison(cmp, ax=ax, kind="throughput")
    sizes = set(svg_font_sizes(as_svg(fig).data))
    assert {11.0, 12.0} <= sizes


def test_full_labels_put_back_whole_names_wrapped() -> None:
    cmp = comparison()
    fig, (ax,) = phone_figure()
    plot_comparison(cmp, ax=ax, kind="throughput")
    names = [r.name for r in cmp.results[1:]]
    assert any("…" in t.get_text() for t in ax.get_yticklabels())  # plot_comparison shortened one
    labels = [t.get_text() for t in full_labels(ax, names).get_yticklabels()]
    assert [label.replace("\n", " ") for label in labels] == names
    assert labels[1] == "fused suite, compiled\n(reduce-overhead)"
    with pytest.raises(ValueError, match=r"the axes has 3 y ticks but 2 names were given"):
        full_labels(ax, names[:2])


def test_as_svg_leaves_matplotlib_settings_alone() -> None:
    before = dict(matplotlib.rcParams)
    fig, _ = phone_figure()
    as_svg(fig)
    assert dict(matplotlib.rcParams) == before


@pytest.mark.parametrize("call, message", [
    (lambda: phone_figure(0), r"rows must be an int >= 1"),
    (lambda: phone_figure(1, row_height_in=0), r"row_height_in must be a positive number of inches, got 0"),
    (lambda: phone_text(phone_figure()[0], 7.0), r"size must be a number of points >= MIN_TEXT_PT \(8.0\), got 7.0"),
    (lambda: phone_text(phone_figure()[0], 8.0, title=5), r"title must be a number of points >= MIN_TEXT_PT"),
])
def test_bad_arguments_are_refused(call, message) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_phone_text_wraps_long_axis_labels_and_keeps_their_words() -> None:
    fig, (ax,) = phone_figure()
    label = "overhead of the total time, reports included (%)\nvs no metrics; bars: 95 % interval over 12 rounds"
    ax.set_xlabel(label)
    phone_text(fig, 8.0, wrap=30)
    lines = ax.get_xlabel().split("\n")
    assert max(len(line) for line in lines) <= 30 and len(lines) == 4
    assert " ".join(lines).split() == label.split()


def test_the_defaults() -> None:
    """One panel 2.6 inches high; labels wrap at 44 characters; an empty figure has no smallest or largest text."""
    fig, axes = phone_figure()
    assert tuple(float(x) for x in fig.get_size_inches()) == (4.0, 2.6) and len(axes) == 1
    assert tuple(float(x) for x in phone_figure(2, row_height_in=0.5)[0].get_size_inches()) == (4.0, 1.0)
    forty_four, forty_five = "x" * 20 + " " + "y" * 23, "x" * 20 + " " + "y" * 24
    axes[0].set_xlabel(forty_four)
    axes[0].set_ylabel(forty_five)
    phone_text(fig)
    assert axes[0].get_xlabel() == forty_four and axes[0].get_ylabel() == "x" * 20 + "\n" + "y" * 24
    empty, _ = phone_figure()
    empty.axes[0].set_axis_off()
    assert smallest_text_pt(empty) == float("inf") and largest_text_pt(empty) == 0.0


def test_hidden_text_and_existing_line_breaks() -> None:
    """A hidden text does not count as the smallest; a label's own line breaks are kept when it is wrapped."""
    fig, (ax,) = phone_figure()
    ax.text(0, 0, "hidden", fontsize=3).set_visible(False)
    ax.set_xlabel("first line\nsecond line")
    phone_text(fig, 9.0)
    assert smallest_text_pt(fig) == 9.0
    assert ax.get_xlabel() == "first line\nsecond line"
