"""mentor.lab.trace on hand-made traces and on the real H200 traces in tests/data (3 profiled steps each).

The traces were recorded from a small ResNet-18 run on an H200 (scripts/record_test_traces.py):
``no_metrics`` (training step only), ``naive`` (the naive metric set), ``optimized`` and
``ranged_mean`` (MeanMetric with record_function ranges around its stages).
"""

import gzip
import json
import shutil
import statistics
import sys
from pathlib import Path

import pytest
import torch

from marks import gpu
from mentor.lab.plots import plot_timeline
from mentor.lab.trace import (
    GPU_CATEGORIES,
    SYNC_CALLS,
    Event,
    Trace,
    gpu_busy_intervals,
    gpu_idle_fraction,
    gpu_step_spans,
    load_trace,
    step_windows,
    sync_events,
    wait_events,
)

DATA = Path(__file__).parent / "data"
NAMES = ["no_metrics", "naive", "optimized", "ranged_mean"]


@pytest.fixture(scope="module")
def traces():
    return {name: load_trace(DATA / f"{name}.json.gz") for name in NAMES}


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


def test_load_reads_the_correlation_id(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "name": "cudaLaunchKernel", "cat": "cuda_runtime", "ts": 1, "dur": 1, "args": {"correlation": 7}},
        {"ph": "X", "name": "k", "cat": "kernel", "ts": 3, "dur": 1, "args": {"correlation": 7.0}},
        {"ph": "X", "name": "no args", "cat": "cpu_op", "ts": 4, "dur": 1},
        {"ph": "X", "name": "odd", "cat": "cpu_op", "ts": 5, "dur": 1, "args": {"correlation": True}},
        {"ph": "X", "name": "text", "cat": "cpu_op", "ts": 6, "dur": 1, "args": {"correlation": "7"}},
    ]}))
    assert [e.correlation for e in load_trace(path).events] == [7, 7, None, None, None]


def test_event_constructor_stays_positional():
    e = Event("k", "kernel", 1.0, 2.0, 0, 7)
    assert e.correlation is None and e == Event("k", "kernel", 1.0, 2.0, 0, 7, None)
    assert Event("k", "kernel", 1.0, 2.0, 0, 7, 5).correlation == 5


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


def test_load_defaults_missing_name_and_category_and_reads_pid_tid(tmp_path):
    # a complete event without "name"/"cat" gets empty strings (not "None"); pid and tid are kept as written
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", "ts": 1, "dur": 2, "pid": 3, "tid": 4}]}))
    assert load_trace(path).events == [Event("", "", 1.0, 2.0, 3, 4, None)]


def test_load_gzip_decodes_utf8_whatever_the_locale(tmp_path):
    # the gzip branch must decode UTF-8 itself: under an ASCII locale the default text encoding cannot read "µ"
    import locale

    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wb") as f:
        f.write(json.dumps({"traceEvents": [{"ph": "X", "name": "µs", "ts": 1, "dur": 2}]},
                           ensure_ascii=False).encode("utf-8"))
    saved = locale.setlocale(locale.LC_CTYPE)
    try:
        locale.setlocale(locale.LC_CTYPE, "C")
        if sys.flags.utf8_mode or locale.getencoding().lower().replace("-", "") == "utf8":
            pytest.skip("text files default to UTF-8 here: nothing to distinguish")
        assert [e.name for e in load_trace(path).events] == ["µs"]
    finally:
        locale.setlocale(locale.LC_CTYPE, saved)


# ----------------------------------------------------------------------------------------------------------
# Bad files and bad arguments: the whole reason in the message


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _trace_file(path: Path, bad: dict) -> Path:
    """A .json trace whose event 1 (after a good event 0) has the fields of ``bad``."""
    events = [{"ph": "X", "name": "ok", "cat": "cpu_op", "ts": 0, "dur": 1},
              {"ph": "X", "name": "bad", "cat": "cpu_op", **bad}]
    path.write_text(json.dumps({"traceEvents": events}))  # json.dumps writes NaN as the bare token NaN
    return path


GOOD_JSON = json.dumps({"traceEvents": [{"ph": "X", "name": "a", "cat": "kernel", "ts": 1, "dur": 2}]}).encode()

