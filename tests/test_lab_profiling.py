"""mentor.lab.profiling: profiler sessions and record_steps, step_syncs on hand-made traces and on the H200
traces, audits and their table, ranged_mean_metric against MeanMetric, and the refusals of the CUDA-only helpers;
on CUDA (``@gpu``, run with `pytest -m gpu`): the profiler and the guard agree, audit's warm-up and table,
debug_mode_count."""

import gzip
import inspect
import json
import sys
import types
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from torch.testing import assert_close
from torchmetrics import MeanMetric

import mentor.lab.profiling as profiling
from marks import gpu
from mentor.lab.data import device_batches
from mentor.lab.profiling import (
    StepSyncs,
    audit,
    audit_table,
    debug_mode_count,
    profiling_session,
    ranged_mean_metric,
    record_steps,
    step_syncs,
)
from mentor.lab.trace import DEFAULT_WAIT_THRESHOLD_US, Event, Trace, load_trace, step_windows
from mentor.lab.train import build_setup, train
from mentor.syncs import SyncReport, SyncSite

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
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "rt") as f:
        assert json.load(f)["traceName"] == path.name  # not the temporary file torch wrote first, nor tmp_path


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


def _short_session(path: Path, steps: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own "Incorrect schedule" warning: the error below says more
        with profiling_session(path, wait=0, warmup=2, active=1) as prof:
            for _ in range(steps):
                torch.ones(4) + 1
                prof.step()


PROFILING_CASES = [
    pytest.param(lambda d: _short_session(d / "short.json", steps=1), RuntimeError,
                 r"profiling_session recorded nothing and wrote no trace to '.*short\.json': the block called "
                 r"prof\.step\(\) 1 time\(s\), but the schedule needs 3 steps \(wait 0 \+ warmup 2 \+ active 1\) "
                 r"and records only from step 3 on\. Call prof\.step\(\) once per training step and run at least 3 "
                 r"steps", id="profiling_session-ends-before-recording"),
    pytest.param(lambda d: _short_session(d / "none.json.gz", steps=0), RuntimeError,
                 r"wrote no trace to '.*none\.json\.gz': the block called prof\.step\(\) 0 time\(s\), but the "
                 r"schedule needs 3 steps", id="profiling_session-no-step-at-all"),
    pytest.param(lambda d: step_syncs(Trace([Event("cudaStreamSynchronize", "cuda_runtime", 5, 1, 1, 1)],
                                            path="run.json")), ValueError,
                 r"the trace 'run\.json' has no ProfilerStep windows, so there are no steps to count syncs in; "
                 r"record it with mentor\.lab\.profiling\.profiling_session \(or record_steps\) and call "
                 r"prof\.step\(\) "
                 r"once per training step\.", id="step_syncs-no-profiler-step"),
]


@pytest.mark.parametrize("call,error,message", PROFILING_CASES)
def test_profiling_bad_inputs(tmp_path, call, error, message):
    with pytest.raises(error, match=message):
        call(tmp_path)
    assert not (tmp_path / "short.json").exists() and not (tmp_path / "none.json.gz").exists()


def test_profiling_session_does_not_mask_the_blocks_own_error(tmp_path):
    # the block failed before its first step: that error, not "recorded nothing", is what the user must see
    with pytest.raises(KeyError, match="the block's own error"):
        with profiling_session(tmp_path / "t.json", wait=0, warmup=2, active=1):
            raise KeyError("the block's own error")


def test_profiling_session_that_reaches_its_active_steps_writes_the_trace(tmp_path):
    # the check does not fire when the schedule was run through (so the error above cannot be unconditional)
    _short_session(tmp_path / "full.json", steps=3)
    assert (tmp_path / "full.json").is_file()


def test_record_steps_on_cpu(tmp_path):
    seen = []
    path = record_steps(build_setup(num_classes=10), device_batches(2, 32, 10), tmp_path / "r.json.gz",
                        on_step=lambda s: seen.append(s.index), warmup=1, active=2)
    assert path == tmp_path / "r.json.gz" and path.is_file()
    # the profiled run's step 0 is the one warm-up step; steps 1 and 2 are recorded
    assert [w.name for w in step_windows(load_trace(path))] == ["ProfilerStep#1", "ProfilerStep#2"]
    # two untimed steps, then warmup + active profiled ones: each run's hook indices start at 0
    assert seen == [0, 1, 0, 1, 2]


def test_record_steps_defaults_to_two_warmup_and_three_active_steps(tmp_path):
    seen = []
    path = record_steps(build_setup(num_classes=10), device_batches(2, 32, 10), tmp_path / "r.json",
                        on_step=lambda s: seen.append(s.index))
    assert seen == [0, 1, 0, 1, 2, 3, 4]  # 2 untimed, then warmup 2 + active 3
    assert [w.name for w in step_windows(load_trace(path))] == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]


