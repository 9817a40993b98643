"""scripts/decompose_residuals.py: its trace decomposition and per-batch aggregation on hand-made Chrome traces
(exact), on the H200 traces of tests/data (against mentor.lab.trace), its measuring loop on the CPU, and one
``--smoke`` run in a subprocess."""

import gzip
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import background
from mentor.lab.trace import HOST_API_CATEGORIES, load_trace, step_windows, sync_events

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "decompose_residuals.py"
_spec = importlib.util.spec_from_file_location("decompose_residuals", SCRIPT)
dr = importlib.util.module_from_spec(_spec)
sys.modules["decompose_residuals"] = dr  # dataclasses look their module up there
_spec.loader.exec_module(dr)

DATA = REPO / "tests" / "data"


def x(name, cat, ts, dur, tid=1, corr=None, pid=1):
    event = {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid}
    if corr is not None:
        event["args"] = {"correlation": corr}
    return event


def memory(ts, size, device):
    return {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "ts": ts, "pid": 1, "tid": 1,
            "args": {"Bytes": size, "Device Type": device}}


# Two batches on the main thread (tid 1), autograd's thread (tid 2), the GPU (pid 0). Every number below is
# worked out by hand in test_decompose_trace_exact.
TRACE = {"traceEvents": [
    x("ProfilerStep#1", "user_annotation", 0, 100),
    x("ProfilerStep#2", "user_annotation", 100, 100),
    x("ProfilerStep#1", "gpu_user_annotation", 0, 300, tid=7, pid=0),  # the GPU's copy: no window
    x("PyTorch Profiler (0)", "Trace", 0, 500),
    {"ph": "s", "cat": "ac2g", "name": "flow", "ts": 15, "pid": 1, "tid": 1, "id": 1},
    # batch 1, main thread
    x("/r/mentor/suite.py(10): update", "python_function", 10, 30),
    x("cuLaunchKernel", "cuda_driver", 15, 5, corr=1),
    x("aten::zeros", "cpu_op", 22, 8),
    x("aten::fill_", "cpu_op", 24, 4),
    x("torch/nn/x.py(3): f", "python_function", 32, 4),  # no rule: the suite's, from its ancestor
    x("Optimizer.step#SGD.step", "user_annotation", 50, 20),
    x("cudaMemcpyAsync", "cuda_runtime", 52, 3, corr=2),
    x("cudaStreamSynchronize", "cuda_runtime", 56, 10),
    x("TorchDynamo Cache Lookup", "cpu_op", 80, 4),
    # autograd's thread, across the two windows
    x("autograd::engine::evaluate_function: ConvBackward0", "cpu_op", 60, 70, tid=2),
    x("cudaLaunchKernel", "cuda_runtime", 90, 5, tid=2, corr=3),
    x("aten::convolution_backward", "cpu_op", 105, 20, tid=2),
    # batch 2, main thread
    x("Torch-Compiled Region: 0/0", "user_annotation", 110, 40),
    x("cudaGraphLaunch", "cuda_runtime", 120, 10, corr=4),
    x("cudaGraphLaunch", "cuda_runtime", 132, 2, corr=5),  # a replay whose kernels the trace does not show
    x("x.py(1): past_its_parent", "python_function", 140, 20),  # ends after its parent: cut at 150
    x("decompose: gate", "user_annotation", 160, 20),
    x("cudaDeviceSynchronize", "cuda_runtime", 161, 9),
    x("cudaLaunchKernel", "cuda_runtime", 171, 2, corr=6),
    # the GPU
    x("fused_update", "kernel", 200, 5, tid=7, corr=1, pid=0),
    x("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", 210, 2, tid=8, corr=2, pid=0),
    x("conv_bwd", "kernel", 215, 50, tid=7, corr=3, pid=0),
    x("g1", "kernel", 300, 10, tid=7, corr=4, pid=0),
    x("g2", "kernel", 310, 20, tid=7, corr=4, pid=0),
    x("spin_kernel", "kernel", 320, 900, tid=7, corr=6, pid=0),  # the gate's sleep: no batch's work
    x("orphan", "kernel", 1300, 3, tid=7, corr=99, pid=0),  # launched before the trace
    x("Memset (Device)", "gpu_memset", 1310, 1, tid=7, corr=98, pid=0),
    memory(12, 512, 1), memory(15, -512, 1), memory(150, 64, 0), memory(250, 64, 0), memory(20, 0, 1),
]}