PASS_A_TRACE = r"pass a \.json or \.json\.gz file written by torch\.profiler \(export_chrome_trace\)\.$"


def _zero_length_step() -> Trace:
    return Trace([Event("ProfilerStep#1", "user_annotation", 0, 10, 1, 1),
                  Event("cudaLaunchKernel", "cuda_runtime", 1, 1, 1, 1, 1), Event("k", "kernel", 3, 0, 0, 7, 1)])


TRACE_CASES = [
    pytest.param(lambda d: load_trace(_write(d / "noise.json.gz", b"this is not gzip at all")), ValueError,
                 r"'.*noise\.json\.gz' is named \.gz but is not gzip data \(Not a gzipped file .*\); gzip it, "
                 r"rename a plain JSON trace to \.json, or " + PASS_A_TRACE, id="load_trace-not-gzip"),
    pytest.param(lambda d: load_trace(_write(d / "garbage.json.gz", b"\x1f\x8b\x08\x00" + b"\x07garbage" * 8)),
                 ValueError, r"'.*garbage\.json\.gz' is a truncated or damaged gzip file \(error: .*\); "
                 r"record the trace again or " + PASS_A_TRACE, id="load_trace-gzip-garbage"),
    pytest.param(lambda d: load_trace(_write(d / "cut.json.gz", gzip.compress(GOOD_JSON)[:-12])), ValueError,
                 r"'.*cut\.json\.gz' is a truncated or damaged gzip file \(EOFError: Compressed file ended before "
                 r"the end-of-stream marker was reached\); record the trace again or " + PASS_A_TRACE,
                 id="load_trace-truncated-gzip"),
    pytest.param(lambda d: load_trace(_write(d / "plain.json.gz", GOOD_JSON)), ValueError,
                 r"'.*plain\.json\.gz' is named \.gz but is not gzip data \(Not a gzipped file \(b'\{\"'\)\); "
                 r"gzip it, rename a plain JSON trace to \.json, or " + PASS_A_TRACE,
                 id="load_trace-plain-json-as-gz"),
    pytest.param(lambda d: load_trace(_write(d / "latin.json", b'{"traceEvents": [\xff]}')), ValueError,
                 r"'.*latin\.json' is not UTF-8 text \(.*\); " + PASS_A_TRACE, id="load_trace-not-utf8"),
    pytest.param(lambda d: load_trace(_trace_file(d / "ts.json", {"ts": "abc", "dur": 1})), ValueError,
                 r"'.*ts\.json': event 1 \('bad'\) has ts='abc', but ts must be a finite number of microseconds; "
                 + PASS_A_TRACE, id="load_trace-ts-string"),
    pytest.param(lambda d: load_trace(_trace_file(d / "dur.json", {"ts": 5, "dur": [1]})), ValueError,
                 r"'.*dur\.json': event 1 \('bad'\) has dur=\[1\], but dur must be a finite number >= 0 of "
                 r"microseconds; " + PASS_A_TRACE, id="load_trace-dur-list"),
    pytest.param(lambda d: load_trace(_trace_file(d / "neg.json", {"ts": 5, "dur": -3})), ValueError,
                 r"'.*neg\.json': event 1 \('bad'\) has dur=-3, but dur must be a finite number >= 0 of "
                 r"microseconds; " + PASS_A_TRACE, id="load_trace-negative-dur"),
    pytest.param(lambda d: load_trace(_trace_file(d / "nan.json", {"ts": float("nan"), "dur": 1})), ValueError,
                 r"'.*nan\.json': event 1 \('bad'\) has ts=nan, but ts must be a finite number of microseconds; "
                 + PASS_A_TRACE, id="load_trace-nan-ts"),
    pytest.param(lambda d: load_trace(_trace_file(d / "inf.json", {"ts": 5, "dur": float("inf")})), ValueError,
                 r"'.*inf\.json': event 1 \('bad'\) has dur=inf, but dur must be a finite number >= 0",
                 id="load_trace-inf-dur"),
    pytest.param(lambda d: load_trace(_trace_file(d / "bool.json", {"ts": True, "dur": 1})), ValueError,
                 r"'.*bool\.json': event 1 \('bad'\) has ts=True, but ts must be a finite number",
                 id="load_trace-bool-ts"),
    pytest.param(lambda d: gpu_idle_fraction(_zero_length_step()), ValueError,
                 r"the GPU span of ProfilerStep#1 has zero length \(3 to 3 us\): there is no time to measure an "
                 r"idle share in; pass a trace recorded on a CUDA device whose steps run GPU work of nonzero "
                 r"duration\.",
                 id="gpu_idle_fraction-zero-length-step"),
    pytest.param(lambda d: gpu_busy_intervals(Trace([Event("k", "kernel", 0, 5, 0, 7)]), 5, 1), ValueError,
                 r"gpu_busy_intervals needs start <= end, got start=5 and end=1; pass the earlier time first\.",
                 id="gpu_busy_intervals-start-after-end"),
]


