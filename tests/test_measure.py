"""mentor.measure, the reader's measuring tools: the GPU's idle share pinned to exact values on hand-made Chrome traces
(JSON written to a file and read back with load_trace), its refusals word for word, profiling_session's short
schedule, update_cost's CPU path with a fake clock and its refusals, that the lab's old names are the library's
objects, and that the module imports with the lab and its plotting and logging packages made unimportable. On CUDA
(``@gpu``): a traced host-bound loop and a traced GPU-bound loop fall on either side of HOST_BOUND_IDLE, and
update_cost counts a sync-free update and a syncing one as they are."""

from __future__ import annotations

import gzip
import inspect
import json
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

import mentor.measure as measure
from marks import gpu
from mentor.measure import (
    HOST_BOUND_IDLE,
    Event,
    Trace,
    gpu_idle_share,
    load_trace,
    profiling_session,
    update_cost,
)

REPO = Path(__file__).resolve().parent.parent


def x(name, cat, ts, dur, tid=1, correlation=None):
    """One complete ("ph": "X") event of a Chrome trace, as torch.profiler writes it."""
    event = {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": tid}
    if correlation is not None:
        event["args"] = {"correlation": correlation}
    return event


def step(n, start, dur=50):
    return x(f"ProfilerStep#{n}", "user_annotation", start, dur)


def launch(ts, correlation, tid=1):
    return x("cudaLaunchKernel", "cuda_runtime", ts, 1, tid, correlation)


def written(tmp_path, events, name="trace.json"):
    """``events`` as a Chrome trace file (gzipped when ``name`` ends in .gz), read back with load_trace."""
    path = tmp_path / name
    text = json.dumps({"traceEvents": events, "traceName": name})
    if name.endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return load_trace(path)


# ----------------------------------------------------------------------------------------------------------
# gpu_idle_share on hand-made traces


def test_the_gap_between_two_steps_is_idle_time(tmp_path):
    trace = written(tmp_path, [
        step(1, 0), launch(10, 1), x("k1", "kernel", 100, 40, tid=7, correlation=1),
        step(2, 50), launch(60, 2), x("k2", "kernel", 160, 20, tid=7, correlation=2),
    ])
    # from 100 to 180 µs: busy 40 + 20 of 80, idle the 20 µs between the steps
    assert gpu_idle_share(trace) == 0.25


def test_copies_memsets_other_streams_and_the_backward_thread_count(tmp_path):
    trace = written(tmp_path, [
        step(1, 0), launch(5, 1), launch(30, 2, tid=2),        # tid 2: autograd's backward thread
        step(2, 50), launch(55, 3), launch(80, 4, tid=2),
        x("a", "kernel", 100, 20, tid=7, correlation=1),       # [100, 120)
        x("b", "gpu_memcpy", 120, 10, tid=7, correlation=2),   # [120, 130)
        x("c", "gpu_memset", 150, 10, tid=7, correlation=3),   # [150, 160)
        x("d", "kernel", 180, 20, tid=7, correlation=4),       # [180, 200): the last work, from the backward thread
        x("e", "kernel", 135, 10, tid=8),                      # another stream, no step's: busy all the same
        x("f", "kernel", 60, 30, tid=8),                       # before the first step's GPU work: not counted
        x("g", "kernel", 210, 50, tid=8),                      # after the last step's: not counted
        x("aten::mm", "cpu_op", 100, 100),                     # host work is not GPU work
    ])
    # from 100 to 200 µs: busy 30 + 10 + 10 + 20 = 70 of 100
    assert gpu_idle_share(trace) == 0.3


def test_three_steps_from_a_gzipped_trace_with_overlapping_work(tmp_path):
    trace = written(tmp_path, [
        step(1, 0), step(2, 50), step(3, 100),
        launch(1, 1), launch(51, 2), launch(52, 3), launch(101, 4),
        x("k1", "kernel", 200, 50, tid=7, correlation=1),     # [200, 250)
        x("k2", "kernel", 240, 30, tid=8, correlation=2),     # [240, 270): overlaps k1, counted once
        x("k3", "kernel", 300, 20, tid=7, correlation=3),     # [300, 320)
        x("k4", "kernel", 360, 40, tid=7, correlation=4),     # [360, 400)
        {"ph": "i", "name": "an instant event", "ts": 280},   # not a complete event: ignored
    ], name="loop.json.gz")
    # from 200 to 400 µs: busy 70 + 20 + 40 = 130 of 200
    assert gpu_idle_share(trace) == 0.35
    assert gpu_idle_share(trace) > HOST_BOUND_IDLE


def test_a_gpu_that_never_waits_idles_zero(tmp_path):
    trace = written(tmp_path, [
        step(1, 0), launch(1, 1), step(2, 50), launch(51, 2),
        x("k1", "kernel", 100, 60, tid=7, correlation=1), x("k2", "kernel", 160, 60, tid=7, correlation=2),
    ])
    assert gpu_idle_share(trace) == 0.0


def test_the_threshold_is_the_books_convention():
    assert HOST_BOUND_IDLE == 0.10


@pytest.mark.parametrize("events, message", [
    pytest.param([step(1, 0), launch(1, 1), x("k", "kernel", 10, 5, 7, 1)],
                 "gpu_idle_share needs a trace of at least 2 steps, got 1: the gaps between steps are what it "
                 "measures; record more (profiling_session(..., active=5)).", id="one-step"),
    pytest.param([step(1, 0), launch(1, 1), x("k1", "kernel", 100, 0, 7, 1),
                  step(2, 50), launch(51, 2), x("k2", "kernel", 100, 0, 7, 2)],
                 "the GPU work of the 2 traced steps spans no time (100 to 100 us): there is no time to measure an "
                 "idle share in; pass a trace recorded on a CUDA device whose steps run GPU work of nonzero "
                 "duration.", id="zero-span"),
    pytest.param([x("k", "kernel", 0, 1, 7, 1)],
                 "the trace has no ProfilerStep windows: record it with a torch.profiler schedule and call "
                 "prof.step() once per training step.", id="no-steps"),
    pytest.param([step(1, 0), x("aten::add", "cpu_op", 5, 2), step(2, 50)],
                 "ProfilerStep#1 (host window at 0 us) launched no GPU work that the trace links to it by "
                 "correlation id; record the trace on a CUDA device with ProfilerActivity.CUDA "
                 "(mentor.measure.profiling_session does) so that kernels carry args.correlation.", id="cpu-trace"),
])
def test_gpu_idle_share_refuses_a_trace_it_cannot_measure(tmp_path, events, message):
    with pytest.raises(ValueError) as caught:
        gpu_idle_share(written(tmp_path, events))
    assert str(caught.value) == message


def test_gpu_idle_share_takes_a_trace_not_a_path():
    with pytest.raises(TypeError) as caught:
        gpu_idle_share("regime.json.gz")
    assert str(caught.value) == "expected a mentor.measure.Trace from load_trace(path), not str."


def test_load_trace_keeps_what_gpu_idle_share_reads(tmp_path):
    trace = written(tmp_path, [launch(60, 2, tid=3), step(1, 0), {"ph": "X", "name": "no ts"}])
    assert trace.events == [Event("ProfilerStep#1", "user_annotation", 0.0, 50.0, 1, 1),
                            Event("cudaLaunchKernel", "cuda_runtime", 60.0, 1.0, 1, 3, 2)]
    assert isinstance(trace, Trace) and trace.path == str(tmp_path / "trace.json")


# ----------------------------------------------------------------------------------------------------------
# profiling_session


def test_a_session_too_short_for_its_schedule_says_what_to_do(tmp_path):
    path = tmp_path / "short.json"
    with warnings.catch_warnings(), pytest.raises(RuntimeError) as caught:
        warnings.simplefilter("ignore")  # torch's own warning about the schedule: the error says more
        with profiling_session(path, wait=1, warmup=1, active=2) as prof:
            prof.step()  # one step: the block ends in the warm-up step, before anything is recorded
    assert str(caught.value) == (
        f"profiling_session recorded nothing and wrote no trace to '{path}': the block called prof.step() 1 "
        "time(s), but the schedule needs 4 steps (wait 1 + warmup 1 + active 2) and records only from step 3 on. "
        "Call prof.step() once per training step and run at least 4 steps, or shorten the schedule.")
    assert not path.exists()


def test_a_session_of_a_loop_without_gpu_work_gives_no_idle_share(tmp_path):
    path = tmp_path / "cpu.json.gz"
    with profiling_session(path, wait=0, warmup=1, active=2) as prof:
        for _ in range(3):
            torch.ones(16, 16) @ torch.ones(16, 16)  # on the CPU: the step launches nothing on a GPU
            prof.step()
    trace = load_trace(path)
    steps = [e.name for e in trace.by_cat("user_annotation") if e.name.startswith("ProfilerStep#")]
    assert steps == ["ProfilerStep#1", "ProfilerStep#2"]
    with pytest.raises(ValueError, match=r"^ProfilerStep#1 \(host window at .* us\) launched no GPU work"):
        gpu_idle_share(trace)


# ----------------------------------------------------------------------------------------------------------
# update_cost


def test_without_cuda_only_the_host_time_is_measured(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(measure.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(measure, "_gpu_ops", lambda *a: pytest.fail("no kernels to count without CUDA"))
    import mentor.syncs

    monkeypatch.setattr(mentor.syncs, "count_syncs", lambda *a: pytest.fail("no syncs to count without CUDA"))
    durations = iter([1e-6, 2e-6, 25e-6, 40e-6, 30e-6])

    def update():
        now[0] += next(durations)

    cost = update_cost("my metrics", update, repeats=3, warmup=2)
    assert (cost.name, cost.syncs, cost.kernels, cost.copies, cost.queue) == ("my metrics", 0, None, None,
                                                                               "n/a (CPU)")
    assert cost.repeats_us == pytest.approx([25.0, 40.0, 30.0], abs=1e-9)  # the two warm-up calls are not timed
    assert cost.host_us == pytest.approx(30.0, abs=1e-9)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(name=3, fn=lambda: None), TypeError,
     'name must be a str that labels the update (e.g. "my metrics"), not int.'),
    (dict(name="m", fn=None), TypeError, "fn must be a function of no arguments (e.g. lambda: metric.update(x)), "
                                         "not None."),
    (dict(name="m", fn=lambda: None, repeats=0), ValueError, "repeats must be an int >= 1, got 0."),
    (dict(name="m", fn=lambda: None, warmup=-1), ValueError,
     "warmup must be an int >= 0 (untimed calls before measuring), got -1."),
    (dict(name="m", fn=lambda: None, warmup=True), ValueError,
     "warmup must be an int >= 0 (untimed calls before measuring), got True."),
    (dict(name="m", fn=lambda: None, warmup=1.5), ValueError,
     "warmup must be an int >= 0 (untimed calls before measuring), got 1.5."),
])
def test_update_cost_refuses_bad_arguments(kwargs, error, message):
    name, fn = kwargs.pop("name"), kwargs.pop("fn")
    with pytest.raises(error) as caught:
        update_cost(name, fn, **kwargs)
    assert str(caught.value) == message