def window(dur, other, host, api=None, gpu=None, kernels=None, mem=None):
    zeros = dict.fromkeys
    return {"window_us": dur, "other_threads_us": other, "host_us": {**zeros(dr.CATEGORIES, 0.0), **host},
            "api": {**zeros(("kernel_launches", "graph_launches", "graph_launches_without_gpu_events", "syncs"),
                            0.0), **(api or {})},
            "gpu": {**zeros(("us", "kernels", "kernel_us", "copies", "copy_us", "memsets", "memset_us"), 0.0),
                    **(gpu or {})},
            "kernels": kernels or {},
            "memory": {**zeros(("cuda_allocs", "cuda_frees", "cpu_allocs", "cpu_frees"), 0.0), **(mem or {})}}


def test_decompose_trace_exact():
    first = window(100.0, 40.0, {
        # suite 30 less the launch (5) and aten::zeros (8); torch/nn/x.py's 4 are the suite's too
        "suite Python (mentor/, not mentor/lab/)": 17.0, "kernel launch": 5.0 + 5.0, "allocation ops": 8.0 - 4.0,
        "other aten ops": 4.0, "optimizer annotations": 20.0 - 3.0 - 10.0, "copy/memset API": 3.0,
        "sync (host waits)": 10.0, "dynamo guards": 4.0,
        "autograd engine": 40.0 - 5.0,  # the part of autograd's range inside this window, less its launch
        dr.NO_EVENT: 100.0 - 30.0 - 20.0 - 4.0},
        api={"kernel_launches": 2.0, "syncs": 1.0},
        gpu={"us": 57.0, "kernels": 2.0, "kernel_us": 55.0, "copies": 1.0, "copy_us": 2.0},
        kernels={"fused_update": {"count": 1.0, "us": 5.0}, "conv_bwd": {"count": 1.0, "us": 50.0}},
        mem={"cuda_allocs": 1.0, "cuda_frees": 1.0})
    second = window(100.0, 30.0, {
        "autograd engine": 30.0 - 20.0, "other aten ops": 20.0,
        "dynamo frame (graph call, side-effect replay)": 40.0 - 10.0 - 2.0, "CUDA-graph launch": 12.0,
        dr.GATE: 20.0,  # the gate's sync and launch stay the gate's
        dr.NO_EVENT: 100.0 - 40.0 - 20.0},
        api={"graph_launches": 2.0, "graph_launches_without_gpu_events": 1.0},
        gpu={"us": 30.0, "kernels": 2.0, "kernel_us": 30.0},
        kernels={"g1": {"count": 1.0, "us": 10.0}, "g2": {"count": 1.0, "us": 20.0}},
        mem={"cpu_allocs": 1.0})
    assert dr.decompose_trace(TRACE) == [first, second]
    for w in (first, second):  # the categories hold every host microsecond once
        assert sum(w["host_us"].values()) == w["window_us"] + w["other_threads_us"]


def test_decompose_trace_takes_the_event_list_and_any_event_order():
    assert dr.decompose_trace(list(reversed(TRACE["traceEvents"]))) == dr.decompose_trace(TRACE)