@pytest.mark.parametrize("call,error,message", TRACE_CASES)
def test_trace_bad_inputs(tmp_path, call, error, message):
    with pytest.raises(error, match=message):
        call(tmp_path)


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


def _launch(t, corr, tid=1):
    return Event("cudaLaunchKernel", "cuda_runtime", t, 1, 1, tid, corr)


def test_sync_calls_include_the_driver_api_and_cuda_free():
    assert {"cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize", "cuMemcpyDtoH", "cuMemcpyDtoH_v2",
            "cuMemcpy", "cudaFree"} <= set(SYNC_CALLS)
    assert not {"cudaMemcpyAsync", "cudaLaunchKernel", "cudaFreeAsync", "cuMemcpyDtoHAsync_v2"} & set(SYNC_CALLS)


def test_wait_events_threshold_window_and_follower():
    t = Trace([
        Event("cudaMemcpyAsync", "cuda_runtime", 0, 200, 1, 1),         # long, next call not a sync: a wait
        Event("cudaMemcpyAsync", "cuda_runtime", 300, 200, 1, 1),       # long, but next on its thread is a sync
        Event("cudaLaunchKernel", "cuda_runtime", 350, 500, 1, 2),      # long launch on another thread: a wait
        Event("cudaStreamSynchronize", "cuda_runtime", 501, 900, 1, 1),  # a sync call: never a wait
        Event("cuModuleLoadData", "cuda_driver", 2000, 50, 1, 1),       # short
        Event("aten::copy_", "cpu_op", 3000, 900, 1, 1),                # not a runtime call
    ])
    assert [e.start for e in wait_events(t)] == [0, 350]
    assert [e.start for e in wait_events(t, threshold_us=40)] == [0, 350, 2000]
    assert [e.start for e in wait_events(t, Event("ProfilerStep#1", "user_annotation", 100, 1000, 1, 1))] == [350]
    with pytest.raises(ValueError, match="wait_threshold_us must be a positive number"):
        wait_events(t, threshold_us=-1)


def test_gpu_step_spans_and_idle_fraction_by_correlation():
    # host window [0, 10) launches at 2 and 8; the GPU runs them at [20, 25) and [27, 30): after the window
    t = Trace([
        Event("ProfilerStep#1", "user_annotation", 0, 10, 1, 1),
        _launch(2, 1), _launch(8, 2),
        Event("k1", "kernel", 20, 5, 0, 7, 1),
        Event("k2", "kernel", 27, 3, 0, 7, 2),
    ])
    assert gpu_step_spans(t) == [(20, 30)]
    assert gpu_idle_fraction(t) == [0.2]  # 2 us idle of a 10 us span; the host window [0, 10) saw no GPU work


def test_gpu_step_spans_use_the_launch_time_on_any_thread():
    t = Trace([
        Event("ProfilerStep#1", "user_annotation", 0, 10, 1, 1),
        Event("ProfilerStep#2", "user_annotation", 10, 10, 1, 1),
        _launch(1, 1),
        Event("cuLaunchKernel", "cuda_driver", 9, 1, 1, 2, 2),   # backward thread, driver API, step 1
        _launch(12, 3),
        _launch(25, 4),                                          # after the last window: no step
        Event("a", "kernel", 5, 10, 0, 7, 1),                    # [5, 15)
        Event("b", "kernel", 16, 2, 0, 8, 2),                    # [16, 18), another stream
        Event("c", "gpu_memset", 18, 4, 0, 7, 3),                # [18, 22): step 2
        Event("d", "kernel", 40, 5, 0, 7, 4),
        Event("e", "kernel", 50, 5, 0, 7, 99),                   # no launch with this id: in no span
    ])
    assert gpu_step_spans(t) == [(5, 18), (18, 22)]
    # step 1: busy [5, 15) and [16, 18) = 12 of 13; step 2: busy throughout
    assert gpu_idle_fraction(t) == pytest.approx([1 / 13, 0.0], abs=1e-12)


