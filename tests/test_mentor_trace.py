"""Tests of mentor.trace on hand-made traces and on the real H200 traces in tests/data (3 profiled steps each).

The traces were recorded from a small ResNet-18 run on an H200 (scripts/record_test_traces.py):
``no_metrics`` (training step only), ``naive`` (the naive metric set), ``optimized`` and
``ranged_mean`` (MeanMetric with record_function ranges around its stages).
"""

import gzip
import json
import shutil
import statistics
from pathlib import Path

import pytest

from mentor.trace import (
    GPU_CATEGORIES,
    SYNC_CALLS,
    Event,
    Trace,
    gpu_busy_intervals,
    gpu_idle_fraction,
    load_trace,
    plot_timeline,
    step_windows,
    sync_events,
)

DATA = Path(__file__).parent / "data"
NAMES = ["no_metrics", "naive", "optimized", "ranged_mean"]


@pytest.fixture(scope="module")
def traces():
    return {name: load_trace(DATA / f"{name}.json.gz") for name in NAMES}


@pytest.fixture
def close_figures():
    import matplotlib.pyplot as plt

    yield
    plt.close("all")


# ----------------------------------------------------------------------------------------------------------
# Loading


def test_load_gzip_and_plain_json_agree(tmp_path):
    plain = tmp_path / "naive.json"
    with gzip.open(DATA / "naive.json.gz", "rb") as src, open(plain, "wb") as dst:
        shutil.copyfileobj(src, dst)
    a, b = load_trace(DATA / "naive.json.gz"), load_trace(str(plain))
    assert len(a.events) > 1000
    assert a.events == b.events
    assert b.path == str(plain)


def test_load_keeps_complete_events_sorted(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "name": "b", "cat": "cpu_op", "ts": 5, "dur": 1, "pid": 1, "tid": 2},
        {"ph": "X", "name": "a", "cat": "cpu_op", "ts": 1, "dur": 10, "pid": 1, "tid": 2},
        {"ph": "X", "name": "inner", "cat": "cpu_op", "ts": 1, "dur": 2, "pid": 1, "tid": 2},
        {"ph": "i", "name": "instant", "ts": 3},           # not a complete event
        {"ph": "X", "name": "no ts"},                      # no timestamp
        "not a dict",
    ]}))
    t = load_trace(path)
    # sorted by start, and at equal start the longer (enclosing) event first
    assert [(e.name, e.start, e.dur) for e in t.events] == [("a", 1.0, 10.0), ("inner", 1.0, 2.0), ("b", 5.0, 1.0)]
    assert t.events[0].end == 11.0


def test_load_accepts_a_bare_event_list(tmp_path):
    path = tmp_path / "list.json"
    path.write_text(json.dumps([{"ph": "X", "name": "x", "ts": 0, "dur": 1}]))
    assert [e.name for e in load_trace(path).events] == ["x"]


def test_load_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no trace at .*missing.json.*pass the path of a .json or .json.gz"):
        load_trace(tmp_path / "missing.json")


def test_load_directory_is_not_a_trace(tmp_path):
    with pytest.raises(FileNotFoundError, match="no trace at"):
        load_trace(tmp_path)


def test_load_invalid_json(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="is not Chrome-trace JSON"):
        load_trace(path)


def test_load_invalid_gzipped_json(tmp_path):
    path = tmp_path / "bad.json.gz"
    with gzip.open(path, "wt") as f:
        f.write("[1, 2")
    with pytest.raises(ValueError, match="is not Chrome-trace JSON"):
        load_trace(path)


def test_load_json_without_trace_events(tmp_path):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"something": []}))
    with pytest.raises(ValueError, match="has no 'traceEvents' list: is it a torch.profiler Chrome trace"):
        load_trace(path)


# ----------------------------------------------------------------------------------------------------------
# Hand-made traces


def test_step_windows_host_only():
    t = Trace([
        Event("ProfilerStep#1", "user_annotation", 0, 10, 1, 1),
        Event("ProfilerStep#1", "gpu_user_annotation", 2, 10, 0, 7),
        Event("ProfilerStep#2", "user_annotation", 10, 10, 1, 1),
        Event("other", "user_annotation", 1, 1, 1, 1),
    ])
    assert [(w.name, w.start) for w in step_windows(t)] == [("ProfilerStep#1", 0), ("ProfilerStep#2", 10)]


