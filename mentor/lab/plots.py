"""What the book draws: overhead bars, sweeps, drift, a profiler timeline and TensorBoard scalars.

Every function takes the objects of the lab (a :class:`mentor.lab.comparison.Comparison`, a sweep's dict
of them, a :class:`mentor.measure.Trace`, step times, scalars) and returns matplotlib Axes or a figure.

Example:
    >>> from mentor.lab.stats import Result
    >>> from mentor.lab.comparison import Comparison
    >>> cmp = Comparison([Result("a", "", [[10.0], [20.0]]), Result("b", "", [[11.0], [22.0]])], "a", 1)
    >>> comparison_figure(cmp).axes[0].get_xlabel().replace("\\n", " ")[:48]
    'overhead of the total time, reports included (%)'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mentor.lab.figures import PHONE_WIDTH_IN
# a Comparison is only read here (its annotations are never evaluated): not importing its module keeps
# mentor.lab.comparison, whose plot() and figure() draw with this module, out of an import cycle
from mentor.lab.stats import KINDS, Result, _short, drift
from mentor.lab.trace import (
    _NO_WINDOWS,
    GPU_CATEGORIES,
    HOST_API_CATEGORIES,
    SYNC_CALLS,
    Event,
    Trace,
    _check_trace,
    _gpu_spans,
    step_windows,
    sync_events,
)


def plot_comparison(cmp: Comparison, ax: Any = None, kind: str = "median") -> Any:
    """Horizontal bars of each configuration's overhead over the baseline, with its interval; returns the Axes.

    The baseline gets no bar (its overhead is 0 by definition: the vertical line). Syncs per
    step are written next to each bar when they were counted.
    """
    import matplotlib.pyplot as plt

    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}: pass one of {list(KINDS)}.")
    others = [r for r in cmp.results if r.name != cmp.baseline]
    if ax is None:
        _, ax = plt.subplots(figsize=(5.6, 1.5 + 0.5 * max(1, len(others))), layout="constrained")
    colors = {"slower": "#d62728", "faster": "#2ca02c"}
    intervals = [cmp.overhead(r.name, kind) for r in others]
    points = [iv.point for iv in intervals]
    err = [[max(0.0, iv.point - iv.lo) if iv.has_interval else 0.0 for iv in intervals],
           [max(0.0, iv.hi - iv.point) if iv.has_interval else 0.0 for iv in intervals]]
    y = list(range(len(others)))
    ax.barh(y, points, xerr=err, capsize=4, height=0.6, error_kw={"linewidth": 1.2},
            color=[colors.get(cmp.verdict(r.name, kind), "#7f7f7f") for r in others])
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(y, [_short(r.name, 24) for r in others], fontsize=12)
    ax.invert_yaxis()
    ax.tick_params(axis="x", labelsize=11)
    reach = [max(abs(p), abs(iv.hi) if iv.has_interval else 0, abs(iv.lo) if iv.has_interval else 0)
             for p, iv in zip(points, intervals)] or [1.0]
    pad = 0.03 * (max(reach) or 1.0)
    labels = [sync_label(r) for r in others]
    for yi, label, iv in zip(y, labels, intervals):
        if label is None:
            continue
        end = max(iv.point, iv.hi) if iv.has_interval else iv.point
        ax.text(max(end, 0.0) + pad, yi, label, va="center", fontsize=11)
    if any(label is not None for label in labels):
        ax.set_xlim(right=ax.get_xlim()[1] + 0.5 * (max(reach) or 1.0))
        _fit_texts(ax)
    what = "median step time" if kind == "median" else "total time, reports included"
    level = (f"bars: 95 % interval over {cmp.rounds} rounds" if cmp.rounds > 1 else "one round: no interval")
    ax.set_xlabel(f"overhead of the {what} (%)\nvs {_short(cmp.baseline, 22)}; {level}", fontsize=12)
    return ax

def _fit_texts(ax: Any, passes: int = 4) -> None:
    """Widen the x range of ``ax`` to the right until every text written in it ends inside the axes, as drawn now
    (the layout engine and the fonts included): a text keeps its width in pixels while the data range grows."""
    for _ in range(passes):
        ax.figure.canvas.draw()
        box = ax.get_window_extent()
        over = max(t.get_window_extent().x1 for t in ax.texts) - box.x1
        if over <= 0:
            return
        lo, hi = ax.get_xlim()
        ax.set_xlim(lo, hi + 1.2 * over * (hi - lo) / box.width)


def sync_label(result: Result) -> str | None:
    """What a bar of :func:`plot_comparison` says of ``result``'s syncs: per step and, when its report syncs, per
    report; None when they were not counted.

    Example:
        >>> sync_label(Result("a", "", [[1.0]], syncs_per_step=0, report_syncs=4))
        '0 syncs/step, 4 per report'
        >>> sync_label(Result("b", "", [[1.0]], syncs_per_step=2, report_syncs=0))
        '2 syncs/step'
    """
    if result.syncs_per_step is None:
        return None
    label = f"{result.syncs_per_step:g} syncs/step"
    return f"{label}, {result.report_syncs:g} per report" if result.report_syncs else label


def comparison_figure(cmp: Comparison, kind: str = "throughput") -> Any:
    """:func:`plot_comparison` in a figure of its own at phone width (:mod:`mentor.lab.figures`): whole names,
    wrapped, and every text at :data:`mentor.lab.figures.MIN_TEXT_PT`. Glue it with
    :func:`mentor.lab.figures.as_svg`.

    The figure is closed in pyplot, so that a notebook shows it only where it is
    glued or displayed, not a second time at the end of the cell.

    Example:
        >>> from mentor.lab.stats import Result
        >>> from mentor.lab.comparison import Comparison
        >>> cmp = Comparison([Result("a", "", [[10.0], [20.0]]), Result("b", "", [[11.0], [22.0]])], "a", 1)
        >>> fig = comparison_figure(cmp)
        >>> fig.axes[0].get_yticklabels()[0].get_text(), float(fig.get_size_inches()[0])
        ('b', 4.0)
    """
    from mentor.lab.figures import full_labels, phone_figure, phone_text

    others = [r.name for r in cmp.results if r.name != cmp.baseline]
    fig, (ax,) = phone_figure(row_height_in=1.4 + 0.5 * max(1, len(others)))
    plot_comparison(cmp, ax=ax, kind=kind)
    full_labels(ax, others)
    phone_text(fig)
    if ax.texts:
        _fit_texts(ax)  # the texts' final size, in the final layout
    return fig


def plot_sweep(results: dict[str, Comparison], kind: str = "throughput", ax: Any = None) -> Any:
    """Overhead (%) with its interval against the baseline's median step time, one line per configuration.

    The figure is closed in pyplot (glue or display it). Returns the figure.

    Example:
        >>> from mentor.lab.stats import Result
        >>> base = Result("none", "", [[10.0], [12.0]]); slow = Result("m", "", [[11.0], [13.2]])
        >>> from mentor.lab.comparison import Comparison
        >>> fig = plot_sweep({"p": Comparison([base, slow], "none", 4)})
        >>> fig.axes[0].get_xlabel()
        'step time without metrics (ms, median)'
    """
    import matplotlib.pyplot as plt

    if not results:
        raise ValueError("results is empty: pass the dict that sweep() returns.")
    first = next(iter(results.values()))
    names = [r.name for r in first.results if r.name != first.baseline]
    if ax is None:
        fig, ax = plt.subplots(figsize=(6.4, 4.2), layout="constrained")
    points = list(results.items())
    base_ms = [cmp[cmp.baseline].median_ms for _, cmp in points]
    for k, name in enumerate(names):
        ivs = [cmp.overhead(name, kind=kind) for _, cmp in points]
        y = np.array([i.point for i in ivs])
        err = np.array([[i.point - i.lo for i in ivs], [i.hi - i.point for i in ivs]])
        ax.errorbar(np.array(base_ms) * (1 + 0.012 * (k - len(names) / 2)), y, yerr=err, marker="o", ms=4,
                    capsize=2, lw=1, label=name)
    ax.axhline(0, color="0.5", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("step time without metrics (ms, median)")
    ax.set_ylabel("overhead over no metrics (%)")
    for (point, _), x in zip(points, base_ms):
        ax.annotate(point, (x, 0), xytext=(0, -14), textcoords="offset points", ha="center", fontsize=7, color="0.3")
    ax.legend(fontsize=8, frameon=False)
    plt.close(ax.figure)
    return ax.figure


def plot_drift(step_ms: Sequence[float], window: int = 50, ax: Any = None) -> Any:
    """Each step's time and the mean of every ``window`` steps against the step number, in one run.

    The figure is closed in pyplot (glue or display it). Returns the figure.

    Example:
        >>> fig = plot_drift([10.0, 12.0, 11.0, 9.0], window=2)
        >>> fig.axes[0].get_ylabel()
        'step time (ms)'
    """
    import matplotlib.pyplot as plt

    means = drift(step_ms, window)
    if ax is None:
        fig, ax = plt.subplots(figsize=(6.4, 3.2), layout="constrained")
    ax.plot(range(1, len(step_ms) + 1), step_ms, lw=0.4, color="0.7", label="one step")
    edges = np.arange(len(means) + 1) * window
    ax.stairs(means, edges + 0.5, baseline=None, color="C0", lw=1.5, label=f"mean of {window} steps")
    ax.set_xlabel("step")
    ax.set_ylabel("step time (ms)")
    ax.legend(fontsize=8, frameon=False, loc="upper right")
    plt.close(ax.figure)
    return ax.figure


def plot_timeline(trace: Trace, steps: int = 2, ax: Any = None, annotations: bool = True) -> Any:
    """Draw the first ``steps`` profiled steps: host and GPU step spans, host ops, ``record_function`` ranges, GPU work, syncs in red.

    The row "host step (ProfilerStep)" shows the host windows, "GPU step" the span of the GPU
    work each step launched (:func:`mentor.lab.trace.gpu_step_spans`; empty for a step without GPU work). The
    x-axis runs to the end of the last drawn GPU span when that is later than the last host
    window, so GPU work that runs past the host window is drawn. The host rows (ranges, ops,
    runtime calls, syncs) show only events that overlap the drawn host windows; the GPU row shows
    all GPU work up to the right edge. An event that began before the first window is drawn from
    the left edge to its end. Returns the matplotlib Axes.

    Example:
        >>> t = Trace([Event("ProfilerStep#1", "user_annotation", 0, 10, 1, 1)])
        >>> ax = plot_timeline(t, steps=1)
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    _check_trace(trace)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}.")
    windows = step_windows(trace)[:steps]
    if not windows:
        raise ValueError(_NO_WINDOWS)
    spans = [s for s in _gpu_spans(trace, windows) if s is not None]
    t0, t1 = windows[0].start, windows[-1].end
    t_end = max([t1] + [end for _, end in spans])
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 3.6))

    def on_host(e: Event) -> bool:
        return e.end > t0 and e.start < t1

    def bar(start: float, dur: float, minimum: float = 1.0) -> tuple[float, float]:
        """(left, width) in ms: an event that began before the first window is drawn from the edge to its end."""
        left = max(start, t0)
        return (left - t0) / 1000, max(start + dur - left, minimum) / 1000

    rows = [
        ("host step (ProfilerStep)", [bar(w.start, w.dur) for w in windows], "#c7c7c7"),
        ("GPU step", [bar(s, e - s) for s, e in spans], "#98df8a"),
        ("record_function", [bar(e.start, e.dur) for e in trace.by_cat("user_annotation")
                             if on_host(e) and not e.name.startswith("ProfilerStep#")], "#9467bd"),
        ("host ops", [bar(e.start, e.dur) for e in trace.by_cat("cpu_op") if on_host(e)], "#1f77b4"),
        ("CUDA runtime", [bar(e.start, e.dur) for e in trace.by_cat(*HOST_API_CATEGORIES)
                          if on_host(e) and e.name not in SYNC_CALLS], "#7f7f7f"),
        ("GPU", [bar(e.start, e.dur) for e in trace.by_cat(*GPU_CATEGORIES)
                 if e.end > t0 and e.start < t_end], "#2ca02c"),
    ]
    syncs = [e for e in sync_events(trace) if on_host(e)]
    labels = [r[0] for r in rows]
    for y, (_, bars, color) in enumerate(rows):
        ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=color, edgecolors="none", alpha=0.85)
    y_sync = labels.index("CUDA runtime")
    ax.broken_barh([bar(e.start, e.dur, 20.0) for e in syncs], (y_sync - 0.45, 0.9),
                   facecolors="#d62728", edgecolors="#d62728")
    if annotations:
        for w in windows:
            ax.text((w.start - t0) / 1000 + 0.2, -0.05, w.name.replace("ProfilerStep", "step "),
                    fontsize=8, va="center")
    ax.set_yticks(range(len(labels)), labels)
    ax.tick_params(axis="y", labelsize=9)
    ax.invert_yaxis()
    ax.set_xlim(0, (t_end - t0) / 1000)
    ax.set_xlabel("time since the first step began (ms)")
    ax.legend(handles=[Patch(color="#d62728", label=f"sync calls ({len(syncs)})"),
                       Patch(color="#2ca02c", label="GPU busy")], loc="upper right", fontsize=8)
    return ax