def test_record_steps_hides_only_the_profiler_s_clears_events_warning(tmp_path, monkeypatch):
    """torch's profiler may warn that it "clears events at the end of each cycle": torch 2.14 does so once per
    process, when a profiler prepares its trace a second time (profiler.py, prepare_trace); torch 2.11 did so for a
    one-cycle profiling_session of this suite. record_steps hides that warning and passes every other one on, here
    the hook's.

    A fake profiling_session stands in for torch's, so that the warning is raised whatever the torch version.
    """
    torch_message = ("Warning: Profiler clears events at the end of each cycle. Only events from the current "
                     "cycle will be reported. To keep events across cycles, set acc_events=True.")
    steps = []

    @contextmanager
    def fake_session(trace_path, **schedule):
        assert (trace_path, schedule) == (tmp_path / "r.json", dict(wait=0, warmup=1, active=2))
        warnings.warn(torch_message, UserWarning)
        yield types.SimpleNamespace(step=lambda: steps.append("step"))

    monkeypatch.setattr(profiling, "profiling_session", fake_session)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = record_steps(build_setup(num_classes=10), device_batches(2, 32, 10), tmp_path / "r.json",
                            on_step=lambda s: warnings.warn(f"hook of step {s.index}", UserWarning), warmup=1, active=2)
    assert path == tmp_path / "r.json"
    assert [str(w.message) for w in caught] == ["hook of step 0", "hook of step 1",  # the untimed steps
                                                "hook of step 0", "hook of step 1", "hook of step 2"]
    assert steps == ["step"] * 3


# ----------------------------------------------------------------------------------------------------------
# step_syncs on hand-made traces and on the H200 traces


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
    assert first.waits == () and second.waits == ()


def test_step_syncs_without_step_windows_raises():
    t = Trace([Event("cudaStreamSynchronize", "cuda_runtime", 1, 1, 1, 1)], path="x.json")
    with pytest.raises(ValueError, match=r"the trace 'x.json' has no ProfilerStep windows.*call prof.step\(\)"):
        step_syncs(t)


def test_step_syncs_attributes_at_the_edges_of_a_range():
    """A call belongs to a range that starts with it or that it ends with; one that ends up to 1e-3 us (a trace's
    nanosecond resolution) after the range still belongs to it, one that ends later does not. Of two ranges with the
    same times the later-listed one is the innermost."""
    t = Trace([
        Event("ProfilerStep#1", "user_annotation", 0, 100, 1, 1),
        Event("edge", "user_annotation", 10, 20, 1, 1),               # [10, 30]
        Event("tolerance", "user_annotation", 40, 10, 1, 1),          # [40, 50]
        Event("short", "user_annotation", 60, 11, 1, 1),              # [60, 71]
        Event("first", "user_annotation", 80, 10, 1, 1),
        Event("second", "user_annotation", 80, 10, 1, 1),
        Event("cudaStreamSynchronize", "cuda_runtime", 10, 2, 1, 1),   # starts with "edge"
        Event("cudaStreamSynchronize", "cuda_runtime", 28, 2, 1, 1),   # ends with "edge" (at 30)
        Event("cudaStreamSynchronize", "cuda_runtime", 50, 1e-3, 1, 1),  # ends at 50 + 1e-3: inside the tolerance
        Event("cudaStreamSynchronize", "cuda_runtime", 70, 1.5, 1, 1),  # ends at 71.5, 0.5 us after "short"
        Event("cudaStreamSynchronize", "cuda_runtime", 82, 2, 1, 1),   # inside "first" and "second"
    ])
    (step,) = step_syncs(t)
    assert step.ranges == ("edge", "edge", "tolerance", "(none)", "second")