def test_gpu_step_spans_and_idle_count_copies():
    # fails if gpu_memcpy events are ignored: the span would end at 25 and the copy would not count as busy
    t = Trace([
        Event("ProfilerStep#1", "user_annotation", 0, 10, 1, 1),
        _launch(2, 1), Event("cudaMemcpyAsync", "cuda_runtime", 5, 1, 1, 1, 2), _launch(7, 3),
        Event("k", "kernel", 20, 5, 0, 7, 1),
        Event("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", 25, 3, 0, 7, 2),
        Event("m", "gpu_memset", 28, 2, 0, 7, 3),
    ])
    assert gpu_step_spans(t) == [(20, 30)]
    assert gpu_idle_fraction(t) == [0.0]


def test_gpu_step_span_ends_with_a_trailing_copy():
    # complements test_gpu_step_spans_and_idle_count_copies: here the copy is the step's last GPU work, so a
    # span that ignores gpu_memcpy ends at 25 instead of 30 (and the idle share becomes 2/5 of a shorter span)
    t = Trace([
        Event("ProfilerStep#1", "user_annotation", 0, 10, 1, 1),
        _launch(2, 1), Event("cudaMemcpyAsync", "cuda_runtime", 5, 1, 1, 1, 2),
        Event("k", "kernel", 20, 3, 0, 7, 1),
        Event("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", 25, 5, 0, 7, 2),
    ])
    assert gpu_step_spans(t) == [(20, 30)]
    assert gpu_idle_fraction(t) == [0.2]  # busy [20, 23) and [25, 30) of [20, 30)


def test_gpu_idle_counts_other_work_inside_the_span():
    # busy is every GPU event within the span, also work that the step did not launch
    t = Trace([
        Event("ProfilerStep#1", "user_annotation", 0, 10, 1, 1),
        _launch(1, 1), _launch(2, 2),
        Event("k1", "kernel", 10, 2, 0, 7, 1),
        Event("k2", "kernel", 18, 2, 0, 7, 2),
        Event("other", "gpu_memcpy", 12, 2, 0, 9, None),
    ])
    assert gpu_idle_fraction(t) == [0.4]  # span [10, 20): busy [10, 14) and [18, 20)


def test_gpu_step_spans_name_the_step_without_gpu_work():
    t = Trace([
        Event("ProfilerStep#1", "user_annotation", 0, 10, 1, 1), _launch(1, 1), Event("k", "kernel", 3, 1, 0, 7, 1),
        Event("ProfilerStep#2", "user_annotation", 10, 10, 1, 1),
        Event("k2", "kernel", 12, 1, 0, 7, None),  # no correlation id: not linked to the step
    ])
    with pytest.raises(ValueError, match=r"ProfilerStep#2 \(host window at 10 us\) launched no GPU work"):
        gpu_step_spans(t)
    with pytest.raises(ValueError, match=r"ProfilerStep#2"):
        gpu_idle_fraction(t)


def test_gpu_step_spans_need_windows():
    with pytest.raises(ValueError, match="the trace has no ProfilerStep windows"):
        gpu_step_spans(Trace([Event("k", "kernel", 0, 1, 0, 7, 1)]))


def test_gpu_idle_fraction_zero_length_span_is_an_error():
    t = Trace([Event("ProfilerStep#1", "user_annotation", 0, 10, 1, 1), _launch(1, 1),
               Event("k", "kernel", 3, 0, 0, 7, 1)])
    assert gpu_step_spans(t) == [(3, 3)]
    with pytest.raises(ValueError, match=r"the GPU span of ProfilerStep#1 has zero length"):
        gpu_idle_fraction(t)


def test_gpu_busy_intervals_rejects_reversed_bounds():
    t = Trace([Event("k", "kernel", 0, 5, 0, 7)])
    with pytest.raises(ValueError, match="gpu_busy_intervals needs start <= end, got start=5 and end=1"):
        gpu_busy_intervals(t, 5, 1)
    assert gpu_busy_intervals(t, 2, 2) == []