def test_zero_warmup_calls_are_allowed(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    calls = []
    update_cost("m", lambda: calls.append(1), repeats=2, warmup=0)
    assert len(calls) == 2


# ----------------------------------------------------------------------------------------------------------
# The module: the lab's old names, examples, and what it imports


MOVED = {
    "mentor.lab.update_cost": ["UpdateCost", "update_cost", "one_core", "LAUNCHES_PER_REPEAT", "_gpu_ops",
                               "_measure", "_sleep_cycles_per_ms", "_time_behind_sleep"],
    "mentor.lab.regimes": ["HOST_BOUND_IDLE", "gpu_idle_share"],
    "mentor.lab.profiling": ["profiling_session"],
    "mentor.lab.trace": ["Event", "Trace", "load_trace"],
}


@pytest.mark.parametrize("module", sorted(MOVED))
def test_the_labs_old_names_are_the_librarys_objects(module):
    import importlib

    lab = importlib.import_module(module)
    assert [name for name in MOVED[module] if getattr(lab, name) is not getattr(measure, name)] == []


def test_every_exported_name_has_an_example():
    """``__all__`` also names what mentor._chrome_trace defines (Event, Trace, load_trace): their examples too."""
    names = [n for n in measure.__all__
             if inspect.isfunction(getattr(measure, n)) or inspect.isclass(getattr(measure, n))]
    assert set(names) == {"Event", "Trace", "UpdateCost", "gpu_idle_share", "load_trace", "one_core",
                          "profiling_session", "update_cost"}
    assert [n for n in names if ">>>" not in (inspect.getdoc(getattr(measure, n)) or "")] == []
    assert all(hasattr(measure, n) for n in measure.__all__)


BLOCKED = ("matplotlib", "tqdm", "tensorboard", "torchvision", "mentor.lab")

IMPORT_CHECK = """
import importlib.abc, sys

BLOCKED = {blocked!r}

def blocked(name):
    return any(name == b or name.startswith(b + ".") for b in BLOCKED)

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if blocked(name):
            raise ModuleNotFoundError(f"{{name}} is made unimportable by this test", name=name)
        return None

sys.meta_path.insert(0, Refuse())
import mentor.measure
print(sorted(m for m in sys.modules if blocked(m)))
for name in BLOCKED:  # the finder does refuse each of them
    try:
        __import__(name)
    except ImportError:
        print("refused", name)
"""


def test_mentor_measure_imports_without_the_lab_and_its_plotting_and_logging_packages():
    done = subprocess.run([sys.executable, "-c", IMPORT_CHECK.format(blocked=BLOCKED)], capture_output=True,
                          text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[]"] + [f"refused {name}" for name in BLOCKED]


# ----------------------------------------------------------------------------------------------------------
# On CUDA


def traced_idle_share(path: Path, step_fn) -> float:
    with profiling_session(path, wait=0, warmup=1, active=4) as prof:
        for _ in range(5):
            step_fn()
            prof.step()
    torch.cuda.synchronize()
    return gpu_idle_share(load_trace(path))


@gpu
def test_a_loop_that_waits_on_the_host_is_host_bound(tmp_path):
    x = torch.zeros(1024, device="cuda")

    def host_bound_step():
        x.add_(1)          # microseconds of GPU work
        time.sleep(0.003)  # milliseconds of host work: the GPU waits for the next step's launch

    idle = traced_idle_share(tmp_path / "host.json.gz", host_bound_step)
    assert idle > 0.9 and idle > HOST_BOUND_IDLE, idle


@gpu
def test_a_loop_that_queues_long_kernels_is_gpu_bound(tmp_path):
    a = torch.randn(4096, 4096, device="cuda")

    def gpu_bound_step():
        for _ in range(8):  # milliseconds of matmuls per step, launched in microseconds: the queue never drains
            a @ a

    idle = traced_idle_share(tmp_path / "gpu.json.gz", gpu_bound_step)
    assert 0.0 <= idle < HOST_BOUND_IDLE, idle


@gpu
def test_update_cost_of_the_fused_suite_on_cuda():
    from mentor.suite import FusedMetrics

    suite = FusedMetrics(1000).cuda()
    logits, labels = torch.randn(32, 1000, device="cuda"), torch.randint(0, 1000, (32,), device="cuda")
    loss = torch.nn.functional.cross_entropy(logits, labels)
    cost = update_cost("suite", lambda: suite.update(loss, logits, labels), repeats=5)
    assert (cost.syncs, cost.kernels, cost.copies, cost.queue) == (0, 1, 0, "full")
    assert len(cost.repeats_us) == 5 and 0 < cost.host_us < 10_000


@gpu
def test_update_cost_of_a_mean_metric_that_checks_for_nan_on_cuda():
    """torchmetrics 1.9.0's MeanMetric reads two booleans back in its NaN check, ``nans.any() or
    nans_weight.any()`` (torchmetrics/aggregation.py:93): two syncs, each copying one value to the host, so the
    update is timed with an idle GPU."""
    from torchmetrics import MeanMetric

    metric, value = MeanMetric().cuda(), torch.ones(8, device="cuda")
    cost = update_cost("mean", lambda: metric.update(value), repeats=3)
    assert (cost.syncs, cost.copies, cost.queue) == (2, 2, "idle")
    assert cost.kernels is not None and cost.kernels >= 2