def test_step_syncs_lists_the_waits_of_each_window_in_it():
    """A probable wait belongs to the window it starts in, not to every window."""
    t = Trace([
        Event("ProfilerStep#1", "user_annotation", 0, 1000, 1, 1),
        Event("cudaLaunchKernel", "cuda_runtime", 10, 5, 1, 1),
        Event("ProfilerStep#2", "user_annotation", 1000, 1000, 1, 1),
        Event("cudaMemcpyAsync", "cuda_runtime", 1100, 400, 1, 1),      # a long copy in the second step
    ])
    first, second = step_syncs(t)
    assert first.waits == ()
    assert [(w.name, w.start) for w in second.waits] == [("cudaMemcpyAsync", 1100)]


@pytest.mark.parametrize("path, where", [("", ""), ("x.json", " 'x.json'")])
def test_step_syncs_without_step_windows_says_exactly_why(path, where):
    """The trace's path is named when it has one; a trace built in memory has none."""
    t = Trace([Event("cudaStreamSynchronize", "cuda_runtime", 1, 1, 1, 1)], path=path)
    with pytest.raises(ValueError) as raised:
        step_syncs(t)
    assert str(raised.value) == (f"the trace{where} has no ProfilerStep windows, so there are no steps to count syncs "
                                 "in; record it with mentor.lab.profiling.profiling_session (or record_steps) and call "
                                 "prof.step() once per training step.")


def test_step_syncs_lists_probable_waits():
    t = Trace([
        Event("ProfilerStep#1", "user_annotation", 0, 1000, 1, 1),
        Event("cudaMemcpyAsync", "cuda_runtime", 10, 400, 1, 1),        # a long copy: probable wait
        Event("cudaLaunchKernel", "cuda_runtime", 420, 5, 1, 1),
        Event("cudaMemcpyAsync", "cuda_runtime", 500, 300, 1, 1),       # followed by a counted sync: left out
        Event("cudaStreamSynchronize", "cuda_runtime", 801, 2, 1, 1),
        Event("cudaLaunchKernel", "cuda_runtime", 900, 100, 1, 2),      # exactly the threshold: not longer
        Event("cuMemcpyDtoH_v2", "cuda_driver", 950, 500, 1, 3),        # a sync call: counted, not a wait
    ])
    (step,) = step_syncs(t)
    assert [(c.name, c.start) for c in step.calls] == [("cudaStreamSynchronize", 801), ("cuMemcpyDtoH_v2", 950)]
    assert [(w.name, w.start) for w in step.waits] == [("cudaMemcpyAsync", 10)]
    assert step.count == 2  # waits are not counted
    assert [(w.name, w.start) for w in step_syncs(t, wait_threshold_us=99.0)[0].waits] == [
        ("cudaMemcpyAsync", 10), ("cudaLaunchKernel", 900)]
    assert DEFAULT_WAIT_THRESHOLD_US == 100.0


