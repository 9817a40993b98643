"""The book's figures at phone width: drawn 4 inches wide, no text under 8 points, glued as SVG with text kept as text.

A book page shows a figure about 342 CSS px wide on a 390 px phone (measured in the built book). An SVG figure
:data:`PHONE_WIDTH_IN` inches (72 points an inch) wide is scaled to that width, so a font of ``s`` points shows at
``s * 342 / (72 * PHONE_WIDTH_IN)`` px: :data:`MIN_TEXT_PT` points show at about 9.5 px, above the 9 px that the
book's browser test asks for. On a wide screen the figure keeps its own width (4 inches, 384 px), so the text is
as large there.

:func:`phone_figure` makes the figure, :func:`phone_text` sets every text of it to one size (the plotting helpers
of :mod:`mentor.lab.plots` pick their own sizes for wider figures) and wraps long axis labels, :func:`full_labels`
puts back the whole names that :func:`mentor.lab.plots.plot_comparison` shortens, wrapped, :func:`bottom_xlabel`
keeps one x label for panels that share their scale, and :func:`as_svg` renders the figure for ``glue``.
Nothing here changes matplotlib's global settings: each setting applies inside a ``matplotlib.rc_context``.

Example:
    >>> fig, axes = phone_figure(2)
    >>> _ = axes[0].set_title("a title", fontsize=20)
    >>> smallest_text_pt(phone_text(fig, 9.0)), largest_text_pt(fig)
    (9.0, 9.0)
    >>> svg = as_svg(fig).data
    >>> "font-size: 9px" in svg, "font-size: 10px" in svg
    (True, False)
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Sequence
from typing import Any

PHONE_WIDTH_IN = 4.0
"""Every figure's width, in inches."""

MIN_TEXT_PT = 8.0
"""The smallest text of a figure, in points (see the module docstring for what it gives on a phone)."""


def phone_figure(rows: int = 1, row_height_in: float = 2.6, **subplots: Any) -> tuple[Any, Any]:
    """A figure :data:`PHONE_WIDTH_IN` wide with ``rows`` panels one above the other, and its axes (an array).

    ``subplots`` go to ``plt.subplots`` (``sharex=True`` where the panels compare). The figure is closed in pyplot,
    so that a notebook shows it only where it is glued.

    Example:
        >>> fig, axes = phone_figure(3, row_height_in=2.0, sharex=True)
        >>> tuple(float(x) for x in fig.get_size_inches()), len(axes)
        ((4.0, 6.0), 3)
    """
    import matplotlib.pyplot as plt

    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ValueError(f"rows must be an int >= 1 (panels one above the other), got {rows!r}.")
    if not isinstance(row_height_in, (int, float)) or isinstance(row_height_in, bool) or row_height_in <= 0:
        raise ValueError(f"row_height_in must be a positive number of inches, got {row_height_in!r}.")
    fig, axes = plt.subplots(rows, 1, figsize=(PHONE_WIDTH_IN, rows * row_height_in), layout="constrained",
                             squeeze=False, **subplots)
    plt.close(fig)
    return fig, axes[:, 0]