@pytest.mark.parametrize(("name", "cat", "expected"), [
    ("cudaGraphLaunch", "cuda_runtime", "CUDA-graph launch"),
    ("cuLaunchKernel", "cuda_driver", "kernel launch"),
    ("cudaMemcpy", "cuda_runtime", "sync (host waits)"),  # the blocking copy waits
    ("cudaMemsetAsync", "cuda_runtime", "copy/memset API"),
    ("cudaMalloc", "cuda_runtime", "allocator API"),
    ("cudaFree", "cuda_runtime", "sync (host waits)"),
    ("cudaEventQuery", "cuda_runtime", "other CUDA API"),
    ("cudaGraphLaunch", "cpu_op", "other aten ops"),  # the name alone is not a CUDA call
    ("TorchDynamo Cache Lookup", "cpu_op", "dynamo guards"),
    ("## Call CompiledFxGraph fabc ##", "user_annotation", "inductor call (cudagraph trees)"),
    ("CompiledFunctionBackward", "cpu_op", "AOTAutograd wrappers"),
    ("aten::copy_", "cpu_op", "copy ops"),
    ("aten::empty_strided", "cpu_op", "allocation ops"),
    ("decompose: report", "user_annotation", "metric report"),
    ("mentor/suite.py(259): update", "python_function", "suite Python (mentor/, not mentor/lab/)"),
    ("mentor/lab/train.py(9): train", "python_function", None),
    ("/work/mentor/scripts/x.py(1): f", "python_function", None),  # a folder named mentor is not the package
    ("mentor/suite.py(259): update", "cpu_op", "other aten ops"),
    ("/usr/lib/site-packages/lightning/pytorch/loops/fit_loop.py(3): run", "python_function", "Lightning Python"),
    ("accelerate/accelerator.py(1): backward", "python_function", "Accelerate Python"),
    ("torchmetrics/metric.py(2): forward", "python_function", "torchmetrics Python"),
    ("Activity Buffer Request", "overhead", "profiler overhead"),
    ("ProfilerStep#3", "user_annotation", None),
])
def test_category_rules(name, cat, expected):
    assert dr.category(name, cat) == expected


def test_every_category_has_a_rule_text_and_the_derived_ones_come_last():
    assert [c for c, _ in dr.RULE_TEXT] + [dr.REST, dr.NO_EVENT] == list(dr.CATEGORIES)
    assert dict(dr.RULE_TEXT)["dynamo guards"] == "name: TorchDynamo Cache Lookup"


@pytest.mark.parametrize(("raw", "message"), [
    ({"traceEvents": [x("aten::add", "cpu_op", 0, 1)]}, "no ProfilerStep windows"),
    ({"traceEvents": [x("ProfilerStep#1", "user_annotation", 0, -1)]}, "dur=-1"),
    ({"traceEvents": [x("ProfilerStep#1", "user_annotation", "0", 1)]}, "ts='0'"),
    ({"traceEvents": [x("ProfilerStep#1", "user_annotation", 0, float("nan"))]}, "dur=nan"),
    ({"events": []}, "traceEvents"),
    ("trace.json", "traceEvents"),
])
def test_decompose_trace_refuses_what_is_not_a_trace(raw, message):
    with pytest.raises(ValueError, match=message):
        dr.decompose_trace(raw)


@pytest.mark.parametrize("name", ["no_metrics", "naive", "optimized", "ranged_mean"])
def test_decompose_trace_on_h200_traces_agrees_with_mentor_lab_trace(name):
    with gzip.open(DATA / f"{name}.json.gz", "rt", encoding="utf-8") as f:
        windows = dr.decompose_trace(json.load(f))
    trace = load_trace(DATA / f"{name}.json.gz")
    steps = step_windows(trace)
    launched = {e.correlation: e.start for e in trace.by_cat(*HOST_API_CATEGORIES) if e.correlation is not None}
    assert len(windows) == len(steps) == 3
    for w, step in zip(windows, steps):
        assert w["window_us"] == step.dur
        assert sum(w["host_us"].values()) == pytest.approx(w["window_us"] + w["other_threads_us"], abs=1e-6)
        assert w["api"]["syncs"] == len(sync_events(trace, step))
        mine = [e for e in trace.by_cat("kernel") if step.start <= launched.get(e.correlation, -1) < step.end]
        assert w["gpu"]["kernels"] == len(mine) == sum(k["count"] for k in w["kernels"].values()) > 100
        assert w["gpu"]["kernel_us"] == pytest.approx(sum(e.dur for e in mine))
        assert w["host_us"]["kernel launch"] > 0 and w["host_us"][dr.GATE] == 0