@pytest.mark.parametrize("bad", [0, -5.0, True, "50"])
def test_step_syncs_rejects_bad_wait_threshold(bad):
    t = Trace([Event("ProfilerStep#1", "user_annotation", 0, 10, 1, 1)])
    with pytest.raises(ValueError, match=r"wait_threshold_us must be a positive number of microseconds"):
        step_syncs(t, wait_threshold_us=bad)


@pytest.mark.parametrize("name", ["naive", "no_metrics", "ranged_mean"])
def test_step_syncs_h200_traces_have_no_probable_waits(name):
    # computed from the committed traces: the longest runtime call in any step that is not a sync is a
    # 87 us cudaLaunchKernel (ranged_mean), below the 100 us default
    assert [s.waits for s in step_syncs(DATA / f"{name}.json.gz")] == [(), (), ()]


# ----------------------------------------------------------------------------------------------------------
# audit and audit_table (the table from hand-made reports; audit itself needs CUDA)


@pytest.mark.parametrize("bad", [[lambda: None], {"x": 3}, None])
def test_audit_rejects_bad_cases(bad):
    with pytest.raises(TypeError, match=r"audit takes a dict of \{label: callable with no arguments\}"):
        audit(bad)


def test_audit_type_error_message_is_exact():
    with pytest.raises(TypeError) as raised:
        audit({"x": 3})
    assert str(raised.value) == "audit takes a dict of {label: callable with no arguments}."


@no_cuda
def test_audit_needs_cuda():
    calls = []
    with pytest.raises(RuntimeError, match="no CUDA device"):
        audit({"append": lambda: calls.append(1)})
    assert calls == []


def test_audit_table_fits_its_width_and_cuts_long_source_lines():
    # a real file, so that the source text comes from linecache: this test's own lines
    here = Path(__file__).resolve()
    line = inspect.currentframe().f_lineno + 1
    long_line = "x" * 120  # this line is longer than the table is wide once indented, so it is cut
    short = SyncSite(str(here), line - 1, "test", ())
    long = SyncSite(str(here), line, "test", ())
    wrapped = SyncSite(str(here), line, "test", (), kind="torch.cuda.synchronize")
    table = audit_table({"update(loss)": SyncReport([long, long, wrapped]), "one": SyncReport([short]),
                         "none": SyncReport()})
    assert long_line
    cut = ("     " + 'long_line = "x" * 120  # this line is longer than the table is wide once indented, so it is '
           'cut')[:79] + "…"
    assert table.splitlines() == [
        f"{'update(loss)':<72} 3 syncs",
        f"  2x tests/test_lab_profiling.py:{line}",
        cut,
        f"  1x tests/test_lab_profiling.py:{line}  [torch.cuda.synchronize]",
        cut,
        f"{'one':<73} 1 sync",
        f"  1x tests/test_lab_profiling.py:{line - 1}",
        "     line = inspect.currentframe().f_lineno + 1",
        f"{'none':<72} 0 syncs",
    ]
    assert max(map(len, table.splitlines())) == 80


def test_audit_table_at_its_minimum_width_keeps_a_line_that_fits_exactly(tmp_path):
    """width=30 is allowed. An indented source line of exactly 30 columns stays whole; one of 31 is cut to
    29 columns + "…"."""
    source = tmp_path / "mod.py"
    source.write_text("value = 12345678901234567\nvalue = 123456789012345678\n")  # 25 and 26 characters
    fits, too_long = SyncSite(str(source), 1, "f", ()), SyncSite(str(source), 2, "f", ())
    table = audit_table({"a": SyncReport([fits, too_long])}, width=30)
    assert table.splitlines() == [
        f"{'a':<22} 2 syncs",  # 30 - len("2 syncs") - 1 = 22 columns for the label
        f"  1x {fits.where}",
        "     value = 12345678901234567",
        f"  1x {too_long.where}",
        "     value = 1234567890123456…",
    ]
    assert len(table.splitlines()[2]) == 30 and len(table.splitlines()[4]) == 30