def plot_scalars(scalars: Mapping[str, list[tuple[int, float]]], axes: Any = None, ncols: int = 2) -> Any:
    """One line plot per tag of :func:`mentor.lab.tensorboard.read_tensorboard`'s result, ``ncols`` to a row, in a
    figure of phone width (:data:`mentor.lab.figures.PHONE_WIDTH_IN`) when no ``axes`` are given; returns the axes.

    Each panel's y axis spans its own values (so a curve that saturates at 1.0 shows
    where it got there), with the tag as the title.

    Example:
        >>> axes = plot_scalars({"train/loss": [(1, 2.0), (2, 1.5)]})
    """
    import matplotlib.pyplot as plt

    if not scalars:
        raise ValueError("no scalars to plot: log some with log_to_tensorboard first.")
    if isinstance(ncols, bool) or not isinstance(ncols, int) or ncols < 1:
        raise ValueError(f"ncols must be an int >= 1, got {ncols!r}.")
    if axes is None:
        cols = min(ncols, len(scalars))
        rows = -(-len(scalars) // cols)
        fig, grid = plt.subplots(rows, cols, figsize=(PHONE_WIDTH_IN, 2.0 * rows), squeeze=False, layout="constrained")
        axes = list(grid.flat)
        for extra in axes[len(scalars):]:
            fig.delaxes(extra)
        axes = axes[:len(scalars)]
    else:
        axes = list(axes.flat) if hasattr(axes, "flat") else list(axes)
        if len(axes) < len(scalars):
            raise ValueError(f"plot_scalars got {len(axes)} axes for {len(scalars)} tags {sorted(scalars)}; "
                             "pass one Axes per tag, or axes=None to make them.")
    for ax, (tag, points) in zip(axes, sorted(scalars.items())):
        steps, values = zip(*points)
        ax.plot(steps, values, marker="o", ms=5)
        ax.set_title(tag, fontsize=12)
        ax.set_xlabel("step", fontsize=11)
        ax.tick_params(labelsize=10)
        ax.margins(y=0.15)
    return axes