def test_sync_events_by_name_category_and_window():
    t = Trace([
        Event("cudaStreamSynchronize", "cuda_runtime", 1, 1, 1, 1),
        Event("cudaDeviceSynchronize", "cuda_runtime", 5, 1, 1, 1),
        Event("cudaMemcpy", "cuda_driver", 9, 1, 1, 1),
        Event("cudaMemcpyAsync", "cuda_runtime", 2, 1, 1, 1),       # does not block
        Event("cudaStreamSynchronize", "cpu_op", 3, 1, 1, 1),       # wrong category
        Event("cudaEventSynchronize", "cuda_runtime", 10, 1, 1, 1),  # at the window's end: outside
    ])
    assert [e.start for e in sync_events(t)] == [1, 5, 9, 10]
    window = Event("ProfilerStep#1", "user_annotation", 1, 9, 1, 1)
    assert [e.start for e in sync_events(t, window)] == [1, 5, 9]
    assert set(SYNC_CALLS) >= {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy"}


def test_gpu_busy_intervals_merge_and_clip():
    t = Trace([
        Event("k1", "kernel", -5, 6, 0, 7),        # 1 us inside [0, 20)
        Event("k2", "kernel", 2, 4, 0, 7),         # [2, 6)
        Event("k3", "kernel", 4, 4, 0, 8),         # [4, 8): overlaps k2, another stream
        Event("m", "gpu_memcpy", 8, 2, 0, 7),      # [8, 10): touches k3's end
        Event("s", "gpu_memset", 15, 10, 0, 7),    # [15, 20) after clipping
        Event("host", "cpu_op", 0, 20, 1, 1),      # not GPU work
    ])
    assert gpu_busy_intervals(t, 0, 20) == [(0, 1), (2, 10), (15, 20)]
    assert set(GPU_CATEGORIES) == {"kernel", "gpu_memcpy", "gpu_memset"}


def test_gpu_idle_fraction_hand_made():
    t = Trace([
        Event("ProfilerStep#1", "user_annotation", 0, 20, 1, 1),
        Event("ProfilerStep#2", "user_annotation", 20, 10, 1, 1),
        Event("ProfilerStep#3", "user_annotation", 30, 0, 1, 1),
        Event("k2", "kernel", 2, 4, 0, 7),
        Event("k3", "kernel", 4, 4, 0, 8),
        Event("k4", "kernel", 18, 4, 0, 7),         # 2 us in each of the first two steps
    ])
    # step 1: busy [2, 8) and [18, 20) = 8 of 20; step 2: [20, 22) = 2 of 10; step 3: empty window
    assert gpu_idle_fraction(t) == pytest.approx([1 - 8 / 20, 1 - 2 / 10, 0.0])


@pytest.mark.parametrize("fn", [step_windows, sync_events, gpu_idle_fraction, plot_timeline])
def test_functions_reject_non_traces(fn):
    with pytest.raises(TypeError, match=r"expected a mentor.trace.Trace from load_trace\(path\), not str"):
        fn("naive.json.gz")


# ----------------------------------------------------------------------------------------------------------
# The H200 traces


@pytest.mark.parametrize("name", NAMES)
def test_three_step_windows(traces, name):
    assert [w.name for w in step_windows(traces[name])] == ["ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"]


def test_no_metrics_has_no_sync_in_its_steps(traces):
    t = traces["no_metrics"]
    assert [len(sync_events(t, w)) for w in step_windows(t)] == [0, 0, 0]


@pytest.mark.parametrize("name", ["naive", "ranged_mean"])
def test_two_stream_syncs_per_step_from_the_nan_check(traces, name):
    # MeanMetric's NaN check reads two booleans back: `nans.any() or nans_weight.any()`
    t = traces[name]
    for w in step_windows(t):
        calls = sync_events(t, w)
        assert [c.name for c in calls] == ["cudaStreamSynchronize"] * 2, w.name


def test_optimized_has_no_sync_in_its_steps(traces):
    # the optimized set: tensor weight, no NaN check, micro-averaged classifiers: nothing reads back per step
    t = traces["optimized"]
    assert [len(sync_events(t, w)) for w in step_windows(t)] == [0, 0, 0]


@pytest.mark.parametrize("name", NAMES)
def test_gpu_idle_fraction_in_unit_interval(traces, name):
    fractions = gpu_idle_fraction(traces[name])
    assert len(fractions) == 3
    assert all(0.0 <= f <= 1.0 for f in fractions)
    # every profiled step launched kernels and none kept the GPU busy throughout: strictly inside
    assert all(0.0 < f < 1.0 for f in fractions)


def test_naive_leaves_the_gpu_idle_longer_than_no_metrics(traces):
    # the naive set's syncs make the host wait for the GPU, which then waits for the host
    naive = statistics.mean(gpu_idle_fraction(traces["naive"]))
    none = statistics.mean(gpu_idle_fraction(traces["no_metrics"]))
    assert naive > none, (naive, none)


def _legend(ax):
    return [t.get_text() for t in ax.get_legend().get_texts()]


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_plot_timeline_counts_the_syncs(traces, close_figures, steps):
    ax = plot_timeline(traces["naive"], steps=steps)
    assert _legend(ax) == [f"sync calls ({2 * steps})", "GPU busy"]  # 2 syncs per step (see above)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["steps", "record_function", "host ops",
                                                            "CUDA runtime", "GPU"]
    step_labels = [t.get_text() for t in ax.texts]
    assert step_labels == [f"step #{k}" for k in range(1, steps + 1)]


def test_plot_timeline_without_syncs_and_annotations(traces, close_figures):
    import matplotlib.pyplot as plt

    _, given = plt.subplots()
    ax = plot_timeline(traces["no_metrics"], steps=10, ax=given, annotations=False)
    assert ax is given
    assert _legend(ax)[0] == "sync calls (0)"
    assert len(ax.texts) == 0
    windows = step_windows(traces["no_metrics"])
    assert ax.get_xlim() == pytest.approx((0, (windows[-1].end - windows[0].start) / 1000))  # all 3 steps, in ms


def test_plot_timeline_needs_steps(close_figures):
    with pytest.raises(ValueError, match="no ProfilerStep windows: record it with a torch.profiler schedule"):
        plot_timeline(Trace([Event("k", "kernel", 0, 1, 0, 7)]))


@pytest.mark.parametrize("bad", [0, -1, True, 1.0])
def test_plot_timeline_rejects_bad_steps(traces, bad):
    with pytest.raises(ValueError, match=f"steps must be an int >= 1, got {bad!r}"):
        plot_timeline(traces["naive"], steps=bad)