@pytest.mark.parametrize("width", [29, 80.0, None])
def test_audit_table_rejects_a_bad_width(width):
    with pytest.raises(ValueError,
                       match=rf"width is the table's width in columns, an int of at least 30, not {width!r}"):
        audit_table({}, width=width)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_debug_mode_count_needs_cuda_and_a_callable():
    with pytest.raises(TypeError, match="debug_mode_count takes a callable, not int"):
        debug_mode_count(3)
    with pytest.raises(RuntimeError, match="torch sees no CUDA device"):
        debug_mode_count(lambda: None)


@no_cuda
def test_cuda_only_helpers_say_exactly_why_they_refuse():
    with pytest.raises(RuntimeError) as raised:
        audit({})
    assert str(raised.value) == ("audit counts CUDA host-device syncs and torch sees no CUDA device here; "
                                 "run it on a GPU machine (mentor.lab.env.needs_cuda tells you when to skip).")
    with pytest.raises(RuntimeError) as raised:
        debug_mode_count(lambda: None)
    assert str(raised.value) == "debug_mode_count counts CUDA syncs and torch sees no CUDA device; run it on a GPU."


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
                np.float32, shape,
                elements=st.one_of(finite, st.just(float("nan"))) if draw(st.booleans()) else finite))))
        kind = draw(st.sampled_from(["none", "float", "tensor", "scalar tensor"]))
        if kind == "none":
            weight = None
        elif kind == "float":
            weight = draw(st.one_of(st.floats(0, 5, width=32), st.just(float("nan"))))
        else:
            wshape = shape if kind == "tensor" else ()
            weight = torch.from_numpy(np.array(draw(hnp.arrays(np.float32, wshape,
                                                               elements=st.floats(0, 5, width=32)))))
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


def test_ranged_mean_makes_python_numbers_in_the_metric_s_dtype():
    """In a float64 metric 0.1 stays the float64 0.1 (as float32 it would be 0.100000001490116...), as in MeanMetric."""
    for cls in (ranged_mean_metric(), MeanMetric):
        m = cls().set_dtype(torch.float64)
        m.update(0.1)
        assert (m.mean_value.item(), m.weight.item()) == (0.1, 1.0), cls
        w = cls().set_dtype(torch.float64)
        w.update(torch.tensor(2.0, dtype=torch.float64), weight=0.1)
        assert (w.mean_value.item(), w.weight.item()) == (0.2, 0.1), cls  # 2 * 0.1 is exact in binary


def test_ranged_mean_makes_python_numbers_on_the_metric_s_device_not_the_default_one():
    """Under a default device of "meta", the numbers still go to the CPU metric's device (meta tensors hold no
    values: bool(nans.any()) of one raises)."""
    m = ranged_mean_metric()()
    with torch.device("meta"):
        m.update(2.0, weight=0.5)
        m.update(4.0, weight=1.5)
    assert m.mean_value.device.type == "cpu"
    assert (m.mean_value.item(), m.weight.item()) == (2.0 * 0.5 + 4.0 * 1.5, 2.0)
    assert m.compute().item() == 3.5


def test_ranged_mean_casts_value_and_weight_to_the_metric_s_dtype_before_multiplying():
    """float64 inputs to a float32 metric are cast first, as MeanMetric does. Each input is 1 + 0.4 * 2**-23, which
    float32 rounds to 1.0: both states are 3.0. Summed in float64 the three give 3 + 1.2 * 2**-23, 0.6 of a float32
    step (2**-22) above 3, which float32 would round up to 3 + 2**-22."""
    x = torch.full((3,), 1 + 0.4 * 2**-23, dtype=torch.float64)
    states = []
    for cls in (ranged_mean_metric(), MeanMetric):
        m = cls()
        m.update(x.clone(), weight=x.clone())
        assert m.mean_value.dtype == m.weight.dtype == torch.float32
        states.append((m.mean_value.item(), m.weight.item()))
    assert states == [(3.0, 3.0), (3.0, 3.0)]


