"""CPU tests of mentor.profiling: profiler sessions, step_syncs on the H200 traces, sync reports, ranged_mean_metric."""

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from torch.testing import assert_close
from torchmetrics import MeanMetric

from mentor.data import device_batches
from mentor.profiling import (
    StepSyncs,
    SyncReport,
    SyncSite,
    audit,
    count_syncs,
    profiling_session,
    ranged_mean_metric,
    record_steps,
    short_path,
    step_syncs,
    sync_guard,
)
from mentor.trace import Event, Trace, load_trace, step_windows
from mentor.train import build_setup

# slow CPUs and the NumPy/Tensor strategies: judge the examples, not the time it takes to draw them
SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

DATA = Path(__file__).parent / "data"
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")


# ----------------------------------------------------------------------------------------------------------
# profiling_session and record_steps (CPU activity only here)


def _tiny_loop(prof, steps):
    for _ in range(steps):
        with torch.profiler.record_function("work"):
            torch.ones(20, 20) @ torch.ones(20, 20)
        prof.step()


@pytest.mark.parametrize("name,magic", [("t.json", b"{"), ("sub/dir/t.json.gz", b"\x1f\x8b")])
def test_profiling_session_writes_a_trace(tmp_path, name, magic):
    path = tmp_path / name
    with profiling_session(path, wait=1, warmup=1, active=2) as prof:
        _tiny_loop(prof, 4)
    assert path.read_bytes().lstrip()[:len(magic)] == magic  # gzipped when the name ends in .gz
    trace = load_trace(path)
    assert len(step_windows(trace)) == 2  # the `active` steps
    assert any(e.name == "work" for e in trace.by_cat("user_annotation"))
    assert [s.count for s in step_syncs(trace)] == [0, 0]  # no CUDA, no sync calls