def test_gpu_step_spans_take_launches_in_half_open_windows():
    # a launch at a window's start belongs to that step, one at its end to the next step
    t = Trace([
        Event("ProfilerStep#1", "user_annotation", 0, 10, 1, 1),
        Event("ProfilerStep#2", "user_annotation", 10, 10, 1, 1),
        _launch(0, 1), _launch(10, 2), _launch(15, 3),
        Event("a", "kernel", 30, 2, 0, 7, 1),
        Event("b", "kernel", 40, 5, 0, 7, 2),
        Event("c", "kernel", 50, 1, 0, 7, 3),
    ])
    assert gpu_step_spans(t) == [(30, 32), (40, 51)]


@pytest.mark.parametrize("fn", [step_windows, sync_events, wait_events, gpu_step_spans, gpu_idle_fraction,
                                plot_timeline, lambda t: gpu_busy_intervals(t, 0, 1)])
def test_functions_reject_non_traces(fn):
    with pytest.raises(TypeError, match=r"expected a mentor\.measure\.Trace from load_trace\(path\), not str"):
        fn("naive.json.gz")


# ----------------------------------------------------------------------------------------------------------
# host_time


def test_host_time_splits_each_range_and_averages():
    from mentor.lab.trace import host_time

    t = Trace([
        Event("metrics", "user_annotation", 0, 200, 1, 1),
        Event("cudaLaunchKernel", "cuda_runtime", 10, 6, 1, 1),
        Event("cudaLaunchKernelExC", "cuda_runtime", 20, 4, 1, 1),
        Event("cudaMemcpyAsync", "cuda_runtime", 30, 150, 1, 1),   # a probable wait (longer than 100 us)
        Event("cudaEventRecord", "cuda_runtime", 185, 2, 1, 1),
        Event("metrics", "user_annotation", 1000, 100, 1, 1),
        Event("cuLaunchKernel", "cuda_driver", 1010, 10, 1, 1),
        Event("cudaStreamSynchronize", "cuda_runtime", 1050, 30, 1, 1),
        Event("cudaLaunchKernel", "cuda_runtime", 1105, 5, 1, 1),    # after the range
        Event("cudaLaunchKernel", "cuda_runtime", 1020, 5, 1, 9),    # another thread
        Event("metrics", "gpu_user_annotation", 1000, 100, 0, 7),    # the GPU copy of the range: not a range
    ])
    h = host_time(t, "metrics")
    assert (h.ranges, h.total_us, h.wait_us, h.launch_us, h.other_api_us, h.launches) == (
        2, 150.0, 90.0, 10.0, 1.0, 1.5)
    assert h.rest_us == 49.0
    with pytest.raises(ValueError, match=r"no range named 'update'; wrap the code in "
                                         r"torch.profiler.record_function\('update'\)"):
        host_time(t, "update")


def test_host_time_half_open_range_threshold_and_sums():
    from mentor.lab.trace import host_time

    t = Trace([
        Event("metrics", "user_annotation", 100, 200, 1, 1),      # [100, 300)
        Event("cudaEventRecord", "cuda_runtime", 100, 2, 1, 1),   # starts with the range: inside
        Event("cudaMemsetAsync", "cuda_runtime", 150, 3, 1, 1),
        Event("cudaMemcpyAsync", "cuda_runtime", 160, 50, 1, 1),  # a wait only below a 50 us threshold
        Event("cudaLaunchKernel", "cuda_runtime", 250, 5, 1, 1),
        Event("cudaLaunchKernel", "cuda_runtime", 300, 7, 1, 1),  # starts at the range's end: outside
    ])
    h = host_time(t, "metrics")
    assert (h.name, h.ranges, h.total_us, h.wait_us, h.launch_us, h.other_api_us, h.launches) == (
        "metrics", 1, 200.0, 0.0, 5.0, 2.0 + 3.0 + 50.0, 1.0)
    low = host_time(t, "metrics", threshold_us=40)
    assert (low.wait_us, low.launch_us, low.other_api_us) == (50.0, 5.0, 2.0 + 3.0)