@pytest.mark.parametrize("strategy", ["warn", "ignore", 5.0])
def test_ranged_mean_nan_check_without_a_weight_follows_torchmetrics(strategy):
    """Called without a weight, the NaN check gives what MeanMetric's gives: ones for the weight, NaNs handled."""
    for x in (torch.tensor([1.0, 2.0]), torch.tensor([1.0, float("nan"), 3.0])):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the "warn" policy's warning: compared elsewhere
            ranged = ranged_mean_metric()(nan_strategy=strategy)._cast_and_nan_check_input(x.clone())
            plain = MeanMetric(nan_strategy=strategy)._cast_and_nan_check_input(x.clone())
        for a, b in zip(ranged, plain):
            assert_close(a, b, rtol=0, atol=0)
    ignoring = ranged_mean_metric()(nan_strategy="ignore")
    value, weight = ignoring._cast_and_nan_check_input(torch.tensor([1.0, float("nan")]))
    assert value.tolist() == [1.0] and weight.tolist() == [1.0]


def test_ranged_mean_names_the_nan_policy_range_in_a_cpu_trace(tmp_path):
    metric = ranged_mean_metric()(nan_strategy="ignore")
    path = tmp_path / "ranged.json"
    with profiling_session(path, wait=0, warmup=1, active=1) as prof:
        for _ in range(2):
            metric.update(torch.tensor([1.0, float("nan")]))
            prof.step()
    names = {e.name for e in load_trace(path).by_cat("user_annotation")}
    assert {"nan check: isnan", "nan check: any()", "nan check: apply policy"} <= names
    assert "nan check: cast" not in names  # torchmetrics' own check casts, inside the policy's range
    assert metric.compute().item() == 1.0


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


# ----------------------------------------------------------------------------------------------------------
# On CUDA


def _here() -> int:
    """The line number of the caller's current line."""
    return sys._getframe(1).f_lineno


@gpu
def test_profiler_and_guard_agree(tmp_path):
    setup = build_setup(num_classes=100, device="cuda")
    batches = device_batches(8, image_size=32, num_classes=100, device="cuda")
    metric = ranged_mean_metric()().cuda()
    train(setup, batches, steps=2, on_step=lambda s: metric.update(s.loss))
    trace = tmp_path / "t.json.gz"
    with profiling_session(trace, wait=0, warmup=1, active=3) as prof:
        train(setup, batches, steps=4, on_step=lambda s: metric.update(s.loss), profiler=prof)
    steps = step_syncs(trace)
    assert [s.count for s in steps] == [2, 2, 2]
    assert all(set(s.ranges) == {"nan check: any()"} for s in steps)


@gpu
def test_audit_shows_the_kind_of_a_wrapped_call():
    table = audit({"device sync": lambda: torch.cuda.synchronize()}); line = _here()  # noqa: E702
    assert table.splitlines()[:2] == [f"{'device sync':<73} 1 sync",
                                      f"  1x tests/test_lab_profiling.py:{line}  [torch.cuda.synchronize]"], table


@gpu
def test_debug_mode_count_sees_item_and_not_device_synchronize():
    x = torch.rand(10, device="cuda")
    assert debug_mode_count(lambda: x.sum().item()) == 1
    assert debug_mode_count(lambda: torch.cuda.synchronize()) == 0
    assert torch.cuda.get_sync_debug_mode() == 0


@gpu
def test_audit_warms_each_case_up_before_counting():
    m = MeanMetric().cuda()  # the first update allocates and moves state; audit must not count it
    calls = []

    def update():
        calls.append(1)
        m.update(torch.ones((), device="cuda"))

    table = audit({"MeanMetric.update": update})
    assert len(calls) == 2  # one untimed warm-up, one counted
    first = table.splitlines()[0]
    assert first == f"{'MeanMetric.update':<72} 2 syncs", table