def _texts(fig: Any) -> list[Any]:
    """Every visible, non-empty text of ``fig``: titles, labels, tick labels, annotations, legends."""
    from matplotlib.text import Text

    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def phone_text(fig: Any, size: float = MIN_TEXT_PT, title: float | None = None, wrap: int = 44) -> Any:
    """Set every text of ``fig`` to ``size`` points (axes titles to ``title``, when given), and wrap each axis label
    at ``wrap`` characters a line, so that it fits the narrow figure; returns ``fig``.

    Example:
        >>> fig, (ax,) = phone_figure()
        >>> _ = ax.set_xlabel("x", fontsize=14); _ = ax.set_title("t")
        >>> fig = phone_text(fig, 8.0, title=9.0)
        >>> ax.xaxis.label.get_fontsize(), ax.title.get_fontsize()
        (8.0, 9.0)
    """
    if not isinstance(size, (int, float)) or isinstance(size, bool) or size < MIN_TEXT_PT:
        raise ValueError(f"size must be a number of points >= MIN_TEXT_PT ({MIN_TEXT_PT}), got {size!r}: smaller "
                         "text is under 9 px on a phone.")
    if title is not None and (not isinstance(title, (int, float)) or isinstance(title, bool) or title < MIN_TEXT_PT):
        raise ValueError(f"title must be a number of points >= MIN_TEXT_PT ({MIN_TEXT_PT}), got {title!r}.")
    titles = {id(t) for ax in fig.axes for t in (ax.title, ax._left_title, ax._right_title)}
    wrapper = textwrap.TextWrapper(wrap, break_on_hyphens=False, break_long_words=False)
    for ax in fig.axes:  # the ticks that a draw makes anew take their size from here
        ax.tick_params(axis="both", which="both", labelsize=size)
        for label in (ax.xaxis.label, ax.yaxis.label):
            text = label.get_text()
            if text:
                label.set_text("\n".join(w for line in text.split("\n") for w in (wrapper.wrap(line) or [""])))
    for text in _texts(fig):
        text.set_fontsize(title if title is not None and id(text) in titles else size)
    return fig


def bottom_xlabel(axes: Sequence[Any]) -> Sequence[Any]:
    """Keep the x label of the bottom panel only: panels that share their x scale need it once; returns ``axes``.

    Example:
        >>> fig, axes = phone_figure(2, sharex=True)
        >>> for ax in axes: _ = ax.set_xlabel("overhead (%)")
        >>> [ax.get_xlabel() for ax in bottom_xlabel(axes)]
        ['', 'overhead (%)']
    """
    for ax in list(axes)[:-1]:
        ax.set_xlabel("")
    return axes


def smallest_text_pt(fig: Any) -> float:
    """The size of the smallest visible text of ``fig``, in points (``inf`` for a figure without text).

    Example:
        >>> fig, (ax,) = phone_figure()
        >>> _ = ax.text(0, 0, "small", fontsize=5)
        >>> smallest_text_pt(fig)
        5.0
    """
    return min((float(t.get_fontsize()) for t in _texts(fig)), default=float("inf"))


def largest_text_pt(fig: Any) -> float:
    """The size of the largest visible text of ``fig``, in points (``0`` for a figure without text)."""
    return max((float(t.get_fontsize()) for t in _texts(fig)), default=0.0)


def full_labels(ax: Any, names: Sequence[str], width: int = 22) -> Any:
    """Replace the y tick labels of ``ax`` by ``names``, whole, wrapped at ``width`` characters; returns ``ax``.

    :func:`mentor.lab.plots.plot_comparison` shortens long names with an ellipsis to fit a wide figure; at phone
    width a name is wrapped instead, so that none is cut.

    Example:
        >>> fig, (ax,) = phone_figure()
        >>> _ = ax.barh([0, 1], [1.0, 2.0]); _ = ax.set_yticks([0, 1], ["a", "b"])
        >>> [t.get_text() for t in full_labels(ax, ["fused suite, compiled (reduce-overhead)", "b"]).get_yticklabels()]
        ['fused suite, compiled\\n(reduce-overhead)', 'b']
    """
    ticks = list(ax.get_yticks())
    if len(ticks) != len(names):
        raise ValueError(f"the axes has {len(ticks)} y ticks but {len(names)} names were given: pass one name per bar, "
                         "in the order of the bars.")
    wrap = textwrap.TextWrapper(width, break_on_hyphens=False, break_long_words=False)
    ax.set_yticks(ticks, ["\n".join(wrap.wrap(n)) or n for n in names])
    return ax


def as_svg(fig: Any) -> Any:
    """``fig`` as an ``IPython.display.SVG``, its text kept as ``<text>`` elements, for ``glue``.

    Kept as text, the words stay selectable and searchable, and the book's browser test can read their size.
    """
    import matplotlib
    from IPython.display import SVG

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "mentor"}):
        fig.savefig(buffer, format="svg")
    return SVG(buffer.getvalue())