def test_aggregate_exact():
    windows = [{"us": 10.0, "k": {"a": 1.0}}, {"us": 70.0, "k": {"a": 3.0, "b": 2.0}}, {"us": 30.0, "k": {}}]
    out = dr.aggregate(windows, [False, True, False], every=4)
    assert out == {"windows": 3, "report_windows": 1, "plain": {"us": 20.0, "k": {"a": 0.5}},
                   "report": {"us": 70.0, "k": {"a": 3.0, "b": 2.0}},
                   "amortized": {"us": 0.75 * 20.0 + 0.25 * 70.0, "k": {"a": 0.75 * 0.5 + 0.25 * 3.0, "b": 0.5}}}


def test_aggregate_without_reports():
    never = dr.aggregate([{"us": 1.0}, {"us": 3.0}], [False, False], every=None)
    assert never["amortized"] == never["plain"] == {"us": 2.0} and never["report"] is None
    missed = dr.aggregate([{"us": 1.0}], [False], every=50)  # it reports, but not in these windows
    assert missed["amortized"] is None and missed["plain"] == {"us": 1.0}


@pytest.mark.parametrize(("report", "every", "message"), [
    ([False], 5, "2 windows"), ([False, True], None, "every is None"), ([False, False], 0, "every must be"),
    ([False, False], True, "every must be"),
])
def test_aggregate_refuses_bad_input(report, every, message):
    with pytest.raises(ValueError, match=message):
        dr.aggregate([{"us": 1.0}, {"us": 2.0}], report, every)


def test_difference_and_top_kernels():
    assert dr.difference({"a": 5.0, "d": {"x": 1.0}, "n": None}, {"a": 2.0, "d": {"y": 4.0}, "n": 1.0}) == {
        "a": 3.0, "d": {"x": 1.0, "y": -4.0}, "n": None}
    assert dr.difference(None, {"a": 1.0}) is None
    kernels = {"a": {"count": 1.0, "us": 1.0}, "b": {"count": 1.0, "us": -9.0}, "c": {"count": 2.0, "us": 4.0}}
    assert list(dr.top_kernels(kernels, 2)) == ["b", "c"]


def _toy_loop(every, work=lambda: None):
    """A Loop whose batches do ``work`` and, when due, a report; each batch updates in a timed hook."""
    def run(n, on_batch_start):
        for i in range(n):
            on_batch_start(i)
            loop.timed("update", work)
            if every and (loop.done + i + 1) % every == 0:
                loop.timed("report", lambda: torch.ones(3).sum())

    loop = dr.Loop(run, every)
    return loop


def test_measure_block_on_the_cpu_times_each_free_batch():
    settings = dr.Settings(rounds=1, settle=2, free=5, gated=4, active=2, stack=1)
    loop = _toy_loop(every=None, work=lambda: time.sleep(0.002))
    found = dr.measure_block(loop, settings, gate=None)  # no CUDA: no gated batches
    assert loop.done == 2 + 5 + 1
    assert len(found["step_ms"]) == len(found["host_free_us"]) == 5 and found["issue_us"] == []
    assert all(ms >= 2.0 for ms in found["step_ms"])
    assert len(loop.hook_us["free"]) == 5 and loop.hook_us["gated"] == [] and loop.phase is None
    assert loop.reports(4) == set()


def test_profile_run_places_the_report_in_the_middle_and_out_of_the_stack_run():
    settings = dr.Settings(rounds=1, settle=1, free=2, gated=2, active=4, stack=2)
    loop = _toy_loop(every=7, work=lambda: torch.ones(2).add_(1))
    loop.batches(3)
    windows, flags, waited = dr.profile_run(loop, settings, settings.active, None)
    assert flags == [False, False, True, False] and waited == 0
    reported = [w["host_us"]["metric report"] > 0 for w in windows]
    assert reported == flags and all(w["host_us"]["metric update"] > 0 for w in windows)
    windows, flags, _ = dr.profile_run(loop, settings, settings.stack, None, stack=True)
    assert flags == [False, False] and loop.done == 3 + 6 + 1 + 4  # a lead-in of 1: the closing batch reported
    assert not any(w["host_us"]["metric report"] for w in windows)