@pytest.mark.parametrize("kwargs,message", [
    (dict(wait=-1), "wait must be an int >= 0, got -1"),
    (dict(warmup=True), "warmup must be an int >= 0, got True"),
    (dict(active=0), "active must be an int >= 1, got 0"),
])
def test_profiling_session_rejects_bad_schedule(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        with profiling_session(tmp_path / "t.json", **kwargs):
            pass


@pytest.mark.parametrize("name", ["t.txt", "t.gz", "t.tar.gz", "t"])
def test_profiling_session_rejects_bad_names(tmp_path, name):
    with pytest.raises(ValueError, match=r"trace_path must end in .json or .json.gz"):
        with profiling_session(tmp_path / name):
            pass


def test_record_steps_on_cpu(tmp_path):
    seen = []
    path = record_steps(build_setup(num_classes=10), device_batches(2, 32, 10), tmp_path / "r.json.gz",
                        on_step=lambda s: seen.append(s.index), warmup=1, active=2)
    assert path == tmp_path / "r.json.gz" and path.is_file()
    assert len(step_windows(load_trace(path))) == 2
    # two untimed steps, then warmup + active profiled ones: each run's hook indices start at 0
    assert seen == [0, 1, 0, 1, 2]


# ----------------------------------------------------------------------------------------------------------
# step_syncs on the H200 traces


def test_step_syncs_no_metrics():
    steps = step_syncs(DATA / "no_metrics.json.gz")
    assert [s.step for s in steps] == ["ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"]
    assert [s.count for s in steps] == [0, 0, 0]


def test_step_syncs_naive_two_unranged_syncs_per_step():
    steps = step_syncs(str(DATA / "naive.json.gz"))
    assert [s.count for s in steps] == [2, 2, 2]
    for s in steps:
        assert s.ranges == ("(none)", "(none)")  # the naive run has no record_function ranges
        assert all(op != "(none)" and op.startswith("aten::") for op in s.ops), s.ops


def test_step_syncs_ranged_mean_in_the_nan_check():
    steps = step_syncs(load_trace(DATA / "ranged_mean.json.gz"))
    assert [s.count for s in steps] == [2, 2, 2]
    for s in steps:
        assert dict(s.by_range()) == {"nan check: any()": 2}
        assert all(c.name == "cudaStreamSynchronize" for c in s.calls)
        # the host op reading the boolean back (aten::_local_scalar_dense, under item()/is_nonzero)
        assert all(op != "(none)" and op.startswith("aten::") for op in s.ops), s.ops


def test_step_syncs_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no trace at"):
        step_syncs(tmp_path / "nope.json.gz")


def test_step_syncs_attributes_to_innermost_range_and_op():
    t = Trace([
        Event("ProfilerStep#1", "user_annotation", 0, 100, 1, 1),
        Event("outer", "user_annotation", 5, 50, 1, 1),
        Event("inner", "user_annotation", 10, 20, 1, 1),
        Event("other thread", "user_annotation", 10, 5, 1, 2),
        Event("aten::item", "cpu_op", 11, 10, 1, 1),
        Event("aten::_local_scalar_dense", "cpu_op", 12, 5, 1, 1),
        Event("cudaStreamSynchronize", "cuda_runtime", 13, 2, 1, 1),   # inner / _local_scalar_dense
        Event("cudaStreamSynchronize", "cuda_runtime", 40, 2, 1, 1),   # outer / no op
        Event("cudaDeviceSynchronize", "cuda_runtime", 70, 2, 1, 1),   # no range, no op
        Event("ProfilerStep#2", "user_annotation", 100, 50, 1, 1),
    ])
    first, second = step_syncs(t)
    assert first.count == 3 and second.count == 0
    assert first.ranges == ("inner", "outer", "(none)")
    assert first.ops == ("aten::_local_scalar_dense", "(none)", "(none)")
    assert first.by_range() == {"inner": 1, "outer": 1, "(none)": 1}
    assert isinstance(first, StepSyncs)


# ----------------------------------------------------------------------------------------------------------
# Sync reports (built by hand: recording them needs CUDA)


@pytest.mark.parametrize("path,expected", [
    ("/x/lib/python3.11/site-packages/torchmetrics/aggregation.py", "torchmetrics/aggregation.py"),
    ("/usr/lib/python3/dist-packages/torch/cuda/__init__.py", "torch/cuda/__init__.py"),
    ("/work/main/mentor/metrics.py", "mentor/metrics.py"),
    ("/home/u/book/ch1/notebook.py", "book/ch1/notebook.py"),
    ("/a/tests/b/tests/test_x.py", "tests/test_x.py"),  # the innermost anchor
    ("/home/u/elsewhere/script.py", "/home/u/elsewhere/script.py"),
])
def test_short_path(path, expected):
    assert short_path(path) == expected


TM = "/x/site-packages/torchmetrics/aggregation.py"
USER = "/home/u/proj/loop.py"


def _site(line=93, user_line=10):
    stack = ((USER, user_line, "main"), ("/x/site-packages/torchmetrics/metric.py", 500, "wrapped_func"),
             (TM, line, "_cast_and_nan_check_input"))
    return SyncSite(TM, line, "_cast_and_nan_check_input", stack)


def test_sync_site_where_and_caller():
    site = _site()
    assert site.where == "torchmetrics/aggregation.py:93"
    assert site.caller == f"{USER}:10"  # innermost frame outside torch, torchmetrics and mentor.profiling


def test_sync_site_caller_falls_back_to_where():
    site = SyncSite(TM, 93, "f", ((TM, 93, "f"),))
    assert site.caller == site.where


def test_sync_site_code_reads_the_line(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text("a = 1\nflag = bool(x.any())\n")
    assert SyncSite(str(source), 2, "f", ()).code == "flag = bool(x.any())"


def test_sync_report_table_and_counts():
    report = SyncReport([_site(), _site(), _site(line=95, user_line=12)])
    assert report.count == 3
    assert report.by_line() == {"torchmetrics/aggregation.py:93": 2, "torchmetrics/aggregation.py:95": 1}
    assert report.table().splitlines() == [
        f"  2x  torchmetrics/aggregation.py:93  in _cast_and_nan_check_input()  <- {USER}:10",
        f"  1x  torchmetrics/aggregation.py:95  in _cast_and_nan_check_input()  <- {USER}:12",
    ]
    assert SyncReport().table() == "no synchronizing calls"


@no_cuda
def test_sync_guard_needs_cuda():
    with pytest.raises(RuntimeError, match=r"torch sees no CUDA device here; run it on a GPU machine.*needs_cuda"):
        with sync_guard():
            pass


def test_sync_guard_rejects_non_bool_strict():
    with pytest.raises(TypeError, match="strict must be True or False, not 1"):
        with sync_guard(strict=1):  # type: ignore[arg-type]
            pass


@no_cuda
def test_count_syncs_needs_cuda():
    calls = []
    with pytest.raises(RuntimeError, match="no CUDA device"):
        count_syncs(calls.append, 1)
    assert calls == []  # refused before running the function


def test_count_syncs_rejects_non_callable():
    with pytest.raises(TypeError, match=r"count_syncs takes a callable \(e.g. metric.update\), not int"):
        count_syncs(3)


@pytest.mark.parametrize("bad", [[lambda: None], {"x": 3}, None])
def test_audit_rejects_bad_cases(bad):
    with pytest.raises(TypeError, match=r"audit takes a dict of \{label: callable with no arguments\}"):
        audit(bad)


@no_cuda
def test_audit_needs_cuda():
    calls = []
    with pytest.raises(RuntimeError, match="no CUDA device"):
        audit({"append": lambda: calls.append(1)})
    assert calls == []


# ----------------------------------------------------------------------------------------------------------
# ranged_mean_metric equals MeanMetric: values, weights, NaN policies

STRATEGIES = ["error", "warn", "ignore", "disable", 0.0, 5.0]
finite = st.floats(-100, 100, width=32)


@st.composite
def mean_updates(draw):
    out = []
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.booleans()):
            value = draw(st.one_of(finite, st.just(float("nan"))))
            shape = ()
        else:
            shape = draw(hnp.array_shapes(min_dims=1, max_dims=2, min_side=0, max_side=4))
            value = torch.from_numpy(np.array(draw(hnp.arrays(
                np.float32, shape, elements=st.one_of(finite, st.just(float("nan"))) if draw(st.booleans()) else finite))))
        kind = draw(st.sampled_from(["none", "float", "tensor", "scalar tensor"]))
        if kind == "none":
            weight = None
        elif kind == "float":
            weight = draw(st.one_of(st.floats(0, 5, width=32), st.just(float("nan"))))
        else:
            wshape = shape if kind == "tensor" else ()
            weight = torch.from_numpy(np.array(draw(hnp.arrays(np.float32, wshape, elements=st.floats(0, 5, width=32)))))
        out.append((value, weight))
    return out


def _outcome(metric, stream):
    """What a metric does with a stream: ("raised", type, update index) or ("value", tensor), plus warnings seen."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i, (v, w) in enumerate(stream):
            v = v.clone() if isinstance(v, torch.Tensor) else v  # the float policy writes into its input
            w = w.clone() if isinstance(w, torch.Tensor) else w
            try:
                metric.update(v) if w is None else metric.update(v, weight=w)
            except Exception as err:  # noqa: BLE001 - compared between the two metrics
                return ("raised", type(err), i), len(caught)
        result = metric.compute()
    return ("value", result), len([c for c in caught if "nan" in str(c.message).lower()])


@pytest.mark.parametrize("strategy", STRATEGIES, ids=str)
@settings(max_examples=40, deadline=None, suppress_health_check=SLOW_OK)
@given(stream=mean_updates())
def test_ranged_mean_equals_mean_metric(strategy, stream):
    ranged, ranged_warnings = _outcome(ranged_mean_metric()(nan_strategy=strategy), stream)
    plain, plain_warnings = _outcome(MeanMetric(nan_strategy=strategy), stream)
    assert ranged[0] == plain[0]
    if ranged[0] == "raised":
        assert ranged[1:] == plain[1:]
    else:
        assert_close(ranged[1], plain[1], rtol=0, atol=0, equal_nan=True)
        assert ranged_warnings == plain_warnings


def test_ranged_mean_weights_and_nan_error():
    m = ranged_mean_metric()()
    m.update(torch.tensor([1.0, 3.0]), weight=torch.tensor([1.0, 3.0]))
    m.update(2.0, weight=2.0)
    assert float(m.compute()) == pytest.approx((1 + 9 + 4) / (1 + 3 + 2), rel=1e-6)  # float32 state
    strict = ranged_mean_metric()(nan_strategy="error")
    with pytest.raises(RuntimeError, match="Encountered `nan` values in tensor"):
        strict.update(torch.tensor([1.0, float("nan")]))


def test_ranged_mean_is_a_mean_metric():
    cls = ranged_mean_metric()
    assert issubclass(cls, MeanMetric) and cls.__name__ == "RangedMeanMetric"


def test_ranged_mean_ranges_in_a_cpu_trace(tmp_path):
    metric = ranged_mean_metric()()
    path = tmp_path / "ranged.json"
    with profiling_session(path, wait=0, warmup=1, active=1) as prof:
        for _ in range(2):
            metric.update(torch.tensor([1.0, 2.0]), weight=torch.tensor([1.0, 1.0]))
            prof.step()
    names = {e.name for e in load_trace(path).by_cat("user_annotation")}
    assert {"mean: value to tensor", "mean: weight to tensor", "mean: broadcast weight", "nan check: isnan",
            "nan check: any()", "nan check: cast", "mean: accumulate"} <= names
    assert "nan check: apply policy" not in names  # no NaN in this update
