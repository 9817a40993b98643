"""mentor.lab.plots: what each figure shows (bars, error bars, colours, labels, notes), checked on hand-made
comparisons, step times, scalars and traces, and on two of the real H200 traces in tests/data."""

import io
import itertools
from pathlib import Path

import pytest

from exact import whole
from fakes import table_comparison, two_rounds, two_points
from mentor.lab.comparison import Comparison
from mentor.lab.plots import comparison_figure, plot_comparison, plot_drift, plot_scalars, plot_sweep, plot_timeline
from mentor.lab.stats import Result
from mentor.lab.trace import Event, Trace, gpu_step_spans, load_trace, step_windows

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def traces():
    return {name: load_trace(DATA / f"{name}.json.gz") for name in ("naive", "no_metrics")}


@pytest.fixture
def close_figures():
    import matplotlib.pyplot as plt

    yield
    plt.close("all")


# ----------------------------------------------------------------------------------------------------------
# a comparison drawn: plot_comparison, comparison_figure






def test_plot(close_figures):
    cmp = table_comparison()
    ax = plot_comparison(cmp)
    others = [r.name for r in cmp.results[1:]]
    assert tuple(ax.figure.get_size_inches()) == pytest.approx((5.6, 1.5 + 0.5 * 3))
    assert len(ax.patches) == 3  # one bar per non-baseline configuration
    assert [p.get_width() for p in ax.patches] == pytest.approx([cmp.overhead(n).point for n in others])
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["naive", "a configuration with a …", "not counted one"]  # 24 characters
    # readable at phone width: the 5.6-inch figure shrinks to about 0.65 of its size there
    assert all(t.get_fontsize() >= 11 for t in ax.get_yticklabels() + ax.get_xticklabels() + ax.texts)
    assert ax.xaxis.label.get_fontsize() >= 11 and ax.get_title() == ""
    from matplotlib.container import ErrorbarContainer

    (errorbar,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    segments = errorbar.lines[2][0].get_segments()
    assert len(segments) == 3
    for seg, name in zip(segments, others):
        iv = cmp.overhead(name)
        assert (seg[0][0], seg[1][0]) == pytest.approx((iv.lo, iv.hi))
    assert any(list(line.get_xdata()) == [0, 0] for line in ax.lines)  # the zero line
    assert [t.get_text() for t in ax.texts] == ["3 syncs/step, 5 per report", "0.5 syncs/step"]  # only where counted
    assert ax.get_xlabel() == ("overhead of the median step time (%)\n"
                               "vs no metrics; bars: 95 % interval over 5 rounds")
    ax2 = plot_comparison(cmp, kind="throughput")
    assert [p.get_width() for p in ax2.patches] == pytest.approx(
        [cmp.overhead(n, "throughput").point for n in others])
    assert ax2.get_xlabel().startswith("overhead of the total time, reports included (%)")
    with pytest.raises(ValueError, match=r"unknown kind 'max': pass one of \['median', 'throughput'\]"):
        plot_comparison(cmp, kind="max")


def test_figure_is_the_throughput_plot_closed_in_pyplot(close_figures):
    import matplotlib.pyplot as plt

    cmp = table_comparison()
    before = plt.get_fignums()
    fig = comparison_figure(cmp)
    assert plt.get_fignums() == before  # not shown again at the end of a notebook cell
    (ax,) = fig.axes
    assert [p.get_width() for p in ax.patches] == pytest.approx(
        [cmp.overhead(r.name, "throughput").point for r in cmp.results[1:]])
    assert [p.get_width() for p in comparison_figure(cmp, "median").axes[0].patches] == pytest.approx(
        [cmp.overhead(r.name).point for r in cmp.results[1:]])


def verdict_comparison():
    base = [[10.0, 10.0, 10.0]] * 4
    return Comparison([
        Result("base", "", base),
        Result("slow", "", [[11.0, 11.0, 11.0]] * 4),                                      # slower: [10, 10]
        Result("fast", "", [[9.0, 9.0, 9.0]] * 4),                                         # faster: [-10, -10]
        Result("mixed", "", [[10.0] * 3, [9.0] * 3, [10.0] * 3, [9.0] * 3]),               # unresolved [-10, 0]
        Result("report", "", [[10.0, 10.0, 30.0]] * 4, [2]),  # median: +0 [0, 0]; total time: +66.7 %, slower
    ], "base", 1)


def test_plot_colours_bars_by_the_verdict_of_the_kind_shown(close_figures):
    cmp = verdict_comparison()
    for kind, report_like in (("median", "mixed"), ("throughput", "slow")):
        assert [cmp.verdict(n, kind) for n in ("slow", "fast", "mixed")] == [
            "slower", "faster", "no difference resolved"]
        colour = dict(zip(["slow", "fast", "mixed", "report"],
                          (tuple(p.get_facecolor()) for p in plot_comparison(cmp, kind=kind).patches)))
        assert len({colour["slow"], colour["fast"], colour["mixed"]}) == 3  # three verdicts, three colours
        assert colour["report"] == colour[report_like]


def error_extents(ax):
    from matplotlib.container import ErrorbarContainer

    (errorbar,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    return [x for seg in errorbar.lines[2][0].get_segments() for x in (seg[0][0], seg[1][0])]  # (from, to) per bar


def test_plot_error_bars_span_the_interval_and_vanish_without_one(close_figures):
    cmp = verdict_comparison()
    assert error_extents(plot_comparison(cmp)) == pytest.approx([10.0, 10.0, -10.0, -10.0, -10.0, 0.0, 0.0, 0.0])
    one = Comparison([Result("a", "", [[10.0]]), Result("b", "", [[12.0]])], "a", 1)
    ax = plot_comparison(one)
    assert error_extents(ax) == pytest.approx([20.0, 20.0])  # no interval: no error bar around +20 %
    assert ax.get_xlabel() == "overhead of the median step time (%)\nvs a; one round: no interval"


def test_plot_label_names_the_rounds_and_a_long_baseline(close_figures):
    cmp = Comparison([two_rounds("b" * 23, 10.0, 10.0), two_rounds("c", 11.0, 11.0)], "b" * 23, 1)
    assert plot_comparison(cmp).get_xlabel() == ("overhead of the median step time (%)\nvs " + "b" * 21 + "…; "
                                       "bars: 95 % interval over 2 rounds")


def sync_plot_comparison(rounds=2, uncounted=True, report_syncs=None):
    def r(name, factor, syncs, report=None):
        return Result(name, "", [[10.0 * factor * (1 + 0.02 * k)] for k in range(rounds)], syncs_per_step=syncs,
                      report_syncs=report)

    base = Result("base", "", [[10.0 * (1 + 0.01 * k)] for k in range(rounds)])
    middle = [r("none", 1.1, None)] if uncounted else []
    return Comparison([base, r("up", 1.3, 3, report_syncs), *middle, r("down", 0.8, 0.5)], "base", 1)


@pytest.mark.parametrize("report_syncs", [None, 0, 4, 12.5])
@pytest.mark.parametrize("phone", [False, True])
@pytest.mark.parametrize("uncounted", [True, False])
@pytest.mark.parametrize("rounds", [1, 2, 5])
def test_plot_writes_syncs_right_of_each_counted_bar_inside_the_axes(close_figures, rounds, uncounted, phone,
                                                                     report_syncs):
    cmp = sync_plot_comparison(rounds, uncounted, report_syncs)
    if phone:  # the book's figure: phone width, every text at the phone size
        from mentor.lab.plots import comparison_figure

        fig = comparison_figure(cmp, kind="median")
        ax = fig.axes[0]
    else:
        ax = plot_comparison(cmp)
    ax.figure.canvas.draw()
    up = "3 syncs/step" + (f", {report_syncs:g} per report" if report_syncs else "")  # the longest bar's label
    assert [t.get_text() for t in ax.texts] == [up, "0.5 syncs/step"]  # none for an uncounted one
    box = ax.get_window_extent()
    for text, name, y in zip(ax.texts, ["up", "down"], [0, 2 if uncounted else 1]):
        iv = cmp.overhead(name)
        end = max(iv.point, iv.hi) if iv.has_interval else iv.point
        x, ty = text.get_position()
        assert ty == y and x > max(end, 0.0)  # on the bar's row, right of the bar and its error bar
        extent = text.get_window_extent()
        assert box.x0 <= extent.x0 and extent.x1 <= box.x1  # readable: inside the axes


# ----------------------------------------------------------------------------------------------------------
# plot_sweep


def test_plot_sweep_draws_each_config_against_the_base_step(close_figures):
    fig = plot_sweep(two_points())
    ax = fig.axes[0]
    assert [c.get_label() for c in ax.containers] == ["m", "n"]
    m, n = (c.lines[0] for c in ax.containers)
    assert list(m.get_ydata()) == pytest.approx([10.0, 20.0]) and list(n.get_ydata()) == pytest.approx([25.0, 0.0])
    # the x positions are the base step times, nudged apart by 1.2 % per configuration
    assert list(m.get_xdata()) == pytest.approx([10.0 * 0.988, 5.0 * 0.988])
    assert list(n.get_xdata()) == pytest.approx([10.0, 5.0])
    assert [t.get_text() for t in ax.texts] == ["slow point", "fast"]
    assert ax.get_ylabel() == "overhead over no metrics (%)"
    with pytest.raises(ValueError, match="results is empty"):
        plot_sweep({})


def sweep_points():
    a = Comparison([Result("none", "", [[10.0, 10.0], [10.0, 10.0]]), Result("n", "", [[12.0, 12.0], [13.0, 13.0]])],
                   "none", 4)
    b = Comparison([Result("none", "", [[5.0], [5.0]]), Result("n", "", [[5.0], [5.0]])], "none", 4)
    return {"slow point": a, "fast": b}


def sweep_errors(container):
    return [y for seg in container.lines[2][0].get_segments() for y in (seg[0][1], seg[1][1])]  # (from, to) per point


def test_plot_sweep_shows_each_interval(close_figures):
    ax = plot_sweep(sweep_points()).axes[0]
    (n,) = ax.containers
    # at 10 ms: total 50 over 40 ms, +25 %; resampled rounds (0, 0) give 48 / 40, (1, 1) 52 / 40, each with
    # probability 1/4: the interval is [20, 30]; at 5 ms: +0 [0, 0]
    assert list(n.lines[0].get_ydata()) == pytest.approx([25.0, 0.0])
    assert sweep_errors(n) == pytest.approx([20.0, 30.0, 0.0, 0.0])
    assert ax.get_xlabel() == "step time without metrics (ms, median)"
    assert any(list(line.get_xdata()) == [0, 1] and list(line.get_ydata()) == [0, 0] for line in ax.lines)  # 0 %
    with pytest.raises(ValueError, match=whole("results is empty: pass the dict that sweep() returns.")):
        plot_sweep({})


def test_plot_sweep_kind_changes_the_values(close_figures):
    base = [[10.0, 10.0, 10.0], [10.0, 10.0, 10.0]]
    cfg = [[11.0, 11.0, 38.0], [11.0, 11.0, 38.0]]
    results = {"p": Comparison([Result("none", "", base), Result("m", "", cfg)], "none", 4)}
    (tput,) = plot_sweep(results).axes[0].containers
    (median,) = plot_sweep(results, kind="median").axes[0].containers
    assert list(tput.lines[0].get_ydata()) == pytest.approx([100.0])  # 60 over 30 ms
    assert list(median.lines[0].get_ydata()) == pytest.approx([10.0])  # 11 over 10 ms


def test_plot_sweep_renders_and_closes_the_figure_it_drew_on(close_figures):
    import matplotlib.pyplot as plt

    mine = plt.figure()
    ax = mine.subplots()
    other = plt.figure()  # the current figure, not the one drawn on
    fig = plot_sweep(sweep_points(), ax=ax)
    assert fig is mine
    assert mine.number not in plt.get_fignums() and other.number in plt.get_fignums()
    fig.savefig(io.BytesIO(), format="png")  # it renders, the names of the points included (a closed figure's
    assert [t.get_text() for t in ax.texts] == ["slow point", "fast"]  # canvas.draw() draws nothing)


def test_plot_sweep_names_each_point_under_it():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure()
    FigureCanvasAgg(fig)  # not a pyplot figure: closing it in pyplot leaves it drawable here
    ax = fig.subplots()
    plot_sweep(sweep_points(), ax=ax)
    fig.canvas.draw()
    for text, x in zip(ax.texts, [10.0, 5.0]):  # the base step times of "slow point" and "fast"
        px, py = ax.transData.transform((x, 0.0))
        box = text.get_window_extent()
        assert abs((box.x0 + box.x1) / 2 - px) < 2 and box.y1 < py  # centred under its point on the 0 % line


# ----------------------------------------------------------------------------------------------------------
# plot_drift


def test_plot_drift_draws_the_steps_and_the_window_means():
    fig = plot_drift([10.0, 12.0, 11.0, 9.0, 30.0], window=2)
    ax = fig.axes[0]
    assert list(ax.lines[0].get_ydata()) == [10.0, 12.0, 11.0, 9.0, 30.0]
    stairs = [p for p in ax.patches]
    assert list(stairs[0].get_data().values) == [11.0, 10.0]
    # steps are numbered from 1; the mean of steps 1-2 spans 0.5..2.5, of steps 3-4 2.5..4.5 (step 5 dropped)
    assert list(ax.lines[0].get_xdata()) == [1, 2, 3, 4, 5]
    assert list(stairs[0].get_data().edges) == [0.5, 2.5, 4.5]
    assert stairs[0].get_data().baseline is None  # a line of means, not bars down to zero
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("step", "step time (ms)")
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["one step", "mean of 2 steps"]


def test_plot_drift_default_window_is_50():
    fig = plot_drift([4.0] * 50 + [6.0] * 50)
    ax = fig.axes[0]
    assert list(ax.patches[0].get_data().values) == [4.0, 6.0]
    assert list(ax.patches[0].get_data().edges) == [0.5, 50.5, 100.5]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["one step", "mean of 50 steps"]


def test_plot_drift_closes_the_figure_of_the_given_axes():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    other = plt.figure()  # the current figure: not plot_drift's to close
    try:
        assert plot_drift([1.0, 2.0], window=1, ax=ax) is fig
        assert fig.number not in plt.get_fignums() and other.number in plt.get_fignums()
    finally:
        plt.close(fig)
        plt.close(other)


# ----------------------------------------------------------------------------------------------------------
# plot_timeline


def _launch(t, corr, tid=1):
    return Event("cudaLaunchKernel", "cuda_runtime", t, 1, 1, tid, corr)


def _legend(ax):
    return [t.get_text() for t in ax.get_legend().get_texts()]


ROWS = ["host step (ProfilerStep)", "GPU step", "record_function", "host ops", "CUDA runtime", "GPU"]


def _row_extents(ax, row):
    """(left, right) in ms of every bar drawn in the given row (one broken_barh collection per row)."""
    return [(p.get_extents().x0, p.get_extents().x1) for p in ax.collections[ROWS.index(row)].get_paths()]


def _y_extents(collection):
    return [(p.get_extents().y0, p.get_extents().y1) for p in collection.get_paths()]


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_plot_timeline_counts_the_syncs(traces, close_figures, steps):
    ax = plot_timeline(traces["naive"], steps=steps)
    assert _legend(ax) == [f"sync calls ({2 * steps})", "GPU busy"]  # 2 syncs per step (see above)
    assert [t.get_text() for t in ax.get_yticklabels()] == ROWS
    assert min(t.get_fontsize() for t in ax.get_yticklabels() + ax.texts) >= 8
    step_labels = [t.get_text() for t in ax.texts]
    assert step_labels == [f"step #{k}" for k in range(1, steps + 1)]
    assert len(_row_extents(ax, "GPU step")) == steps


def test_plot_timeline_without_syncs_and_annotations(traces, close_figures):
    import matplotlib.pyplot as plt

    _, given = plt.subplots()
    ax = plot_timeline(traces["no_metrics"], steps=10, ax=given, annotations=False)
    assert ax is given
    assert _legend(ax)[0] == "sync calls (0)"
    assert len(ax.texts) == 0
    windows = step_windows(traces["no_metrics"])
    # in this trace the last GPU span ends before the last host window does: the axis ends with the host
    assert gpu_step_spans(traces["no_metrics"])[-1][1] < windows[-1].end
    assert ax.get_xlim() == pytest.approx((0, (windows[-1].end - windows[0].start) / 1000))  # all 3 steps, in ms


def test_plot_timeline_draws_gpu_work_past_the_host_window(close_figures):
    t = Trace([
        Event("ProfilerStep#1", "user_annotation", 0, 10, 1, 1),
        _launch(2, 1), _launch(8, 2),
        Event("k1", "kernel", 20, 5, 0, 7, 1),
        Event("k2", "kernel", 27, 3, 0, 7, 2),
        Event("ProfilerStep#2", "user_annotation", 10, 10, 1, 1),
        _launch(12, 3),
        Event("k3", "kernel", 40, 5, 0, 7, 3),   # step 2, not drawn with steps=1
    ])
    ax = plot_timeline(t, steps=1)
    assert ax.get_xlim() == pytest.approx((0, 0.030))  # to the end of step 1's GPU span, in ms
    assert _row_extents(ax, "host step (ProfilerStep)") == [pytest.approx((0, 0.010))]
    assert _row_extents(ax, "GPU step") == [pytest.approx((0.020, 0.030))]
    assert _row_extents(ax, "GPU") == [pytest.approx((0.020, 0.025)), pytest.approx((0.027, 0.030))]
    two = plot_timeline(t, steps=2)
    assert two.get_xlim() == pytest.approx((0, 0.045))
    assert _row_extents(two, "GPU step") == [pytest.approx((0.020, 0.030)), pytest.approx((0.040, 0.045))]


def test_plot_timeline_of_a_cpu_trace_has_no_gpu_step(close_figures):
    ax = plot_timeline(Trace([Event("ProfilerStep#1", "user_annotation", 0, 10, 1, 1)]), steps=1)
    assert _row_extents(ax, "GPU step") == [] and ax.get_xlim() == pytest.approx((0, 0.010))


def test_plot_timeline_needs_steps(close_figures):
    with pytest.raises(ValueError, match="no ProfilerStep windows: record it with a torch.profiler schedule"):
        plot_timeline(Trace([Event("k", "kernel", 0, 1, 0, 7)]))


@pytest.mark.parametrize("bad", [0, -1, True, 1.0])
def test_plot_timeline_rejects_bad_steps(traces, bad):
    with pytest.raises(ValueError, match=f"steps must be an int >= 1, got {bad!r}"):
        plot_timeline(traces["naive"], steps=bad)


def test_plot_timeline_draws_two_steps_by_default(traces, close_figures):
    ax = plot_timeline(traces["naive"])
    assert _legend(ax)[0] == "sync calls (4)"  # 2 per step
    assert [t.get_text() for t in ax.texts] == ["step #1", "step #2"]


def test_plot_timeline_rows_hold_what_overlaps_the_host_window(close_figures):
    # step 1's host window is [5000, 6000) us; bars are in ms since its start. Events that end exactly at
    # 5000 or start exactly at 6000 do not overlap it; GPU work is drawn up to the end of the GPU span (6200).
    t = Trace([
        Event("ProfilerStep#1", "user_annotation", 5000, 1000, 1, 1),
        Event("ProfilerStep#2", "user_annotation", 6000, 1000, 1, 1),
        Event("metrics", "user_annotation", 5100, 200, 1, 1),
        Event("after", "user_annotation", 6000, 100, 1, 1),            # starts at the window's end
        Event("aten::add", "cpu_op", 5200, 50, 1, 1),
        Event("aten::early", "cpu_op", 4000, 1000, 1, 1),              # ends at the first window's start
        Event("cudaLaunchKernel", "cuda_runtime", 5400, 10, 1, 1, 1),
        Event("cudaStreamSynchronize", "cuda_runtime", 5500, 50, 1, 1),
        Event("cudaLaunchKernel", "cuda_runtime", 6500, 10, 1, 1, 2),  # in step 2: not drawn
        Event("k1", "kernel", 5800, 400, 0, 7, 1),                      # step 1's GPU span [5800, 6200)
        Event("early", "kernel", 4900, 100, 0, 7),                      # ends at the first window's start
        Event("k2", "kernel", 6200, 100, 0, 7, 2),                      # starts at the right edge
    ])
    ax = plot_timeline(t, steps=1)
    expected = {
        "host step (ProfilerStep)": [(0.0, 1.0)],
        "GPU step": [(0.8, 1.2)],
        "record_function": [(0.1, 0.3)],
        "host ops": [(0.2, 0.25)],
        "CUDA runtime": [(0.4, 0.41)],   # the sync is drawn on top, in its own collection
        "GPU": [(0.8, 1.2)],
    }
    for row, extents in expected.items():
        assert _row_extents(ax, row) == [pytest.approx(e) for e in extents], row
    sync_bars = ax.collections[len(ROWS)]
    assert [(p.get_extents().x0, p.get_extents().x1) for p in sync_bars.get_paths()] == [pytest.approx((0.5, 0.55))]
    assert ax.get_xlim() == pytest.approx((0, 1.2))
    assert ax.get_xlabel() == "time since the first step began (ms)"
    # every bar sits on its own row: centred on the row's tick, inside the band halfway to the neighbours
    for y, collection in enumerate(ax.collections[:len(ROWS)]):
        for y0, y1 in _y_extents(collection):
            assert y - 0.5 < y0 < y1 < y + 0.5 and (y0 + y1) / 2 == pytest.approx(y), ROWS[y]
    y_runtime = ROWS.index("CUDA runtime")
    for y0, y1 in _y_extents(sync_bars):
        assert y_runtime - 0.5 < y0 < y1 < y_runtime + 0.5 and (y0 + y1) / 2 == pytest.approx(y_runtime)


def test_plot_timeline_draws_an_event_over_the_left_edge_from_the_edge_to_its_real_end(close_figures):
    # step 1's host window starts at 5000 us; each event below starts before it and ends inside it: its bar runs
    # from 0 (the edge) to its end, not for its whole duration from the edge
    t = Trace([
        Event("ProfilerStep#1", "user_annotation", 5000, 1000, 1, 1),
        Event("metrics", "user_annotation", 4000, 1300, 1, 1),          # [4000, 5300): 0.3 ms drawn, not 1.3
        Event("aten::early", "cpu_op", 4700, 500, 1, 1),                # [4700, 5200): 0.2 ms, not 0.5
        Event("cudaLaunchKernel", "cuda_runtime", 4950, 100, 1, 1),     # [4950, 5050): 0.05 ms, not 0.1
        Event("cudaStreamSynchronize", "cuda_runtime", 4980, 60, 1, 1),  # [4980, 5040): 0.04 ms, not 0.06
        Event("k", "kernel", 4900, 200, 0, 7),                          # [4900, 5100): 0.1 ms, not 0.2
        Event("k2", "kernel", 5500, 100, 0, 7),                         # inside the window: as it is
    ])
    ax = plot_timeline(t, steps=1)
    expected = {
        "GPU": [(0.0, 0.1), (0.5, 0.6)],
        "host ops": [(0.0, 0.2)],
        "record_function": [(0.0, 0.3)],
        "CUDA runtime": [(0.0, 0.05)],
        "host step (ProfilerStep)": [(0.0, 1.0)],
        "GPU step": [],
    }
    for row, extents in expected.items():
        assert _row_extents(ax, row) == [pytest.approx(e, abs=1e-9) for e in extents], row
    sync_bars = ax.collections[len(ROWS)]
    assert [(p.get_extents().x0, p.get_extents().x1) for p in sync_bars.get_paths()] == [
        pytest.approx((0.0, 0.04), abs=1e-9)]
    assert ax.get_xlim() == pytest.approx((0, 1.0))


def test_plot_timeline_keeps_the_least_width_of_an_event_that_ends_just_past_the_left_edge(close_figures):
    # a bar is at least 1 us wide (a sync 20 us) so that it shows; an event that ends 0.5 us after the edge too
    t = Trace([
        Event("ProfilerStep#1", "user_annotation", 5000, 1000, 1, 1),
        Event("aten::early", "cpu_op", 4000, 1000.5, 1, 1),
        Event("cudaStreamSynchronize", "cuda_runtime", 4990, 15, 1, 1),
    ])
    ax = plot_timeline(t, steps=1)
    assert _row_extents(ax, "host ops") == [pytest.approx((0.0, 0.001), abs=1e-9)]
    sync_bars = ax.collections[len(ROWS)]
    assert [(p.get_extents().x0, p.get_extents().x1) for p in sync_bars.get_paths()] == [
        pytest.approx((0.0, 0.02), abs=1e-9)]


def test_plot_timeline_step_labels_sit_in_their_windows(close_figures):
    # 1 ms host windows, the second 300 ms after the first: each label lies inside its own window on the
    # host-step row (row 0)
    t = Trace([
        Event("ProfilerStep#1", "user_annotation", 5000, 1000, 1, 1),
        Event("ProfilerStep#2", "user_annotation", 305000, 1000, 1, 1),
    ])
    ax = plot_timeline(t, steps=2)
    assert [t.get_text() for t in ax.texts] == ["step #1", "step #2"]
    for text, (left, right) in zip(ax.texts, [(0.0, 1.0), (300.0, 301.0)]):
        x, y = text.get_position()
        assert left <= x < right and -0.5 < y < 0.5, (text.get_text(), x, y)


# ----------------------------------------------------------------------------------------------------------
# plot_scalars


def test_plot_scalars_one_axes_per_tag(close_figures):
    scalars = {"train/b": [(1, 2.0), (2, 1.5)], "train/a": [(1, 0.5), (3, 0.25), (5, 0.125)]}
    axes = plot_scalars(scalars)
    assert len(axes) == 2
    # sorted by tag: a first; each axes shows its points
    assert [ax.get_title() for ax in axes] == ["train/a", "train/b"]
    x, y = axes[0].lines[0].get_data()
    assert list(x) == [1, 3, 5] and list(y) == [0.5, 0.25, 0.125]


def test_plot_scalars_lays_out_a_grid_of_ncols(close_figures):
    scalars = {f"t{i}": [(1, float(i)), (2, float(i) + 1)] for i in range(5)}
    axes = plot_scalars(scalars)
    fig = axes[0].figure
    assert len(axes) == 5 and len(fig.axes) == 5  # the sixth cell of the 3 x 2 grid is removed
    assert [ax.get_subplotspec().rowspan.start for ax in axes] == [0, 0, 1, 1, 2]
    assert [ax.get_subplotspec().colspan.start for ax in axes] == [0, 1, 0, 1, 0]
    assert tuple(float(x) for x in fig.get_size_inches()) == (4.0, 2.0 * 3)  # phone width, 2 inches a row
    assert len(plot_scalars(scalars, ncols=5)[0].figure.axes) == 5
    with pytest.raises(ValueError, match="ncols must be an int >= 1, got 0"):
        plot_scalars(scalars, ncols=0)


def test_plot_scalars_rejects_empty(close_figures):
    with pytest.raises(ValueError, match="no scalars to plot: log some with log_to_tensorboard first"):
        plot_scalars({})


def test_plot_scalars_needs_one_axes_per_tag(close_figures):
    import matplotlib.pyplot as plt

    _, axes = plt.subplots(1, 1, squeeze=False)
    with pytest.raises(ValueError, match=r"plot_scalars got 1 axes for 2 tags \['a', 'b'\]"):
        plot_scalars({"a": [(1, 1.0)], "b": [(1, 2.0)]}, axes=axes)


@pytest.mark.parametrize("bad", [True, 2.5, 0])
def test_plot_scalars_refuses_bad_ncols_with_the_whole_message(bad, close_figures):
    with pytest.raises(ValueError, match=whole(f"ncols must be an int >= 1, got {bad!r}.")):
        plot_scalars({"a": [(1, 1.0)], "b": [(1, 2.0)]}, ncols=bad)


def test_plot_scalars_draws_on_given_axes_as_a_grid_or_a_list(close_figures):
    import matplotlib.pyplot as plt

    scalars = {"b": [(1, 2.0), (2, 3.0)], "a": [(1, 1.0), (2, 0.5)]}
    _, grid = plt.subplots(2, 1, squeeze=False)  # a 2-D array of Axes: read through .flat
    _, (left, right) = plt.subplots(1, 2)
    for given, expected in ((grid, [grid[0, 0], grid[1, 0]]), ([left, right], [left, right])):
        axes = plot_scalars(scalars, axes=given)
        assert axes == expected
        assert [ax.get_title() for ax in axes] == ["a", "b"]
        assert [list(ax.lines[0].get_ydata()) for ax in axes] == [[1.0, 0.5], [2.0, 3.0]]


def test_plot_scalars_panels_do_not_overlap(close_figures):
    """Titles, tick labels and the x label of one panel stay clear of the next panel's, inside the figure."""
    scalars = {f"train/t{i}": [(1, 0.125 * i), (2, 0.5 + i)] for i in range(5)}
    axes = plot_scalars(scalars)
    fig = axes[0].figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [ax.get_tightbbox(renderer) for ax in axes]
    figure_box = fig.bbox
    for box in boxes:
        assert figure_box.x0 <= box.x0 and box.x1 <= figure_box.x1
        assert figure_box.y0 <= box.y0 and box.y1 <= figure_box.y1
    for i, j in itertools.combinations(range(len(boxes)), 2):
        assert not boxes[i].overlaps(boxes[j]), (axes[i].get_title(), axes[j].get_title())
