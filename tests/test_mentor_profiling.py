"""CPU tests of mentor.profiling: profiler sessions, step_syncs on the H200 traces, sync reports, ranged_mean_metric."""

import functools
import inspect
import sys
import threading
import traceback
import types
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from torch.testing import assert_close
from torchmetrics import MeanMetric

import mentor.profiling as profiling
from mentor.data import device_batches
from mentor.ddp import single_rank_group
from mentor.profiling import (
    COLLECTIVES,
    DEBUG_MODE,
    PAGEABLE_COPY,
    StepSyncs,
    SyncError,
    SyncReport,
    SyncSite,
    _copy_waits,
    _intercept,
    _targets,
    audit,
    audit_table,
    count_syncs,
    is_pageable_d2h_copy,
    profiling_session,
    ranged_mean_metric,
    record_steps,
    short_path,
    step_syncs,
    sync_guard,
)
from mentor.trace import DEFAULT_WAIT_THRESHOLD_US, Event, Trace, load_trace, step_windows
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
                                 "in; record it with mentor.profiling.profiling_session (or record_steps) and call "
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
# Sync reports (built by hand: recording them needs CUDA)


@pytest.mark.parametrize("path,expected", [
    ("/x/lib/python3.11/site-packages/torchmetrics/aggregation.py", "torchmetrics/aggregation.py"),
    ("/usr/lib/python3/dist-packages/torch/cuda/__init__.py", "torch/cuda/__init__.py"),
    ("/work/main/mentor/metrics.py", "mentor/metrics.py"),
    ("/home/u/book/ch1/notebook.py", "book/ch1/notebook.py"),
    ("/a/tests/b/tests/test_x.py", "tests/test_x.py"),  # the innermost anchor
    ("/home/u/elsewhere/script.py", "/home/u/elsewhere/script.py"),
    ("/tmp/ipykernel_759/1813045355.py", "<cell>"),  # a Jupyter cell's temporary file
    ("/tmp/ipykernel_759/helpers.py", "/tmp/ipykernel_759/helpers.py"),  # a real file in such a folder
    # only the first marker splits: a package folder inside site-packages keeps its own site-packages/
    ("/venv/site-packages/pkg/site-packages/mod.py", "pkg/site-packages/mod.py"),
    (r"C:\Users\u\AppData\Local\Temp\ipykernel_759\1813045355.py", "<cell>"),  # a cell on Windows
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
    assert table.splitlines() == [
        f"{'update(loss)':<72} 3 syncs",
        f"  2x tests/test_mentor_profiling.py:{line}",
        ("     " + 'long_line = "x" * 120  # this line is longer than the table is wide once indented, so it is cut')[:79]
        + "…",
        f"  1x tests/test_mentor_profiling.py:{line}  [torch.cuda.synchronize]",
        ("     " + 'long_line = "x" * 120  # this line is longer than the table is wide once indented, so it is cut')[:79]
        + "…",
        f"{'one':<73} 1 sync",
        f"  1x tests/test_mentor_profiling.py:{line - 1}",
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
    with pytest.raises(ValueError, match=rf"width is the table's width in columns, an int of at least 30, not {width!r}"):
        audit_table({}, width=width)


def test_sync_site_kind_defaults_to_debug_mode_and_shows_in_the_table():
    assert _site().kind == DEBUG_MODE == "debug mode"
    extra = SyncSite(USER, 7, "main", ((USER, 7, "main"),), "torch.cuda.synchronize")
    report = SyncReport([_site(), extra])
    assert report.table().splitlines() == [
        f"  1x  torchmetrics/aggregation.py:93  in _cast_and_nan_check_input()  <- {USER}:10",
        f"  1x  {USER}:7  in main()  <- {USER}:7  [torch.cuda.synchronize]",
    ]
    assert report.by_kind() == {"debug mode": 1, "torch.cuda.synchronize": 1}


# ----------------------------------------------------------------------------------------------------------
# The interceptor behind sync_guard: wrapped Python-level calls, checked on CPU (gloo, fakes)


def _here() -> int:
    """The line number of the caller's current line."""
    return sys._getframe(1).f_lineno


def _attributes():
    """Every attribute the interceptor replaces, with its current value (``None`` when it is inherited)."""
    return {(id(owner), name): vars(owner).get(name) for owner, name, _ in _targets()} | {
        (id(torch.Tensor), "copy_"): vars(torch.Tensor).get("copy_")}


@pytest.fixture
def originals():
    before = _attributes()
    named = (torch.cuda.synchronize, torch.cuda.empty_cache, torch.cuda.Event.synchronize,
             torch.cuda.Stream.synchronize, dist.all_reduce, dist.barrier, dist.distributed_c10d.all_gather,
             torch.Tensor.copy_)
    yield before, named
    after = (torch.cuda.synchronize, torch.cuda.empty_cache, torch.cuda.Event.synchronize,
             torch.cuda.Stream.synchronize, dist.all_reduce, dist.barrier, dist.distributed_c10d.all_gather,
             torch.Tensor.copy_)
    assert all(a is b for a, b in zip(after, named))
    assert _attributes() == before


def test_targets_cover_the_documented_calls():
    kinds = {kind for _, _, kind in _targets()}
    assert {"torch.cuda.synchronize", "Event.synchronize", "Stream.synchronize", "empty_cache"} <= kinds
    assert {f"collective: {name}" for name in COLLECTIVES} <= kinds
    assert {"all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "broadcast",
            "broadcast_object_list", "reduce", "reduce_scatter", "reduce_scatter_tensor", "gather", "scatter",
            "all_to_all", "all_to_all_single", "barrier", "monitored_barrier"} <= set(COLLECTIVES)
    # both the public module and distributed_c10d (whose functions call each other by global name)
    assert {(owner.__name__, name) for owner, name, kind in _targets() if kind == "collective: all_gather"} == {
        ("torch.distributed", "all_gather"), ("torch.distributed.distributed_c10d", "all_gather")}


def test_interceptor_records_gloo_collectives_with_kind_and_line(originals):
    report = SyncReport()
    with single_rank_group("gloo"):
        t = torch.tensor([1.0, 2.0])
        out = [torch.zeros(2)]
        with _intercept(report):
            dist.all_reduce(t); line_reduce = _here()  # noqa: E702 - the call and its line number together
            dist.barrier(); line_barrier = _here()  # noqa: E702
            dist.all_gather(out, t); line_gather = _here()  # noqa: E702
            dist.all_gather_object([None], {"a": 1}); line_object = _here()  # noqa: E702
    assert [s.kind for s in report.sites] == ["collective: all_reduce", "collective: barrier",
                                              "collective: all_gather", "collective: all_gather_object"]
    assert [s.line for s in report.sites] == [line_reduce, line_barrier, line_gather, line_object]
    assert all(s.file == __file__ for s in report.sites)
    assert all(s.function == "test_interceptor_records_gloo_collectives_with_kind_and_line" for s in report.sites)
    assert report.sites[0].where == f"tests/test_mentor_profiling.py:{line_reduce}"
    assert report.sites[0].caller == report.sites[0].where
    assert report.sites[0].code.startswith("dist.all_reduce(t)")
    # the originals ran: the gather filled its output
    assert torch.equal(out[0], torch.tensor([1.0, 2.0]))
    # all_gather_object calls all_gather inside: counted once, as the outer call
    assert report.by_kind()["collective: all_gather"] == 1


def test_interceptor_strict_raises_before_the_collective(originals, monkeypatch):
    report = SyncReport()
    with single_rank_group("gloo"):
        t = torch.tensor([1.0, 2.0])
        out = [torch.zeros(2)]
        with pytest.raises(SyncError) as raised:
            with _intercept(report, strict=True):
                line = _here() + 1
                dist.all_gather(out, t)
        assert torch.equal(out[0], torch.zeros(2))  # not gathered: the original was not called
        assert str(raised.value).startswith(f"collective: all_gather at tests/test_mentor_profiling.py:{line} ")
        calls = []
        monkeypatch.setattr(dist, "all_reduce", lambda *a, **k: calls.append(a))
        with pytest.raises(SyncError, match=r"collective: all_reduce at tests/test_mentor_profiling.py:\d+ "):
            with _intercept(SyncReport(), strict=True):
                dist.all_reduce(t)
        assert calls == []
    assert [s.kind for s in report.sites] == ["collective: all_gather"]  # recorded, then raised


def test_interceptor_restores_after_an_exception(originals):
    report = SyncReport()
    with pytest.raises(ZeroDivisionError):
        with _intercept(report):
            assert torch.cuda.synchronize is not originals[1][0]
            assert "copy_" in vars(torch.Tensor)
            1 / 0
    assert "copy_" not in vars(torch.Tensor) and torch.Tensor.copy_ is torch._C.TensorBase.copy_
    assert torch.cuda.synchronize is originals[1][0] and dist.all_reduce is originals[1][4]


def test_interceptor_restores_after_a_sync_error(originals, monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    fake = torch.cuda.synchronize
    with pytest.raises(SyncError, match="torch.cuda.synchronize at tests/test_mentor_profiling.py"):
        with _intercept(SyncReport(), strict=True):
            torch.cuda.synchronize()
    assert torch.cuda.synchronize is fake


def test_interceptor_wraps_fakes_of_the_cuda_calls(originals, monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty"))
    monkeypatch.setattr(torch.cuda.Stream, "synchronize", lambda self: calls.append("stream"))
    if hasattr(torch, "accelerator"):
        monkeypatch.setattr(torch.accelerator, "synchronize", lambda device=None: calls.append("accelerator"))
    report = SyncReport()
    event = torch.cuda.Event()  # never recorded: its real synchronize() returns at once, also without CUDA
    with _intercept(report):
        torch.cuda.synchronize(); first = _here()  # noqa: E702
        torch.cuda.empty_cache()
        torch.cuda.Stream.synchronize(object())
        event.synchronize(); last = _here()  # noqa: E702
        if hasattr(torch, "accelerator"):
            torch.accelerator.synchronize()
    expected = ["torch.cuda.synchronize", "empty_cache", "Stream.synchronize", "Event.synchronize"]
    expected += ["torch.accelerator.synchronize"] if hasattr(torch, "accelerator") else []
    assert [s.kind for s in report.sites] == expected
    assert calls == ["sync", "empty", "stream"] + (["accelerator"] if hasattr(torch, "accelerator") else [])
    assert (report.sites[0].line, report.sites[3].line) == (first, last)
    assert report.table().splitlines()[0].endswith("  [torch.cuda.synchronize]")


def test_interceptor_counts_a_wrapped_call_inside_another_once(originals, monkeypatch):
    # a fake synchronize that empties the cache, looked up at call time: one site, the outer call
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: torch.cuda.empty_cache())
    report = SyncReport()
    with _intercept(report):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    assert [s.kind for s in report.sites] == ["torch.cuda.synchronize", "empty_cache"]


def test_interceptor_nested_inner_records_and_restores_the_outer(originals, monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    fake = torch.cuda.synchronize
    outer, inner = SyncReport(), SyncReport()
    with _intercept(outer):
        outer_state = _attributes()
        outer_sync = torch.cuda.synchronize
        torch.cuda.synchronize()
        with _intercept(inner, strict=True):
            with pytest.raises(SyncError):
                torch.cuda.synchronize()
        assert _attributes() == outer_state and torch.cuda.synchronize is outer_sync
        torch.cuda.synchronize()
    assert torch.cuda.synchronize is fake
    assert (outer.count, inner.count) == (2, 1)  # the inner guard's call is in its own report only


def test_interceptor_records_calls_from_other_threads(originals, monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    report = SyncReport()

    def worker():
        torch.cuda.synchronize()

    with _intercept(report):
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
    assert [(s.kind, s.function) for s in report.sites] == [("torch.cuda.synchronize", "worker")]


def test_interceptor_copy_passes_through_on_cpu(originals):
    report = SyncReport()
    dst = torch.zeros(3)
    with _intercept(report):
        dst.copy_(torch.ones(3), non_blocking=True)
        torch.Tensor.copy_(dst, torch.full((3,), 2.0), True)
    assert report.count == 0 and torch.equal(dst, torch.full((3,), 2.0))


@pytest.mark.parametrize("strict", [False, True])
def test_interceptor_reports_a_pageable_copy(originals, monkeypatch, strict):
    # the decision needs a CUDA source; on CPU the test makes every copy count to check the wrapper
    seen = []
    monkeypatch.setattr(profiling, "_copy_waits", lambda dst, src, nb: seen.append(nb) or True)
    report = SyncReport()
    dst = torch.zeros(2)
    if strict:
        with pytest.raises(SyncError, match=rf"pageable non_blocking copy at tests/test_mentor_profiling.py:\d+ "):
            with _intercept(report, strict=True):
                dst.copy_(torch.ones(2), non_blocking=True)
        assert torch.equal(dst, torch.zeros(2))  # not copied
    else:
        with _intercept(report):
            dst.copy_(torch.ones(2), non_blocking=True); line = _here()  # noqa: E702
        assert torch.equal(dst, torch.ones(2)) and report.sites[0].line == line
    assert [s.kind for s in report.sites] == [PAGEABLE_COPY] and seen == [True]


def test_debug_mode_warning_under_the_copy_wrapper_points_at_the_caller(originals):
    # a warning raised inside copy_ is attributed by Python to the innermost Python frame, the wrapper;
    # the guard's handler moves it to the caller. A CPU copy_ that warns stands in for a blocking D2H copy.
    report = SyncReport()
    dst = torch.zeros(2)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = functools.partial(profiling._record_warning, report)  # no frame of its own
        with _intercept(SyncReport()):
            dst.copy_(torch.ones(2, dtype=torch.complex64)); line = _here()  # noqa: E702 - warns: complex to real
    assert [(s.file, s.line, s.function, s.kind) for s in report.sites] == [
        (__file__, line, "test_debug_mode_warning_under_the_copy_wrapper_points_at_the_caller", DEBUG_MODE)]
    assert report.sites[0].stack[-1] == (__file__, line, "test_debug_mode_warning_under_the_copy_wrapper_points_at_the_caller")


SRC = ["cuda", "cpu"]
DST = ["cuda", "cpu"]


@pytest.mark.parametrize("src", SRC)
@pytest.mark.parametrize("dst", DST)
@pytest.mark.parametrize("pinned", [False, True])
@pytest.mark.parametrize("non_blocking", [False, True])
def test_pageable_copy_decision_table(src, dst, pinned, non_blocking):
    expected = (src, dst, pinned, non_blocking) == ("cuda", "cpu", False, True)  # the only waiting combination
    assert is_pageable_d2h_copy(src, dst, pinned, non_blocking) is expected
    assert is_pageable_d2h_copy(torch.device(src), torch.device(dst), pinned, non_blocking) is expected


def test_pageable_copy_decision_with_indexed_devices():
    assert is_pageable_d2h_copy("cuda:1", "cpu", False, True) is True
    assert is_pageable_d2h_copy("cuda:1", "cuda:0", False, True) is False
    assert is_pageable_d2h_copy("meta", "cpu", False, True) is False


@pytest.mark.parametrize("args,error,message", [
    (("cuda", "cpu", 0, True), TypeError, "dst_pinned must be True or False, not 0"),
    (("cuda", "cpu", False, None), TypeError, "non_blocking must be True or False, not None"),
    (("gpu", "cpu", False, True), ValueError, "src_device must be a device such as 'cuda:0'"),
    (("cuda", 3.5, False, True), ValueError, "dst_device must be a device such as 'cuda:0'"),
])
def test_pageable_copy_decision_rejects_bad_input(args, error, message):
    with pytest.raises(error, match=message):
        is_pageable_d2h_copy(*args)


def test_copy_waits_on_cpu_tensors_is_false():
    a, b = torch.zeros(2), torch.ones(2)
    assert _copy_waits(a, b, True) is False  # CPU source
    assert _copy_waits(a, b, False) is False
    assert _copy_waits(a, 1.0, True) is False  # not a tensor: left to copy_ to reject


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


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_debug_mode_count_needs_cuda_and_a_callable():
    from mentor.profiling import debug_mode_count

    with pytest.raises(TypeError, match="debug_mode_count takes a callable, not int"):
        debug_mode_count(3)
    with pytest.raises(RuntimeError, match="torch sees no CUDA device"):
        debug_mode_count(lambda: None)


# ----------------------------------------------------------------------------------------------------------
# Pinned values of the interceptor's parts, independent of the real call stack and of CUDA

TORCH_FILE = "/x/site-packages/torch/cuda/__init__.py"
HERE = profiling.__file__  # frames of mentor.profiling itself


def _fake_stack(monkeypatch, frames):
    """Make ``traceback.extract_stack`` return ``frames`` ((file, line, function), outermost first)."""
    summaries = [traceback.FrameSummary(file, line, name, lookup_line=False) for file, line, name in frames]
    monkeypatch.setattr(traceback, "extract_stack", lambda *a, **k: list(summaries))


@pytest.mark.parametrize("frames, expected", [
    # the innermost frame outside torch, torchmetrics and this module; this module's inner frames are dropped
    ([(USER, 10, "main"), (TM, 93, "update"), (TORCH_FILE, 20, "synchronize"), (HERE, 400, "intercepted"),
      (HERE, 390, "_seen"), (HERE, 380, "_site_here")],
     (USER, 10, "main", ((USER, 10, "main"), (TM, 93, "update"), (TORCH_FILE, 20, "synchronize")))),
    # a frame without a line number reads as line 0
    ([(USER, None, "<module>"), (HERE, 380, "_site_here")], (USER, 0, "<module>", ((USER, 0, "<module>"),))),
    # only library frames left: the innermost of them
    ([("/x/site-packages/torch/a.py", 1, "f"), (TM, 2, "g"), (TORCH_FILE, 3, "h"), (HERE, 4, "_site_here")],
     (TORCH_FILE, 3, "h", (("/x/site-packages/torch/a.py", 1, "f"), (TM, 2, "g"), (TORCH_FILE, 3, "h")))),
    # nothing but this module: an unknown site
    ([(HERE, 1, "a"), (HERE, 2, "_site_here")], ("?", 0, "?", ())),
])
def test_site_here_picks_the_caller_from_the_stack(monkeypatch, frames, expected):
    _fake_stack(monkeypatch, frames)
    site = profiling._site_here("torch.cuda.synchronize")
    assert site == SyncSite(*expected, kind="torch.cuda.synchronize")
    assert (site.file, site.line, site.function, site.stack) == expected


def test_seen_records_the_site_and_strict_raises_naming_it(monkeypatch):
    _fake_stack(monkeypatch, [(USER, 12, "train"), (TORCH_FILE, 20, "synchronize"), (HERE, 390, "_seen")])
    report = SyncReport()
    assert profiling._seen(report, False, "empty_cache") is None
    with pytest.raises(SyncError) as raised:
        profiling._seen(report, True, "collective: all_reduce")
    assert str(raised.value) == (f"collective: all_reduce at {USER}:12 (in train()): sync_guard(strict=True) forbids "
                                 "synchronizing calls; the call was not made.")
    stack = ((USER, 12, "train"), (TORCH_FILE, 20, "synchronize"))
    assert report.sites == [SyncSite(USER, 12, "train", stack, "empty_cache"),
                            SyncSite(USER, 12, "train", stack, "collective: all_reduce")]  # recorded, then raised


def test_is_library_reads_windows_paths():
    assert profiling._is_library(r"C:\env\Lib\site-packages\torch\cuda\__init__.py") is True
    assert profiling._is_library(r"C:\env\Lib\site-packages\torchmetrics\metric.py") is True
    assert profiling._is_library(r"C:\proj\mentor\profiling.py") is True
    assert profiling._is_library(r"C:\proj\loop.py") is False
    site = SyncSite(r"C:\env\Lib\site-packages\torchmetrics\metric.py", 5, "f",
                    ((r"C:\proj\loop.py", 10, "main"), (r"C:\env\Lib\site-packages\torchmetrics\metric.py", 5, "f")))
    assert site.caller == r"C:\proj\loop.py:10"


class _OnDevice(torch.Tensor):
    """A CPU tensor that reports the device type it is given and records when its pinning is asked."""

    @property
    def device(self):
        return torch.device(self.fake_device)

    def is_pinned(self, *args, **kwargs):
        self.asked.append("is_pinned")
        return self.fake_pinned


def _on(device, pinned=False):
    t = torch.zeros(2).as_subclass(_OnDevice)
    t.fake_device, t.fake_pinned, t.asked = device, pinned, []
    return t


@pytest.mark.parametrize("src, dst, pinned, non_blocking, waits", [
    ("cuda", "cpu", False, True, True),  # the only copy that waits
    ("cuda:1", "cpu", False, True, True),
    ("cuda", "cpu", True, True, False),  # pinned memory: no wait
    ("cuda", "cpu", False, False, False),  # blocking: the debug mode flags it
    ("cuda", "cpu", False, 1, False),  # only True itself counts
    ("cuda", "cpu", False, None, False),
    ("cuda", "cuda", False, True, False),
    ("cpu", "cpu", False, True, False),
    ("cpu", "cuda", False, True, False),
    ("meta", "cpu", False, True, False),
])
def test_copy_waits_decides_on_device_types_and_asks_pinning_last(src, dst, pinned, non_blocking, waits):
    d, s = _on(dst, pinned), _on(src)
    assert _copy_waits(d, s, non_blocking) is waits
    # pinning is asked only of a non-blocking copy from CUDA to the host
    expected = ["is_pinned"] if src.startswith("cuda") and dst == "cpu" and non_blocking is True else []
    assert d.asked == expected and s.asked == []


def test_copy_waits_needs_two_tensors():
    src = _on("cuda")
    assert _copy_waits(3.0, src, True) is False
    assert _copy_waits(_on("cpu"), [1.0], True) is False
    assert src.asked == []


def _accelerator_targets():
    return [(owner, name, kind) for owner, name, kind in _targets() if kind == "torch.accelerator.synchronize"]


def test_targets_list_the_cuda_calls_and_the_accelerator_when_it_has_synchronize(monkeypatch):
    import torch.cuda.memory

    calls = [(owner, name, kind) for owner, name, kind in _targets() if not kind.startswith("collective: ")]
    expected = [(torch.cuda, "synchronize", "torch.cuda.synchronize"),
                (torch.cuda.Event, "synchronize", "Event.synchronize"),
                (torch.cuda.Stream, "synchronize", "Stream.synchronize"),
                (torch.cuda, "empty_cache", "empty_cache"),
                (torch.cuda.memory, "empty_cache", "empty_cache")]
    if hasattr(getattr(torch, "accelerator", None), "synchronize"):
        expected.append((torch.accelerator, "synchronize", "torch.accelerator.synchronize"))
    assert [(id(o), n, k) for o, n, k in calls] == [(id(o), n, k) for o, n, k in expected]
    fake = types.SimpleNamespace(synchronize=lambda device=None: None)
    monkeypatch.setattr(torch, "accelerator", fake, raising=False)
    assert [(id(o), n, k) for o, n, k in _accelerator_targets()] == [
        (id(fake), "synchronize", "torch.accelerator.synchronize")]
    monkeypatch.setattr(torch, "accelerator", types.SimpleNamespace())  # a torch.accelerator without synchronize
    assert _accelerator_targets() == []
    monkeypatch.delattr(torch, "accelerator")  # a torch without torch.accelerator
    assert _accelerator_targets() == []


def test_audit_type_error_message_is_exact():
    with pytest.raises(TypeError) as raised:
        audit({"x": 3})
    assert str(raised.value) == "audit takes a dict of {label: callable with no arguments}."


@no_cuda
def test_cuda_only_helpers_say_exactly_why_they_refuse():
    from mentor.profiling import debug_mode_count

    with pytest.raises(RuntimeError) as raised:
        audit({})
    assert str(raised.value) == ("audit counts CUDA host-device syncs and torch sees no CUDA device here; "
                                 "run it on a GPU machine (mentor.env.needs_cuda tells you when to skip).")
    with pytest.raises(RuntimeError) as raised:
        debug_mode_count(lambda: None)
    assert str(raised.value) == "debug_mode_count counts CUDA syncs and torch sees no CUDA device; run it on a GPU."