def test_keeper_keeps_the_first_points_traces_within_the_budget(tmp_path, monkeypatch):
    keep = dr._keeper(tmp_path, "eager", enabled=True)
    path = keep(0, "fp32 b32", "suite, no report")
    assert path == tmp_path / "traces" / "eager_fp32_b32_suite_no_report.json.gz"
    assert keep(1, "fp32 b128", "suite") is None
    assert dr._keeper(tmp_path, "eager", enabled=False)(0, "fp32 b32", "suite") is None
    monkeypatch.setattr(dr, "TRACE_BUDGET", 10)
    path.write_bytes(b"x" * 11)
    assert keep(0, "fp32 b32", "no metrics") is None


def test_main_refuses_an_unknown_part(capsys):
    with pytest.raises(SystemExit) as stop:
        dr.main(["--part", "compiled,bogus", "--out", "x", "--smoke"])
    assert stop.value.code == 2 and "--part takes compiled, frameworks, eager" in capsys.readouterr().err


def smoke_run(env: dict[str, str]):
    """Background job: the script's smoke run of its three parts, into a folder of its own; (the finished
    process, the folder)."""
    out = background.scratch("decompose-smoke-")
    done = background.run([sys.executable, str(SCRIPT), "--part", "eager,compiled,frameworks", "--smoke", "--out",
                           str(out)], env, timeout=300, cwd=REPO)
    return done, out


SMOKE = background.job(smoke_run, "test_smoke_run")


@pytest.mark.subprocess
def test_smoke_run():
    done, tmp_path = background.result(SMOKE)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout[-3000:] + done.stderr[-3000:]
    frameworks = json.loads((tmp_path / "frameworks.json").read_text())["results"]
    assert list(frameworks) == ["Lightning, fp32 b128", "Accelerate, fp32 b128"]
    for loop, way in zip(frameworks.values(), ["suite, LogEvery", "suite, readback"]):
        assert list(loop["variants"]) == ["no metrics", way, "suite, no report"]
        assert loop["variants"][way]["profile"]["report_windows"] == 1
        assert loop["variants"]["suite, no report"]["stack_profile"]["plain"]["host_us"][
            "suite Python (mentor/, not mentor/lab/)"] > 0
    for part, names in (("eager", ["no metrics", "suite", "suite, no report"]),
                        ("compiled", ["no metrics", "suite inside", "suite inside, no report"])):
        doc = json.loads((tmp_path / f"{part}.json").read_text())
        assert doc["part"] == part and "no CUDA" in doc["smoke"] and len(doc["results"]) == 1
        (point, result), = doc["results"].items()
        assert list(result["variants"]) == names
        assert list(result["differences"]) == [f"{names[1]} - no metrics", f"{names[2]} - no metrics"]
        for name, v in result["variants"].items():
            assert v["host_issue_us"] is None and v["step_ms"]["n"] == 2
            profile = v["profile"]
            assert profile["report_windows"] == (name == names[1]) and profile["windows"] == 2
            plain = profile["plain"]
            assert sum(plain["host_us"].values()) == pytest.approx(plain["window_us"] + plain["other_threads_us"])
            update = plain["host_us"]["metric update"]
            assert (update > 0) == (part == "eager" and name != "no metrics")  # compiled: inside the graph
            if name == names[1]:
                assert profile["report"]["host_us"]["metric report"] > 0
            assert v["stack_profile"]["plain"]["host_us"]["suite Python (mentor/, not mentor/lab/)"] >= 0
        with gzip.open(tmp_path / "traces" / f"{part}_{point.replace(' ', '_')}_no_metrics.json.gz", "rt") as f:
            assert any(e.get("name", "").startswith("ProfilerStep#") for e in json.load(f)["traceEvents"])
    eager = json.loads((tmp_path / "eager.json").read_text())["results"]
    suite = next(iter(eager.values()))["variants"]["suite, no report"]
    assert suite["hook_us"]["free"]["n"] == 2 and suite["stack_profile"]["plain"]["host_us"][
        "suite Python (mentor/, not mentor/lab/)"] > 0