def test_host_time_table_pins_every_column():
    from mentor.lab.trace import HostTime, host_time_table

    table = host_time_table({"naive": HostTime("m", 3, 1234.5, 1000.0, 50.25, 4.0, 12.0),
                             "a name longer than twenty": HostTime("m", 1, 10.0, 0.0, 1.0, 0.0, 1.0)})
    assert table.splitlines() == [
        "config               range us   waits  launches  other API    rest  kernels",
        "naive                  1234.5  1000.0      50.2        4.0   180.2     12.0",
        "a name longer than…      10.0     0.0       1.0        0.0     9.0      1.0",
    ]


def test_host_time_table_shortens_labels_past_19_characters():
    from mentor.lab.trace import HostTime, host_time_table

    h = HostTime("m", 1, 10.0, 0.0, 1.0, 0.0, 1.0)
    table = host_time_table({"a label of 19 chars": h, "a label of 20 chars!": h})
    assert [line[:20] for line in table.splitlines()[1:]] == ["a label of 19 chars ", "a label of 20 char… "]


@gpu
def test_host_time_finds_the_wait_of_an_item_in_a_range(tmp_path):
    from mentor.lab.profiling import profiling_session
    from mentor.lab.trace import host_time, load_trace

    x = torch.randn(4096, 4096, device="cuda")
    path = tmp_path / "t.json.gz"
    with profiling_session(path, wait=0, warmup=1, active=2) as prof:
        for _ in range(3):
            y = x @ x  # keeps the GPU busy, so that the read-back below waits
            with torch.profiler.record_function("read"):
                y.sum().item()
            prof.step()
    h = host_time(load_trace(path), "read")
    assert h.ranges == 2 and h.launches >= 1
    assert h.wait_us > 0.5 * h.total_us  # the matmul (about a millisecond) is waited for inside the range


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


# Computed once from the committed traces with gpu_step_spans / gpu_idle_fraction (deterministic given the
# files): trace timestamps in us, fractions as printed by Python.
H200_SPANS = {
    "naive": [(5169558932474.657, 5169558951018.491), (5169558951641.938, 5169558971387.836),
              (5169558972176.24, 5169558995010.574)],
    "no_metrics": [(5169558382615.106, 5169558395389.102), (5169558396051.364, 5169558409083.53),
                   (5169558410047.55, 5169558432581.951)],
}

H200_IDLE = {
    "naive": [0.900047164430815, 0.9062283457911723, 0.9188009181965309],
    "no_metrics": [0.8642859703907421, 0.8661440765030156, 0.9225809566250421],
}


@pytest.mark.parametrize("name", ["naive", "no_metrics"])
def test_gpu_step_spans_and_idle_of_the_h200_traces(traces, name):
    flat = [x for span in gpu_step_spans(traces[name]) for x in span]
    assert flat == pytest.approx([x for span in H200_SPANS[name] for x in span], abs=1e-3)
    assert gpu_idle_fraction(traces[name]) == pytest.approx(H200_IDLE[name], abs=1e-9)
    # this small model is launch-bound: each step's GPU work starts after its host window does and ends
    # before the next window begins
    windows = step_windows(traces[name])
    for w, nxt, (start, end) in zip(windows, windows[1:] + [None], gpu_step_spans(traces[name])):
        assert w.start < start < w.end and (nxt is None or end < nxt.start)


@pytest.mark.parametrize("name", NAMES)
def test_gpu_step_spans_against_the_profilers_gpu_step_annotation(traces, name):
    # Kineto also draws each ProfilerStep on the GPU (category gpu_user_annotation), over the kernels linked to
    # the step's range on the main thread. The spans start where it does; they end at or after it because
    # they also take the kernels that the autograd thread launched during the host window (backward).
    t = traces[name]
    for w, (start, end) in zip(step_windows(t), gpu_step_spans(t)):
        (piece,) = [e for e in t.by_cat("gpu_user_annotation") if e.name == w.name]
        assert start == pytest.approx(piece.start, abs=0.01)
        assert end >= piece.end - 0.01


def test_naive_leaves_the_gpu_idle_longer_than_no_metrics(traces):
    # the naive set's syncs make the host wait for the GPU, which then waits for the host
    naive = statistics.mean(gpu_idle_fraction(traces["naive"]))
    none = statistics.mean(gpu_idle_fraction(traces["no_metrics"]))
    assert naive > none, (naive, none)