def test_compare_takes_differences_over_every_kernel_then_keeps_the_top_ones():
    big = {f"conv{i}": {"count": 1.0, "us": 100.0 + i} for i in range(20)}
    none = {"step_ms": {"median": 4.0}, "profile": {"plain": {"kernels": dict(big)}, "amortized": None}}
    suite = {"step_ms": {"median": 4.25}, "profile": {"plain": {"kernels": {**big, "fused_update": {
        "count": 1.0, "us": 5.0}}}, "amortized": None}}
    diff = dr.compare({"no metrics": none, "suite": suite})
    assert diff == {"suite - no metrics": {"step_ms": {"median": 0.25}, "profile": {
        "plain": {"kernels": {"fused_update": {"count": 1.0, "us": 5.0},
                              **{f"conv{i}": {"count": 0.0, "us": 0.0} for i in range(14)}}}, "amortized": None}}}
    assert list(suite["profile"]["plain"]["kernels"]) == [f"conv{i}" for i in range(19, 4, -1)]  # 15 kept


def test_the_docstring_examples():
    import doctest

    result = doctest.testmod(dr)
    assert result.attempted >= 8 and result.failed == 0


class FakeGate:
    """Gate's interface without CUDA: ``close`` answers from a script of validities; ``opens`` records the scales."""

    def __init__(self, valid):
        self.valid, self.sleep_ms, self.event, self.opens = list(valid), 2.0, None, []

    def open(self, scale=1.0):
        self.event = object()
        self.opens.append(scale)

    def close(self):
        self.event = None
        return 7.0, self.valid.pop(0)


def test_measure_block_gated_batches_drop_reports_and_waits_and_double_the_sleep():
    settings = dr.Settings(rounds=1, settle=1, free=3, gated=4, active=2, stack=1)
    loop = _toy_loop(every=6)  # counted from 1, batch 5 (the second gated one) reports
    gate = FakeGate([True, False, False, True])  # the report batch waited (its sync), and batch 6 did too
    found = dr.measure_block(loop, settings, gate)
    assert loop.done == 1 + 3 + 4 + 1 and gate.opens == [1.0] * 4 and gate.valid == []
    assert found["issue_us"] == [7.0, 7.0] and found["report"] == 1 and found["waited"] == 1
    assert gate.sleep_ms == 4.0  # 2 ms (the free batches are far shorter), doubled once: under the cap
    assert len(loop.hook_us["free"]) == 3 and len(loop.hook_us["gated"]) == 4


def test_measure_block_stops_doubling_at_four_free_steps():
    settings = dr.Settings(rounds=1, settle=0, free=2, gated=6, active=2, stack=1)
    gate = FakeGate([False] * 6)  # a batch that syncs waits whatever the sleep
    found = dr.measure_block(_toy_loop(every=None), settings, gate)
    assert found["waited"] == 6 and found["issue_us"] == []
    assert 5.0 <= gate.sleep_ms < 6.0  # the cap: 4 free steps (under 0.25 ms here) + 5 ms


def test_profile_run_gates_every_batch_but_the_report_and_leaves_the_gate_out():
    settings = dr.Settings(rounds=1, settle=1, free=2, gated=2, active=4, stack=1)
    loop = _toy_loop(every=5, work=lambda: torch.ones(2).add_(1))
    gate = FakeGate([True, True, True, False, True])  # batch 3 reports (drained, no sleep: it waited)
    windows, flags, waited = dr.profile_run(loop, settings, settings.active, gate)
    assert flags == [False, False, True, False] and waited == 0
    assert gate.opens == [3.0, 3.0, 3.0, 0.0, 3.0]  # the report batch is drained but gets no sleep
    assert all(w["host_us"][dr.GATE] > 0 for w in windows)
    for w in windows:
        assert sum(w["host_us"].values()) == pytest.approx(w["window_us"] + w["other_threads_us"])


def test_a_failed_measurement_is_recorded_and_compared_as_missing(capsys):
    failed = dr._safely(lambda: 1 / 0)
    assert failed == {"error": "ZeroDivisionError: division by zero"}
    assert "ZeroDivisionError" in capsys.readouterr().err  # with its traceback
    none = {"step_ms": {"median": 4.0}, "profile": {"plain": {"us": 1.0, "kernels": {}}, "amortized": None}}
    diff = dr.compare({"no metrics": none, "suite": {"step_ms": {"median": 5.0}, "profile": failed}})
    assert diff == {"suite - no metrics": {"step_ms": {"median": 1.0}, "profile": {"plain": None, "amortized": None}}}
